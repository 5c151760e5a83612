"""On the GPU (sm_90 only): hopper points of each precision -- one and two consumer warpgroups,
one and two m64 rows per consumer, 2..6 stages, N-major and (tf32) K-major B, grouped tile order,
clusters of two blocks sharing B by multicast, ping-pong consumers -- match the float64 reference at odd shapes (TMA zero-fills every tile edge; where K or N break
16-byte rows the pack kernel runs first) and aligned ones, and in a persistent grid with more
tiles than SMs."""

import pytest
from conftest import assert_measured_ok

from gemmgen.config import make_config
from gemmgen.problem import Shape

pytestmark = pytest.mark.gpu

POINTS = [
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4}),
    ("bf16", {"BM": 128, "BN": 128, "consumers": 1, "stages": 3, "swizzle": 8}),
    ("fp16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swizzle": 4}),
    ("bf16", {"BM": 128, "BN": 192, "consumers": 2, "stages": 5}),
    ("fp16", {"BM": 64, "BN": 64, "consumers": 1, "stages": 2}),
    ("tf32", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4}),
    ("tf32", {"BM": 64, "BN": 64, "consumers": 1, "stages": 6, "swizzle": 16}),
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "cluster": 2}),
    ("bf16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swizzle": 8, "cluster": 2}),
    ("tf32", {"BM": 128, "BN": 128, "consumers": 1, "stages": 4, "cluster": 2}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "schedule": "pingpong"}),
    ("bf16", {"BM": 64, "BN": 256, "consumers": 2, "stages": 4, "schedule": "pingpong", "swizzle": 8}),
    ("tf32", {"BM": 128, "BN": 128, "consumers": 2, "stages": 5, "schedule": "pingpong", "cluster": 2}),
    ("tf32", {"BM": 256, "BN": 128, "consumers": 2, "stages": 4, "swizzle": 8, "cluster": 2}),
]
SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(31, 257, 127), Shape(300, 200, 8), Shape(1000, 1000, 1000),
          Shape(16, 4096, 4096), Shape(4095, 4097, 4093), Shape(2048, 2048, 2048)]

BENCH_SEED = 5  # the `bench` fixture (conftest.py) draws its inputs from this seed


@pytest.fixture(autouse=True)
def _needs_sm90(bench):
    if bench.gpu.info.arch.cc != 90:
        pytest.skip(f"the hopper family runs on sm_90 only; this GPU is {bench.gpu.info.arch.name}")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", POINTS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(POINTS)])
def test_hopper_point_is_correct(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    assert_measured_ok(bench, config.name, config, shape)
