"""On the GPU (sm_80 or newer): batched strided GEMM (batch=strided) of the mma and warp families,
each emitted library called many times in one process over odd shapes (1x1x1, 17x33x9,
127x129x65, 257x255x1023), batch counts 1, 3 and 8, strides with padding between the matrices
and stride 0 (one A, B or bias for the whole batch), every layout, fp16/bf16 C, bias and
activation, split-K, misaligned pointers and beta = 0 into a NaN-poisoned C: every matrix of the
batch against its float64 reference, and the padding between C's matrices untouched. Also
batch = 0 (nothing written) and the launcher's refusals. (`bench --batch` against the
batched cuBLAS baselines: tests/measure/test_gpu_measure_batched.py.) The calls and their check are
conftest's batched_calls and check_batched_call."""

import numpy as np
import pytest
from conftest import SMALL_MMA, batched_calls, build_all, check_batched_call

from gemmgen.describe.config import make_config

pytestmark = pytest.mark.gpu

BENCH_SEED = 5

POINTS = {
    "mma_fp16_nn": ("mma", "fp16", {}),
    "mma_fp16_nt_ofp16_bcol_gelu": ("mma", "fp16", {**SMALL_MMA, "trans": "nt", "out": "fp16", "bias": "col",
                                                   "act": "gelu"}),
    "mma_bf16_tn_obf16_brow_relu_k4": ("mma", "bf16", {**SMALL_MMA, "trans": "tn", "out": "bf16", "bias": "row",
                                                      "act": "relu", "split_k": 4, "swizzle": 4}),
    "mma_bf16_tt_k2": ("mma", "bf16", {"trans": "tt", "split_k": 2}),
    "mma_tf32_nn_silu": ("mma", "tf32", {**SMALL_MMA, "BK": 16, "act": "silu"}),
    "mma_tf32_tn_ofp16_bcol_k8": ("mma", "tf32", {**SMALL_MMA, "BK": 16, "trans": "tn", "out": "fp16", "bias": "col",
                                                  "split_k": 8}),
    "mma_tf32_nt_obf16": ("mma", "tf32", {**SMALL_MMA, "BK": 16, "trans": "nt", "out": "bf16"}),
    "warp_nn": ("warp", "fp32", {}),
    "warp_nt_bcol_silu_k4": ("warp", "fp32", {"trans": "nt", "bias": "col", "act": "silu", "split_k": 4,
                                              "swizzle": 8}),
    "warp_tt_brow_gelu": ("warp", "fp32", {"trans": "tt", "bias": "row", "act": "gelu"}),
    "warp_tn_k16": ("warp", "fp32", {"BM": 16, "BN": 64, "BK": 32, "WM": 16, "WN": 16, "TM": 2, "TN": 4,
                                     "buffers": 2, "split_k": 16, "trans": "tn"}),
}


@pytest.fixture(scope="module")
def built(build_cache):
    configs = {key: make_config(f, {**params, "batch": "strided"}, p, "sm_90") for key, (f, p, params) in POINTS.items()}
    return build_all(configs)


@pytest.mark.parametrize("key", list(POINTS))
def test_a_batched_library_is_right_for_every_matrix_over_many_calls(bench, built, key):
    from gemmgen.measure.launcher import Launcher

    config, result = built[key]
    assert result.ok, result.log
    kernel = Launcher(result.library)
    rng = np.random.default_rng(sum(map(ord, key)))
    for call in batched_calls(sum(map(ord, key))):
        check_batched_call(bench, kernel, config, call, rng)


def test_the_launcher_refuses_a_bad_batch_on_the_gpu(bench, built):
    from gemmgen.measure.launcher import Launcher, ShapeRefused

    config, result = built["mma_fp16_nn"]
    kernel = Launcher(result.library)
    with pytest.raises(ShapeRefused, match="batch must be >= 0"):
        kernel.launch(8, 8, 8, 1.0, 0, 0, 0.0, 0, batch=-1)
    with pytest.raises(ShapeRefused, match="C's matrices overlap"):
        kernel.launch(8, 8, 8, 1.0, 0, 0, 0.0, 0, batch=2, strides=(64, 64, 63))

