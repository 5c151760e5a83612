"""On the GPU: the fused epilogues -- a bias per row or per column of C and ReLU, GELU (tanh) or
SiLU, C = act(alpha * A @ B + beta * C + bias) -- match the float64 reference at odd and aligned
shapes with both checks. hopper (sm_90): beta = 0 through TMA stores where C's rows allow, beta
!= 0 through direct stores, for the coop, ping-pong, stream-K and swap-AB schedules and tf32.
mma and warp (sm_80 or newer): each of mma's stores (fp16/bf16 fragments, tf32's C^T form, its
pair loads of A or B stored K-major) into fp32 and 16-bit C, with and without split-K (the
epilogue applied once, to the reduced sum), transposed layouts, and warp with and without
split-K; mma called with a null workspace (its element-wise copies) too. cuBLASLt's fused
baseline of the same variant passes the same checks; and emitted libraries with a bias called
many times in one process over mixed shapes, misaligned pointers and beta values are right every
time."""

import numpy as np
import pytest
from conftest import assert_measured_ok, call_sequence, check_calls_in_one_process, check_without_workspace, load_kernel

from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape, Variant
from gemmgen.measure.cublas import CublasError
from gemmgen.measure.cublaslt import CublasLt

pytestmark = pytest.mark.gpu

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


@pytest.mark.usefixtures("needs_sm90")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", POINTS, ids=_ids(POINTS))
def test_epilogue_point_is_correct(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    assert config.variant != Variant() and config.name.endswith(config.variant.suffix)
    assert_measured_ok(bench, config.name, config, shape)


@pytest.mark.usefixtures("needs_sm90")
@pytest.mark.parametrize("precision, variant", [("bf16", Variant("nt", "bf16", "col", "gelu")),
                                                ("fp16", Variant("nn", "fp16", "col", "relu")),
                                                ("bf16", Variant("nt", "fp32", "none", "gelu")),
                                                ("fp16", Variant("nt", "fp16", "col", "none"))], ids=str)
def test_cublaslt_baseline_of_an_epilogue_passes_the_checks(bench, precision, variant):
    for shape in (Shape(257, 130, 96), Shape(64, 4096, 512)):
        m = bench.measure_cublas(precision, shape, variant)
        assert m.status == "ok", m.message
        assert m.kernel == f"cublas_{precision}{variant.suffix}"


@pytest.mark.usefixtures("needs_sm90")
def test_cublaslt_refuses_what_it_does_not_fuse(bench):
    lt = CublasLt()
    try:
        for variant in (Variant(bias="row"), Variant(act="silu")):
            with pytest.raises(CublasError, match="no cuBLASLt baseline"):
                lt.gemm("fp16", 16, 16, 16, 1.0, 0, 0, 0.0, 0, variant, bias=1)
    finally:
        lt.close()


@pytest.mark.usefixtures("needs_sm90")
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


# ---- mma and warp (sm_80 or newer) ---------------------------------------------------------------

MMA = {"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2}
MMA_TF32 = {"BM": 128, "BN": 128, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 4, "frags": 2}
MMA_SPLIT = {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "stages": 4, "frags": 2, "split_k": 8}
MMA_SPLIT_TF32 = {"BM": 32, "BN": 128, "BK": 16, "WARPS_M": 1, "WARPS_N": 4, "stages": 4, "frags": 1, "split_k": 4}
WARP = {"BM": 128, "BN": 128, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "buffers": 2}  # v4
WARP_SPLIT = {"BM": 16, "BN": 64, "BK": 32, "WM": 16, "WN": 16, "TM": 2, "TN": 4, "buffers": 2, "split_k": 8}

# Every bias kind and activation in each precision, C as fp32 and as a 16-bit type, with and
# without split-K, nn and transposed layouts, and each of mma's stores: fp16/bf16 fragments, tf32
# nn's C^T form, tf32 B stored K x N (tn: 4-element rows), tf32 A stored K x M (tt: row pairs).
MW_POINTS = [
    ("mma", "fp16", {**MMA, "bias": "col", "act": "gelu"}),
    ("mma", "fp16", {**MMA, "trans": "tn", "out": "fp16", "bias": "row", "act": "silu"}),
    ("mma", "fp16", {**MMA, "bias": "row"}),
    ("mma", "fp16", {**MMA_SPLIT, "trans": "tt", "out": "fp16", "bias": "col", "act": "relu"}),
    ("mma", "bf16", {**MMA, "trans": "nt", "out": "bf16", "bias": "col", "act": "gelu"}),  # nn.Linear + GELU
    ("mma", "bf16", {**MMA, "trans": "tt", "out": "bf16", "swizzle": 8, "bias": "row", "act": "relu"}),
    ("mma", "bf16", {"BM": 64, "BN": 128, "BK": 64, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2, "split_k": 4,
                     "swizzle": 4, "trans": "nt", "bias": "row", "act": "gelu"}),
    ("mma", "bf16", {**MMA_SPLIT, "trans": "nt", "out": "bf16", "bias": "col", "act": "silu"}),
    ("mma", "tf32", {**MMA_TF32, "bias": "col", "act": "relu"}),
    ("mma", "tf32", {**MMA_TF32, "out": "bf16", "bias": "row", "act": "gelu"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "tn", "bias": "row", "act": "silu"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "tn", "out": "fp16", "bias": "col", "act": "gelu"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "tt", "out": "bf16", "bias": "col", "act": "silu"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "nt", "act": "gelu"}),
    ("mma", "tf32", {**MMA_SPLIT_TF32, "trans": "tn", "bias": "col", "act": "gelu"}),
    ("mma", "tf32", {**MMA_SPLIT_TF32, "out": "fp16", "bias": "row", "act": "relu"}),
    ("warp", "fp32", {**WARP, "bias": "col", "act": "gelu"}),
    ("warp", "fp32", {**WARP, "trans": "nt", "bias": "row", "act": "silu"}),
    ("warp", "fp32", {**WARP, "bias": "col"}),
    ("warp", "fp32", {**WARP, "split_k": 4, "swizzle": 8, "trans": "tn", "bias": "col", "act": "relu"}),
    ("warp", "fp32", {**WARP_SPLIT, "trans": "tt", "bias": "row", "act": "gelu"}),
    ("warp", "fp32", {"BM": 64, "BN": 16, "BK": 16, "WM": 32, "WN": 16, "TM": 4, "TN": 4, "buffers": 1, "split_k": 2,
                      "swizzle": 16, "act": "silu"}),
]
# Odd shapes: 7x33x4099 (thin, K of many tiles: split-K's partials and rows of K breaking 16
# bytes), 100x1000x3000, 1000x1000x1000 (N not a multiple of the tile; 16-bit C pairs), 129x257x65
# (every dimension odd: element-wise stores, clamped bias loads past C's edge); 1x1x1 and
# 16x4096x520 (thin, split-K).
MW_SHAPES = [Shape(7, 33, 4099), Shape(100, 1000, 3000), Shape(1000, 1000, 1000), Shape(129, 257, 65), Shape(1, 1, 1),
             Shape(16, 4096, 520)]


def _mw_ids(points):
    return [f"{f}-{p}-{q.get('trans', 'nn')}-o{q.get('out', 'fp32')}-b{q.get('bias', 'none')}-{q.get('act', 'none')}"
            f"-k{q.get('split_k', 1)}" for f, p, q in points]


@pytest.fixture
def needs_sm80(bench):
    if bench.gpu.info.arch.cc < 80:
        pytest.skip(f"the mma family needs sm_80 or newer; this GPU is {bench.gpu.info.arch.name}")


@pytest.mark.usefixtures("needs_sm80")
@pytest.mark.parametrize("shape", MW_SHAPES, ids=str)
@pytest.mark.parametrize("family, precision, params", MW_POINTS, ids=_mw_ids(MW_POINTS))
def test_mma_warp_epilogue_point_is_correct(bench, family, precision, params, shape):
    config = make_config(family, params, precision, bench.gpu.info.arch)
    assert config.variant.has_epilogue and config.name.endswith(config.variant.suffix)
    assert_measured_ok(bench, config.name, config, shape)


NO_WORKSPACE = [("mma", "fp16", {**MMA, "trans": "tn", "out": "bf16", "bias": "col", "act": "gelu"}),
                ("mma", "tf32", {**MMA_TF32, "trans": "tt", "bias": "row", "act": "silu"}),
                ("mma", "bf16", {**MMA, "trans": "nt", "out": "fp16", "bias": "row", "act": "relu"})]


@pytest.mark.usefixtures("needs_sm80")
@pytest.mark.parametrize("family, precision, params", NO_WORKSPACE, ids=_mw_ids(NO_WORKSPACE))
def test_mma_epilogue_without_workspace(bench, family, precision, params):
    """Called with a null workspace (no pack kernel first), the kernel's element-wise copy path,
    with the epilogue and the bias passed right after C, where M, N and K all break 16-byte rows."""
    check_without_workspace(bench, make_config(family, params, precision, bench.gpu.info.arch), Shape(301, 203, 517))


MW_LIBRARIES = [MW_POINTS[1], MW_POINTS[3], MW_POINTS[4], MW_POINTS[11], MW_POINTS[14], MW_POINTS[17], MW_POINTS[19]]


@pytest.mark.usefixtures("needs_sm80")
@pytest.mark.parametrize("family, precision, params", MW_LIBRARIES, ids=_mw_ids(MW_LIBRARIES))
def test_mma_warp_epilogue_library_called_many_times_in_one_process(bench, family, precision, params):
    """The emitted launcher, loaded once and called over call_sequence's 30 shapes (thin, 1x1x1,
    K = 1, growing and shrinking, misaligned pointers, beta = 0 into NaN and beta != 0), with a
    fresh bias each call: every result within the tolerance of its float64 reference (bias and
    activation applied), split-K's workspace reused across calls, and a missing bias refused."""
    config = make_config(family, params, precision, bench.gpu.info.arch)
    kernel = load_kernel(bench, config)
    try:
        if config.variant.bias != "none":
            with pytest.raises(ValueError, match="bias"):
                kernel.launch(4, 4, 4, 1.0, 0, 0, 0.0, 0)
        check_calls_in_one_process(bench, kernel, config, call_sequence(21), np.random.default_rng(7))
    finally:
        kernel.close()
