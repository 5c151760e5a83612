"""Results database on a temporary SQLite file: get-or-create, record, find, results, best, URLs.

Expected rows are worked out from the measurements each test records, not read back from
gemmgen's own output. Set GEMMGEN_TEST_DB_URL (e.g. postgresql://user@127.0.0.1/scratch) to run
the database tests against that server too; its gemmgen tables are dropped after each test.
"""

import os
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest

import gemmgen
from gemmgen.errors import GemmgenError
from gemmgen.store.db import DEFAULT_URL, SORT_KEYS, STATUSES, ResultRow, ResultsDB, resolve_url

H100 = dict(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132, clock_mhz=1980,
            memory_clock_mhz=2619, driver_version="580.159.04", cuda_version="13.0")
RTX = dict(name="NVIDIA GeForce RTX 4090", arch="sm_89", sm_count=128, clock_mhz=2520,
           memory_clock_mhz=10501, driver_version="580.159.04", cuda_version="13.0")
V4 = dict(name="warp_128x128x8_w64x32_t8x8_b2_fp32", family="warp", precision="fp32", arch="sm_90",
          params={"BM": 128, "BN": 128, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "buffers": 2},
          template_hash="t1", source_hash="s1")


SERVER_URL = os.environ.get("GEMMGEN_TEST_DB_URL")


@pytest.fixture(params=["sqlite"] + (["server"] if SERVER_URL else []))
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.db'}"
        return
    server = SERVER_URL
    from sqlalchemy import create_engine

    from gemmgen.store.db import Base

    engine = create_engine(server)
    Base.metadata.drop_all(engine)
    yield server
    Base.metadata.drop_all(engine)
    engine.dispose()


@pytest.fixture
def db(url):
    database = ResultsDB(url)
    yield database
    database.close()


# ---- get or create ------------------------------------------------------------------------------

def test_get_or_create_returns_stable_ids(db, url):
    h100, rtx = db.device(**H100), db.device(**RTX)
    assert h100 != rtx
    assert db.device(**H100) == h100
    assert db.device(**{**H100, "driver_version": "590.10"}) not in (h100, rtx)  # new driver, new row

    v4 = db.kernel(**V4)
    assert db.kernel(**V4) == v4
    assert db.kernel(**{**V4, "source_hash": "s2"}) != v4  # template changed: another build
    assert db.kernel(**{**V4, "arch": "sm_89"}) != v4
    cublas = db.kernel(name="cublas_fp32", family="cublas", precision="fp32", arch="sm_90", params={})
    assert cublas not in (v4,) and db.kernel(name="cublas_fp32", family="cublas", precision="fp32",
                                             arch="sm_90", params={}) == cublas

    p = db.problem(4096, 4096, 4096, 1.0, 0.0)
    assert db.problem(4096, 4096, 4096, 1, 0) == p
    assert db.problem(4096, 4096, 4096, 1.25, -0.75) != p
    assert db.problem(4096, 4096, 4095, 1.0, 0.0) != p

    with ResultsDB(url) as again:  # ids are keys in the file, not in this process
        assert again.device(**H100) == h100
        assert again.kernel(**V4) == v4
        assert again.problem(4096, 4096, 4096, 1.0, 0.0) == p


def test_kernel_copies_tiles_and_keeps_params(db):
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from gemmgen.store.db import Kernel

    v4 = db.kernel(**V4)
    naive = db.kernel(name="naive_b16x16_fp32", family="naive", precision="fp32", arch="sm_90",
                      params={"BX": 16, "BY": 16})
    with Session(db._engine) as session:
        rows = {k.id: k for k in session.scalars(select(Kernel))}
    assert (rows[v4].BM, rows[v4].BN, rows[v4].BK) == (128, 128, 8)
    assert rows[v4].params == V4["params"]
    assert (rows[v4].template_hash, rows[v4].source_hash) == ("t1", "s1")
    assert (rows[naive].BM, rows[naive].BN, rows[naive].BK) == (None, None, None)
    assert rows[naive].source_hash == ""


def _open_and_fill(url: str) -> list[int]:
    with ResultsDB(url) as db:
        ids = [db.problem(n, n, n, 1.0, 0.0) for n in range(1, 40)]
        d = db.device(**H100)
        db.record(kernel_id=db.kernel(**V4), device_id=d, problem_id=ids[0], status="ok")
        return ids + [d]


def test_processes_sharing_a_new_database_agree_on_ids(url):
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    with multiprocessing.get_context("fork").Pool(8) as pool:  # all create the tables and rows at once
        results = pool.map(_open_and_fill, [url] * 16)
    assert all(r == results[0] for r in results)
    with ResultsDB(url) as db:
        assert len(db.results()) == 16
        assert db.problem(39, 39, 39, 1.0, 0.0) == results[0][38]


# ---- record -------------------------------------------------------------------------------------

def test_record_commits_at_once(db, url):
    k, d, p = db.kernel(**V4), db.device(**H100), db.problem(4096, 4096, 4096, 1.0, 0.0)
    before = datetime.now(timezone.utc)
    mid = db.record(kernel_id=k, device_id=d, problem_id=p, status="ok", median_ms=3.35, min_ms=3.3,
                    max_ms=3.5, runs=300, tflops=41.02, rel_error=8.5e-8, registers=128,
                    smem_bytes=16384, spill_bytes=0, tag="bench")
    other = ResultsDB(url)  # the first is still open
    try:
        rows = other.results()
    finally:
        other.close()
    assert len(rows) == 1
    row = rows[0]
    assert row.measurement_id == mid
    assert (row.kernel, row.family, row.precision, row.arch, row.device) == (
        V4["name"], "warp", "fp32", "sm_90", "NVIDIA H100 80GB HBM3")
    assert (row.M, row.N, row.K, row.alpha, row.beta) == (4096, 4096, 4096, 1.0, 0.0)
    assert (row.status, row.median_ms, row.min_ms, row.max_ms, row.tflops, row.rel_error) == (
        "ok", 3.35, 3.3, 3.5, 41.02, 8.5e-8)
    assert (row.registers, row.smem_bytes, row.spill_bytes, row.tag, row.message) == (128, 16384, 0, "bench", "")
    assert row.params == V4["params"]
    created = datetime.fromisoformat(row.created_at)
    assert created.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= created <= datetime.now(timezone.utc) + timedelta(seconds=1)


def test_numpy_parameters_are_stored_as_plain_numbers(db):
    np = pytest.importorskip("numpy")
    from sqlalchemy.orm import Session

    from gemmgen.store.db import Kernel

    kid = db.kernel(name="warp_np", family="warp", precision="fp32", arch="sm_90",
                    params={"BM": np.int64(64), "BN": np.int32(32), "BK": np.int64(16), "layout": "contig"})
    with Session(db._engine) as session:
        k = session.get(Kernel, kid)
        assert k.params == {"BM": 64, "BN": 32, "BK": 16, "layout": "contig"}
        assert type(k.params["BM"]) is int
        assert (k.BM, k.BN, k.BK) == (64, 32, 16)


def test_record_stores_the_gemmgen_version_and_numpy_like_numbers(db):
    from sqlalchemy.orm import Session

    from gemmgen.store.db import Measurement

    class Scalar:  # stands in for numpy.float32, which is not a float
        def __init__(self, v):
            self.v = v

        def __float__(self):
            return float(self.v)

    k, d, p = db.kernel(**V4), db.device(**H100), db.problem(1000, 1000, 1000, 1.0, 0.0)
    mid = db.record(kernel_id=k, device_id=d, problem_id=p, status="ok", tflops=Scalar(17.25))
    with Session(db._engine) as session:
        m = session.get(Measurement, mid)
        assert m.gemmgen_version == gemmgen.__version__
        assert m.tflops == 17.25 and isinstance(m.tflops, float)


@pytest.mark.parametrize("status", ["OK", "passed", "", "wrong-result"])
def test_record_rejects_an_unknown_status(db, status):
    k, d, p = db.kernel(**V4), db.device(**H100), db.problem(8, 8, 8, 1.0, 0.0)
    with pytest.raises(ValueError, match="status must be one of ok, wrong_result, compile_error"):
        db.record(kernel_id=k, device_id=d, problem_id=p, status=status)
    assert db.results() == []


def test_every_status_is_accepted(db):
    k, d, p = db.kernel(**V4), db.device(**H100), db.problem(8, 8, 8, 1.0, 0.0)
    for status in STATUSES:
        db.record(kernel_id=k, device_id=d, problem_id=p, status=status)
    assert sorted(r.status for r in db.results()) == sorted(STATUSES)


def test_record_rejects_ids_that_name_nothing(db):
    k, d, p = db.kernel(**V4), db.device(**H100), db.problem(8, 8, 8, 1.0, 0.0)
    with pytest.raises(ValueError, match="must name existing rows"):
        db.record(kernel_id=k + 100, device_id=d, problem_id=p, status="ok")
    assert db.results() == []


# ---- a small study ------------------------------------------------------------------------------

@pytest.fixture
def study(db):
    """Eight measurements; returns (db, {label: measurement id}, ids of the rows)."""
    h100, rtx = db.device(**H100), db.device(**RTX)
    v4 = db.kernel(**V4)
    v4_89 = db.kernel(**{**V4, "arch": "sm_89"})
    v3 = db.kernel(name="register_64x64x16_t4x4_contig_v4_p0_fp32", family="register", precision="fp32",
                   arch="sm_90", params={"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4})
    v6 = db.kernel(name="wmma_64x64x16_w2x2_p8_fp16", family="wmma", precision="fp16", arch="sm_90",
                   params={"BM": 64, "BN": 64, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "PAD": 8})
    cublas = db.kernel(name="cublas_fp32", family="cublas", precision="fp32", arch="sm_90", params={})
    big, small = db.problem(4096, 4096, 4096, 1.0, 0.0), db.problem(1000, 1000, 1000, 1.0, 0.0)

    def rec(kernel, device, problem, status, tflops, tag="bench", **kw):
        return db.record(kernel_id=kernel, device_id=device, problem_id=problem, status=status,
                         tflops=tflops, median_ms=None if tflops is None else 137.4 / tflops, tag=tag, **kw)

    m = {
        "v4_big": rec(v4, h100, big, "ok", 41.02, registers=128),
        "v3_big": rec(v3, h100, big, "ok", 29.07, registers=96),
        "v3_bad": rec(v3, h100, big, "wrong_result", 60.0, rel_error=0.25, message="max error 0.25 at (7, 3)"),
        "v6_big": rec(v6, h100, big, "ok", 112.21, tag="tune-fp16"),
        "cublas_big": rec(cublas, h100, big, "ok", 51.5),
        "v4_small": rec(v4, h100, small, "ok", 17.27),
        "v4_rtx": rec(v4_89, rtx, big, "ok", 45.0),
        "v3_broken": rec(v3, h100, small, "compile_error", None, message="ptxas error", tag=None),
    }
    return db, m


def ids(rows: list[ResultRow]) -> list[int]:
    return [r.measurement_id for r in rows]


def test_results_sorts_by_tflops_descending_with_nulls_last(study):
    db, m = study
    expected = ["v6_big", "v3_bad", "cublas_big", "v4_rtx", "v4_big", "v3_big", "v4_small", "v3_broken"]
    assert ids(db.results()) == [m[k] for k in expected]


def test_results_ascending_still_puts_nulls_last(study):
    db, m = study
    expected = ["v4_small", "v3_big", "v4_big", "v4_rtx", "cublas_big", "v3_bad", "v6_big", "v3_broken"]
    assert ids(db.results(descending=False)) == [m[k] for k in expected]
    # rel_error is NULL everywhere but v3_bad
    assert ids(db.results(sort="rel_error", descending=False))[0] == m["v3_bad"]
    assert ids(db.results(sort="rel_error"))[0] == m["v3_bad"]


def test_results_sort_by_other_columns_and_limit(study):
    db, m = study
    assert ids(db.results(sort="median_ms", descending=False, limit=2)) == [m["v6_big"], m["v3_bad"]]
    assert [r.kernel for r in db.results(sort="kernel", descending=False, limit=1)] == ["cublas_fp32"]
    assert [r.M for r in db.results(sort="M", descending=False, limit=3)] == [1000, 1000, 4096]
    assert ids(db.results(sort="created_at", limit=1)) == [m["v3_broken"]]
    assert ids(db.results(sort="registers", limit=2)) == [m["v4_big"], m["v3_big"]]
    assert db.results(limit=0) == []
    assert len(db.results(limit=100)) == 8


def test_results_rejects_an_unknown_sort_key(study):
    db, _ = study
    with pytest.raises(GemmgenError) as err:
        db.results(sort="speed")
    assert "'speed'" in str(err.value)
    assert "tflops" in str(err.value) and "median_ms" in str(err.value)
    assert "params" not in SORT_KEYS


def test_results_filters(study):
    db, m = study
    assert set(ids(db.results(family="register"))) == {m["v3_big"], m["v3_bad"], m["v3_broken"]}
    assert set(ids(db.results(precision="fp16"))) == {m["v6_big"]}
    assert set(ids(db.results(arch="sm_89"))) == {m["v4_rtx"]}
    assert set(ids(db.results(device="rtx"))) == {m["v4_rtx"]}
    assert set(ids(db.results(device="h100 80GB"))) == set(m.values()) - {m["v4_rtx"]}
    assert db.results(device="A100") == []
    assert set(ids(db.results(shape=(1000, 1000, 1000)))) == {m["v4_small"], m["v3_broken"]}
    assert db.results(shape=(1000, 1000, 4096)) == []
    assert set(ids(db.results(status="wrong_result"))) == {m["v3_bad"]}
    assert set(ids(db.results(status=["compile_error", "wrong_result"]))) == {m["v3_bad"], m["v3_broken"]}
    assert set(ids(db.results(tag="tune-fp16"))) == {m["v6_big"]}
    # several filters at once
    assert ids(db.results(family="warp", arch="sm_90", shape=(4096, 4096, 4096), status="ok")) == [m["v4_big"]]


def test_archs_are_those_of_kernels_with_a_measurement_of_the_status(study):
    db, _ = study
    db.kernel(**{**V4, "arch": "sm_80"})  # a kernel never measured
    assert db.archs() == ["sm_89", "sm_90"] == sorted({r.arch for r in db.results(status="ok")})
    assert db.archs("compile_error") == ["sm_90"]
    assert db.archs("infeasible") == []
    with pytest.raises(GemmgenError, match="unknown status 'passed'"):
        db.archs("passed")


def test_device_filter_treats_wildcards_literally(study):
    db, _ = study
    assert db.results(device="%") == []
    assert db.results(device="_") == []


def test_results_rejects_an_unknown_status_filter(study):
    db, _ = study
    with pytest.raises(GemmgenError, match="unknown status 'passed'; statuses: ok, wrong_result"):
        db.results(status="passed")


def test_wrong_result_keeps_its_message(study):
    db, m = study
    (row,) = db.results(status="wrong_result")
    assert (row.kernel, row.rel_error, row.message) == (
        "register_64x64x16_t4x4_contig_v4_p0_fp32", 0.25, "max error 0.25 at (7, 3)")


# ---- find ------------------------------------------------------------------------------

def test_find_returns_the_latest_matching_measurement(db):
    k, d, p = db.kernel(**V4), db.device(**H100), db.problem(4096, 4096, 4096, 1.0, 0.0)
    key = dict(kernel_name=V4["name"], arch="sm_90", source_hash="s1", device_id=d, problem_id=p)
    assert db.find(**key) is None
    first = db.record(kernel_id=k, device_id=d, problem_id=p, status="ok", tflops=40.0)
    second = db.record(kernel_id=k, device_id=d, problem_id=p, status="ok", tflops=41.0)
    failed = db.record(kernel_id=k, device_id=d, problem_id=p, status="launch_error", message="too many resources")
    assert first < second < failed
    assert db.find(**key).measurement_id == second
    assert db.find(**key).tflops == 41.0
    assert db.find(**key, statuses=("ok", "launch_error")).measurement_id == failed
    assert db.find(**{**key, "source_hash": "s2"}) is None  # another build of the same name
    assert db.find(**{**key, "arch": "sm_89"}) is None
    assert db.find(**{**key, "device_id": db.device(**RTX)}) is None
    assert db.find(**{**key, "problem_id": db.problem(4096, 4096, 4096, 1.25, -0.75)}) is None


def test_result_row_as_dict(study):
    db, m = study
    row = db.results(tag="tune-fp16")[0]
    d = row.as_dict()
    assert d["measurement_id"] == m["v6_big"]
    assert d["kernel"] == "wmma_64x64x16_w2x2_p8_fp16"
    assert d["params"] == {"BM": 64, "BN": 64, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "PAD": 8}
    assert (d["M"], d["N"], d["K"], d["tflops"]) == (4096, 4096, 4096, 112.21)
    assert isinstance(d["created_at"], str)


# ---- URLs and errors ----------------------------------------------------------------------------

def test_resolve_url_precedence(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GEMMGEN_DB", raising=False)
    assert resolve_url(None) == DEFAULT_URL == "sqlite:///results/gemmgen.db"
    assert not (tmp_path / "results").exists()  # resolving creates nothing
    monkeypatch.setenv("GEMMGEN_DB", "postgresql://u@dbhost/gemm")
    assert resolve_url(None) == "postgresql://u@dbhost/gemm"
    assert resolve_url("sqlite:///other.db") == "sqlite:///other.db"  # --db wins over the environment
    monkeypatch.setenv("GEMMGEN_DB", "")
    assert resolve_url(None) == DEFAULT_URL


def test_resolve_url_turns_a_path_into_a_sqlite_url(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GEMMGEN_DB", raising=False)
    target = tmp_path / "new" / "deeper" / "r.db"
    assert resolve_url(str(target)) == f"sqlite:///{target}"
    assert not target.parent.exists()
    assert resolve_url("runs/h100.db") == "sqlite:///runs/h100.db"
    monkeypatch.setenv("GEMMGEN_DB", "env/e.db")
    assert resolve_url(None) == "sqlite:///env/e.db"
    with ResultsDB(resolve_url(str(target))) as db:  # to record: the folders and the file are made
        db.problem(1, 1, 1, 1.0, 0.0)
    assert target.is_file()


def test_reading_creates_nothing(tmp_path):
    missing = tmp_path / "no" / "such.db"
    with pytest.raises(GemmgenError, match=rf"no results database at {missing}: nothing has been measured there"):
        ResultsDB(f"sqlite:///{missing}", create=False)
    assert not (tmp_path / "no").exists()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()  # a SQLite file without gemmgen's tables
    with pytest.raises(GemmgenError, match=r"is not a gemmgen results database \(it has no table devices"):
        ResultsDB(f"sqlite:///{empty}", create=False)
    with ResultsDB(f"sqlite:///{empty}") as db:
        db.problem(1, 1, 1, 1.0, 0.0)
    with ResultsDB(f"sqlite:///{empty}", create=False) as db:
        assert db.results() == []


def test_reading_leaves_the_file_in_its_journal_mode_and_writes_nothing(tmp_path):
    """A file only read is opened read-only: a file in rollback-journal mode (as results/h100.db
    ships, to be read from read-only media) is not switched to WAL, and no -wal or -shm file is
    left beside it; recording switches it."""
    path = tmp_path / "r.db"
    with ResultsDB(f"sqlite:///{path}") as db:
        db.problem(1, 2, 3, 1.0, 0.0)
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    with ResultsDB(f"sqlite:///{path}", create=False) as db:
        assert db.results() == [] and db.version == 5
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.db", "r.db.lock"]  # the lock file of the first open
    with ResultsDB(f"sqlite:///{path}") as db:
        db.problem(4, 5, 6, 1.0, 0.0)
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@pytest.mark.parametrize("bad", [
    "postgresql://bob:hunter2@127.0.0.1:1/gemm",  # no driver here, or nothing listening on port 1
    "nosuchdb://somewhere/x",
])
def test_a_bad_url_gives_one_line_naming_it_with_the_password_hidden(bad):
    with pytest.raises(GemmgenError) as err:
        ResultsDB(bad)
    message = str(err.value)
    assert message.startswith("cannot open results database ")
    assert "\n" not in message
    assert "hunter2" not in message
    assert bad.replace("hunter2", "***") in message


def test_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("this is not sqlite\n" * 100)
    pattern = r"cannot open results database sqlite:///.*notes\.db: file is not a database"
    with pytest.raises(GemmgenError, match=pattern):
        ResultsDB(f"sqlite:///{path}")


def test_a_sqlite_folder_that_cannot_be_made(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(GemmgenError, match="cannot create folder"):
        ResultsDB(f"sqlite:///{blocker / 'sub' / 'r.db'}")


def test_a_database_of_the_first_schema_is_migrated_when_opened_to_record(tmp_path):
    """Schema 1 had no schema_version and no claims table: recording adds both and keeps the rows."""
    from gemmgen.store.db import SCHEMA_VERSION

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    with ResultsDB(url) as db:
        device = db.device(**H100)
    with sqlite3.connect(path) as c:  # back to schema 1
        c.execute("DROP TABLE claims")
        c.execute("DROP TABLE schema_version")
        for column in ("trans", "out", "bias", "act"):
            c.execute(f"ALTER TABLE kernels DROP COLUMN {column}")
    with ResultsDB(url, create=False) as db:  # reading an older schema is fine, and changes nothing
        assert db.results() == []
    with sqlite3.connect(path) as c:
        assert not c.execute("SELECT name FROM sqlite_master WHERE name IN ('claims', 'schema_version')").fetchall()
    with ResultsDB(url) as db:
        assert db.device(**H100) == device  # the old rows are there
    with sqlite3.connect(path) as c:
        assert c.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)] and SCHEMA_VERSION == 5
        assert c.execute("SELECT COUNT(*) FROM claims").fetchone() == (0,)
        assert c.execute("SELECT trans, out, bias, act FROM kernels").fetchall() == []  # (no kernel rows)


def test_a_database_of_a_newer_schema_is_refused_naming_both_versions(tmp_path):
    path = tmp_path / "new.db"
    ResultsDB(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE schema_version SET version = 7")
    for create in (True, False):
        with pytest.raises(GemmgenError, match=r"has schema version 7; this gemmgen \(.*\) reads versions up to 5: "
                                               r"upgrade gemmgen"):
            ResultsDB(f"sqlite:///{path}", create=create)


def test_claims_go_to_the_first_and_can_be_taken_over(tmp_path):
    with ResultsDB(f"sqlite:///{tmp_path / 'c.db'}") as db:
        key = dict(kernel_id=db.kernel(name="k", family="warp", precision="fp32", arch="sm_90", params={}),
                   device_id=db.device(**H100), problem_id=db.problem(1, 2, 3, 1.0, 0.0))
        assert db.claim(**key, owner=11) == 11  # claimed now
        assert db.claim(**key, owner=12) == 11  # the claim that stands
        assert not db.take_over(**key, old_owner=12, new_owner=13)  # 12 never held it
        assert db.take_over(**key, old_owner=11, new_owner=12)
        assert db.claim(**key, owner=14) == 12


def test_optunas_schema_is_checked_on_the_first_open_of_a_url_in_a_process(tmp_path, monkeypatch):
    from optuna.storages._rdb.storage import _VersionManager

    from gemmgen.store import studies

    checks = []
    real = _VersionManager.check_table_schema_compatibility
    monkeypatch.setattr(_VersionManager, "check_table_schema_compatibility",
                        lambda self: checks.append(1) or real(self))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    for _ in range(3):
        studies.open_storage(url).engine.dispose()
    assert len(checks) == 1
