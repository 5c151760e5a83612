"""On the GPU (sm_90 only): hopper points of each precision -- one and two consumer warpgroups,
one and two m64 rows per consumer, 2..6 stages, N-major and (tf32) K-major B, grouped tile order,
clusters of two blocks sharing B by multicast, ping-pong consumers, the right half of a tile held
in registers and stored during the next tile (overlap=1) -- match the float64 reference at odd shapes (TMA zero-fills every tile edge; where K or N break
16-byte rows the pack kernel runs first) and aligned ones, and in a persistent grid with more
tiles than SMs.

Both epilogues run: each shape is checked with beta = 0 and beta != 0 (verify.CHECKS), and C
goes through TMA stores only with beta = 0 and N % 4 == 0 (clipped at C's edges where M or N is
not a multiple of the tile, or N is narrower than a 32-column box); beta != 0, N odd or N % 4 == 2,
and a C whose base is not 16-byte aligned take the direct stores."""

import numpy as np
import pytest
from conftest import assert_measured_ok, load_kernel, run_gemm

from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_sm90")]

POINTS = [
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4}),
    ("bf16", {"BM": 128, "BN": 128, "consumers": 1, "stages": 3, "swizzle": 8}),
    ("fp16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swizzle": 4}),
    ("bf16", {"BM": 128, "BN": 192, "consumers": 2, "stages": 4}),
    ("fp16", {"BM": 64, "BN": 64, "consumers": 1, "stages": 2}),
    ("tf32", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4}),
    ("tf32", {"BM": 64, "BN": 64, "consumers": 1, "stages": 6, "swizzle": 16}),
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "cluster": 2}),
    ("bf16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swizzle": 8, "cluster": 2}),
    ("tf32", {"BM": 128, "BN": 128, "consumers": 1, "stages": 4, "cluster": 2}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "schedule": "pingpong"}),
    ("bf16", {"BM": 64, "BN": 256, "consumers": 2, "stages": 4, "schedule": "pingpong", "swizzle": 8}),
    ("tf32", {"BM": 128, "BN": 128, "consumers": 2, "stages": 5, "schedule": "pingpong", "cluster": 2}),
    ("tf32", {"BM": 256, "BN": 128, "consumers": 2, "stages": 4, "swizzle": 8, "cluster": 2}),
    ("fp16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "overlap": 1}),
    ("bf16", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "cluster": 2, "overlap": 1}),
    ("fp16", {"BM": 64, "BN": 128, "consumers": 1, "stages": 5, "swizzle": 4, "overlap": 1}),
    # swap=1: C^T = B^T A^T from shared memory, BM as wgmma's N
    ("fp16", {"BM": 16, "BN": 128, "consumers": 1, "stages": 8, "swap": 1}),
    ("bf16", {"BM": 32, "BN": 256, "consumers": 2, "stages": 6, "swap": 1, "cluster": 2, "swizzle": 4}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 4, "swap": 1, "schedule": "pingpong"}),
    ("bf16", {"BM": 64, "BN": 192, "consumers": 1, "stages": 4, "swap": 1}),
    ("fp16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swap": 1, "swizzle": 8}),
]
# With beta = 0: TMA stores at 300x200 (N cuts a box, and leaves boxes wholly outside C), 5x12 (C
# narrower and shorter than one box), 1000^3, 16x4096 and 2048^3; direct stores at N = 1, 33,
# 257, 4097 (odd: one float at a time) and 258 (pairs, but rows not 16-byte aligned).
SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(31, 257, 127), Shape(300, 200, 8), Shape(5, 12, 40),
          Shape(130, 258, 72), Shape(1000, 1000, 1000), Shape(16, 4096, 4096), Shape(4095, 4097, 4093),
          Shape(2048, 2048, 2048)]

BENCH_SEED = 5  # the `bench` fixture (conftest.py) draws its inputs from this seed


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", POINTS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(POINTS)])
def test_hopper_point_is_correct(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    assert_measured_ok(bench, config.name, config, shape)


@pytest.mark.parametrize("offset", [4, 8], ids=["c_plus_4_bytes", "c_plus_8_bytes"])
@pytest.mark.parametrize("precision, params", [POINTS[0], POINTS[10]], ids=["coop", "pingpong"])
def test_misaligned_c_takes_the_direct_stores(bench, precision, params, offset):
    """N % 4 == 0 but C's base not 16-byte aligned: TMA cannot store C, so the launch passes a
    zero map and the kernel stores directly (floats at +4 bytes, float2 at +8); both checks."""
    from gemmgen.build.nvcc import build_kernel
    from gemmgen.measure.launcher import LoadedKernel

    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    shape = Shape(257, 260, 96)
    kernel = LoadedKernel(bench.gpu, config, build_kernel(config).library)
    ops = bench.operands(shape, precision)
    drv, c_bytes = bench.gpu.drv, shape.m * shape.n * 4
    buffer = drv.mem_alloc(c_bytes + 16)
    shifted = int(buffer) + offset
    assert kernel.describe(shape.m, shape.n, shape.k, int(ops.a), int(ops.b), 0.0, shifted).stores_c == 0
    assert kernel.describe(shape.m, shape.n, shape.k, int(ops.a), int(ops.b), 0.0, int(buffer)).stores_c == 1

    def run(alpha, beta):  # C (NaN or C0, as reset_c left it) -> shifted C -> GEMM -> C
        drv.memcpy_dtod(shifted, ops.c, c_bytes)
        kernel.launch(shape.m, shape.n, shape.k, alpha, int(ops.a), int(ops.b), beta, shifted)
        drv.memcpy_dtod(ops.c, shifted, c_bytes)

    try:
        verdict = bench.verify(run, ops)
    finally:
        bench.gpu.synchronize()
        buffer.free()
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("shape", [Shape(2048, 2048, 64), Shape(1000, 1000, 1000), Shape(4096, 4096, 256),
                                   Shape(300, 2000, 130), Shape(17024, 512, 128)], ids=str)
@pytest.mark.parametrize("precision, params", [POINTS[14], POINTS[15], ("fp16", {**POINTS[14][1], "trans": "tn"})],
                         ids=["fp16", "bf16-x2", "fp16-tn"])
def test_overlap_gives_the_same_bits_as_the_plain_epilogue(bench, precision, params, shape):
    """overlap=1 moves where and when the right half of C is stored, not what: the same bits as
    overlap=0, with alpha != 1 (applied before the half is held). The shapes give items of one k
    tile (all held boxes go out after the k loop), of two and three (some after), several tiles per
    block, and a last partial wave; with A stored K x M (tn) too."""
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    plain = load_kernel(bench, make_config("hopper", {**params, "overlap": 0}, precision, bench.gpu.info.arch))
    held = load_kernel(bench, config)
    ops = bench.operands(shape, precision, config.variant)
    ops.fill(np.random.default_rng(13))
    expected = run_gemm(bench, plain, ops, -0.75, 0.0)
    got = run_gemm(bench, held, ops, -0.75, 0.0)
    assert np.isfinite(got).all() and np.array_equal(got, expected)
