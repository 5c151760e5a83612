"""The mma family without a GPU: its constraints and derived geometry, the PTX it emits for each
precision, and that its variants compile for sm_80 and sm_90 without spilling."""

import pytest

from gemmgen.build.nvcc import build_kernel, kernel_usage
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.errors import InvalidPoint

DEFAULT = {"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2}


def test_name_and_geometry_of_the_default_point():
    c = make_config("mma", DEFAULT, "fp16")
    assert c.name == "mma_128x128x32_w2x2_s3_f2_fp16"
    g = c.geometry
    assert g.block == (128, 1, 1) and (g.tile_m, g.tile_n) == (128, 128)
    # 3 stages of A (128 x 32 halves) and B (32 x 128 halves), unpadded (swizzled), 2 bytes each
    assert g.smem_bytes == 3 * (128 * 32 + 32 * 128) * 2 == 49152
    assert (c.derived["MT"], c.derived["NT"]) == (4, 8)  # a 64x64 warp tile of m16n8 tiles


def test_tf32_tiles_are_unpadded_floats():
    c = make_config("mma", DEFAULT, "tf32")
    assert c.geometry.smem_bytes == 3 * (128 * 32 + 32 * 128) * 4


@pytest.mark.parametrize("params, precision, expected", [
    ({"BM": 32, "WARPS_M": 4}, "fp16", "BM=32 must be a multiple of 16*WARPS_M=64"),
    ({"BN": 32, "WARPS_N": 4}, "fp16", "BN=32 must be a multiple of 16*WARPS_N=64"),
    ({"BK": 8}, "fp16", "a fp16 mma is 16 deep: BK=8 must be a multiple of mma K=16"),
    ({"BM": 256, "BN": 128, "WARPS_M": 2, "WARPS_N": 1}, "bf16", "(WM/16)*(WN/8)*4 = 8*16*4 = 512 registers"),
])
def test_constraints_name_the_values(params, precision, expected):
    with pytest.raises(InvalidPoint) as err:
        make_config("mma", {**DEFAULT, **params}, precision)
    assert expected in str(err.value)


def test_tf32_takes_eight_deep_tiles():
    assert make_config("mma", {**DEFAULT, "BK": 8}, "tf32").derived["MMA_K"] == 8


@pytest.mark.parametrize("precision, instruction", [
    ("fp16", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    ("bf16", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"),
    ("tf32", "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
])
def test_source_uses_the_precisions_instruction(precision, instruction):
    source = render_kernel(make_config("mma", DEFAULT, precision))
    assert instruction in source
    assert "cp.async.cg.shared.global" in source and "ldmatrix.sync.aligned.m8n8.x4" in source
    # tf32 feeds raw fp32 bits to the mma (it truncates them): no conversions
    assert "cvt.rna.tf32.f32" not in source


def test_frags_one_does_not_double_buffer():
    one = render_kernel(make_config("mma", {**DEFAULT, "frags": 1}, "fp16"))
    two = render_kernel(make_config("mma", DEFAULT, "fp16"))
    assert "STAGES = 3, FRAGS = 1;" in one and "STAGES = 3, FRAGS = 2;" in two
    assert "constexpr bool DB = FRAGS == 2 && !STAGE_IN_REGS;" in one


VARIANTS = [
    ("fp16", DEFAULT, "sm_90"),
    ("fp16", DEFAULT, "sm_80"),
    ("bf16", {**DEFAULT, "frags": 1, "stages": 4}, "sm_90"),
    ("tf32", {**DEFAULT, "frags": 1}, "sm_90"),
    ("tf32", {**DEFAULT, "BK": 16, "frags": 1, "stages": 2}, "sm_80"),
    ("fp16", {"BM": 64, "BN": 64, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 5, "frags": 2}, "sm_90"),
    # the fastest points of the H100 tuning at 4096^3
    ("fp16", {"BM": 128, "BN": 256, "BK": 64, "WARPS_M": 2, "WARPS_N": 4, "stages": 3, "frags": 2}, "sm_90"),
    ("tf32", {"BM": 128, "BN": 256, "BK": 16, "WARPS_M": 2, "WARPS_N": 4, "stages": 5, "frags": 2}, "sm_90"),
    # narrow rows (2 and 4 chunks: the swizzle's D = 4 and 2); one warp, whose copies step fewer rows
    # than the swizzle's period
    ("fp16", {"BM": 64, "BN": 32, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 1}, "sm_90"),
    ("fp16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 1, "stages": 3, "frags": 1}, "sm_90"),
    # split-K for thin shapes, on both targets the issue names (sm_80 / sm_89 users)
    ("fp16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "stages": 4, "frags": 2, "split_k": 8},
     "sm_89"),
    ("tf32", {"BM": 32, "BN": 128, "BK": 16, "WARPS_M": 1, "WARPS_N": 4, "stages": 4, "frags": 1, "split_k": 4},
     "sm_80"),
]


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("precision, params, arch", VARIANTS,
                         ids=[f"{p}-{a}-{i}" for i, (p, _, a) in enumerate(VARIANTS)])
def test_variant_compiles_without_spills(precision, params, arch):
    config = make_config("mma", params, precision, arch)
    result = build_kernel(config)
    assert result.ok, result.log
    usage = kernel_usage(config, result)
    assert usage.spill_store_bytes == 0 and usage.spill_load_bytes == 0, usage
    assert usage.registers <= 255


def test_split_k_joins_the_name_grid_and_workspace_only_above_1():
    split = make_config("mma", {**DEFAULT, "split_k": 4, "swizzle": 8}, "bf16")
    assert split.name == "mma_128x128x32_w2x2_s3_f2_k4_g8_bf16"
    assert make_config("mma", {**DEFAULT, "split_k": 1}, "bf16").name == "mma_128x128x32_w2x2_s3_f2_bf16"
    assert split.geometry.split_k == 4
    source = render_kernel(split)
    assert "constexpr int WARPS_N = 2, THREADS = 128;" in source  # SPLIT_K: every use decided, trimmed
    assert "\n    gg_splitk_range<BK>(K, split_begin, split_end);" in source  # if constexpr (SPLIT_K > 1), decided
    assert "const int k_begin = split_begin, k_end = split_end;" in source  # SPLIT_K > 1 ? split_begin : 0
    assert "gg_splitk_reduce<FI * FJ * 4, THREADS>(&acc[0][0][0], ws)" in source
    plain = render_kernel(make_config("mma", DEFAULT, "bf16"))
    assert "const int k_begin = 0, k_end = split_end;" in plain and "gg_splitk" not in plain


def test_needs_sm80():
    with pytest.raises(InvalidPoint) as err:
        make_config("mma", DEFAULT, "fp16", "sm_75")
    assert "family mma needs sm_80 or newer (cp.async, ldmatrix, mma.sync with bf16/tf32); target is sm_75" in str(
        err.value)
