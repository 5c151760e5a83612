"""Schema 3 of the results database: kernels gain the problem variant's columns (trans, out, bias,
act), filled from each row's name when an older database is opened to record; schema 4: kernels
gain batch, measurements batch_count (1 for every earlier row); schema 5: kernels gain scale (from
the names too: none for every earlier row). On a copy of the
shipped results/h100.db (a real schema-2 file, never the file itself), on SQLite files and on a
PostgreSQL server of the test session's own (conftest's `postgres`), and (in the slow run) with
several processes opening one old database at once. Read without migrating, an older database is read as it is,
the variant then taken from the names."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.names import variant_of
from gemmgen.describe.problem import VARIANT_KEYS, Shape, Variant
from gemmgen.selection.best import best, ranked
from gemmgen.store.db import SCHEMA_VERSION, ResultsDB, ResultsDBError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "results" / "h100.db"
SM90 = parse_arch("sm_90")
H100 = dict(name="H100", arch="sm_90", sm_count=132, clock_mhz=1980, memory_clock_mhz=2619, driver_version="580",
            cuda_version="13.0")
SHAPE = Shape(16, 4096, 4096)
NT_BF16_COL_GELU = Variant("nt", "bf16", "col", "gelu")
# kernels of several variants, each with its cuBLAS baseline (name, family, TFLOP/s)
KERNELS = [
    ("cublas_bf16", "cublas", 100.0),
    ("hopper_128x256_c2_s4_g8_bf16", "hopper", 101.0),
    ("cublas_bf16_nt_obf16", "cublas", 100.0),
    ("hopper_128x256_c2_s4_g8_bf16_nt_obf16", "hopper", 99.0),
    ("cublas_bf16_nt_obf16_bcol_gelu", "cublas", 80.0),
    ("hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol_gelu", "hopper", 84.0),
    ("hopper_64x128_c1_s5_bf16_nt_obf16_bcol_gelu", "hopper", 76.0),
]


def _columns(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns("kernels")}
    finally:
        engine.dispose()


def _execute(url: str, *statements: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


def back_to_schema_2(url: str) -> None:
    """What the tables of schema 2 were: kernels without the variant columns."""
    _execute(url, *(f'ALTER TABLE kernels DROP COLUMN "{key}"' for key in VARIANT_KEYS),
             "ALTER TABLE measurements DROP COLUMN batch_count", "UPDATE schema_version SET version = 2")


def back_to_schema_3(url: str) -> None:
    """What the tables of schema 3 were: kernels without batch and scale, measurements without batch_count."""
    _execute(url, 'ALTER TABLE kernels DROP COLUMN "batch"', 'ALTER TABLE kernels DROP COLUMN "scale"',
             "ALTER TABLE measurements DROP COLUMN batch_count", "UPDATE schema_version SET version = 3")


def back_to_schema_4(url: str) -> None:
    """What the tables of schema 4 were: kernels without scale."""
    _execute(url, 'ALTER TABLE kernels DROP COLUMN "scale"', "UPDATE schema_version SET version = 4")


def _store(db: ResultsDB) -> None:
    device, problem = db.device(**H100), db.problem(SHAPE.m, SHAPE.n, SHAPE.k, 1.0, 0.0)
    for name, family, tflops in KERNELS:
        kernel = db.kernel(name=name, family=family, precision="bf16", arch="sm_90", params={})
        db.record(kernel_id=kernel, device_id=device, problem_id=problem, status="ok", tflops=tflops, median_ms=1.0)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("postgres")()


def test_a_schema_2_database_is_read_as_it_is_and_migrated_when_opened_to_record(url):
    with ResultsDB(url) as db:
        _store(db)
        assert db.version == SCHEMA_VERSION == 5
    back_to_schema_2(url)
    assert not set(VARIANT_KEYS) & _columns(url)
    with ResultsDB(url, create=False) as old:  # read: nothing changes, the variant comes from the names
        assert old.version == 2
        rows = old.results()
        assert sorted((r.kernel, r.variant) for r in rows) == sorted((n, variant_of(n)) for n, _, _ in KERNELS)
        assert {r.kernel for r in old.results(variant=NT_BF16_COL_GELU)} == {n for n, _, _ in KERNELS[4:]}
        assert [r.kernel for r in old.results(variant={"bias": "col"}, limit=1)] == [KERNELS[5][0]]  # 84 > 80, 76
        assert best(old, "bf16", SHAPE, SM90, variant=NT_BF16_COL_GELU).kernel == KERNELS[5][0]
    assert not set(VARIANT_KEYS) & _columns(url)
    with ResultsDB(url) as db:  # to record: migrated
        assert db.version == SCHEMA_VERSION
        ids = {r.kernel: r.measurement_id for r in db.results()}
        assert set(ids) == {n for n, _, _ in KERNELS}
    assert set(VARIANT_KEYS) <= _columns(url)
    engine = create_engine(url)
    with engine.connect() as connection:
        stored = {name: Variant(*variant) for name, *variant in
                  connection.execute(text('SELECT name, trans, "out", bias, act FROM kernels')).all()}
        assert connection.execute(text("SELECT version FROM schema_version")).scalar() == SCHEMA_VERSION
    engine.dispose()
    assert stored == {n: variant_of(n) for n, _, _ in KERNELS}
    with ResultsDB(url, create=False) as db:  # now by the columns
        assert {r.measurement_id for r in db.results()} == set(ids.values())
        assert {r.kernel for r in db.results(variant=NT_BF16_COL_GELU)} == {n for n, _, _ in KERNELS[4:]}
        assert {r.kernel for r in db.results(variant={"trans": "nt", "bias": "none"})} == \
            {n for n, _, _ in KERNELS[2:4]}
        assert [(r.kernel, r.score) for r in ranked(db, "bf16", SHAPE, SM90, variant=NT_BF16_COL_GELU)] == \
            [(KERNELS[5][0], pytest.approx(84 / 80)), (KERNELS[6][0], pytest.approx(76 / 80))]
        assert best(db, "bf16", SHAPE, SM90).kernel == KERNELS[1][0]  # the default variant's
        new = db.kernel(name="hopper_64x128_c1_s5_bf16_nt_obf16", family="hopper", precision="bf16", arch="sm_90",
                        params={})
        assert new not in ids.values()
    with ResultsDB(url) as db:  # opened again: nothing more to do
        assert db.version == SCHEMA_VERSION and len(db.results()) == len(KERNELS)


def test_kernel_records_the_variant_its_name_says(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with ResultsDB(url) as db:
        name = "hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol_gelu"
        assert db.kernel(name=name, family="hopper", precision="bf16", arch="sm_90", params={},
                         variant=NT_BF16_COL_GELU) == db.kernel(name=name, family="hopper", precision="bf16",
                                                                arch="sm_90", params={})
        with pytest.raises(ValueError, match="is named for the variant 'nt bf16 col gelu', not 'nt bf16 none none'"):
            db.kernel(name=name, family="hopper", precision="bf16", arch="sm_90", params={},
                      variant=Variant("nt", "bf16"))
    engine = create_engine(url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT trans, out, bias, act FROM kernels")).all() == [
            ("nt", "bf16", "col", "gelu")]
    engine.dispose()


@pytest.mark.parametrize("variant, message", [
    ({"transpose": "nt"}, "unknown variant key 'transpose'; keys: trans, out, bias, act, batch, scale$"),
    ({"act": "tanh"}, "act='tanh' is not allowed"),
    ("nt", "variant must be a gemmgen.describe.problem.Variant or a mapping"),
])
def test_a_bad_variant_filter_is_one_error(tmp_path, variant, message):
    with ResultsDB(f"sqlite:///{tmp_path / 'r.db'}") as db, pytest.raises(ResultsDBError, match=message):
        db.results(variant=variant)


@pytest.mark.skipif(not SHIPPED.is_file(), reason="results/h100.db is not in this checkout")
def test_the_shipped_schema_2_file_migrates_and_keeps_every_row(tmp_path):
    """A copy of results/h100.db (schema 2: kernels known by their names only, those of F.linear's
    tunes of other variants) with rows of other variants added the way gemmgen 0.1 stored them, at
    a shape nothing shipped was measured at: opened to record, every kernel's columns say what its
    name does, no row is lost, and the best kernels are the ones they were."""
    import sqlite3

    copy = tmp_path / "h100.db"
    shutil.copyfile(SHIPPED, copy)
    url = f"sqlite:///{copy}"
    with ResultsDB(url, create=False) as shipped:
        assert shipped.version == 2
        before_rows = {r.measurement_id: (r.kernel, r.status, r.tflops) for r in shipped.results()}
        suite = [Shape(1000, 1000, 1000), Shape(4096, 4096, 4096), Shape(16, 4096, 4096)]
        before_best = {(s, p): best(shipped, p, s, SM90) for s in suite for p in ("fp32", "tf32", "fp16", "bf16")}
    assert all(before_best.values())
    unseen = Shape(16, 4096, 4104)
    with sqlite3.connect(copy) as c:  # rows of other variants, as a schema-2 gemmgen stored them
        shipped_variants = sum(1 for (name,) in c.execute("SELECT name FROM kernels") if variant_of(name) != Variant())
        device = c.execute("SELECT id FROM devices LIMIT 1").fetchone()[0]
        mnk = (unseen.m, unseen.n, unseen.k)
        assert not c.execute("SELECT id FROM problems WHERE m = ? AND n = ? AND k = ?", mnk).fetchone()
        problem = c.execute("INSERT INTO problems (m, n, k, alpha, beta) VALUES (?, ?, ?, 1.0, 0.0)", mnk).lastrowid
        added = 0
        for name, family, tflops in KERNELS[2:]:
            found = c.execute("SELECT id FROM kernels WHERE name = ? AND arch = 'sm_90' AND source_hash = ''",
                              (name,)).fetchone()  # the shipped file's cuBLAS rows of F.linear's variant
            added += found is None
            kernel = found[0] if found else c.execute(
                "INSERT INTO kernels (name, family, precision, arch, params, template_hash, source_hash) "
                "VALUES (?, ?, 'bf16', 'sm_90', '{}', '', '')", (name, family)).lastrowid
            c.execute("INSERT INTO measurements (kernel_id, device_id, problem_id, status, tflops, median_ms, "
                      "message, gemmgen_version, created_at) VALUES (?, ?, ?, 'ok', ?, 1.0, '', '0.1.0', "
                      "'2026-11-24 00:00:00.000000')", (kernel, device, problem, tflops))
        kernels = c.execute("SELECT COUNT(*) FROM kernels").fetchone()[0]
    with ResultsDB(url) as db:
        assert db.version == SCHEMA_VERSION
        after_rows = {r.measurement_id: (r.kernel, r.status, r.tflops) for r in db.results()}
        assert len(after_rows) == len(before_rows) + len(KERNELS) - 2
        assert {k: v for k, v in after_rows.items() if k in before_rows} == before_rows
        for (shape, precision), found in before_best.items():
            assert best(db, precision, shape, SM90) == found, (shape, precision)
        assert best(db, "bf16", unseen, SM90, variant=NT_BF16_COL_GELU).kernel == KERNELS[5][0]
        assert best(db, "bf16", unseen, SM90, variant=Variant("nt", "bf16")).kernel == KERNELS[3][0]
    with sqlite3.connect(copy) as c:
        rows = c.execute("SELECT name, trans, out, bias, act FROM kernels").fetchall()
        assert c.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    assert len(rows) == kernels
    assert all(Variant(*variant) == variant_of(name) for name, *variant in rows)
    assert sum(1 for _, *variant in rows if Variant(*variant) != Variant()) == shipped_variants + added


@pytest.mark.slow
def test_processes_opening_one_old_database_at_once_migrate_it_once(postgres):
    url = postgres()
    with ResultsDB(url) as db:
        _store(db)
    back_to_schema_2(url)
    code = "import sys; from gemmgen.store.db import ResultsDB; db = ResultsDB(sys.argv[1]); print(db.version); db.close()"
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == str(SCHEMA_VERSION), err
    with ResultsDB(url, create=False) as db:
        assert db.version == SCHEMA_VERSION
        assert {r.kernel: r.variant for r in db.results()} == {n: variant_of(n) for n, _, _ in KERNELS}


def test_rows_recorded_into_an_old_database_opened_to_read_get_their_variant_when_it_migrates(url):
    """gemmgen's own readers never record, but a ResultsDB opened to read may: kernels then go in
    without the columns that schema lacks, and its migration fills them in from their names."""
    with ResultsDB(url) as db:
        _store(db)
    back_to_schema_2(url)
    name = "hopper_64x128_c1_s5_bf16_nt_ofp16_brow_silu"
    with ResultsDB(url, create=False) as old:
        kernel = old.kernel(name=name, family="hopper", precision="bf16", arch="sm_90", params={"BM": 64})
        old.record(kernel_id=kernel, device_id=old.device(**H100), problem_id=old.problem(1, 2, 3, 1.0, 0.0),
                   status="ok", tflops=1.0)
        assert [r.variant for r in old.results(shape=(1, 2, 3))] == [Variant("nt", "fp16", "row", "silu")]
    with ResultsDB(url) as db:
        assert [(r.kernel, r.variant) for r in db.results(variant={"act": "silu"})] == [
            (name, Variant("nt", "fp16", "row", "silu"))]


def test_a_schema_3_database_reads_without_batch_and_migrates_to_batch_count_1(url):
    """Schema 4 adds kernels.batch and measurements.batch_count: a schema-3 database is read as it
    is (batch from the names, batch_count 1), and opened to record gains both, every old row
    keeping its meaning; a batched kernel's rows then carry their count and select by it."""
    with ResultsDB(url) as db:
        _store(db)
    back_to_schema_3(url)
    with ResultsDB(url, create=False) as old:
        assert old.version == 3
        rows = old.results()
        assert len(rows) == len(KERNELS) and {(r.batch, r.scale, r.batch_count) for r in rows} == {("none", "none", 1)}
        assert {r.kernel for r in old.results(variant=NT_BF16_COL_GELU)} == {n for n, _, _ in KERNELS[4:]}
        assert old.results(variant={"batch": "strided"}) == []
    with ResultsDB(url) as db:
        assert db.version == SCHEMA_VERSION
        assert {(r.batch, r.batch_count) for r in db.results()} == {("none", 1)}
        name = "mma_128x128x32_w2x2_s3_f2_fp16_batched"
        kernel = db.kernel(name=name, family="mma", precision="fp16", arch="sm_90", params={})
        device, problem = db.device(**H100), db.problem(17, 33, 9, 1.0, 0.0)
        db.record(kernel_id=kernel, device_id=device, problem_id=problem, status="ok", tflops=1.0, batch_count=8)
        found = db.results(variant={"batch": "strided"})
        assert [(r.kernel, r.variant, r.batch_count) for r in found] == [(name, Variant(batch="strided"), 8)]
        assert db.find(kernel_name=name, arch="sm_90", source_hash="", device_id=device, problem_id=problem,
                       batch_count=8) is not None
        assert db.find(kernel_name=name, arch="sm_90", source_hash="", device_id=device, problem_id=problem) is None
    assert {"batch", "scale"} <= _columns(url)


def test_a_schema_4_database_reads_without_scale_and_migrates_to_scale_none(url):
    """Schema 5 adds kernels.scale: a schema-4 database is read as it is, unchanged (scale from the
    names: none for every kernel of schema 4), and opened to record gains the column, each row's
    from its name, every old row keeping its variant and its batch count."""
    batched = "mma_128x128x32_w2x2_s3_f2_fp16_batched"
    with ResultsDB(url) as db:
        _store(db)
        kernel = db.kernel(name=batched, family="mma", precision="fp16", arch="sm_90", params={})
        db.record(kernel_id=kernel, device_id=db.device(**H100), problem_id=db.problem(17, 33, 9, 1.0, 0.0),
                  status="ok", tflops=1.0, batch_count=8)
        before = {r.measurement_id: (r.kernel, r.variant, r.batch_count) for r in db.results()}
    back_to_schema_4(url)
    assert "scale" not in _columns(url)
    with ResultsDB(url, create=False) as old:  # a SQLite file: opened read-only
        assert old.version == 4
        rows = old.results()
        assert {r.measurement_id: (r.kernel, r.variant, r.batch_count) for r in rows} == before
        assert {r.scale for r in rows} == {"none"}
        assert [(r.kernel, r.batch_count) for r in old.results(variant={"batch": "strided"})] == [(batched, 8)]
        assert old.results(variant={"scale": "row"}) == []
        assert {r.kernel for r in old.results(variant=NT_BF16_COL_GELU)} == {n for n, _, _ in KERNELS[4:]}
    assert "scale" not in _columns(url)
    with ResultsDB(url) as db:
        assert db.version == SCHEMA_VERSION
        assert {r.measurement_id: (r.kernel, r.variant, r.batch_count) for r in db.results()} == before
    engine = create_engine(url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT DISTINCT scale FROM kernels")).all() == [("none",)]
        assert connection.execute(text("SELECT batch FROM kernels WHERE name = :n"), {"n": batched}).all() == [
            ("strided",)]
        assert connection.execute(text("SELECT version FROM schema_version")).scalar() == SCHEMA_VERSION
    engine.dispose()


def test_a_scaled_kernel_recorded_into_a_schema_4_database_opened_to_read_gets_its_scale_when_it_migrates(url):
    """As for schema 2 above: the kernel goes in without scale, which its name says; the migration
    fills the column in from the name."""
    with ResultsDB(url) as db:
        _store(db)
    back_to_schema_4(url)
    name, variant = "hopper_128x256_c2_s4_g8_bf16_nt_obf16_srow", Variant("nt", "bf16", scale="row")
    with ResultsDB(url, create=False) as old:
        kernel = old.kernel(name=name, family="hopper", precision="bf16", arch="sm_90", params={}, variant=variant)
        old.record(kernel_id=kernel, device_id=old.device(**H100), problem_id=old.problem(1, 2, 3, 1.0, 0.0),
                   status="ok", tflops=1.0)
        assert [(r.kernel, r.variant) for r in old.results(variant={"scale": "row"})] == [(name, variant)]
    with ResultsDB(url) as db:
        assert [(r.kernel, r.variant) for r in db.results(variant={"scale": "row"})] == [(name, variant)]
    engine = create_engine(url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT scale FROM kernels WHERE name = :n"), {"n": name}).all() == [("row",)]
    engine.dispose()


@pytest.mark.parametrize("scale", ["tensor", "row"])
def test_a_scaled_kernel_round_trips(url, scale):
    """A kernel of a scaled variant is stored with its scale, and read back (and selected) with it."""
    variant = Variant("nt", "bf16", scale=scale)
    name = f"hopper_128x256_c2_s4_g8_bf16{variant.suffix}"
    with ResultsDB(url) as db:
        _store(db)
        kernel = db.kernel(name=name, family="hopper", precision="bf16", arch="sm_90", params={}, variant=variant)
        assert kernel == db.kernel(name=name, family="hopper", precision="bf16", arch="sm_90", params={})
        device, problem = db.device(**H100), db.problem(SHAPE.m, SHAPE.n, SHAPE.k, 1.0, 0.0)
        recorded = db.record(kernel_id=kernel, device_id=device, problem_id=problem, status="ok", tflops=2.0)
        with pytest.raises(ValueError, match="is named for the variant"):
            db.kernel(name=name, family="hopper", precision="bf16", arch="sm_90", params={},
                      variant=Variant("nt", "bf16"))
    with ResultsDB(url, create=False) as db:
        found = db.find(kernel_name=name, arch="sm_90", source_hash="", device_id=device, problem_id=problem)
        assert (found.measurement_id, found.scale, found.variant) == (recorded, scale, variant)
        assert [r.kernel for r in db.results(variant=variant)] == [name]
        assert [r.kernel for r in db.results(variant={"scale": scale})] == [name]
        assert name not in {r.kernel for r in db.results(variant=Variant("nt", "bf16"))}
    engine = create_engine(url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT trans, out, scale FROM kernels WHERE name = :n"), {"n": name}).all() \
            == [("nt", "bf16", scale)]
    engine.dispose()
