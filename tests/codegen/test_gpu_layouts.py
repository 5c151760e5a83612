"""On the GPU (sm_80 or newer): the operand layouts of the mma and warp families -- A stored K x M
(trans tn, tt) and/or B stored N x K (nt, tt) -- and mma's fp16/bf16 C match the float64
reference at odd and aligned shapes with both checks (beta = 0 into a NaN-poisoned C, beta != 0
reading C in its type): split-K, the block swizzle, tf32's pair loads, narrow swizzled rows, and
shapes where K, M or N break 16-byte rows (the packed path, and A stored K x M read element by
element). A kernel called with a null workspace copies misaligned operands itself; cuBLAS's
baseline of each layout passes the same checks; and one emitted library per family, called 20
times in one process over mixed shapes, misaligned pointers and beta values, is right every time.

On sm_90, the same for hopper's A stored K x M (tn, tt; fp16 and bf16): TMA boxes of 64 columns
of M read M-major by wgmma, in the coop, ping-pong, stream-K, cluster, overlap and swap-AB
schedules, into fp32 and 16-bit C, with and without the epilogue, at shapes where A's rows of M
(and B's) break 16 bytes (packed first) and aligned ones."""

import numpy as np
import pytest
from conftest import assert_measured_ok, call_sequence, check_calls_in_one_process, check_without_workspace, load_kernel

from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape, Variant

pytestmark = pytest.mark.gpu

BENCH_SEED = 18  # the `bench` fixture (conftest.py) draws its inputs from this seed

MMA = {"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2}
MMA_TF32 = {"BM": 128, "BN": 128, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 4, "frags": 2}
WARP = {"BM": 128, "BN": 128, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "buffers": 2}  # v4

POINTS = [
    # mma, fp16/bf16: ldmatrix.trans for A stored K x M, plain ldmatrix for B stored N x K
    ("mma", "fp16", {**MMA, "trans": "nt"}),
    ("mma", "fp16", {**MMA, "trans": "tn", "out": "fp16"}),
    ("mma", "bf16", {**MMA, "trans": "tt", "out": "bf16", "swizzle": 8}),
    ("mma", "bf16", {**MMA, "frags": 1, "stages": 4, "trans": "tn"}),
    ("mma", "fp16", {**MMA, "out": "bf16"}),  # nn into 16-bit C
    # narrow rows (the swizzle's D = 4 for B stored N x K; BM = 32 for A stored K x M), one warp
    ("mma", "fp16", {"BM": 64, "BN": 32, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 1, "trans": "tt"}),
    ("mma", "bf16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 1, "stages": 3, "frags": 1, "trans": "tn",
                     "out": "bf16"}),
    # split-K (partials in fp32 whatever C's type)
    ("mma", "fp16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "stages": 4, "frags": 2, "split_k": 8,
                     "trans": "tt", "out": "fp16"}),
    ("mma", "bf16", {"BM": 64, "BN": 128, "BK": 64, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2, "split_k": 4,
                     "swizzle": 4, "trans": "nt", "out": "bf16"}),
    # tf32: ldmatrix for K-contiguous tiles, 8-byte pair loads for tiles stored K-major
    ("mma", "tf32", {**MMA_TF32, "trans": "nt"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "tn"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "tt", "out": "bf16"}),
    ("mma", "tf32", {**MMA_TF32, "out": "fp16"}),  # nn (C^T form) into 16-bit C
    ("mma", "tf32", {"BM": 64, "BN": 64, "BK": 8, "WARPS_M": 2, "WARPS_N": 4, "stages": 4, "frags": 2, "trans": "tt"}),
    ("mma", "tf32", {"BM": 32, "BN": 128, "BK": 16, "WARPS_M": 1, "WARPS_N": 4, "stages": 4, "frags": 1, "split_k": 4,
                     "trans": "tn"}),
    # warp (fp32): each layout, split-K and the block swizzle, one buffer
    ("warp", "fp32", {**WARP, "trans": "nt"}),
    ("warp", "fp32", {**WARP, "trans": "tn"}),
    ("warp", "fp32", {**WARP, "trans": "tt"}),
    ("warp", "fp32", {**WARP, "split_k": 4, "swizzle": 8, "trans": "tn"}),
    ("warp", "fp32", {"BM": 16, "BN": 64, "BK": 32, "WM": 16, "WN": 16, "TM": 2, "TN": 4, "buffers": 2, "split_k": 8,
                      "trans": "nt"}),
    ("warp", "fp32", {"BM": 64, "BN": 16, "BK": 16, "WM": 32, "WN": 16, "TM": 4, "TN": 4, "buffers": 1, "split_k": 2,
                      "swizzle": 16, "trans": "tt"}),
]
# 1x1x1 and 17x33x7: one partial tile (later splits empty); 127x129x65 and 255x257x131: odd, every
# operand's rows misaligned (packed; A stored K x M read element by element); 256^3 aligned;
# 264x136x200: M, N, K multiples of 8 but not of the tiles; 100x202x1000: K of many tiles, M and
# N breaking 16-byte rows of 16-bit A stored K x M and B stored K x N, not of fp32 A;
# 16x4096x520: thin, for split-K.
SHAPES = [Shape(1, 1, 1), Shape(17, 33, 7), Shape(127, 129, 65), Shape(255, 257, 131), Shape(256, 256, 256),
          Shape(264, 136, 200), Shape(100, 202, 1000), Shape(16, 4096, 520)]


def _ids(points):
    return [f"{f}-{p}-{params.get('trans', 'nn')}-o{params.get('out', 'fp32')}-{i}"
            for i, (f, p, params) in enumerate(points)]


@pytest.fixture(autouse=True)
def _needs_sm80(bench):
    if bench.gpu.info.arch.cc < 80:
        pytest.skip(f"the mma family needs sm_80 or newer; this GPU is {bench.gpu.info.arch.name}")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("family, precision, params", POINTS, ids=_ids(POINTS))
def test_layout_point_is_correct(bench, family, precision, params, shape):
    config = make_config(family, params, precision, bench.gpu.info.arch)
    assert config.name.endswith(config.variant.suffix)
    assert_measured_ok(bench, config.name, config, shape)


# hopper (sm_90), A stored K x M: each schedule, one and two consumers (one and two m64 blocks
# each: the A tile's 64-column chunks at every offset), swap-AB (A's chunks as wgmma's N-major B),
# clusters, stream-K, overlap, 16-bit C and the epilogue, with B stored K x N (tn) and N x K (tt)
HOPPER = [
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "trans": "tn"}),
    ("bf16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "trans": "tt", "out": "bf16"}),
    ("bf16", {"BM": 128, "BN": 128, "consumers": 1, "stages": 3, "swizzle": 8, "trans": "tn"}),
    ("fp16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swizzle": 4, "trans": "tt"}),
    ("fp16", {"BM": 64, "BN": 64, "consumers": 1, "stages": 2, "trans": "tn", "out": "fp16"}),
    ("bf16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "schedule": "pingpong", "trans": "tn",
              "out": "bf16"}),
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "cluster": 2, "streamk": 1,
              "trans": "tt"}),
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "overlap": 1, "trans": "tn",
              "out": "fp16"}),
    ("bf16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "cluster": 2, "overlap": 1, "trans": "tt"}),
    ("fp16", {"BM": 64, "BN": 128, "consumers": 1, "stages": 8, "streamk": 1, "swap": 1, "trans": "tn"}),
    ("bf16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swizzle": 8, "swap": 1, "trans": "tt",
              "out": "bf16"}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 4, "schedule": "pingpong", "swap": 1, "cluster": 2,
              "trans": "tn"}),
    ("bf16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "trans": "tt", "out": "bf16",
              "bias": "col", "act": "gelu"}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "schedule": "pingpong", "trans": "tn", "out": "fp16",
              "bias": "row", "act": "relu"}),
    ("bf16", {"BM": 64, "BN": 256, "consumers": 1, "stages": 4, "swap": 1, "cluster": 2, "trans": "tt", "out": "bf16",
              "bias": "col", "act": "silu"}),
]
# 1x1x1; 7x33x4099: one partial tile, every stored row misaligned (A's of M = 7; B's of N = 33 or
# K = 4099), 65 k tiles; 100x1000x3000: A's rows of M = 100 packed, B's aligned; 1000^3 aligned
# (C through TMA stores with beta = 0); 1001x999x1003: nothing aligned; 64x4096x520: thin (a
# stream-K split, the swap-AB points' case); 300x200x8: one k tile; 2048^3: more tiles than SMs.
HOPPER_SHAPES = [Shape(1, 1, 1), Shape(7, 33, 4099), Shape(100, 1000, 3000), Shape(1000, 1000, 1000),
                 Shape(1001, 999, 1003), Shape(64, 4096, 520), Shape(300, 200, 8), Shape(2048, 2048, 2048)]


def _hopper_ids(points):
    keys = ("trans", "out", "schedule", "cluster", "streamk", "overlap", "swap", "bias", "act")
    return [f"{p}-{params['BM']}x{params['BN']}-c{params['consumers']}-"
            + "-".join(f"{k}{params[k]}" for k in keys if k in params) for p, params in points]


@pytest.mark.usefixtures("needs_sm90")
@pytest.mark.parametrize("shape", HOPPER_SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", HOPPER, ids=_hopper_ids(HOPPER))
def test_hopper_a_stored_k_by_m_is_correct(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    assert config.variant.a_transposed and config.name.endswith(config.variant.suffix)
    assert_measured_ok(bench, config.name, config, shape)


@pytest.mark.parametrize("precision, trans", [("fp16", "tn"), ("bf16", "tt"), ("fp16", "nt"), ("tf32", "tn"),
                                              ("tf32", "tt"), ("tf32", "nt")])
def test_kernel_without_workspace_copies_misaligned_operands_itself(bench, precision, trans):
    """Called with a null workspace (no pack kernel first), the kernel's element-wise copy path
    must give the right answer where M, N and K all break 16-byte rows."""
    config = make_config("mma", {**(MMA_TF32 if precision == "tf32" else MMA), "trans": trans}, precision,
                         bench.gpu.info.arch)
    check_without_workspace(bench, config, Shape(301, 203, 517))


@pytest.mark.parametrize("precision, variant", [("fp16", Variant("tn")), ("bf16", Variant("tt", "bf16")),
                                                ("fp16", Variant("nt", "fp16")), ("tf32", Variant("tn")),
                                                ("fp32", Variant("tt")), ("fp32", Variant("nt"))], ids=str)
def test_cublas_baseline_of_a_layout_passes_the_checks(bench, precision, variant):
    m = bench.measure_cublas(precision, Shape(257, 130, 96), variant)
    assert m.status == "ok", m.message
    assert m.kernel == f"cublas_{precision}{variant.suffix}"


LIBRARIES = [("mma", "fp16", {**MMA, "trans": "tn", "out": "bf16"}),
             ("mma", "tf32", {**MMA_TF32, "trans": "tt"}),
             ("mma", "bf16", {"BM": 64, "BN": 128, "BK": 64, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2,
                              "split_k": 4, "trans": "nt", "out": "fp16"}),
             ("warp", "fp32", {**WARP, "split_k": 4, "trans": "tt"})]


@pytest.mark.parametrize("family, precision, params", LIBRARIES, ids=_ids(LIBRARIES))
def test_layout_library_called_many_times_in_one_process(bench, family, precision, params):
    """The emitted launcher, loaded once and called over 20 of call_sequence's shapes (thin,
    1x1x1, K = 1, growing and shrinking, misaligned pointers, beta = 0 into NaN and beta != 0):
    every result within the tolerance of its float64 reference."""
    config = make_config(family, params, precision, bench.gpu.info.arch)
    kernel = load_kernel(bench, config)
    try:
        check_calls_in_one_process(bench, kernel, config, call_sequence(18, count=20), np.random.default_rng(5))
    finally:
        kernel.close()


HOPPER_LIBRARIES = [HOPPER[1], HOPPER[6], HOPPER[10], HOPPER[13]]


@pytest.mark.usefixtures("needs_sm90")
@pytest.mark.parametrize("precision, params", HOPPER_LIBRARIES, ids=_hopper_ids(HOPPER_LIBRARIES))
def test_hopper_a_stored_k_by_m_library_called_many_times_in_one_process(bench, precision, params):
    """As test_layout_library_called_many_times_in_one_process, for hopper with A stored K x M: A
    at an odd element offset about one call in three (its copy packed), M = 1, 3, 15, 17 ... (rows
    of M breaking 16 bytes), with a fresh bias each call where the variant adds one."""
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    kernel = load_kernel(bench, config)
    try:
        check_calls_in_one_process(bench, kernel, config, call_sequence(18, count=20), np.random.default_rng(5))
    finally:
        kernel.close()
