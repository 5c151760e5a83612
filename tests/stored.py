"""Results databases of made-up measurements, for the GPU-free tests of everything that reads
one (best, suite, dispatch, the CLI, workload tunes): ``store`` records one measurement as a
bench run would; ``stored_variant`` fills a database with kernels of the default variant and of
nt/bf16/col/gelu, each next to its variant's cuBLAS. Import with ``from stored import ...``
(tests/ is on sys.path through tests/conftest.py)."""

import time
from datetime import datetime, timedelta, timezone

from sqlalchemy import update

from gemmgen.describe.problem import Shape, Variant
from gemmgen.store.db import Measurement, ResultsDB


def store(db, name, family, precision, shape, tflops, status="ok", batch_count=1, rel_error=None):
    """One fake measurement of ``name`` on an H100 (sm_90) at ``shape``; ``batch_count`` products
    per launch (a batched kernel's or cuBLAS's rows), ``rel_error`` its checked error. Returns the
    measurement's id."""
    device = db.device(name="H100", arch="sm_90", sm_count=132, clock_mhz=1980, memory_clock_mhz=2619,
                       driver_version="580", cuda_version="13.0")
    kernel = db.kernel(name=name, family=family, precision=precision, arch="sm_90", params={})
    return db.record(kernel_id=kernel, device_id=device, problem_id=db.problem(shape.m, shape.n, shape.k, 1.0, 0.0),
                     status=status, tflops=tflops, median_ms=1.0, batch_count=batch_count, rel_error=rel_error)


def dated(db, measurement_id: int, second: float) -> None:
    """Sets a measurement's time to ``second`` seconds past a fixed moment, for tests of what pairs
    measurements by time (sleeping between records fails where a record takes longer than the sleep)."""
    moment = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=second)
    with db._engine.begin() as connection:
        connection.execute(update(Measurement).where(Measurement.id == measurement_id).values(created_at=moment))


CUBE, SKINNY = Shape(4096, 4096, 4096), Shape(16, 4096, 4096)
# FP8 (nt, bf16 C): fast accumulation (its error grows with K), and sums promoted every 16 k tiles
FAST_FP8, PROMOTED_FP8 = "hopper_128x256_c2_s4_g8_e4m3_nt_obf16", "hopper_128x128_c2_s6_g8_pr16_e4m3_nt_obf16"
NT_GELU = Variant("nt", "bf16", "col", "gelu")
V_BIG, V_THIN = "hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol_gelu", "hopper_64x128_c1_s5_bf16_nt_obf16_bcol_gelu"


def stored_variant(folder):
    """(ResultsDB, URL) of a new SQLite file in ``folder``: at CUBE and SKINNY, bf16 kernels of the
    default variant and of NT_GELU (V_BIG best at CUBE, V_THIN at SKINNY), each next to its
    variant's cuBLAS; the default variant's score higher everywhere."""
    url = f"sqlite:///{folder / 'r.db'}"
    db = ResultsDB(url)
    for shape, kernel, ratio in ((CUBE, V_BIG, 1.02), (SKINNY, V_THIN, 1.04), (CUBE, V_THIN, 0.7)):
        store(db, "cublas_bf16", "cublas", "bf16", shape, 100.0)
        store(db, "hopper_128x256_c2_s4_g8_ov_bf16", "hopper", "bf16", shape, 130.0)
        store(db, "cublas_bf16_nt_obf16_bcol_gelu", "cublas", "bf16", shape, 80.0)
        store(db, kernel, "hopper", "bf16", shape, 80.0 * ratio)
        time.sleep(0.002)
    return db, url
