"""On the GPU (sm_90): hopper's problem variants -- B stored N x K (trans=nt, torch's linear
weight) and C stored as fp16 or bf16 (out) -- match the float64 reference at odd and aligned shapes
with both checks (beta = 0, through TMA stores where C's rows allow; beta != 0, direct stores
reading C in its type), for the coop, ping-pong, cluster, stream-K and swap-AB schedules; cuBLAS's
baseline of the same variant passes the same checks; and an emitted library called 30 times in
one process over mixed shapes, misaligned pointers and beta values is right every time."""

import numpy as np
import pytest
from conftest import assert_measured_ok, call_sequence, check_calls_in_one_process, load_kernel

from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape, Variant

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_sm90")]

POINTS = [
    ("bf16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "trans": "nt", "out": "bf16"}),
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "trans": "nt"}),
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "out": "fp16"}),
    ("bf16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "schedule": "pingpong", "trans": "nt", "out": "bf16"}),
    ("fp16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "cluster": 2, "trans": "nt", "out": "bf16"}),
    ("bf16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "streamk": 1, "trans": "nt", "out": "bf16"}),
    ("fp16", {"BM": 16, "BN": 128, "consumers": 1, "stages": 8, "swap": 1, "trans": "nt", "out": "fp16"}),
    ("bf16", {"BM": 32, "BN": 256, "consumers": 2, "stages": 6, "swap": 1, "cluster": 2, "trans": "nt"}),
    ("bf16", {"BM": 64, "BN": 128, "consumers": 1, "stages": 5, "out": "bf16"}),
]
# N = 1, 33, 257, 4097: odd (one element at a time); 258: pairs, rows not 16-byte aligned; 200 and
# 4096: TMA stores; K = 65, 127, 4093: B's rows (nt) not 16-byte aligned, packed first.
SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(31, 257, 127), Shape(300, 200, 8), Shape(130, 258, 72),
          Shape(1000, 1000, 1000), Shape(16, 4096, 4096), Shape(4095, 4097, 4093)]


def _ids(points):
    return [f"{p}-{'-'.join(f'{k}{v}' for k, v in params.items() if k in ('trans', 'out', 'swap', 'schedule'))}"
            for p, params in points]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", POINTS, ids=_ids(POINTS))
def test_variant_point_is_correct(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    assert config.variant != Variant() and config.name.endswith(config.variant.suffix)
    assert_measured_ok(bench, config.name, config, shape)


@pytest.mark.parametrize("precision, variant", [("bf16", Variant("nt", "bf16")), ("bf16", Variant("nt", "fp32")),
                                                ("fp16", Variant("nn", "fp16")), ("fp16", Variant("nt", "fp16"))], ids=str)
def test_cublas_baseline_of_a_variant_passes_the_checks(bench, precision, variant):
    m = bench.measure_cublas(precision, Shape(257, 130, 96), variant)
    assert m.status == "ok", m.message
    assert m.kernel == f"cublas_{precision}{variant.suffix}"


@pytest.mark.parametrize("precision, params", [POINTS[0], POINTS[5], POINTS[6]], ids=_ids([POINTS[0], POINTS[5], POINTS[6]]))
def test_variant_library_called_many_times_in_one_process(bench, precision, params):
    """The emitted launcher, loaded once and called over call_sequence's 30 shapes (thin, 1x1x1,
    K = 1, growing and shrinking, misaligned pointers, beta = 0 into NaN and beta != 0): every
    result within the tolerance of its float64 reference."""
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    kernel = load_kernel(bench, config)
    try:
        check_calls_in_one_process(bench, kernel, config, call_sequence(11), np.random.default_rng(3))
    finally:
        kernel.close()
