"""The emitted launcher's rules, without a GPU: each point's file is built as a shared library
and its <launcher>_describe (host arithmetic only) is asked what a launch needs -- the grid, the
workspace (split-K counters and partial tiles, stream-K flags and slots, packed operands) and
which shapes are refused -- over sequences of shapes, and checked against the indices the kernels
use, worked out here independently. The GPU tests (test_gpu_sequence.py) run the same sequences.
"""

import zlib

import pytest
from conftest import call_sequence, launcher_of, slow_after, split_points

from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.points import NAMED_POINTS, resolve_point
from gemmgen.measure.launcher import ShapeRefused

pytestmark = pytest.mark.nvcc

H100_SMS = 132
ESIZE = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}


def cdiv(a, b):
    return -(-a // b)


def grid(launcher, m, n, k):
    return tuple(launcher.describe(m, n, k, resident=H100_SMS).grid)


def test_grid_covers_c_with_tiles_x_over_n_and_y_over_m():
    v4 = launcher_of(resolve_point("v4"))  # 128 x 128 tiles
    assert grid(v4, 1000, 300, 7) == (3, 8, 1)
    assert grid(v4, 256, 256, 1) == (2, 2, 1)
    assert grid(v4, 1, 1, 1) == (1, 1, 1)
    assert grid(v4, 129, 4096, 5) == (32, 2, 1)
    assert grid(launcher_of(resolve_point("v1")), 17, 33, 1) == (3, 2, 1)  # 16 x 16 tiles
    rect = launcher_of(make_config("wmma", {"BM": 128, "BN": 32, "WARPS_M": 4, "WARPS_N": 1}))
    assert grid(rect, 1024, 1024, 64) == (32, 8, 1)


def test_shapes_the_kernel_cannot_take_are_refused_with_the_reason():
    v4 = launcher_of(resolve_point("v4"))
    for m, n, k in ((0, 1, 1), (1, 0, 1), (1, 1, 0), (-5, 4, 4)):
        with pytest.raises(ShapeRefused, match=rf"refused M={m} N={n} K={k}: M, N and K must be >= 1"):
            v4.describe(m, n, k, resident=H100_SMS)
    assert grid(v4, 65535 * 128, 1, 1) == (1, 65535, 1)
    with pytest.raises(ShapeRefused, match=r"M must be <= 8388480 \(at most 65535 blocks along y\)"):
        v4.describe(65535 * 128 + 1, 1, 1, resident=H100_SMS)
    hopper = launcher_of(NAMED_POINTS["hopper_fp16"].config("sm_90"))  # persistent: no limit along y
    assert grid(hopper, 2**31 - 1, 1, 1) == (H100_SMS, 1, 1)
    assert grid(hopper, 2**31 - 1, 2**31 - 1, 2**31 - 1) == (H100_SMS, 1, 1)


def test_split_k_grid_and_workspace():
    splitk = launcher_of(resolve_point("splitk"))  # 16 x 64 tiles, 8 splits
    info = splitk.describe(16, 4096, 4096)
    assert tuple(info.grid) == (64, 1, 8)
    assert info.flag_words == 64  # a counter per tile
    assert info.partial_bytes == 64 * 8 * 16 * 64 * 4  # 8 partial tiles per tile
    assert (info.packed_a_bytes, info.packed_b_bytes, info.stores_c) == (0, 0, 0)
    big = launcher_of(make_config("warp", {**NAMED_POINTS["v4"].params, "split_k": 4})).describe(4095, 4097, 1)
    assert tuple(big.grid) == (33, 32, 4) and big.flag_words == 1056 and big.partial_bytes == 1056 * 4 * 128 * 128 * 4


def test_no_workspace_without_state():
    """A named point of each family without split-K or stream-K (the builds of test_build's every
    run): no flags, no partial sums, one layer of blocks."""
    for point in ("v1", "v2", "v3", "v4", "v6", "fastgemm", "mma_fp16", "mma_bf16"):
        config = resolve_point(point)
        assert config.geometry.split_k == 1 and not config.geometry.stream_k
        info = launcher_of(config).describe(4095, 4097, 4093, 1, 1, 0.0, 2, resident=H100_SMS)
        assert (info.flag_words, info.partial_bytes) == (0, 0), point
        assert info.grid[2] == 1, point


# ---- the workspace over sequences of shapes -------------------------------------------------------

def kernel_needs(config, m, n, k, a_off, b_off, grid_x):
    """What the kernel touches, from its own indexing (templates), worked out independently:
    (flag words, partial bytes, packed A bytes, packed B bytes)."""
    g, esize = config.geometry, ESIZE[config.precision]
    tiles = cdiv(m, g.tile_m) * cdiv(n, g.tile_n)
    flags = partials = 0
    if g.split_k > 1:  # gg_splitk_reduce: counters[tile], float4 partials[tiles][splits][tile / 4]
        flags, partials = tiles, tiles * g.split_k * g.tile_m * g.tile_n * 4
    if g.stream_k:  # sk_flags[block * consumers + consumer], sk_slots[block][BM * BN / 4]
        flags, partials = grid_x * config.params["consumers"], grid_x * g.tile_m * g.tile_n * 4
    packed_a = packed_b = 0
    if g.pack_vec:  # gg_pack_rows: zero-padded rows of roundup(cols, pack_vec), 256-byte parts
        v = g.pack_vec
        if k % v or (a_off * esize) % 16:
            packed_a = cdiv(m * cdiv(k, v) * v * esize, 256) * 256
        if n % v or (b_off * esize) % 16:
            packed_b = cdiv(k * cdiv(n, v) * v * esize, 256) * 256
    return flags, partials, packed_a, packed_b


def stateful_configs():
    points = split_points()
    configs = {label: make_config("warp", params, "fp32", "sm_90") for label, params in points.items()}
    hopper = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4}
    configs["hopper_sk"] = make_config("hopper", {**hopper, "streamk": 1}, "fp16", "sm_90")
    configs["hopper_x2_sk"] = make_config("hopper", {**hopper, "cluster": 2, "streamk": 1, "swizzle": 8}, "bf16",
                                          "sm_90")
    configs["hopper_tf32_sk"] = make_config("hopper", {**hopper, "streamk": 1}, "tf32", "sm_90")
    configs["mma_fp16"] = NAMED_POINTS["mma_fp16"].config("sm_90")
    configs["mma_tf32"] = NAMED_POINTS["mma_tf32"].config("sm_90")
    return configs


STATEFUL = stateful_configs()
# every run: split-K (the named point), stream-K with a cluster (test_hopper's stream-K point) and
# mma's stages; the rest in the slow run
EVERY_RUN = ["splitk", "hopper_x2_sk", "mma_fp16"]


@pytest.mark.parametrize("label", slow_after(len(EVERY_RUN), EVERY_RUN + sorted(set(STATEFUL) - set(EVERY_RUN))))
def test_every_launch_of_a_sequence_gets_the_workspace_its_kernel_uses(label):
    """Over 30 calls in an order that grows and shrinks, each launch is given at least the flags
    and partial sums its kernel indexes, and exactly the packed copies its pack kernel writes. The
    flags are a buffer of their own (gg_workspace), so a launch with more tiles than the last
    never finds old partial sums where its counters are: the bug of the old single workspace."""
    config = STATEFUL[label]
    launcher = launcher_of(config)
    esize = ESIZE[config.precision]
    for m, n, k, a_off, b_off, c_off, _, beta in call_sequence(seed=zlib.crc32(label.encode())):
        info = launcher.describe(m, n, k, 256 + a_off * esize, 512 + b_off * esize, beta, 768 + 4 * c_off,
                                 resident=H100_SMS)
        flags, partials, packed_a, packed_b = kernel_needs(config, m, n, k, a_off, b_off, info.grid[0])
        assert info.flag_words >= flags and info.partial_bytes >= partials, (m, n, k)
        assert (info.packed_a_bytes, info.packed_b_bytes) == (packed_a, packed_b), (m, n, k, a_off, b_off)
        if config.geometry.split_k > 1:
            assert tuple(info.grid) == (cdiv(n, config.geometry.tile_n), cdiv(m, config.geometry.tile_m),
                                        config.geometry.split_k)


def test_the_launcher_keeps_one_workspace_per_stream_and_device():
    source = render_kernel(resolve_point("splitk"))
    assert "if (slot->device == device && slot->stream == stream && slot->thread == thread)" in source
    assert ("gg_splitk_needs(grid_x * grid_y * o.batch, gg_kernel::split_k, 1024, out.flag_words, "
            "out.partial_bytes);") in source
    # a buffer too small is replaced once the stream's queued launches are done; new flags are zeroed
    assert "cudaStreamSynchronize(slot.stream)" in source
    assert "err = cudaMemsetAsync(slot.base, 0, grown.flag_bytes, slot.stream);" in source
    assert "counters[tile] = 0;  // every split has arrived: clean for the next launch" in source


def test_two_launchers_link_into_one_program_under_their_own_names(tmp_path):
    """-DGEMMGEN_LAUNCHER names the launcher and every function beside it, so two emitted files
    link into one program; its main() asks both (host arithmetic only: it runs without a GPU)."""
    import subprocess

    from conftest import nvcc_compile

    from gemmgen.build.nvcc import find_tool

    objects = []
    for point, name in (("v4", "gemm_v4"), ("splitk", "gemm_splitk")):
        cu = tmp_path / f"{point}.cu"
        cu.write_text(render_kernel(resolve_point(point)))
        obj = tmp_path / f"{point}.o"
        proc = subprocess.run([find_tool("nvcc"), "-O3", "-arch=sm_90", f"-DGEMMGEN_LAUNCHER={name}", "-c", str(cu),
                               "-o", str(obj)], capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        objects.append(str(obj))
    main = """
#include <cstdio>
#include <cuda_runtime.h>
typedef struct { unsigned grid[3]; unsigned long long flag_words, partial_bytes, packed_a_bytes, packed_b_bytes;
                 int stores_c; } info_t;
extern "C" const char* gemm_v4_describe(int, int, int, const float*, const float*, float, const float*, int, info_t*);
extern "C" const char* gemm_splitk_describe(int, int, int, const float*, const float*, float, const float*, int, info_t*);
extern "C" cudaError_t gemm_v4(int, int, int, float, const float*, const float*, float, float*, cudaStream_t);
extern "C" cudaError_t gemm_splitk_plan(void**, int, int, int, float, const float*, const float*, float, float*, cudaStream_t);
extern "C" const char* gemm_v4_error(void);
int main()
{
    info_t a, b;
    gemm_v4_describe(1000, 300, 7, nullptr, nullptr, 0.0f, nullptr, 132, &a);
    gemm_splitk_describe(16, 4096, 4096, nullptr, nullptr, 0.0f, nullptr, 132, &b);
    printf("%u %u %u | %u %u %u %llu\\n", a.grid[0], a.grid[1], a.grid[2], b.grid[0], b.grid[1], b.grid[2], b.flag_words);
    const cudaError_t refused = gemm_v4(0, 1, 1, 1.0f, nullptr, nullptr, 0.0f, nullptr, 0);
    printf("%d %s\\n", (int)refused, gemm_v4_error());
    return gemm_splitk_plan == nullptr;
}
"""
    exe = nvcc_compile(main, tmp_path / "main", "sm_90", *objects)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=False).stdout.splitlines()
    assert out[0] == "3 8 1 | 64 1 8 64"
    assert out[1] == ("1 refused M=0 N=1 K=1: warp_128x128x8_w64x32_t8x8_b2_fp32: M, N and K must be >= 1")


@pytest.mark.slow
def test_stream_k_takes_every_sm_where_tiles_are_fewer():
    """A stream-K kernel's grid is the whole resident grid even at a thin shape, so that its tiles
    are shared out by k over every SM (its own split-K); without stream-K, one block per tile."""
    base = {"BM": 64, "BN": 128, "consumers": 1, "stages": 6}
    sk = launcher_of(make_config("hopper", {**base, "streamk": 1}, "fp16", "sm_90"))
    whole = launcher_of(make_config("hopper", base, "fp16", "sm_90"))
    info = sk.describe(16, 4096, 4096, resident=H100_SMS)
    assert tuple(info.grid) == (H100_SMS, 1, 1)
    assert info.flag_words == H100_SMS and info.partial_bytes == H100_SMS * 64 * 128 * 4
    assert tuple(whole.describe(16, 4096, 4096, resident=H100_SMS).grid) == (32, 1, 1)
    pair = launcher_of(make_config("hopper", {**base, "BM": 128, "consumers": 2, "cluster": 2, "streamk": 1}, "bf16",
                                   "sm_90"))
    assert tuple(pair.describe(128, 4096, 4096, resident=H100_SMS).grid) == (H100_SMS, 1, 1)


@pytest.mark.parametrize("point", ["v4", "mma_bf16", "hopper_fp16", "hopper_tf32"])
def test_the_library_says_its_precision(point):
    """<launcher>_precision names the element type of A and B, for callers that load the library
    by path (gemmgen.torch checks tensors against it)."""
    config = NAMED_POINTS[point].config("sm_90")
    assert launcher_of(config).precision == config.precision
