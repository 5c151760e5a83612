"""On the GPU: mma points of each precision, with and without fragment double-buffering, block
swizzle, 2..5 stages, split-K and the shared-memory swizzle's corner cases, match the float64 reference at odd shapes (where K or N break 16-byte
alignment, so the element-wise copy path runs) and aligned ones (the cp.async path)."""

import pytest
from conftest import assert_measured_ok

from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape

pytestmark = pytest.mark.gpu

POINTS = [
    ("fp16", {"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2}),
    ("bf16", {"BM": 128, "BN": 256, "BK": 32, "WARPS_M": 4, "WARPS_N": 4, "stages": 4, "frags": 1, "swizzle": 8}),
    ("tf32", {"BM": 64, "BN": 128, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 2, "frags": 2}),
    ("tf32", {"BM": 256, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 4, "stages": 3, "frags": 1, "swizzle": 4}),
    ("fp16", {"BM": 64, "BN": 64, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 5, "frags": 2}),
    # the swizzle's corner cases: rows of 2 and 4 chunks (D = 4, 2), 16-column warps, one warp
    # whose copies step fewer rows than the swizzle's period
    ("fp16", {"BM": 64, "BN": 32, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 1}),
    ("tf32", {"BM": 64, "BN": 64, "BK": 8, "WARPS_M": 2, "WARPS_N": 4, "stages": 4, "frags": 2}),
    ("fp16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 1, "stages": 3, "frags": 1}),
    ("bf16", {"BM": 128, "BN": 256, "BK": 64, "WARPS_M": 2, "WARPS_N": 4, "stages": 3, "frags": 2}),
] + [(precision, params) for precision, params in (
    # split-K (thin and small shapes): 1x1x1 and 17x33x65 leave later splits empty
    ("fp16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "stages": 4, "frags": 2, "split_k": 8}),
    ("bf16", {"BM": 64, "BN": 128, "BK": 64, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2, "split_k": 16,
              "swizzle": 4}),
    ("tf32", {"BM": 32, "BN": 128, "BK": 16, "WARPS_M": 1, "WARPS_N": 4, "stages": 4, "frags": 1, "split_k": 4}),
)]
SPLIT_POINTS = [(precision, params) for precision, params in POINTS if params.get("split_k", 1) > 1]
SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(31, 257, 127), Shape(1000, 1000, 1000),
          Shape(16, 4096, 4096), Shape(4095, 4097, 4093), Shape(1024, 1024, 1024)]


BENCH_SEED = 3  # the `bench` fixture (conftest.py) draws its inputs from this seed


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", POINTS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(POINTS)])
def test_mma_point_is_correct(bench, precision, params, shape):
    config = make_config("mma", params, precision, bench.gpu.info.arch)
    assert_measured_ok(bench, config.name, config, shape)


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_kernel_without_workspace_copies_misaligned_operands_itself(bench, precision):
    """Called with a null workspace (no pack kernel first), the kernel's element-wise copy path
    must give the right answer at a shape whose K and N break 16-byte alignment."""
    import numpy as np

    from gemmgen.build.nvcc import build_kernel
    from gemmgen.measure.launcher import LoadedKernel

    config = make_config("mma", POINTS[0][1], precision, bench.gpu.info.arch)
    shape = Shape(301, 203, 517)
    build = build_kernel(config)
    info = LoadedKernel(bench.gpu, config, build.library).describe(shape.m, shape.n, shape.k)
    assert info.packed_a_bytes and info.packed_b_bytes  # the launcher would pack both
    kernel = bench.gpu.drv.module_from_file(str(build.cubin)).get_function(config.name)
    if config.geometry.smem_bytes > 48 * 1024:
        kernel.set_attribute(bench.gpu.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, config.geometry.smem_bytes)
    kernel.prepare("iiifPPfPPPP")  # M, N, K, alpha, A, B, beta, C, gg_workspace{flags, partials, packed}
    ops = bench.operands(shape, precision)

    def run(alpha, beta):
        kernel.prepared_call(tuple(info.grid), config.geometry.block, np.int32(shape.m), np.int32(shape.n),
                             np.int32(shape.k), np.float32(alpha), int(ops.a), int(ops.b), np.float32(beta),
                             int(ops.c), 0, 0, 0, shared_size=config.geometry.smem_bytes)

    verdict = bench.verify(run, ops)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("shape", [Shape(17, 33, 65), Shape(16, 4096, 4096), Shape(301, 203, 517)], ids=str)
@pytest.mark.parametrize("precision, params", SPLIT_POINTS, ids=[p for p, _ in SPLIT_POINTS])
def test_split_results_are_bitwise_identical_run_after_run(bench, precision, params, shape):
    """The splits are added in split order whichever block finishes last, so five runs give the
    same bits; the counters are back at zero after each launch (301x203x517 packs A and B too)."""
    import numpy as np
    from conftest import load_kernel, run_gemm

    config = make_config("mma", params, precision, bench.gpu.info.arch)
    kernel = load_kernel(bench, config)
    ops = bench.operands(shape, precision)
    ops.fill(np.random.default_rng(5))
    results = []
    for _ in range(5):
        results.append(run_gemm(bench, kernel, ops, 1.25, -0.75).view(np.uint32))
        held = kernel.held()
        counters = np.empty(held.flag_bytes // 4, dtype=np.uint32)
        bench.gpu.drv.memcpy_dtoh(counters, held.flags)
        assert counters.size and not counters.any(), "split-K counters not back at zero after the launch"
    for other in results[1:]:
        assert np.array_equal(results[0], other), f"{config.name} at {shape}: results differ between runs"
