"""On an sm_90 GPU: the hopper family's strided batch (batch=strided), in one launch. Each point's
emitted library is called many times in one process (so stream-K's flags must be left zero by
every launch, and the workspace grows and shrinks) over 1x1x1, 17x33x9, 127x129x65, 257x255x1023
and 1000x1000x1000 at batch counts 0, 1, 3 and 8, with packed and padded strides (padding that
breaks 16 bytes makes the launcher pack A or B per matrix, or store C directly), stride 0 for A,
B or the bias, misaligned pointers, and beta = 0 into a NaN-poisoned C: every matrix of the batch
against its float64 reference, C's padding untouched (conftest.check_batched_call). The
points cover every layout, fp16/bf16 (fp32, fp16 and bf16 C, bias and activation) and tf32, and
the schedules: coop, cluster 2 (multicast), stream-K (split-K for thin shapes), overlap,
ping-pong, swap-AB. The GPU-free twin is test_batched_hopper.py."""

import numpy as np
import pytest
from conftest import batched_calls, build_all, check_batched_call

from gemmgen.describe.config import make_config

pytestmark = pytest.mark.gpu

BASE = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "batch": "strided"}
POINTS = {
    "nn_fp16": ("fp16", {}),
    "nt_bf16_obf16_bcol_gelu": ("bf16", {"trans": "nt", "out": "bf16", "bias": "col", "act": "gelu"}),
    "tn_fp16_sw_ofp16_brow": ("fp16", {"BM": 64, "BN": 128, "swap": 1, "trans": "tn", "out": "fp16", "bias": "row"}),
    "tt_bf16_x2_ofp16_relu": ("bf16", {"cluster": 2, "trans": "tt", "out": "fp16", "act": "relu"}),
    "nn_fp16_sk": ("fp16", {"streamk": 1}),
    "nt_bf16_sk_x2_obf16_bcol": ("bf16", {"streamk": 1, "cluster": 2, "trans": "nt", "out": "bf16", "bias": "col"}),
    "nn_fp16_sk_ov": ("fp16", {"streamk": 1, "overlap": 1}),
    "nt_bf16_ov_obf16_bcol_gelu": ("bf16", {"overlap": 1, "trans": "nt", "out": "bf16", "bias": "col", "act": "gelu"}),
    "tn_fp16_pingpong_brow_silu": ("fp16", {"BN": 128, "stages": 6, "schedule": "pingpong", "trans": "tn",
                                            "bias": "row", "act": "silu"}),
    "nt_bf16_sw32_bcol": ("bf16", {"BM": 32, "BN": 128, "swap": 1, "trans": "nt", "bias": "col", "swizzle": 1}),
    "nn_tf32_x2_bcol_silu": ("tf32", {"cluster": 2, "bias": "col", "act": "silu"}),
}
SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 65), (257, 255, 1023), (1000, 1000, 1000)]


def hopper_calls(seed: int, count: int = 31) -> list[dict]:
    """conftest's batched_calls (batch 0 first, then batch 1, 3, 8 in turn, random padding, stride 0
    and offsets, beta = 0 every other call) over SHAPES, every shape at every batch count; calls 1, 2
    and 3 share one A, one B and one bias across a batch of 8 whatever the draw said."""
    calls = batched_calls(seed, count - 1, SHAPES)
    for i, shared in ((1, (True, False, False)), (2, (False, True, False)), (3, (False, False, True))):
        calls[i].update(batch=8, shared=shared)
    return calls


@pytest.fixture(scope="module")
def built(build_cache):
    configs = {key: make_config("hopper", {**BASE, **params}, precision, "sm_90")
               for key, (precision, params) in POINTS.items()}
    return build_all(configs)


@pytest.mark.parametrize("key", list(POINTS))
def test_a_batched_hopper_library_is_right_for_every_matrix_over_many_calls(bench, needs_sm90, built, key):
    from gemmgen.measure.launcher import Launcher

    config, result = built[key]
    assert result.ok, result.log
    kernel = Launcher(result.library)
    seed = sum(map(ord, key))
    rng = np.random.default_rng(seed)
    for call in hopper_calls(seed):
        check_batched_call(bench, kernel, config, call, rng)
