"""On the GPU: a dispatcher of a strided batch (`emit --dispatch --batch-mode strided`), three
kernels of bf16 nt/bf16 C/column bias/GELU, built as a library the way a user builds it and called
in ONE process through its batched launcher over a mix of shapes (each kernel gets some) and batch
counts 0, 1, 3 and 8 -- conftest's batched_calls: padded strides, stride 0 for A, B or the bias,
misaligned pointers, beta = 0 into a NaN-poisoned C -- every matrix against its float64
reference and C's padding untouched (conftest.check_batched_call). Then a batch the chosen
kernel's grid cannot hold (split-K 4: batch <= 16383), which the launch hands to another kernel.
On sm_90 two hopper kernels (one stream-K) and an mma split-K; elsewhere three mma kernels.
(BatchedGemmOp on a batched dispatcher: test_gpu_torch_batched.py; its harness: test_gpu_harness.py.)"""

import numpy as np
import pytest
from conftest import batched_calls, check_batched_call, table_plan
from test_gpu_sequence import ARCH

from gemmgen.build.nvcc import build_library
from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape
from gemmgen.measure.launcher import Launcher
from gemmgen.selection.dispatch.emit import render_dispatcher

pytestmark = pytest.mark.gpu

SEED = 20261123
VARIANT = {"trans": "nt", "out": "bf16", "bias": "col", "act": "gelu", "batch": "strided"}
SPLIT_K4 = {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "split_k": 4}
# five shapes and batch counts 1, 3, 8 in turn: every shape at every count
SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 65), (257, 255, 1023), (1000, 1000, 1000)]
# the table: a tuned shape -> its kernel; the others go to the nearest (127x129x65 to kernel 1,
# 1x1x1 to kernel 2)
TUNED = {(1000, 1000, 1000): 0, (257, 255, 1023): 1, (17, 33, 9): 2}


def _kernels() -> tuple:
    if ARCH.cc == 90:
        first = [make_config("hopper", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, **VARIANT},
                             "bf16", ARCH),
                 make_config("hopper", {"BM": 64, "BN": 128, "consumers": 1, "stages": 6, "streamk": 1, **VARIANT},
                             "bf16", ARCH)]
    else:
        first = [make_config("mma", VARIANT, "bf16", ARCH),
                 make_config("mma", {"BM": 64, "BN": 64, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, **VARIANT}, "bf16",
                             ARCH)]
    return (*first, make_config("mma", {**SPLIT_K4, **VARIANT}, "bf16", ARCH))


@pytest.fixture(scope="module")
def dispatcher(build_cache):
    kernels = _kernels()
    plan = table_plan(kernels, {Shape(*s): i for s, i in TUNED.items()})
    build = build_library(render_dispatcher(plan, ["--dispatch", "--batch-mode", "strided"]), kernels[0].build_arch)
    assert build.ok, build.log
    launcher = Launcher(build.library)
    assert launcher.variant == plan.variant and launcher.variant.batched
    return plan, launcher


def test_batched_calls_through_the_dispatcher(bench, dispatcher):
    plan, launcher = dispatcher
    calls = batched_calls(SEED, 30, SHAPES)
    assert {launcher.choice(*call["shape"]) for call in calls} == {c.name for c in plan.kernels}  # each gets calls
    rng = np.random.default_rng(SEED)
    for call in calls:
        check_batched_call(bench, launcher, plan, call, rng)


def test_a_batch_past_the_chosen_kernels_grid_goes_to_another(bench, dispatcher):
    plan, launcher = dispatcher
    assert launcher.choice(1, 1, 1) == plan.kernels[2].name  # split-K 4: grid z = batch * 4 <= 65535
    call = {"shape": (1, 1, 1), "batch": 17000, "pad": (0, 0, 3, 0), "shared": (True, True, False),
            "offset": (0, 1, 0), "alpha": 1.25, "beta": 0.0}
    check_batched_call(bench, launcher, plan, call, np.random.default_rng(SEED))
