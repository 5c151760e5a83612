"""On the GPU (sm_90): hopper's tiles of 48, 96 and 192 rows -- wgmma N = 48 / 96 / 192 with swap=1
(and tf32, which always swaps), three m64 blocks per consumer without it -- match the float64
reference at odd and aligned shapes, for coop, ping-pong, one consumer, cluster pairs and stream-K;
and an emitted library of one of them, called 30 times in one process over mixed shapes, is right
every time. These tiles are what fills the H100's 132 SMs at M = 3 * 2^k (96, 384, 768, ...)."""

import numpy as np
import pytest
from conftest import assert_measured_ok, call_sequence, check_calls_in_one_process, load_kernel

from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_sm90")]

POINTS = [
    ("fp16", {"BM": 48, "BN": 128, "consumers": 2, "stages": 8, "swap": 1}),
    ("bf16", {"BM": 48, "BN": 64, "consumers": 1, "stages": 8, "swap": 1, "trans": "nt", "out": "bf16"}),
    ("fp16", {"BM": 96, "BN": 192, "consumers": 2, "stages": 5, "swap": 1, "schedule": "pingpong"}),
    ("bf16", {"BM": 96, "BN": 192, "consumers": 1, "stages": 5, "swap": 1}),
    ("fp16", {"BM": 96, "BN": 128, "consumers": 2, "stages": 6, "swap": 1, "streamk": 1}),
    ("bf16", {"BM": 192, "BN": 128, "consumers": 2, "stages": 5, "swap": 1, "cluster": 2, "trans": "nt"}),
    ("fp16", {"BM": 192, "BN": 64, "consumers": 2, "stages": 6, "swap": 1, "schedule": "pingpong", "out": "fp16"}),
    ("bf16", {"BM": 192, "BN": 128, "consumers": 2, "stages": 5, "swap": 1, "streamk": 1}),
    ("fp16", {"BM": 192, "BN": 64, "consumers": 1, "stages": 6}),
    ("bf16", {"BM": 192, "BN": 64, "consumers": 2, "stages": 6, "schedule": "pingpong", "trans": "nt"}),
    ("tf32", {"BM": 96, "BN": 192, "consumers": 1, "stages": 4}),
    ("tf32", {"BM": 192, "BN": 128, "consumers": 2, "stages": 4}),
    ("tf32", {"BM": 48, "BN": 128, "consumers": 2, "stages": 6, "streamk": 1}),
    # BM any multiple of 8 with swap=1 (and tf32): the tiles that fit a token count (tune --fill)
    ("fp16", {"BM": 8, "BN": 128, "consumers": 2, "stages": 6, "swap": 1}),
    ("bf16", {"BM": 80, "BN": 128, "consumers": 2, "stages": 6, "swap": 1, "schedule": "pingpong"}),
    ("fp16", {"BM": 152, "BN": 256, "consumers": 2, "stages": 4, "swap": 1, "streamk": 1}),
    ("bf16", {"BM": 200, "BN": 128, "consumers": 2, "stages": 5, "swap": 1, "trans": "nt", "out": "bf16"}),
    ("fp16", {"BM": 56, "BN": 64, "consumers": 1, "stages": 8, "swap": 1, "out": "fp16"}),
    ("bf16", {"BM": 136, "BN": 256, "consumers": 2, "stages": 4, "swap": 1, "cluster": 2}),
    ("tf32", {"BM": 72, "BN": 128, "consumers": 2, "stages": 5}),
    ("tf32", {"BM": 232, "BN": 64, "consumers": 1, "stages": 4, "streamk": 1}),
]
# odd everywhere (1, 17, 97, 193: one row past a tile), thin, a tile and a half, and large odd
SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(97, 257, 127), Shape(193, 200, 8), Shape(300, 130, 72),
          Shape(1000, 1000, 1000), Shape(96, 4096, 4096), Shape(385, 6143, 4097)]


def _ids(points):
    return [f"{p}-{params['BM']}x{params['BN']}-c{params['consumers']}"
            + "".join(f"-{k}{v}" for k, v in params.items() if k in ("swap", "schedule", "streamk", "cluster", "trans"))
            for p, params in points]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", POINTS, ids=_ids(POINTS))
def test_tile_is_correct(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    assert f"_{params['BM']}x{params['BN']}_" in config.name
    assert_measured_ok(bench, config.name, config, shape)


@pytest.mark.parametrize("precision, params", [POINTS[2], POINTS[7], POINTS[15]],
                         ids=_ids([POINTS[2], POINTS[7], POINTS[15]]))
def test_tile_library_called_many_times_in_one_process(bench, precision, params):
    """The emitted launcher, loaded once and called over call_sequence's 30 shapes: every result
    within the tolerance of its float64 reference."""
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    kernel = load_kernel(bench, config)
    try:
        check_calls_in_one_process(bench, kernel, config, call_sequence(19), np.random.default_rng(19))
    finally:
        kernel.close()
