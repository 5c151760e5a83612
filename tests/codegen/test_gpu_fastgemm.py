"""On the GPU (PyCUDA): fastgemm points that cover each part of its template are verified
against the float64 reference at odd and aligned shapes, through the same Bench as `bench`."""

import zlib

import numpy as np
import pytest
from conftest import FASTGEMM_POINTS as POINTS
from conftest import assert_measured_ok

from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape

pytestmark = pytest.mark.gpu

SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(1000, 1000, 1000), Shape(4095, 4097, 4093)]


BENCH_SEED = 3  # the `bench` fixture (conftest.py) draws its inputs from this seed
BENCH_TAG = "test-fastgemm"


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("point", sorted(POINTS))
def test_fastgemm_point_is_correct(bench, point, shape):
    # Inputs seeded per test, so that a test sees the same data whichever tests run before it.
    bench.rng = np.random.default_rng(zlib.crc32(f"{point}-{shape}".encode()))
    assert_measured_ok(bench, point, make_config("fastgemm", POINTS[point], "fp32", bench.gpu.info.arch), shape)
