"""Database engines shared by the results database and the Optuna study storage: URLs, SQLite set
up for many processes on one host, and a lock for one-time set-up across processes.

SQLite: a file opened to record into is put in WAL mode (readers never wait for the writer; a
commit writes the log once, without a sync of the database file: a killed process loses nothing
committed), and every transaction begins with BEGIN IMMEDIATE, taking the write lock at its start.
Without that, two processes can both read a row and both update it (SQLite ignores SELECT ... FOR
UPDATE): the way two tuners popped the same Optuna trial. Lock waits last up to
SQLITE_LOCK_TIMEOUT_S. A file opened only to read (read_only_engine) is left in the journal mode
it has, and one in rollback-journal mode is opened read-only: it reads from read-only media (a WAL
file cannot: its readers write the -shm file beside it).

PostgreSQL and other servers keep their own concurrency; set-up (table creation, a study's first
trials) is serialized with an advisory lock, or on SQLite with a lock file beside the database.
"""

import fcntl
import os
import re
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError

SQLITE_LOCK_TIMEOUT_S = 60
_SETUP_LOCK_KEY = 0x67656D6D  # PostgreSQL advisory lock id of gemmgen's set-up ("gemm")


def hide_password(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def backend(url: str) -> str:
    """sqlite, postgresql, ... ("" for a URL that cannot be parsed)."""
    try:
        return make_url(url).get_backend_name()
    except (ArgumentError, ValueError):
        return ""


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite file URL; None for other databases, in-memory and URI-style names."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.query.get("uri"):
        return None
    if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
        return None
    return Path(parsed.database)


def sqlite_connect_args() -> dict:
    """connect_args for create_engine on SQLite: the lock timeout, and no transactions begun by
    the driver (make_sqlite_safe begins them)."""
    return {"timeout": SQLITE_LOCK_TIMEOUT_S, "isolation_level": None}


def _set_wal(cursor) -> None:
    """Puts the database file in WAL mode (it stays so). Switching needs the file to itself, and
    SQLite answers "database is locked" at once, without waiting out busy_timeout, while another
    process holds it (processes opening a fresh file together): so retry, for as long as the lock
    timeout allows, unless the file is in WAL mode already."""
    deadline = time.monotonic() + SQLITE_LOCK_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.25)


def make_sqlite_safe(engine: Engine) -> None:
    """WAL, foreign keys, and BEGIN IMMEDIATE for every transaction, on an engine made with
    sqlite_connect_args(); connections made before are dropped."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_LOCK_TIMEOUT_S * 1000}")
        if sqlite_file(str(engine.url)) is not None:
            _set_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


def read_only_engine(path: Path) -> Engine:
    """An engine that only reads the SQLite file ``path``, which it never creates or switches to
    another journal mode: its connections wait for a writer's lock as make_sqlite_safe's do and
    begin each transaction with a plain (deferred) BEGIN, which takes no write lock. A file in
    rollback-journal mode is opened with ``mode=ro``, so that it reads from read-only media; one
    in WAL mode with ``mode=rw``, as its readers write the -shm file anyway and the last one to
    close removes the -shm and -wal files (a read-only one would leave them)."""
    mode = "rw" if _in_wal_mode(path) else "ro"
    uri = "file:" + urllib.parse.quote(str(Path(path).absolute())) + f"?mode={mode}"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(uri, uri=True, timeout=SQLITE_LOCK_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)

    engine = create_engine(f"sqlite:///{path}", creator=connect)

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.exec_driver_sql("BEGIN")

    return engine


def _in_wal_mode(path: Path) -> bool:
    """Whether the SQLite file's header says WAL mode (file format write and read versions 2)."""
    try:
        with open(path, "rb") as f:
            f.seek(18)
            return f.read(2) == b"\x02\x02"
    except OSError:
        return False


def wal_note(path: Path) -> str:
    """Why read_only_engine's connections to ``path`` may have failed where it is in WAL mode (on
    read-only media, say): what to run once to convert it; "" for a file in another mode."""
    if not _in_wal_mode(path):
        return ""
    return (f"; it is in WAL mode, whose readers must write {path}-shm beside it: where it is writable, convert it "
            f"once with sqlite3 {path} 'PRAGMA journal_mode=DELETE'")


@contextmanager
def setup_lock(url: str) -> Iterator[None]:
    """Held by one process at a time per database, for one-time set-up (tables, a study's first
    trials): a lock file beside a SQLite file, an advisory lock on PostgreSQL; nothing elsewhere."""
    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock
        return
    if backend(url) == "postgresql":
        from sqlalchemy import create_engine

        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _SETUP_LOCK_KEY})
                try:
                    yield
                finally:
                    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _SETUP_LOCK_KEY})
        finally:
            engine.dispose()
        return
    yield
