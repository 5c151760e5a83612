"""Split-K and block swizzle in the `warp` family, without a GPU: parameters and names (the optional
`_k` / `_g` parts), constraints at BM = 16, the emitted source (header, kernel signature,
launcher), and nvcc builds without spills. The launcher's grid and workspace: test_launcher.py.

The expected numbers are worked out by hand from the definitions in gemmgen/describe/families/warp.py and
templates/common.cuh.j2; the GPU tests (test_gpu_splitk.py) check the results themselves.
"""

import itertools
import re

import pytest
from conftest import assert_compiles_without_spills, build_all, split_points

from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.names import middle
from gemmgen.describe.points import NAMED_POINTS, point_spec, resolve_point
from gemmgen.errors import InvalidParameter, InvalidPoint

V4 = dict(NAMED_POINTS["v4"].params)
SMALL_M = {"BM": 16, "BN": 128, "BK": 16, "WM": 16, "WN": 64, "TM": 4, "TN": 8}


def warp(**params):
    return make_config("warp", {**V4, **params})


# ---- names --------------------------------------------------------------------------------------

@pytest.mark.parametrize("split_k, swizzle, suffix", [
    (8, 1, "_k8"), (1, 4, "_g4"), (16, 2, "_k16_g2"), (2, 16, "_k2_g16"), (1, 1, ""),
])
def test_split_and_swizzle_join_the_name_only_away_from_1(split_k, swizzle, suffix):
    config = make_config("warp", {**SMALL_M, "split_k": split_k, "swizzle": swizzle})
    assert config.name == f"warp_16x128x16_w16x64_t4x8_b2{suffix}_fp32"


def test_the_named_splitk_point():
    config = resolve_point("splitk")
    assert config.name == "warp_16x64x32_w16x16_t2x4_b2_k8_fp32"
    assert config.params["split_k"] > 1 and config.params["BM"] == 16
    assert NAMED_POINTS["splitk"].note


def test_name_parsing_both_forms_and_explicit_neutral_parts():
    # the short form gives the neutral values; writing them out names the same point
    assert point_spec("warp_128x128x8_w64x32_t8x8_b2_fp32")[2]["split_k"] == "1"
    assert point_spec("warp_128x128x8_w64x32_t8x8_b2_fp32")[2]["swizzle"] == "1"
    assert resolve_point("warp_128x128x8_w64x32_t8x8_b2_k1_g1_fp32") == resolve_point("v4")
    assert resolve_point("warp_128x128x8_w64x32_t8x8_b2_g8_fp32").params["swizzle"] == 8
    with pytest.raises(InvalidParameter, match="split_k must be one of: 1, 2, 4, 8, 16"):
        resolve_point("warp_128x128x8_w64x32_t8x8_b2_k3_fp32")
    with pytest.raises(InvalidParameter, match="unknown point"):  # the parts have a fixed order
        point_spec("warp_128x128x8_w64x32_t8x8_b2_g8_k4_fp32")


def test_every_split_and_swizzle_has_its_own_name():
    names = {warp(split_k=s, swizzle=g).name for s in (1, 2, 4, 8, 16) for g in (1, 2, 4, 8, 16)}
    assert len(names) == 25


def test_families_without_name_options_keep_their_format():
    for fam in FAMILIES.values():
        if not fam.name_options:
            assert middle(fam, fam.defaults) == fam.name_format.format(**fam.defaults)


# ---- constraints --------------------------------------------------------------------------------

def test_bm_16_thread_tiles():
    # 16 rows: WM = 16 with TM = 4 gives 4 thread rows, so WN / TN must be 8 (e.g. 64 / 8)
    config = make_config("warp", SMALL_M)
    assert config.geometry.threads == 64  # 1 x 2 warps of 16 x 64
    assert (config.derived["WTR"], config.derived["WTC"]) == (4, 8)
    # WM = 8: 2 warp rows, each 8 / 4 = 2 thread rows x 64 / 4 = 16 thread columns
    assert make_config("warp", {**SMALL_M, "WM": 8, "TN": 4, "BN": 64}).geometry.threads == 2 * 1 * 32
    with pytest.raises(InvalidPoint) as err:
        make_config("warp", {**SMALL_M, "WM": 32})
    assert "warp tile must divide block tile: BM=16 must be a multiple of WM=32" in err.value.violations
    with pytest.raises(InvalidPoint) as err:
        make_config("warp", {**SMALL_M, "TM": 8})  # (16/8)*(64/8) = 16 threads
    assert err.value.violations == ["a warp is 32 threads: (WM/TM)*(WN/TN) = (16/8)*(64/8) = 16, must be 32"]


@pytest.mark.parametrize("param, raw", [("split_k", 3), ("split_k", 32), ("swizzle", 0), ("swizzle", "x")])
def test_split_and_swizzle_values_are_checked(param, raw):
    with pytest.raises(InvalidParameter, match=f"{param} must be one of: 1, 2, 4, 8, 16"):
        warp(**{param: raw})


# ---- the emitted source -------------------------------------------------------------------------

def header_of(source: str) -> str:
    return source.split("#include", 1)[0]


def test_header_documents_split_and_workspace():
    header = header_of(render_kernel(resolve_point("splitk")))
    assert "grid = (ceil(N / 64), ceil(M / 16), 8);" in header
    assert "the last to finish adds them in split order" in header
    assert "a counter per C tile (zero before a launch, left zero by it)" in header
    assert "8 partial 16 x 64 fp32 tiles per C tile (gg_splitk_needs)" in header
    assert "The launcher below owns this workspace, one per stream and device (gg_slot)." in header
    assert "split_k=8, swizzle=1" in header
    plain = header_of(render_kernel(resolve_point("v4")))
    assert "grid = (ceil(N / 128), ceil(M / 128), 1);" in plain
    assert "workspace  : none" in plain


@pytest.mark.parametrize("point", sorted(NAMED_POINTS))
def test_every_kernel_takes_a_workspace_and_the_launcher_passes_one(point):
    config = resolve_point(point)
    source = re.sub(r"\s+", " ", render_kernel(config))  # on one line
    assert re.search(rf"{config.name}\((?:const __grid_constant__ CUtensorMap tma_a, .*)?int M, int N, int K, "
                     r"float alpha, .*\* __restrict__ C, (?:const float\* __restrict__ scale_a, const float\* "
                     r"__restrict__ scale_b, )?const gg_workspace ws\)", source)
    # the grid's z and the split-K workspace follow from split_k (gg_describe's if constexpr on it,
    # decided when the file is made: only the point's own code is left)
    if not config.geometry.persistent:
        assert f"static constexpr int split_k = {config.geometry.split_k};" in source
        assert ("out.grid[0] = (unsigned)grid_x, out.grid[1] = (unsigned)grid_y, "
                "out.grid[2] = (unsigned)(o.batch * gg_kernel::split_k);") in source
    assert re.search(r"<<<dim3\(p\.info\.grid\[0\], p\.info\.grid\[1\], p\.info\.grid\[2\]\), [^;]*>>>\( "
                     r"(?:p\.maps\.map\[0\], p\.maps\.map\[1\], (?:p\.maps\.map\[2\], )?(?:p\.maps\.map\[3\], )?)?"
                     r"p\.ops\.M, p\.ops\.N, "
                     r"p\.ops\.K, p\.ops\.alpha, p\.ops\.A, p\.ops\.B, p\.ops\.beta, p\.ops\.C, "
                     r"(?:p\.ops\.scale_a, p\.ops\.scale_b, )?ws\);", source)
    assert ("gg_splitk_needs(grid_x * grid_y * o.batch" in source) == (config.geometry.split_k > 1)
    assert "gg_kernel::split_k > 1" not in source


def test_split_and_swizzle_code_only_where_asked():
    def body(config):
        source = render_kernel(config)
        return source[source.index(f"{config.name}(int M"):source.index("#ifndef GEMMGEN_LAUNCHER")]

    def groups(source):  # the swizzle group the kernel asks for, if any
        return {int(g) for g in re.findall(r"gg_(?:block_swizzle\(|tile_origin<BM, BN, )(\d+)", source)} - {1}

    plain = body(resolve_point("v4"))
    assert "const int k_begin = 0, k_end = split_end;" in plain and not groups(plain)  # SPLIT_K > 1 ? ... : 0
    assert "gg_splitk" not in plain  # the split-K code is trimmed away (its if constexpr is false)
    split = body(warp(split_k=4))
    assert "if constexpr (SPLIT_K" not in split  # true: the code stands alone
    assert "const int k_begin = split_begin, k_end = split_end;" in split
    assert "\n    gg_splitk_range<BK>(K, split_begin, split_end);" in split
    assert "\n    if (!gg_splitk_reduce<TM * TN, THREADS>(&acc[0][0], ws))\n        return;" in split
    assert not groups(split)
    swizzled = body(warp(swizzle=8))
    assert groups(swizzled) == {8} and "gg_splitk" not in swizzled


def test_common_helpers_keep_their_signatures():
    """Other families call these; split-K added helpers beside them (in the shared header, which
    the untrimmed source holds whole)."""
    source = render_kernel(resolve_point("v4"), untrimmed=True)
    for signature in (
        "GG_DEVICE void gg_load(T* v, const T* __restrict__ P, int ld, int rows, int cols, int r, int c, bool vec_ok)",
        "GG_DEVICE void gg_vload(T* dst, const T* src)",
        "GG_DEVICE void gg_vstore(T* dst, const T* src)",
        ("GG_DEVICE void gg_store_c(float* __restrict__ C, int ldc, int rows, int cols, int r, int c, const float* acc,\n"
         "                          float alpha, float beta, bool vec_ok)"),
    ):
        assert signature in source, signature
    for helper in ("gg_block_swizzle(unsigned group, int& tile_m, int& tile_n)",
                   "gg_splitk_range(int K, int& k_begin, int& k_end)",
                   "gg_splitk_reduce(float* acc, const gg_workspace& ws)", "__ldcg(", "__stcg("):
        assert helper in source, helper


# ---- a model of the index arithmetic (the CUDA helpers, line for line, in Python) ----------------

def cdiv(a, b):
    return -(-a // b)


def splitk_range(k, splits, bk, z):
    kc = cdiv(cdiv(k, splits), bk) * bk
    begin = min(k, z * kc)
    return begin, min(k, begin + kc)


def block_swizzle(group, grid_n, grid_m, bx, by):
    block_id = by * grid_n + bx
    first_m = block_id // (group * grid_n) * group
    rows = min(grid_m - first_m, group)
    in_group = block_id - first_m * grid_n
    return first_m + in_group % rows, in_group // rows


@pytest.mark.parametrize("k", [1, 3, 16, 17, 65, 100, 4093, 4096])
@pytest.mark.parametrize("splits", [2, 4, 8, 16])
@pytest.mark.parametrize("bk", [4, 8, 16, 32])
def test_split_ranges_cover_k_once_on_bk_boundaries(k, splits, bk):
    ranges = [splitk_range(k, splits, bk, z) for z in range(splits)]
    assert ranges[0][0] == 0 and ranges[-1][1] == k
    for (b0, e0), (b1, _) in itertools.pairwise(ranges):
        assert e0 == b1 and b0 <= e0
    assert all(b % bk == 0 or b == k for b, _ in ranges)
    if k <= bk * (splits - 1):  # KC >= BK, so the last split starts at or past K
        assert ranges[-1][0] == ranges[-1][1] == k  # empty (and it still takes part)


def test_split_range_examples():
    # K = 65, 8 splits, BK = 16: KC = ceil(ceil(65 / 8) / 16) * 16 = 16; splits 5, 6, 7 are empty
    assert [splitk_range(65, 8, 16, z) for z in range(8)] == [
        (0, 16), (16, 32), (32, 48), (48, 64), (64, 65), (65, 65), (65, 65), (65, 65)]
    assert splitk_range(4096, 8, 16, 7) == (3584, 4096)


@pytest.mark.parametrize("grid_n, grid_m", [(1, 1), (3, 1), (1, 7), (33, 32), (5, 9), (64, 64)])
@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
def test_block_swizzle_is_a_permutation_in_grouped_order(group, grid_n, grid_m):
    order = [block_swizzle(group, grid_n, grid_m, bx, by) for by in range(grid_m) for bx in range(grid_n)]
    assert sorted(order) == [(m, n) for m in range(grid_m) for n in range(grid_n)]
    if group == 1:
        assert order == [(m, n) for m in range(grid_m) for n in range(grid_n)]
    # the first group walks min(group, grid_m) rows of column 0, then column 1
    rows = min(group, grid_m)
    assert order[:rows] == [(m, 0) for m in range(rows)]
    if grid_n > 1:
        assert order[rows] == (0, 1)


# ---- nvcc ---------------------------------------------------------------------------------------

BUILD_POINTS = split_points()  # the points test_gpu_splitk.py runs
BUILD_ARCHS = ("sm_80", "sm_90")


@pytest.fixture(scope="module")
def builds():
    return build_all({(p, a): make_config("warp", BUILD_POINTS[p], arch=a) for p in BUILD_POINTS for a in BUILD_ARCHS})


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("arch", BUILD_ARCHS)
@pytest.mark.parametrize("point", sorted(BUILD_POINTS))
def test_split_and_swizzle_points_compile_without_spills(builds, point, arch):
    config, result = builds[(point, arch)]
    assert_compiles_without_spills(config, result)
