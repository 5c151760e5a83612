"""On the GPU (PyCUDA): fastgemm points that cover each part of its template are verified
against the float64 reference at odd and aligned shapes, through the same Bench as `bench`."""

import zlib

import numpy as np
import pytest

from gemmgen.config import make_config
from gemmgen.problem import Shape

pytestmark = pytest.mark.gpu

SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(1000, 1000, 1000), Shape(4095, 4097, 4093)]
SEED = {"BM": 24, "BN": 512, "BK": 8, "THREADS": 128, "AV": 24, "KC": 1, "preload": 1}
POINTS = {
    "seed": SEED,  # the named point: C updated in shared memory at every k step
    "kc_tile": {**SEED, "KC": 8},  # sums kept in registers for a whole K tile
    "no_preload": {**SEED, "KC": 4, "preload": 0},
    "two_groups": {"BM": 48, "BN": 256, "BK": 8, "THREADS": 128, "AV": 24, "KC": 8, "preload": 1},
    "two_b_vectors": {"BM": 16, "BN": 1024, "BK": 4, "THREADS": 128, "AV": 16, "KC": 4, "preload": 1},
    "wide_block": {"BM": 128, "BN": 128, "BK": 8, "THREADS": 512, "AV": 8, "KC": 4, "preload": 1},
    "deep_k": {"BM": 32, "BN": 256, "BK": 16, "THREADS": 128, "AV": 16, "KC": 16, "preload": 1},
}


BENCH_SEED = 3  # the `bench` fixture (conftest.py) draws its inputs from this seed
BENCH_TAG = "test-fastgemm"


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("point", sorted(POINTS))
def test_fastgemm_point_is_correct(bench, point, shape):
    # Inputs seeded per test, so that a test sees the same data whichever tests run before it.
    bench.rng = np.random.default_rng(zlib.crc32(f"{point}-{shape}".encode()))
    config = make_config("fastgemm", POINTS[point], "fp32", bench.gpu.info.arch)
    m = bench.measure_point(point, config, shape)
    assert m.status == "ok", m.message
    assert m.timing.median_ms > 0 and m.rel_error is not None
