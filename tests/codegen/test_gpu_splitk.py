"""On the GPU (PyCUDA): split-K and block-swizzled `warp` points against the float64 reference at
odd shapes (some with empty splits), results bitwise identical run after run (the reduction is
ordered), the workspace counters back at zero after every launch, the workspace grown for a larger
shape, and the emitted --harness program (whose launcher owns the workspace)."""

import subprocess

import numpy as np
import pytest
from conftest import assert_measured_ok, load_kernel, nvcc_compile, run_gemm, split_points

from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import detect_arch
from gemmgen.describe.config import make_config
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.describe.problem import Shape

pytestmark = pytest.mark.gpu

POINTS = split_points()  # test_splitk.py builds the same points without a GPU
# 16x64x33 (and 1x1x1, below): K <= BK * (split_k - 1) for the split points: their last splits are empty.
SHAPES = [Shape(17, 33, 65), Shape(16, 64, 33), Shape(16, 4096, 4096), Shape(4095, 4097, 4093)]


BENCH_SEED = 3  # the `bench` fixture (conftest.py) draws its inputs from this seed


def config_of(point, bench):
    return make_config("warp", POINTS[point], "fp32", bench.gpu.info.arch)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("point", sorted(POINTS))
def test_split_and_swizzle_match_the_reference(bench, point, shape):
    assert_measured_ok(bench, point, config_of(point, bench), shape)


@pytest.mark.parametrize("point", sorted(POINTS))
def test_one_element(bench, point):
    """1x1x1: every split but the first is empty. The result must be bit for bit the unsplit v4's
    (the empty partials add exact zeros) and pass both of verify's checks."""
    from gemmgen.measure import verify

    shape = Shape(1, 1, 1)
    split, plain = load_kernel(bench, config_of(point, bench)), load_kernel(bench, NAMED_POINTS["v4"].config(bench.gpu.info.arch))
    ops = bench.operands(shape, "fp32")
    for alpha, beta in verify.CHECKS:
        ops.fill(bench.rng)
        ours, theirs = run_gemm(bench, split, ops, alpha, beta), run_gemm(bench, plain, ops, alpha, beta)
        assert ours.view(np.uint32)[0, 0] == theirs.view(np.uint32)[0, 0], (ours, theirs)
        ref, scale = verify.host_reference(ops.host_a.astype(np.float64), ops.host_b.astype(np.float64),
                                           ops.host_c0, alpha, beta)
        verdict = verify.compare(ours, ref, scale, "fp32", shape.k)
        assert verdict.ok, verdict.message


@pytest.mark.parametrize("shape", [Shape(17, 33, 65), Shape(16, 4096, 4096), Shape(1000, 1000, 1000)], ids=str)
@pytest.mark.parametrize("point", ["splitk", "m16_k16_g2_b1", "v4_k4_g8"])
def test_split_results_are_bitwise_identical_run_after_run(bench, point, shape):
    config = config_of(point, bench)
    kernel = load_kernel(bench, config)
    ops = bench.operands(shape, "fp32")
    ops.fill(np.random.default_rng(11))
    tiles = kernel.describe(shape.m, shape.n, shape.k).flag_words  # a counter per tile
    for alpha, beta in ((1.0, 0.0), (1.25, -0.75)):
        results = []
        for _ in range(5):
            results.append(run_gemm(bench, kernel, ops, alpha, beta).view(np.uint32))
            held = kernel.held()
            assert held.flag_bytes >= 4 * tiles > 0
            counters = np.empty(held.flag_bytes // 4, dtype=np.uint32)
            bench.gpu.drv.memcpy_dtoh(counters, held.flags)
            assert not counters.any(), "split-K counters not back at zero after the launch"
        for other in results[1:]:
            assert np.array_equal(results[0], other), f"{config.name} at {shape}: results differ between runs"


def test_workspace_grows_for_a_larger_shape(bench):
    """One loaded kernel at a small, a large and again a small shape: correct each time."""
    from gemmgen.measure import verify

    config = config_of("v4_k4_g8", bench)
    kernel = load_kernel(bench, config)
    for shape in (Shape(100, 200, 300), Shape(1000, 1100, 900), Shape(100, 200, 300)):
        ops = bench.operands(shape, "fp32")
        ops.fill(bench.rng)
        c = run_gemm(bench, kernel, ops, 1.0, 0.5)
        need = kernel.describe(shape.m, shape.n, shape.k)
        assert kernel.held().partial_bytes >= need.partial_bytes > 0
        a64, b64 = ops.host_a.astype(np.float64), ops.host_b.astype(np.float64)
        ref, scale = verify.host_reference(a64, b64, ops.host_c0, 1.0, 0.5)
        verdict = verify.compare(c, ref, scale, "fp32", shape.k)
        assert verdict.ok, verdict.message


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    arch = detect_arch()
    folder = tmp_path_factory.mktemp("harness")
    exes = {}
    for point in ("m16_k16_g2_b1", "v4_k4_g8"):
        source = render_kernel(make_config("warp", POINTS[point], "fp32", arch), harness=True)
        exes[point] = nvcc_compile(source, folder / point, f"sm_{arch.cc}")
    return exes


@pytest.mark.parametrize("shape", [(1, 1, 1), (16, 64, 33), (4095, 4097, 4093)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("point", ["m16_k16_g2_b1", "v4_k4_g8"])
def test_split_harness_matches_reference(harnesses, point, shape):
    proc = subprocess.run([str(harnesses[point]), *map(str, shape), "3"], capture_output=True, text=True,
                          timeout=300, check=False)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{point} at {shape}:\n{report}"
    assert report.count("PASS") == 3, report
