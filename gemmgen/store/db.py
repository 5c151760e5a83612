"""The results database: devices, kernels, problems and one row per measurement.

Any SQLAlchemy URL works; the default is a SQLite file, ``results/gemmgen.db``. Only portable
column types are used (JSON for a kernel's parameters), so the same schema runs on SQLite and
PostgreSQL. Column names are lower case (``m``, ``bm``) so hand-written SQL needs no quoting on
PostgreSQL; the ORM attributes keep the usual capitals (``Problem.M``, ``Kernel.BM``).

``device()``, ``kernel()`` and ``problem()`` get or create a row and return its id. ``record()``
inserts one measurement and commits at once, so a crash or Ctrl-C loses nothing already recorded.
Worker processes may share one database: a get-or-create that loses a race re-reads the winner's
row, and SQLite connections wait up to 30 s for a lock.
"""

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from sqlalchemy import (JSON, DateTime, Double, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint, case, create_engine, false, func, inspect, select, text, update)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import gemmgen
from gemmgen.describe.names import variant_of
from gemmgen.describe.problem import FIELD, VARIANT_KEYS, Variant
from gemmgen.errors import GemmgenError
from gemmgen.store.engine import (hide_password, make_sqlite_safe, read_only_engine, setup_lock, sqlite_connect_args,
                                  sqlite_file, wal_note)

DEFAULT_URL = "sqlite:///results/gemmgen.db"
ENV_VAR = "GEMMGEN_DB"
STATUSES = ("ok", "wrong_result", "compile_error", "launch_error", "infeasible")
# The version of the tables below. 1: devices, kernels, problems, measurements (no version table);
# 2: + schema_version, + claims; 3: + kernels.trans, out, bias, act (the problem variant);
# 4: + kernels.batch (the variant's batch mode) and measurements.batch_count (the products one
# launch computed); 5: + kernels.scale (the variant's FP8 scaling). A database of a newer version
# is refused; an older one is migrated (_MIGRATIONS) when opened to record, and read as it is
# otherwise.
SCHEMA_VERSION = 5
# The first version whose kernels have the variant columns (those _variant_columns names).
VARIANT_COLUMNS_SINCE = 3
# The first version whose measurements say their batch count (and kernels their batch mode).
BATCH_COUNT_SINCE = 4
# The first version whose kernels say their scaling.
SCALE_SINCE = 5


class ResultsDBError(GemmgenError):
    """The results database cannot be opened or queried as asked (bad URL, driver, sort key, ...)."""


# ---- URL ----------------------------------------------------------------------------------------

def resolve_url(value: str | None) -> str:
    """The database URL: ``value`` (from --db), else $GEMMGEN_DB, else DEFAULT_URL.

    A value without ``://`` is a file path and becomes ``sqlite:///<path>`` (``~`` is expanded).
    Nothing is created: ResultsDB does that, where it is asked to.
    """
    url = value or os.environ.get(ENV_VAR) or DEFAULT_URL
    if "://" not in url:
        url = "sqlite:///" + os.path.expanduser(url)
    return url


def _make_sqlite_parent(url: str) -> None:
    path = sqlite_file(url)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ResultsDBError(f"cannot open results database {hide_password(url)}: cannot create folder "
                             f"{path.parent}: {err.strerror or err}") from err


def _one_line(text: str, secret: str | None) -> str:
    """``text`` on one line, with ``secret`` (a password) hidden where it stands as a word."""
    line = " ".join(str(text).split())
    return re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", "***", line) if secret else line


def _cause(err: BaseException) -> str:
    if isinstance(err, ImportError):
        return f"its Python driver is not installed ({err}); pip install the driver for this database"
    if isinstance(err, NoSuchModuleError):
        return f"unknown database type ({err}); use e.g. sqlite:///path/to/file.db or postgresql://..."
    if isinstance(err, DBAPIError) and err.orig is not None:
        return str(err.orig)
    return str(err).split("\n(Background on this error")[0]


# ---- schema -------------------------------------------------------------------------------------

class Base(DeclarativeBase):
    pass


class Device(Base):
    """One GPU as seen at measurement time; a new driver or clock makes a new row."""

    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("name", "arch", "sm_count", "clock_mhz", "memory_clock_mhz",
                                       "driver_version", "cuda_version", name="uq_devices_all"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    arch: Mapped[str] = mapped_column(String(32))  # e.g. sm_90
    sm_count: Mapped[int] = mapped_column(Integer)
    clock_mhz: Mapped[int] = mapped_column(Integer)
    memory_clock_mhz: Mapped[int] = mapped_column(Integer)
    driver_version: Mapped[str] = mapped_column(String(64))
    cuda_version: Mapped[str] = mapped_column(String(64))


class Kernel(Base):
    """One compiled kernel: canonical name, target and the hashes of what produced its source.

    ``trans``, ``out``, ``bias``, ``act``, ``batch`` and ``scale`` are the problem variant it
    computes (gemmgen.describe.problem.Variant), always the one its name says (``variant_of(name)``): columns
    so that SQL can select a variant without parsing names. They are deferred (not loaded with the
    row), so that a database of an older schema, read without migrating, can still be read.
    """

    __tablename__ = "kernels"
    __table_args__ = (UniqueConstraint("name", "arch", "source_hash", name="uq_kernels_name_arch_source"),
                      Index("ix_kernels_family_precision_arch", "family", "precision", "arch"))
    __mapper_args__ = {"eager_defaults": False}  # no RETURNING of the variant columns an older schema lacks

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))  # e.g. warp_128x128x8_w64x32_t8x8_b2_fp32, cublas_fp32
    family: Mapped[str] = mapped_column(String(64))  # e.g. warp, cublas
    precision: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict] = mapped_column(JSON)
    BM: Mapped[int | None] = mapped_column("bm", Integer, index=True)
    BN: Mapped[int | None] = mapped_column("bn", Integer, index=True)
    BK: Mapped[int | None] = mapped_column("bk", Integer, index=True)
    template_hash: Mapped[str] = mapped_column(String(128), default="")
    source_hash: Mapped[str] = mapped_column(String(128), default="")
    # the variant (gemmgen.describe.problem.Variant); server defaults: what rows of schema 2 computed
    trans: Mapped[str] = mapped_column(String(8), server_default=FIELD["trans"].default, deferred=True)
    out: Mapped[str] = mapped_column(String(8), server_default=FIELD["out"].default, deferred=True)
    bias: Mapped[str] = mapped_column(String(8), server_default=FIELD["bias"].default, deferred=True)
    act: Mapped[str] = mapped_column(String(8), server_default=FIELD["act"].default, deferred=True)
    # batch since schema 4, scale since schema 5 (_variant_columns)
    batch: Mapped[str] = mapped_column(String(8), server_default=FIELD["batch"].default, deferred=True)
    scale: Mapped[str] = mapped_column(String(8), server_default=FIELD["scale"].default, deferred=True)


class Problem(Base):
    """One GEMM: C = alpha * A @ B + beta * C with A of M x K, B of K x N."""

    __tablename__ = "problems"
    __table_args__ = (UniqueConstraint("m", "n", "k", "alpha", "beta", name="uq_problems_all"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    M: Mapped[int] = mapped_column("m", Integer)
    N: Mapped[int] = mapped_column("n", Integer)
    K: Mapped[int] = mapped_column("k", Integer)
    alpha: Mapped[float] = mapped_column(Double)
    beta: Mapped[float] = mapped_column(Double)


class Measurement(Base):
    """One attempt to run one kernel on one device for one problem, whatever its outcome."""

    __tablename__ = "measurements"
    __table_args__ = (
        Index("ix_measurements_lookup", "kernel_id", "device_id", "problem_id", "created_at"),  # find()
        Index("ix_measurements_problem_status_tflops", "problem_id", "status", "tflops"),  # best()
        Index("ix_measurements_status", "status"),
        Index("ix_measurements_tag", "tag"),
        Index("ix_measurements_device", "device_id"),
    )
    __mapper_args__ = {"eager_defaults": False}  # no RETURNING of batch_count, which an older schema lacks

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    status: Mapped[str] = mapped_column(String(32))  # one of STATUSES
    median_ms: Mapped[float | None] = mapped_column(Double)
    min_ms: Mapped[float | None] = mapped_column(Double)
    max_ms: Mapped[float | None] = mapped_column(Double)
    runs: Mapped[int | None] = mapped_column(Integer)
    tflops: Mapped[float | None] = mapped_column(Double)
    rel_error: Mapped[float | None] = mapped_column(Double)
    message: Mapped[str] = mapped_column(Text, default="")  # compiler / driver / verification message
    registers: Mapped[int | None] = mapped_column(Integer)
    smem_bytes: Mapped[int | None] = mapped_column(Integer)
    spill_bytes: Mapped[int | None] = mapped_column(Integer)
    gemmgen_version: Mapped[str] = mapped_column(String(32))
    tag: Mapped[str | None] = mapped_column(String(128))  # e.g. "bench" or a study name
    # the products of the strided batch one launch computed (1 for a kernel that is not batched, and
    # for every row from before schema 4); the time and TFLOP/s are of the whole launch. Deferred,
    # as the kernels' variant columns are, so that an older schema reads without it.
    batch_count: Mapped[int] = mapped_column(Integer, server_default="1", deferred=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 default=lambda: datetime.now(timezone.utc))


class SchemaVersion(Base):
    """The one row that says which version of these tables the database holds (SCHEMA_VERSION)."""

    __tablename__ = "schema_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class Claim(Base):
    """A tuner measuring a kernel build on a device for a problem: the first to insert the row
    measures, the others wait for its result while ``owner`` (its Optuna trial id) is running."""

    __tablename__ = "claims"
    __table_args__ = (UniqueConstraint("kernel_id", "device_id", "problem_id", name="uq_claims_all"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    owner: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 default=lambda: datetime.now(timezone.utc))


# ---- rows for printing --------------------------------------------------------------------------

@dataclass
class ResultRow:
    """One measurement, flattened with its kernel, device and problem; ``created_at`` is ISO 8601 UTC."""

    measurement_id: int
    kernel: str
    family: str
    precision: str
    trans: str  # the kernel's problem variant (gemmgen.describe.problem.Variant): layouts of A and B,
    out: str  # C's type,
    bias: str  # the bias vector it adds
    act: str  # its activation
    batch: str  # its batch mode ("none" or "strided")
    scale: str  # and its FP8 scaling ("none", "tensor" or "row")
    arch: str  # the kernel's target
    device: str
    M: int
    N: int
    K: int
    alpha: float
    beta: float
    status: str
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None
    runs: int | None  # timed runs behind the median
    tflops: float | None
    rel_error: float | None
    registers: int | None
    smem_bytes: int | None
    spill_bytes: int | None
    params: dict
    message: str
    tag: str | None
    created_at: str
    batch_count: int = 1  # products per launch (the strided batch's count; 1 where not batched)
    sm_count: int = 0  # the device's streaming multiprocessors
    # the kernel's source hash: which build was measured (cuBLAS: its library and version,
    # "cuBLAS <major>.<minor>.<patch>"; "" in rows recorded before 2026-12-07)
    build: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def variant(self) -> Variant:
        return Variant(**{key: getattr(self, key) for key in VARIANT_KEYS})


# Sort key -> column. Every ResultRow field but params and the variant's (filter by those).
_SORT_COLUMNS = {
    "measurement_id": Measurement.id, "kernel": Kernel.name, "family": Kernel.family,
    "precision": Kernel.precision, "arch": Kernel.arch, "device": Device.name,
    "M": Problem.M, "N": Problem.N, "K": Problem.K, "alpha": Problem.alpha, "beta": Problem.beta,
    "status": Measurement.status, "median_ms": Measurement.median_ms, "min_ms": Measurement.min_ms,
    "max_ms": Measurement.max_ms, "tflops": Measurement.tflops, "rel_error": Measurement.rel_error,
    "registers": Measurement.registers, "smem_bytes": Measurement.smem_bytes,
    "spill_bytes": Measurement.spill_bytes, "message": Measurement.message, "tag": Measurement.tag,
    "created_at": Measurement.created_at, "build": Kernel.source_hash,
}
SORT_KEYS = tuple(_SORT_COLUMNS)


def _iso_utc(value: datetime) -> str:
    if value.tzinfo is None:  # SQLite keeps no offset; stored values are UTC
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat()


# The first version with a kernel column of each variant key (VARIANT_COLUMNS_SINCE for one not here).
_VARIANT_COLUMN_SINCE = {"batch": BATCH_COUNT_SINCE, "scale": SCALE_SINCE}


def _variant_columns(version: int) -> tuple[str, ...]:
    """The variant keys a database of schema ``version`` holds as kernel columns, in VARIANT_KEYS' order."""
    return tuple(key for key in VARIANT_KEYS if version >= _VARIANT_COLUMN_SINCE.get(key, VARIANT_COLUMNS_SINCE))


# The columns a ResultRow is made of, selected as columns (not as ORM objects: reading the shipped
# file's 26K rows that way took 4 s); the variant's and batch_count follow where the schema has them.
_ROW_COLUMNS = (Measurement.id, Kernel.name, Kernel.family, Kernel.precision, Kernel.arch, Kernel.params,
                Device.name, Device.sm_count, Problem.M, Problem.N, Problem.K, Problem.alpha, Problem.beta,
                Measurement.status, Measurement.median_ms, Measurement.min_ms, Measurement.max_ms,
                Measurement.runs, Measurement.tflops, Measurement.rel_error, Measurement.registers,
                Measurement.smem_bytes, Measurement.spill_bytes, Measurement.message, Measurement.tag,
                Measurement.created_at, Kernel.source_hash)


def _row(version: int, values) -> ResultRow:
    """A ResultRow from one row of _ROW_COLUMNS followed by the kernel's variant columns that a
    database of schema ``version`` has (_variant_columns), then the measurement's batch_count where
    it has one. A key without a column is read from the name, which is what the columns always hold."""
    (mid, name, family, precision, arch, params, device, sm_count, M, N, K, alpha, beta, status, median_ms,
     min_ms, max_ms, runs, tflops, rel_error, registers, smem_bytes, spill_bytes, message, tag,
     created_at, source_hash, *extra) = values
    columns = _variant_columns(version)
    variant = dict(zip(columns, extra))
    if len(columns) < len(VARIANT_KEYS):
        named = variant_of(name)
        variant = {key: getattr(named, key) for key in VARIANT_KEYS} | variant
    batch_count = extra[len(columns)] if len(extra) > len(columns) else 1
    return ResultRow(
        measurement_id=mid, kernel=name, family=family, precision=precision, **variant, arch=arch,
        batch_count=int(batch_count if batch_count is not None else 1),
        device=device, sm_count=sm_count, M=M, N=N, K=K, alpha=alpha, beta=beta, status=status,
        median_ms=median_ms, min_ms=min_ms, max_ms=max_ms, runs=runs, tflops=tflops, rel_error=rel_error,
        registers=registers, smem_bytes=smem_bytes, spill_bytes=spill_bytes,
        params=dict(params or {}), message=message or "", tag=tag, created_at=_iso_utc(created_at),
        build=source_hash or "")


def _opt(kind, value):
    return None if value is None else kind(value)


def _plain(value):
    """A JSON-safe scalar: numpy numbers become Python numbers."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


# ---- the database -------------------------------------------------------------------------------

class ResultsDB:
    """A connection to a results database. With ``create`` (to record), a SQLite file, its folder
    and the missing tables are created; without (to read), nothing is: a SQLite file that does
    not exist, or a database without gemmgen's tables, is an error, and a SQLite file is opened
    read-only (dbengine.read_only_engine: it reads from read-only media, and stays in the journal
    mode it has).

    Raises ResultsDBError (one line: the URL with its password hidden, and the cause) when the
    URL is malformed, its driver is not installed, the database cannot be reached, or (without
    ``create``) holds no results.
    """

    def __init__(self, url: str, *, create: bool = True):
        self.url = url
        shown = hide_password(url)
        try:
            secret = make_url(url).password
        except (ArgumentError, ValueError):
            secret = None
        if create:
            _make_sqlite_parent(url)
        elif (path := sqlite_file(url)) is not None and not path.is_file():
            raise ResultsDBError(f"no results database at {path}: nothing has been measured there (gemmgen bench "
                                 "and gemmgen tune write one); give another with --db or $GEMMGEN_DB")
        read_only = None if create else sqlite_file(url)  # a SQLite file only read: opened read-only
        engine = None
        try:
            sqlite = make_url(url).get_backend_name() == "sqlite"
            if read_only is not None:
                engine = read_only_engine(read_only)
            else:
                engine = create_engine(url, connect_args=sqlite_connect_args() if sqlite else {})
                if sqlite:
                    make_sqlite_safe(engine)
            with engine.connect() as connection:  # fails fast, and alone, where the server cannot be reached
                missing = [t for t in Base.metadata.tables if not engine.dialect.has_table(connection, t)]
            if create:
                with setup_lock(url):
                    version = _upgrade(engine)
            else:
                version = _read_version(engine, missing)
        except (SQLAlchemyError, ImportError, ValueError) as err:
            if engine is not None:
                engine.dispose()
            note = wal_note(read_only) if read_only is not None else ""
            raise ResultsDBError(f"cannot open results database {shown}: "
                                 f"{_one_line(_cause(err), secret)}{note}") from err
        if version > SCHEMA_VERSION:
            engine.dispose()
            raise ResultsDBError(f"results database {shown} has schema version {version}; this gemmgen "
                                 f"({gemmgen.__version__}) reads versions up to {SCHEMA_VERSION}: upgrade gemmgen")
        core = [t for t in missing if t not in ("schema_version", "claims")]
        if core and not create:
            engine.dispose()
            raise ResultsDBError(f"{shown} is not a gemmgen results database (it has no table {', '.join(core)})")
        self._engine: Engine = engine
        # the schema read: SCHEMA_VERSION once migrated; an older one where opened to read only
        self.version = SCHEMA_VERSION if create else version

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> "ResultsDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- get or create ---------------------------------------------------------------------------

    def _get_or_create(self, model, key: dict, extra: dict | None = None) -> int:
        query = select(model.id).filter_by(**key)
        with Session(self._engine, expire_on_commit=False) as session:
            found = session.scalar(query)
            if found is not None:
                return found
            row = model(**key, **(extra or {}))
            session.add(row)
            try:
                session.commit()
                return row.id
            except IntegrityError:  # another process inserted it first
                session.rollback()
                found = session.scalar(query)
                if found is None:
                    raise
                return found

    def device(self, *, name: str, arch: str, sm_count: int, clock_mhz: int, memory_clock_mhz: int,
               driver_version: str, cuda_version: str) -> int:
        """Id of the device row with exactly these values (created if new)."""
        return self._get_or_create(Device, dict(
            name=str(name), arch=str(arch), sm_count=int(sm_count), clock_mhz=int(clock_mhz),
            memory_clock_mhz=int(memory_clock_mhz), driver_version=str(driver_version),
            cuda_version=str(cuda_version)))

    def kernel(self, *, name: str, family: str, precision: str, arch: str, params: dict,
               template_hash: str = "", source_hash: str = "", variant: Variant | None = None) -> int:
        """Id of the kernel (name, arch, source_hash), created if new.

        On creation BM, BN and BK are copied from ``params`` where present, and the variant
        columns (trans, out, bias, act, batch, scale) are what the name says
        (gemmgen.describe.names.variant_of: a canonical name's or cuBLAS's ``cublas_<precision><suffix>``);
        ``variant``, where given, must be that one (ValueError otherwise: the name is the key, and
        must say what the kernel computes). An existing row is returned as it is (its family,
        precision and params are not compared or updated).
        """
        named = variant_of(str(name))
        if variant is not None and variant != named:
            raise ValueError(f"kernel {name!r} is named for the variant {named.text!r}, not {variant.text!r}: "
                             "a name carries its variant's suffix (gemmgen.describe.problem.Variant.suffix)")
        params = {str(k): _plain(v) for k, v in (params or {}).items()}
        tiles = {key: int(params[key]) if isinstance(params.get(key), int) else None
                 for key in ("BM", "BN", "BK")}
        return self._get_or_create(
            Kernel, dict(name=str(name), arch=str(arch), source_hash=str(source_hash or "")),
            dict(family=str(family), precision=str(precision), params=params,
                 template_hash=str(template_hash or ""), **tiles,
                 # an older schema opened to read has no such columns: its migration fills them in
                 **{key: getattr(named, key) for key in _variant_columns(self.version)}))

    def problem(self, M: int, N: int, K: int, alpha: float, beta: float) -> int:
        """Id of the problem (M, N, K, alpha, beta), created if new."""
        return self._get_or_create(Problem, dict(M=int(M), N=int(N), K=int(K),
                                                 alpha=float(alpha), beta=float(beta)))

    # -- measurements ----------------------------------------------------------------------------

    def record(self, *, kernel_id: int, device_id: int, problem_id: int, status: str,
               median_ms: float | None = None, min_ms: float | None = None, max_ms: float | None = None,
               runs: int | None = None, tflops: float | None = None, rel_error: float | None = None,
               message: str = "", registers: int | None = None, smem_bytes: int | None = None,
               spill_bytes: int | None = None, tag: str | None = None, batch_count: int = 1) -> int:
        """Insert one measurement, commit it, and return its id. ``batch_count``: the products of
        the strided batch the launch computed (1 unless the kernel is batched).

        Raises ValueError for a status not in STATUSES, or ids that name no kernel, device or
        problem (SQLite enforces the foreign keys here too).
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {status!r}")
        if int(batch_count) < 1:
            raise ValueError(f"batch_count must be at least 1; got {batch_count}")
        row = Measurement(
            kernel_id=int(kernel_id), device_id=int(device_id), problem_id=int(problem_id), status=status,
            median_ms=_opt(float, median_ms), min_ms=_opt(float, min_ms), max_ms=_opt(float, max_ms),
            runs=_opt(int, runs), tflops=_opt(float, tflops), rel_error=_opt(float, rel_error),
            message=message or "", registers=_opt(int, registers), smem_bytes=_opt(int, smem_bytes),
            spill_bytes=_opt(int, spill_bytes), gemmgen_version=gemmgen.__version__,
            tag=_opt(str, tag), created_at=datetime.now(timezone.utc),
            **({"batch_count": int(batch_count)} if self.version >= BATCH_COUNT_SINCE else {}))
        with Session(self._engine, expire_on_commit=False) as session:
            session.add(row)
            try:
                session.commit()
            except IntegrityError as err:
                raise ValueError(f"cannot record measurement: kernel_id={kernel_id}, device_id={device_id} "
                                 f"and problem_id={problem_id} must name existing rows "
                                 f"({_one_line(_cause(err), None)})") from err
            return row.id

    def claim(self, *, kernel_id: int, device_id: int, problem_id: int, owner: int) -> int:
        """Claims measuring (kernel, device, problem) for ``owner``: returns ``owner`` where this
        call made the claim, else the owner of the claim that stands."""
        key = dict(kernel_id=int(kernel_id), device_id=int(device_id), problem_id=int(problem_id))
        query = select(Claim.owner).filter_by(**key)
        with Session(self._engine) as session:
            found = session.scalar(query)
            if found is not None:
                return found
            session.add(Claim(**key, owner=int(owner), created_at=datetime.now(timezone.utc)))
            try:
                session.commit()
                return int(owner)
            except IntegrityError:  # another process claimed it first
                session.rollback()
                return session.scalar(query)

    def take_over(self, *, kernel_id: int, device_id: int, problem_id: int, old_owner: int, new_owner: int) -> bool:
        """Moves the claim from ``old_owner`` (no longer measuring it) to ``new_owner``; False where
        another process took it first."""
        statement = (update(Claim)
                     .where(Claim.kernel_id == int(kernel_id), Claim.device_id == int(device_id),
                            Claim.problem_id == int(problem_id), Claim.owner == int(old_owner))
                     .values(owner=int(new_owner), created_at=datetime.now(timezone.utc)))
        with Session(self._engine) as session:
            taken = session.execute(statement).rowcount == 1
            session.commit()
            return taken

    def find(self, *, kernel_name: str, arch: str, source_hash: str, device_id: int, problem_id: int,
             statuses: Iterable[str] = ("ok",), batch_count: int = 1) -> ResultRow | None:
        """The latest measurement of this kernel build on this device and problem (and batch
        count) whose status is one of ``statuses``; None if there is none."""
        query = (self._joined()
                 .where(Kernel.name == kernel_name, Kernel.arch == arch,
                        Kernel.source_hash == (source_hash or ""),
                        Measurement.device_id == device_id, Measurement.problem_id == problem_id,
                        Measurement.status.in_(list(statuses)),
                        *_batch_count_filter(self.version, batch_count))
                 .order_by(Measurement.created_at.desc(), Measurement.id.desc())
                 .limit(1))
        rows = self._fetch(query)
        return rows[0] if rows else None

    # -- queries ---------------------------------------------------------------------------------

    def _joined(self):
        extra = [getattr(Kernel, key) for key in _variant_columns(self.version)]
        if self.version >= BATCH_COUNT_SINCE:
            extra.append(Measurement.batch_count)
        return (select(*_ROW_COLUMNS, *extra)
                .join(Kernel, Measurement.kernel_id == Kernel.id)
                .join(Device, Measurement.device_id == Device.id)
                .join(Problem, Measurement.problem_id == Problem.id))

    def _fetch(self, query) -> list[ResultRow]:
        with self._engine.connect() as connection:
            return [_row(self.version, r) for r in connection.execute(query).all()]

    def archs(self, status: str = "ok") -> list[str]:
        """The architectures (sm_90, ...) of the kernels with a measurement of ``status``, sorted:
        one query, where results() would read every row."""
        if status not in STATUSES:
            raise ResultsDBError(f"unknown status {status!r}; statuses: {', '.join(STATUSES)}")
        query = (select(Kernel.arch).distinct().join(Measurement, Measurement.kernel_id == Kernel.id)
                 .where(Measurement.status == status).order_by(Kernel.arch))
        with Session(self._engine) as session:
            return list(session.scalars(query))

    def results(self, *, family: str | None = None, precision: str | None = None, arch: str | None = None,
                device: str | None = None, shape: tuple[int, int, int] | None = None,
                status: str | Iterable[str] | None = None, tag: str | None = None,
                variant: Variant | Mapping[str, str | None] | None = None, batch_count: int | None = None,
                sort: str = "tflops", descending: bool = True, limit: int | None = None) -> list[ResultRow]:
        """Measurements matching every filter given, sorted by ``sort`` with NULLs last.

        family, precision, arch (the kernel's) and tag match exactly; ``device`` is a
        case-insensitive substring of the device name; ``shape`` is (M, N, K); ``status`` is one
        status or several. ``variant``: a gemmgen.describe.problem.Variant (kernels computing exactly it),
        or a mapping of some of its keys (``{"trans": "nt"}``: any C type, bias and activation);
        where a database of an older schema, read without migrating, has no column of a key,
        the kernels' names are read instead. ``batch_count``: measurements of that many products
        per launch only (every row before schema 4 is of 1). Ties are broken by the newest
        measurement first. Raises ResultsDBError for an unknown sort key, status or variant key or
        value, a malformed shape or a negative limit.
        """
        if sort not in _SORT_COLUMNS:
            raise ResultsDBError(f"cannot sort by {sort!r}; sort keys: {', '.join(SORT_KEYS)}")
        wanted_variant = _variant_filter(variant)
        query = self._joined()
        by_column = {k: v for k, v in wanted_variant.items() if k in _variant_columns(self.version)}
        by_name = {k: v for k, v in wanted_variant.items() if k not in by_column}
        if by_column:
            query = query.where(*(getattr(Kernel, key) == value for key, value in by_column.items()))
        if family is not None:
            query = query.where(Kernel.family == family)
        if precision is not None:
            query = query.where(Kernel.precision == precision)
        if arch is not None:
            query = query.where(Kernel.arch == arch)
        if device is not None:
            query = query.where(func.lower(Device.name).contains(device.lower(), autoescape=True))
        if shape is not None:
            M, N, K = _shape(shape)
            query = query.where(Problem.M == M, Problem.N == N, Problem.K == K)
        if status is not None:
            wanted = [status] if isinstance(status, str) else list(status)
            unknown = [s for s in wanted if s not in STATUSES]
            if unknown:
                raise ResultsDBError(f"unknown status {unknown[0]!r}; statuses: {', '.join(STATUSES)}")
            query = query.where(Measurement.status.in_(wanted))
        if tag is not None:
            query = query.where(Measurement.tag == tag)
        if batch_count is not None:
            query = query.where(*_batch_count_filter(self.version, batch_count))
        column = _SORT_COLUMNS[sort]
        query = query.order_by(case((column.is_(None), 1), else_=0),  # NULLs last, both directions
                               column.desc() if descending else column.asc(),
                               Measurement.id.desc())
        if limit is not None and int(limit) < 0:
            raise ResultsDBError(f"limit must be 0 or more; got {limit}")
        if by_name:  # an older schema, without some of the columns: by the names
            rows = [r for r in self._fetch(query)
                    if all(getattr(r, key) == value for key, value in by_name.items())]
            return rows if limit is None else rows[:int(limit)]
        if limit is not None:
            query = query.limit(int(limit))
        return self._fetch(query)


def _batch_count_filter(version: int, batch_count: int) -> tuple:
    """The conditions of measurements of ``batch_count`` products per launch, on a schema of
    ``version`` (before BATCH_COUNT_SINCE every measurement is of one)."""
    if version >= BATCH_COUNT_SINCE:
        return (Measurement.batch_count == int(batch_count),)
    return () if int(batch_count) == 1 else (false(),)


def _variant_filter(variant) -> dict[str, str]:
    """{column: value} of results()'s ``variant`` filter: every key for a Variant, the keys
    given (not None) for a mapping. Raises ResultsDBError for an unknown key or value."""
    if variant is None:
        return {}
    if isinstance(variant, Variant):
        return {key: getattr(variant, key) for key in VARIANT_KEYS}
    try:
        given = {str(key): str(value).strip().lower() for key, value in dict(variant).items() if value is not None}
    except (TypeError, ValueError) as err:
        raise ResultsDBError(f"variant must be a gemmgen.describe.problem.Variant or a mapping of {', '.join(VARIANT_KEYS)}; "
                             f"got {variant!r}") from err
    unknown = [key for key in given if key not in VARIANT_KEYS]
    if unknown:
        raise ResultsDBError(f"unknown variant key {unknown[0]!r}; keys: {', '.join(VARIANT_KEYS)}")
    try:
        Variant(**given)  # each value checked, with problem.py's message
    except GemmgenError as err:
        raise ResultsDBError(str(err)) from None
    return given


def _shape(shape) -> tuple[int, int, int]:
    try:
        M, N, K = (int(x) for x in shape)
    except (TypeError, ValueError) as err:
        raise ResultsDBError(f"shape must be three integers (M, N, K); got {shape!r}") from err
    return M, N, K


def _read_version(engine: Engine, missing: list[str]) -> int:
    """The schema version a database holds: its schema_version row, or 1 for the tables of
    gemmgen before there was one (and for an empty database)."""
    if "schema_version" in missing:
        return 1
    with Session(engine) as session:
        return session.scalar(select(SchemaVersion.version)) or 1


def _upgrade(engine: Engine) -> int:
    """Creates the missing tables, migrates an older schema and records SCHEMA_VERSION; returns
    the version the database held (call under setup_lock). A newer one is left as it is."""
    with engine.connect() as connection:
        has_version = engine.dialect.has_table(connection, "schema_version")
    version = _read_version(engine, [] if has_version else ["schema_version"])
    if version > SCHEMA_VERSION:
        return version
    Base.metadata.create_all(engine)  # new tables; migrations below change existing ones
    for target in range(version + 1, SCHEMA_VERSION + 1):
        if target in _MIGRATIONS:
            _MIGRATIONS[target](engine)
    with Session(engine) as session:
        row = session.scalar(select(SchemaVersion))
        if row is None:
            session.add(SchemaVersion(id=1, version=SCHEMA_VERSION))
        else:
            row.version = SCHEMA_VERSION
        session.commit()
    return version


def _add_variant_columns(engine: Engine) -> None:
    """Schema 3 (and 4 for batch, 5 for scale): kernels gain trans, out, bias and act (and batch,
    scale), each row's filled from its name (rows of schema 2 are named as before variants existed,
    those of 3 before batches, of 4 before scaling: most read the default). Adds only the columns
    missing (a fresh database has them from create_all; a migration stopped midway left some), all
    in one transaction."""
    have = {column["name"] for column in inspect(engine).get_columns("kernels")}
    quote = engine.dialect.identifier_preparer.quote
    with engine.begin() as connection:
        for key in VARIANT_KEYS:
            if key not in have:
                connection.execute(text(f"ALTER TABLE kernels ADD COLUMN {quote(key)} VARCHAR(8) NOT NULL "
                                        f"DEFAULT '{FIELD[key].default}'"))
        named = []
        for kernel_id, name in connection.execute(text("SELECT id, name FROM kernels")).all():
            variant = variant_of(name)
            if variant != Variant():
                named.append({"id": kernel_id, **{key: getattr(variant, key) for key in VARIANT_KEYS}})
        if named:
            columns = ", ".join(f"{quote(key)} = :{key}" for key in VARIANT_KEYS)
            connection.execute(text(f"UPDATE kernels SET {columns} WHERE id = :id"), named)


def _add_batch_columns(engine: Engine) -> None:
    """Schema 4: kernels gain batch (from each row's name: ``none`` for every kernel before
    batches) and measurements gain batch_count (1: every earlier measurement is of one product
    per launch). Adds only the columns missing, in one transaction."""
    _add_variant_columns(engine)
    have = {column["name"] for column in inspect(engine).get_columns("measurements")}
    if "batch_count" not in have:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE measurements ADD COLUMN batch_count INTEGER NOT NULL DEFAULT 1"))


# version -> what turns the version before it into it, beyond creating new tables (done first).
# 2 adds the tables schema_version and claims: nothing more to do.
_MIGRATIONS: dict[int, Callable[[Engine], None]] = {3: _add_variant_columns, 4: _add_batch_columns,
                                                    5: _add_variant_columns}
