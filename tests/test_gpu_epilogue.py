"""On the GPU (sm_90): hopper's fused epilogues -- a bias per row or per column of C and ReLU,
GELU (tanh) or SiLU, C = act(alpha * A @ B + beta * C + bias) -- match the float64 reference at
odd and aligned shapes with both checks (beta = 0 through TMA stores where C's rows allow, beta
!= 0 through direct stores), for the coop, ping-pong, stream-K and swap-AB schedules and tf32;
cuBLASLt's fused baseline of the same variant passes the same checks; and an emitted library
with a bias called 30 times in one process over mixed shapes, misaligned pointers and beta values
is right every time."""

import numpy as np
import pytest
from conftest import assert_measured_ok, call_sequence, check_calls_in_one_process, load_kernel

from gemmgen.config import make_config
from gemmgen.cublas import CublasError
from gemmgen.cublaslt import CublasLt
from gemmgen.problem import Shape, Variant

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_sm90")]

NT_BF16 = {"trans": "nt", "out": "bf16"}
POINTS = [
    ("bf16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, **NT_BF16, "bias": "col", "act": "gelu"}),
    ("bf16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "schedule": "pingpong", **NT_BF16, "bias": "col",
              "act": "gelu"}),
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "bias": "row", "act": "silu"}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "streamk": 1, "trans": "nt", "out": "fp16",
              "bias": "col", "act": "relu"}),
    ("bf16", {"BM": 32, "BN": 128, "consumers": 1, "stages": 8, "swap": 1, **NT_BF16, "bias": "col", "act": "gelu"}),
    ("bf16", {"BM": 64, "BN": 128, "consumers": 1, "stages": 5, "out": "bf16", "act": "gelu"}),
    ("tf32", {"BM": 128, "BN": 128, "consumers": 2, "stages": 4, "bias": "col", "act": "relu"}),
    # overlap=1: half of each tile held in registers, stored during the next tile's first k tiles
    ("bf16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "overlap": 1, **NT_BF16, "bias": "col",
              "act": "gelu"}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 5, "overlap": 1, "out": "fp16"}),
]
# N = 1, 33, 257: odd (one element at a time); 258: pairs, rows not 16-byte aligned; 200 and
# 4096: TMA stores; K = 65, 127, 4093: B's rows (nt) not 16-byte aligned, packed first.
SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(31, 257, 127), Shape(300, 200, 8), Shape(130, 258, 72),
          Shape(1000, 1000, 1000), Shape(16, 4096, 4096), Shape(4095, 4097, 4093)]


def _ids(points):
    return [f"{p}-{'-'.join(f'{k}{v}' for k, v in params.items() if k in ('trans', 'out', 'swap', 'schedule', 'streamk', 'overlap', 'bias', 'act'))}"
            for p, params in points]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", POINTS, ids=_ids(POINTS))
def test_epilogue_point_is_correct(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    assert config.variant != Variant() and config.name.endswith(config.variant.suffix)
    assert_measured_ok(bench, config.name, config, shape)


@pytest.mark.parametrize("precision, variant", [("bf16", Variant("nt", "bf16", "col", "gelu")),
                                                ("fp16", Variant("nn", "fp16", "col", "relu")),
                                                ("bf16", Variant("nt", "fp32", "none", "gelu")),
                                                ("fp16", Variant("nt", "fp16", "col", "none"))], ids=str)
def test_cublaslt_baseline_of_an_epilogue_passes_the_checks(bench, precision, variant):
    for shape in (Shape(257, 130, 96), Shape(64, 4096, 512)):
        m = bench.measure_cublas(precision, shape, variant)
        assert m.status == "ok", m.message
        assert m.kernel == f"cublas_{precision}{variant.suffix}"


def test_cublaslt_refuses_what_it_does_not_fuse(bench):
    lt = CublasLt()
    try:
        for variant in (Variant(bias="row"), Variant(act="silu")):
            with pytest.raises(CublasError, match="no cuBLASLt baseline"):
                lt.gemm("fp16", 16, 16, 16, 1.0, 0, 0, 0.0, 0, variant, bias=1)
    finally:
        lt.close()


@pytest.mark.parametrize("precision, params", [POINTS[0], POINTS[2], POINTS[3], POINTS[4], POINTS[7]],
                         ids=_ids([POINTS[0], POINTS[2], POINTS[3], POINTS[4], POINTS[7]]))
def test_epilogue_library_called_many_times_in_one_process(bench, precision, params):
    """The emitted launcher, loaded once and called over call_sequence's 30 shapes (thin, 1x1x1,
    K = 1, growing and shrinking, misaligned pointers, beta = 0 into NaN and beta != 0), with a
    fresh bias each call (at an odd offset where the others are): every result within the
    tolerance of its float64 reference, and a missing bias refused."""
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    kernel = load_kernel(bench, config)
    variant, rng = config.variant, np.random.default_rng(5)
    try:
        if variant.bias != "none":
            with pytest.raises(ValueError, match="bias"):
                kernel.launch(4, 4, 4, 1.0, 0, 0, 0.0, 0)
        check_calls_in_one_process(bench, kernel, config, call_sequence(13), rng)
    finally:
        kernel.close()
