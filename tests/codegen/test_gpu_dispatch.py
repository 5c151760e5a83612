"""On the GPU: an emitted dispatcher (`emit --dispatch`), built as a library the way a user builds
it, called through its C launcher over the 30-call sequence of test_gpu_sequence.py (mixed shapes,
misaligned pointers, beta = 0 with C poisoned), by plan too, and on two streams at once; every
result against the float64 reference. Its kernels go to different calls, so a launch after
another kernel's must still be right."""

import numpy as np  # noqa: F401 (the calls fixture's buffers)
import pytest
from conftest import call_sequence
from test_gpu_sequence import ARCH, SEED, calls, on_two_streams  # noqa: F401 (calls is a fixture)

from gemmgen.build.nvcc import build_library
from gemmgen.describe.config import make_config
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.describe.problem import Shape
from gemmgen.measure.launcher import Launcher
from gemmgen.selection.dispatch.emit import render_dispatcher
from gemmgen.selection.dispatch.select import DispatchPlan, Layer, Span

pytestmark = pytest.mark.gpu


def _kernels(precision):
    """Three kernels of different families or options, valid on this GPU."""
    if precision == "fp32":
        return [NAMED_POINTS["v4"].config(ARCH), NAMED_POINTS["splitk"].config(ARCH),
                make_config("warp", {**NAMED_POINTS["v4"].params, "BM": 64, "WM": 32, "TM": 4, "swizzle": 8}, "fp32",
                            ARCH)]
    if ARCH.cc == 90:
        return [NAMED_POINTS[f"hopper_{precision}"].config(ARCH),
                make_config("hopper", {"BM": 64, "BN": 128, "consumers": 1, "stages": 6, "streamk": 1}, precision, ARCH),
                make_config("mma", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "split_k": 4},
                            precision, ARCH)]
    return [NAMED_POINTS[f"mma_{precision}"].config(ARCH),
            make_config("mma", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "split_k": 4}, precision, ARCH),
            make_config("mma", {"BM": 64, "BN": 64, "BK": 32, "WARPS_M": 2, "WARPS_N": 2}, precision, ARCH)]


@pytest.fixture(scope="module", params=["fp32", "tf32", "fp16", "bf16"])
def dispatcher(request, build_cache):
    precision = request.param
    kernels = _kernels(precision)
    shapes = sorted({Shape(m, n, k) for m, n, k, *_ in call_sequence(SEED)}, key=lambda s: (s.m, s.n, s.k))
    # a table for half of the layers, each kernel serving a range of M (rotated from layer to
    # layer); the other layers go to the nearest layer's table
    layers = sorted({(s.n, s.k) for s in shapes})[::2]
    table = tuple(Layer(n, k, tuple(Span(lo, hi, (i + j) % len(kernels), 1.0, 1.0, ())
                                    for j, (lo, hi) in enumerate(((1, 40), (41, 300), (301, 8192)))), (), "test")
                  for i, (n, k) in enumerate(layers))
    plan = DispatchPlan(precision, ARCH, tuple(kernels), table, ("test",), sm_count=132)
    build = build_library(render_dispatcher(plan, ["--dispatch"]), kernels[0].build_arch)
    assert build.ok, build.log
    return precision, Launcher(build.library)


def test_sequence_through_the_dispatcher(bench, dispatcher, calls):
    precision, launcher = dispatcher
    drv = bench.gpu.drv
    assert launcher.precision == precision
    for i, call in enumerate(calls(precision)):
        call.reset_c(drv)
        args = (call.m, call.n, call.k, call.alpha, call.a, call.b, call.beta, call.c)
        if i % 3 == 2:
            with launcher.plan(*args) as plan:
                plan.run()
                bench.gpu.synchronize()
        else:
            launcher.launch(*args)
            bench.gpu.synchronize()
        call.check(drv, precision, f"dispatcher ({precision}), call {i} of the sequence")


def test_two_streams_at_once(bench, dispatcher, calls):
    precision, launcher = dispatcher
    on_two_streams(bench, launcher, calls(precision)[:12], precision, f"dispatcher ({precision})")
