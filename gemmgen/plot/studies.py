"""Reading the Optuna studies a results database holds (gemmgen tune keeps them in the same
database, in Optuna's RDB tables), without creating or upgrading anything there."""

import optuna
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from gemmgen.errors import GemmgenError, InvalidParameter
from gemmgen.store.db import ResultsDB
from gemmgen.store.engine import backend, hide_password, sqlite_connect_args
from gemmgen.store.studies import quiet_optuna


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage on the results database ``url``, read as it is.

    Raises ResultsDBError where ``url`` is no readable gemmgen results database (a SQLite file
    that does not exist is not created), and GemmgenError where it holds no Optuna tables or
    tables of an Optuna version this one cannot read.
    """
    ResultsDB(url, create=False).close()  # the checks and messages of every other command
    shown = hide_password(url)
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            has_studies = inspect(connection).has_table("studies")
    except SQLAlchemyError as err:
        raise GemmgenError(f"cannot read the studies in {shown}: {err}") from err
    finally:
        engine.dispose()
    if not has_studies:
        raise GemmgenError(f"{shown} holds no Optuna studies: `gemmgen tune --db {shown}` stores them there")
    quiet_optuna()
    try:
        return optuna.storages.RDBStorage(
            url, engine_kwargs={"connect_args": sqlite_connect_args()} if backend(url) == "sqlite" else None,
            skip_table_creation=True)
    except (RuntimeError, SQLAlchemyError) as err:  # RuntimeError: tables of another Optuna version
        raise GemmgenError(f"cannot read the studies in {shown}: {' '.join(str(err).split())}") from err


def study_names(storage: optuna.storages.RDBStorage) -> list[tuple[str, int]]:
    """(name, number of trials) of every study in ``storage``, in the order they were created.

    One query of Optuna's tables: Optuna's study summaries load every trial of every study
    (seconds on the shipped file) to count them.
    """
    query = text("SELECT s.study_name, COUNT(t.trial_id) FROM studies s LEFT JOIN trials t "
                 "ON t.study_id = s.study_id GROUP BY s.study_id, s.study_name ORDER BY s.study_id")
    with storage.engine.connect() as connection:
        return [(name, count) for name, count in connection.execute(query).all()]


def load_study(url: str, name: str | None) -> optuna.Study:
    """The study ``name`` in the results database ``url``.

    Raises InvalidParameter, listing the studies there with their trial counts, where ``name`` is
    None or names none of them; the errors of :func:`open_storage` otherwise.
    """
    storage = open_storage(url)
    names = study_names(storage)
    if name is None or name not in {n for n, _ in names}:
        listing = "\n".join(f"  {n}  ({count} trials)" for n, count in names) or "  (none)"
        asked = "give the study with --study NAME" if name is None else f"no study named {name!r}"
        raise InvalidParameter(f"{asked}; the {len(names)} studies in {hide_password(url)}:\n{listing}")
    return optuna.load_study(study_name=name, storage=storage)
