"""On the GPU (sm_90 only): hopper's stream-K points (streamk=1) against the float64 reference at
shapes whose last wave is partial on the GPU, so that blocks share tiles by k: ranges that cross
from one unit into the next, a single leftover unit split in two, one k tile per unit (nothing to
split), misaligned operands (packed) and direct stores, and a last wave too full for stream-K
(whole tiles only); one and two consumers, clusters of two,
tf32's C^T design, the held right half of overlap=1. Then: results bitwise identical run after run (the finishing block adds the partial sums
in worker order) with every flag back at zero after each launch, and the same answer as the
whole-tile kernel up to rounding. Last, the emitted --harness program, whose launcher owns the
stream-K workspace, launched several times in one process per shape."""

import subprocess

import numpy as np
import pytest
from conftest import assert_measured_ok, load_kernel, nvcc_compile, run_gemm

from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape
from gemmgen.measure import verify

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("needs_sm90")]

BASE = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "streamk": 1}
POINTS = [
    ("fp16", BASE),
    ("bf16", {**BASE, "swizzle": 8, "cluster": 2}),
    ("tf32", {**BASE, "cluster": 2}),
    ("fp16", {**BASE, "BN": 128, "consumers": 1, "stages": 5}),
    ("tf32", {**BASE, "BM": 64, "BN": 128, "consumers": 1}),
    ("bf16", {**BASE, "swizzle": 8, "cluster": 2, "overlap": 1}),
    # thin tiles: with fewer tiles than SMs, every tile is shared out by k over all of them
    ("fp16", {**BASE, "BM": 16, "BN": 128, "consumers": 1, "stages": 8, "swap": 1}),
    ("bf16", {**BASE, "BM": 64, "BN": 64, "consumers": 1, "stages": 6}),
    ("tf32", {**BASE, "BM": 16, "BN": 64, "consumers": 1, "stages": 8}),
    ("bf16", {**BASE, "BM": 32, "BN": 256, "consumers": 2, "stages": 6, "swap": 1, "cluster": 2}),
]
# On 132 SMs (H100, H200), for 128x256 tiles: 1900x3500 has 210 tiles, so 78 stream-K units over
# 132 workers (ranges cross from unit to unit; with clusters of two, 46 over 66); 896x4864 has 133
# (one leftover unit, split in two); 1900x3500x40 has one k tile per unit; 1900x3501x1499 packs B
# (N odd) and stores C directly; 2048x4096x512 has 256 tiles, a last wave over 3/4 full, where
# stream-K steps aside.
# 16x4096x4096 and 100x1000x3000 have fewer tiles than SMs: all are shared out (many workers per
# tile; K = 3000 ends in a partial k tile); 7x33x4099 is one or two tiles over 132 workers, N odd.
# The hybrid (a tail under half a wave takes the last full wave with it): 2200x4096x1000 has 288
# tiles, so 132 whole ones and then 156 shared by 132 workers (ranges that hold whole tiles); 1152x4096
# has 144 (all shared, each worker 1 to 2 tiles' worth); 2081x4097x1003 the same with N odd
# (packed B, direct stores) and K ending in a partial k tile.
SHAPES = [Shape(1900, 3500, 1500), Shape(896, 4864, 1000), Shape(1900, 3500, 40), Shape(1900, 3501, 1499),
          Shape(2048, 4096, 512), Shape(16, 4096, 4096), Shape(100, 1000, 3000), Shape(7, 33, 4099),
          Shape(2200, 4096, 1000), Shape(1152, 4096, 1000), Shape(2081, 4097, 1003)]

BENCH_SEED = 7  # the `bench` fixture (conftest.py) draws its inputs from this seed


def stream_k_units(kernel, shape) -> int:
    """The units (cluster-tall tiles) this launch shares out by k (HpWork::whole_units in
    hopper.cu.j2): the tail, units % workers, where the last wave is at most 3/4 full and a unit
    has 8 k tiles or more, with the last full wave where the tail is under half a wave; else none."""
    g = kernel.config.geometry
    workers = kernel.describe(shape.m, shape.n, shape.k).grid[0] // g.cluster  # every SM (cluster)
    gx, gy = -(-shape.n // g.tile_n), -(-shape.m // g.tile_m)
    units = -(-gy // g.cluster) * gx
    tail, k_tiles = units % workers, -(-shape.k // kernel.config.derived["BK"])
    if tail == 0 or 4 * tail > 3 * workers or k_tiles < 8:
        return 0
    return tail + workers if 2 * tail < workers and units >= tail + workers else tail


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("precision, params", POINTS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(POINTS)])
def test_stream_k_point_is_correct(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    assert_measured_ok(bench, config.name, config, shape)


@pytest.mark.parametrize("precision, params, shape", [POINTS[0] + (SHAPES[0],), POINTS[2] + (SHAPES[0],),
                                                     POINTS[6] + (SHAPES[5],), POINTS[8] + (SHAPES[5],),
                                                     POINTS[7] + (SHAPES[6],), POINTS[0] + (SHAPES[8],),
                                                     POINTS[1] + (SHAPES[9],)],
                         ids=["fp16", "tf32-x2", "fp16-thin-swap", "tf32-thin", "bf16-thin", "fp16-hybrid",
                              "bf16-x2-hybrid"])
def test_stream_k_is_deterministic_and_leaves_its_flags_zero(bench, precision, params, shape):
    config = make_config("hopper", params, precision, bench.gpu.info.arch)
    kernel = load_kernel(bench, config)
    assert stream_k_units(kernel, shape) > 0, f"{shape} has no partial wave on this GPU: nothing is tested"
    whole = load_kernel(bench, make_config("hopper", {**params, "streamk": 0}, precision, bench.gpu.info.arch))
    ops = bench.operands(shape, precision)
    ops.fill(np.random.default_rng(11))
    for alpha, beta in verify.CHECKS:
        results = []
        for _ in range(4):
            results.append(run_gemm(bench, kernel, ops, alpha, beta))
            held = kernel.held()
            assert held.flag_bytes >= 4 * kernel.describe(shape.m, shape.n, shape.k).flag_words > 0
            flags = np.empty(held.flag_bytes // 4, dtype=np.uint32)
            bench.gpu.drv.memcpy_dtoh(flags, held.flags)
            assert not flags.any(), f"stream-K flags not back at zero after the launch: {np.flatnonzero(flags)}"
        for other in results[1:]:
            assert np.array_equal(results[0].view(np.uint32), other.view(np.uint32)), "results differ between runs"
        # Only the stream-K tiles add in another order than the whole-tile kernel's: rounding apart.
        reference = run_gemm(bench, whole, ops, alpha, beta)
        scale = np.abs(reference).max()
        assert np.abs(results[0] - reference).max() <= 1e-5 * scale * np.sqrt(shape.k)


@pytest.mark.parametrize("precision, params", [POINTS[0], POINTS[1]], ids=["fp16", "bf16-x2"])
def test_stream_k_harness_matches_reference(tmp_path, bench, precision, params):
    source = render_kernel(make_config("hopper", params, precision, bench.gpu.info.arch), harness=True)
    exe = nvcc_compile(source, tmp_path / "gemm", None, "-gencode=arch=compute_90a,code=sm_90a")
    for shape in SHAPES[:2]:
        proc = subprocess.run([str(exe), str(shape.m), str(shape.n), str(shape.k), "3"], capture_output=True,
                              text=True, timeout=300, check=False)
        report = proc.stdout + proc.stderr
        assert proc.returncode == 0 and report.count("PASS") == 3, f"{shape}:\n{report}"
