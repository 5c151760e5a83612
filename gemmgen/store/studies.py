"""The Optuna study a tune works on, in the results database's URL (Optuna's RDB storage), safe
for any number of tuners at once: processes of one host on a SQLite file, or of many hosts on a
PostgreSQL server.

- Set-up (Optuna's tables, the study, its first enqueued trials) runs under dbengine.setup_lock:
  two tuners starting together raced on Optuna's table creation and on create_study.
- SQLite connections are made safe for many processes (dbengine.make_sqlite_safe): without
  BEGIN IMMEDIATE two tuners could pop the same enqueued trial. PostgreSQL locks the row itself.
- Each running trial has a heartbeat (Optuna's, recorded by the tuner's Heartbeat thread). A
  trial whose worker died (killed, machine lost) goes stale after GRACE_PERIOD_S without one;
  the next tuner to ask fails it, and RetryFailedTrialCallback enqueues it again to be measured.
"""

import threading
import warnings

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from gemmgen.store.engine import backend, make_sqlite_safe, setup_lock, sqlite_connect_args

HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60
MAX_RETRY = 2  # a trial whose worker died is measured again at most this often


# The URLs whose Optuna schema version this process has checked: Optuna's check reads its alembic
# scripts from disk (about 80 ms an open), and a schema does not change under a running process.
_checked: set[str] = set()


def open_storage(url: str, *, heartbeat_interval_s: int = HEARTBEAT_INTERVAL_S,
                 grace_period_s: int = GRACE_PERIOD_S) -> RDBStorage:
    """Optuna's RDB storage on ``url``, with heartbeats and retries of trials whose worker died.
    Creates Optuna's tables where they are missing (under the set-up lock); checks their schema
    version on the first open of ``url`` in the process (Optuna raises where it is not its own)."""
    sqlite = backend(url) == "sqlite"
    quiet_optuna()
    with setup_lock(url):
        storage = RDBStorage(url, engine_kwargs={"connect_args": sqlite_connect_args()} if sqlite else None,
                             skip_compatibility_check=url in _checked,
                             heartbeat_interval=heartbeat_interval_s, grace_period=grace_period_s,
                             heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY))
    _checked.add(url)
    if sqlite:
        make_sqlite_safe(storage.engine)
    return storage


def quiet_optuna() -> None:
    """Heartbeats outside Study.optimize are what gemmgen wants (its tuner asks and tells): Optuna's
    warnings that they are experimental, or meant for optimize, say nothing to a user."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def open_study(storage: RDBStorage, url: str, name: str, sampler, first: list[tuple[dict, dict]],
               space: dict[str, tuple]) -> tuple[optuna.Study, str | None]:
    """The study ``name`` (created if new, joined if not), with the trials ``first`` --
    (params, user_attrs) pairs, e.g. the family's named points -- enqueued once, however many
    tuners join at once; and None, or what was done with a study of another search space.

    ``space`` is the parameters and the values the tuner suggests. Optuna refuses a value list
    other than the one a study's trials were suggested with, so a study begun before its search
    space changed (a family given new values) cannot go on: its trials are kept as a study of
    their own, ``name@N`` (the first free N), and ``name`` begins again; the second result says so.
    The measurements stay in the results database, where the tuner finds them again."""
    with setup_lock(url):
        moved = _set_aside_if_space_changed(storage, name, space)
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize", sampler=sampler,
                                    load_if_exists=True)
        for params, attrs in first:
            study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=True)
    return study, moved


def space_changes(trials, space: dict[str, tuple]) -> dict[str, tuple[list, list]]:
    """The parameters whose values in ``space`` differ from those ``trials`` (a study's) were
    suggested with: parameter -> (the trials' values, the space's); empty where none does."""
    changed = {}
    for trial in trials:
        for param, dist in trial.distributions.items():
            if param in space and param not in changed and tuple(getattr(dist, "choices", ())) != tuple(space[param]):
                changed[param] = (list(dist.choices), list(space[param]))
    return changed


def _set_aside_if_space_changed(storage: RDBStorage, name: str, space: dict[str, tuple]) -> str | None:
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    changed = space_changes(storage.get_all_trials(study_id, deepcopy=False), space)
    if not changed:
        return None
    taken = set(optuna.get_all_study_names(storage))
    kept = next(f"{name}@{n}" for n in range(1, len(taken) + 2) if f"{name}@{n}" not in taken)
    optuna.copy_study(from_study_name=name, from_storage=storage, to_storage=storage, to_study_name=kept)
    optuna.delete_study(study_name=name, storage=storage)
    what = "; ".join(f"{p}: {old} -> {new}" for p, (old, new) in changed.items())
    return (f"study {name} was begun with another search space ({what}): its trials are kept as study {kept}, "
            f"and {name} begins again")


class Heartbeat:
    """Records the heartbeat of the trials this tuner holds (``hold`` / ``drop``) every interval
    of the storage's (open_storage's heartbeat_interval_s), in a thread of its own, so that no
    other tuner takes them for dead."""

    def __init__(self, storage: RDBStorage):
        self._storage, self._interval = storage, storage.get_heartbeat_interval()
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="gemmgen-heartbeat", daemon=True)
        self._thread.start()

    def hold(self, trial_id: int) -> None:
        with self._lock:
            self._held.add(trial_id)
        self._storage.record_heartbeat(trial_id)

    def drop(self, trial_id: int) -> None:
        with self._lock:
            self._held.discard(trial_id)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                held = list(self._held)
            for trial_id in held:
                try:
                    self._storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 (a finished trial, a lost connection: the next beat tries again)
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
