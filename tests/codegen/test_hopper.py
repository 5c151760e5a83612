"""The hopper family without a GPU: its constraints (sm_90 only, registers, tiles, shared memory)
with their messages, the geometry and tensor-map boxes it derives, the PTX it emits for each
precision, the TMA-store epilogue and its launcher, stream-K's schedule, workspace and launcher,
A stored K x M (trans tn, tt: its tile, wgmma's transpose bits, its tensor map and packing), the
sm_90a build, and -- where nvdisasm is installed -- that the SASS holds HGMMA (transposing the
operands that lie MN-major), TMA loads and TMA stores."""

import re
import subprocess

import pytest
from conftest import launcher_of, nvcc_compile, slow_after

from gemmgen.build.nvcc import build_kernel, find_tool, kernel_usage
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.points import NAMED_POINTS, point_spec, resolve_point
from gemmgen.errors import InvalidParameter, InvalidPoint, ToolNotFound
from gemmgen.measure.launcher import ShapeRefused

DEFAULT = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 1}


def test_name_geometry_and_boxes_of_the_default_point():
    c = make_config("hopper", DEFAULT, "fp16", "sm_90")
    assert c.name == "hopper_128x256_c2_s4_fp16"
    assert c.build_arch.name == "sm_90a" and c.arch.name == "sm_90"
    g = c.geometry
    assert g.block == (384, 1, 1) and (g.tile_m, g.tile_n) == (128, 256) and g.persistent
    # 4 stages of A (128 rows of 64 halves) and B (64 rows of 256 halves) and their barriers, two
    # 16 x 32 fp32 C staging boxes per consumer warp, alignment slack: 230464 of sm_90's 232448 bytes
    assert g.smem_bytes == 4 * (128 * 64 * 2 + 64 * 256 * 2 + 16) + 2 * 4 * 2 * 16 * 32 * 4 + 1024 == 230464
    assert g.tma.box_a == (64, 128) and g.tma.box_b == (64, 64)
    assert g.tma.box_c == (32, 16)  # a warp's 16 rows x 32 fp32 columns: one 128-byte swizzled row per C row
    assert c.derived["B_LOADS"] == 4 and c.derived["ACC"] == 128


def grid(launcher, m, n, k, resident):
    return tuple(launcher.describe(m, n, k, resident=resident).grid)


@pytest.mark.nvcc
def test_persistent_grid_is_one_block_per_sm_at_most_one_per_tile():
    launcher = launcher_of(make_config("hopper", DEFAULT, "fp16", "sm_90"))
    assert grid(launcher, 4096, 4096, 4096, 132) == (132, 1, 1)
    assert grid(launcher, 128, 512, 64, 132) == (2, 1, 1)
    assert grid(launcher, 1, 1, 1, 132) == (1, 1, 1)


@pytest.mark.nvcc
def test_cluster_grid_pairs_tile_rows_and_is_a_multiple_of_the_cluster():
    c = NAMED_POINTS["hopper_tf32"].config("sm_90")  # a cluster of 2 that every run builds (test_build)
    assert c.name == "hopper_128x256_c2_s4_g8_x2_tf32"
    launcher = launcher_of(c)
    assert grid(launcher, 4096, 4096, 64, 132) == (132, 1, 1)
    assert grid(launcher, 4096, 4096, 64, 131) == (130, 1, 1)
    assert grid(launcher, 129, 256, 64, 132) == (2, 1, 1)  # 2 tile rows, one unit
    assert grid(launcher, 1, 1, 1, 132) == (2, 1, 1)  # the second block's tile is empty, but it loads B
    with pytest.raises(ShapeRefused, match="not one cluster of 2 blocks fits on this GPU"):
        launcher.describe(1, 1, 1, resident=1)
    source = render_kernel(c)
    assert "__cluster_dims__(2, 1, 1)" in source and ".multicast::cluster" in source
    assert "mapa.shared::cluster.u32" in source and "barrier.cluster.arrive" in source


def test_pingpong_consumers_take_whole_tiles_in_turn():
    c = make_config("hopper", {**DEFAULT, "BN": 128, "stages": 6, "schedule": "pingpong"}, "fp16", "sm_90")
    assert c.name == "hopper_128x128_c2_s6_pingpong_fp16"
    assert c.derived["ROWS"] == 128 and c.derived["MI"] == 2 and c.derived["ACC"] == 128
    source = render_kernel(c)
    # one warpgroup frees a stage; the consumers take turns through named barriers 1 and 2 (the
    # SASS test below finds them in ping-pong code only)
    assert "gg_bar_init(empty_bar + 8 * s, CLUSTER * (HP_PINGPONG ? 1 : CONSUMERS) * 4);" in source
    assert "constexpr bool HP_PINGPONG = true;" in source
    assert "gg_named_sync<256>(1 + consumer);" in source and "gg_named_arrive<256>(2 - consumer);" in source
    coop = render_kernel(make_config("hopper", DEFAULT, "fp16", "sm_90"))
    assert "constexpr bool HP_PINGPONG = false;" in coop and "constexpr int CONSUMERS = 2;" in coop


def test_tf32_cluster_shares_out_the_b_chunks():
    c = make_config("hopper", {**DEFAULT, "cluster": 2}, "tf32", "sm_90")
    assert c.geometry.tma.box_b == (32, 32) and c.derived["B_LOADS"] == 8
    assert "j < (rank + 1) * (B_LOADS / CLUSTER)" in render_kernel(c)


def test_tf32_computes_c_transposed_with_b_fragments_from_registers():
    c = make_config("hopper", DEFAULT, "tf32", "sm_90")
    g, d = c.geometry, c.derived
    # B is read as it lies (K x N, N inner) in 128-byte chunks of 32 columns, never copied when aligned
    assert g.tma.box_a == (32, 128) and g.tma.box_b == (32, 32)
    assert d["BK"] == 32 and d["B_LOADS"] == 8 and d["SWAP_AB"]
    # each consumer takes 128 of the 256 columns (two m64 fragments) over all 128 rows (wgmma N)
    assert (d["ROWS"], d["COLS"], d["MI"], d["WGMMA_N"], d["ACC"]) == (128, 128, 2, 128, 128)
    source = render_kernel(c)
    assert "{ %65, %66, %67, %68 }, %69, acc, 1, 1;" in source  # A from four registers
    assert "gg_lds32(base + frag_at[r] + mi * 2 * B_BOX_BYTES + ks * 1024)" in source
    assert "unsigned frag[2][KSTEPS][MI][4];" in source  # two fragment buffers: one k tile in flight
    assert "constexpr bool HP_SWAP = true;" in source and "constexpr bool HP_TF32 = true;" in source
    wide = make_config("hopper", {**DEFAULT, "BM": 256, "BN": 128}, "tf32", "sm_90").derived
    assert (wide["COLS"], wide["MI"], wide["WGMMA_N"], wide["ACC"]) == (64, 1, 256, 128)


def test_tf32_consumers_split_columns():
    with pytest.raises(InvalidPoint, match="each consumer warpgroup's columns must be whole m64 wgmma tiles"):
        make_config("hopper", {**DEFAULT, "BN": 64}, "tf32", "sm_90")
    assert make_config("hopper", {**DEFAULT, "BN": 64, "BM": 128}, "fp16", "sm_90").derived["ROWS"] == 64
    with pytest.raises(InvalidPoint, match=r"\(BN/consumers/64\)\*\(BM/2\) = 2\*128 = 256 registers"):
        make_config("hopper", {**DEFAULT, "BM": 256}, "tf32", "sm_90")


def packed(launcher, m, n, k, a=0, b=0):
    info = launcher.describe(m, n, k, a, b, resident=132)
    return info.packed_a_bytes, info.packed_b_bytes


@pytest.mark.nvcc
def test_packs_only_misaligned_operands():
    fp16 = launcher_of(make_config("hopper", DEFAULT, "fp16", "sm_90"))
    assert packed(fp16, 4096, 4096, 4096) == (0, 0)
    assert packed(fp16, 4096, 4096, 4096, a=2) == (4096 * 4096 * 2, 0)  # A's pointer not 16-byte aligned
    assert packed(fp16, 100, 33, 64) == (0, -(-64 * 40 * 2 // 256) * 256)  # N % 8: B's rows misaligned
    assert packed(fp16, 100, 32, 63) == (-(-100 * 64 * 2 // 256) * 256, 0)  # K % 8: A's rows
    tf32 = launcher_of(NAMED_POINTS["hopper_tf32"].config("sm_90"))  # a tf32 kernel every run builds
    assert packed(tf32, 4096, 4096, 4096) == (0, 0)  # B is read as it lies, never copied when aligned
    assert packed(tf32, 128, 250, 64) == (0, -(-64 * 252 * 4 // 256) * 256)  # N % 4: rows misaligned


@pytest.mark.parametrize("arch, expected", [
    ("sm_89", "family hopper runs on sm_90 only (TMA, wgmma and setmaxnreg; built for sm_90a, whose code runs "
              "on sm_90 only); target is sm_89"),
    ("sm_100", "family hopper runs on sm_90 only"),
    ("sm_80", "target is sm_80"),
])
def test_other_targets_are_refused_with_the_reason(arch, expected):
    with pytest.raises(InvalidPoint) as err:
        make_config("hopper", DEFAULT, "fp16", arch)
    assert expected in str(err.value)


@pytest.mark.parametrize("params, precision, expected", [
    ({"BM": 64, "consumers": 2}, "fp16", "BM=64 must be a multiple of 64*consumers=128"),
    ({"BM": 256, "BN": 256}, "bf16", "(BM/consumers/64)*(BN/2) = 2*128 = 256 registers"),
    ({"BM": 128, "BN": 256, "consumers": 1}, "fp16", "= 2*128 = 256 registers"),
    ({"BN": 192, "stages": 6}, "fp16", "exceeds sm_90's limit"),
    # the C staging (8 consumer warps x 2 x 2 KB) leaves no room for a fifth stage of 128x256 or 128x192
    ({"stages": 5}, "fp16", "shared memory = 279632 bytes exceeds sm_90's limit of 232448 bytes per block"),
    ({"BN": 192, "stages": 5}, "bf16", "shared memory = 238672 bytes exceeds sm_90's limit of 232448 bytes"),
    ({"BN": 192, "cluster": 2}, "fp16", "B boxes=3 must be a multiple of cluster=2"),
    ({"consumers": 1, "BN": 128, "schedule": "pingpong"}, "fp16", "consumers=1 must be 2"),
    ({"BN": 256, "schedule": "pingpong"}, "fp16", "= 2*128 = 256 registers"),
    ({"BN": 64, "BM": 128, "cluster": 2}, "bf16", "B boxes=1 must be a multiple of cluster=2"),
    ({"BN": 128, "schedule": "pingpong", "streamk": 1}, "fp16", "schedule=pingpong's alternating tiles do not "
                                                                "follow: use schedule=coop, or streamk=0"),
    ({"overlap": 1}, "tf32", "C^T = B^T A^T (tf32, or swap=1) stores its registers directly: use overlap=0 there"),
    ({"BN": 128, "stages": 6, "schedule": "pingpong", "overlap": 1}, "fp16", "schedule=pingpong overlaps whole "
                                                                            "tiles already: use overlap=0"),
    ({"BN": 128, "consumers": 1, "overlap": 1}, "bf16", "overlap=1 holds half of one m64 block of accumulators "
                                                        "per consumer: BM/consumers = 128 must be 64"),
    ({"BN": 192, "stages": 3, "overlap": 1}, "fp16", "overlap=1 is tested only with tile halves of whole 64-column "
                                                     "chunks: BN=192 must be a multiple of 128"),
    # A stored K x M: tf32 has no transpose bit; swap=1 reads A's 64-column chunks as wgmma's N
    ({"trans": "tn"}, "tf32", "tf32 computes trans=nn into fp32 C only so far (its B^T fragments are loaded from an "
                              "N-major B; wgmma transposes 16-bit operands only, so A stored K x M (trans=tn, tt) "
                              "takes fp16 or bf16)"),
    ({"BM": 32, "swap": 1, "trans": "tt"}, "bf16", "swap=1 reads A stored K x M (trans=tt) as wgmma's N-major B "
                                                   "operand, in the 128-byte swizzle's 64-column chunks of M: BM=32 "
                                                   "must be a multiple of 64 (BM=16 and 32 take trans=nn or nt)"),
    ({"BM": 16, "BN": 128, "consumers": 1, "swap": 1, "trans": "tn"}, "fp16", "BM=16 must be a multiple of 64"),
    # fp8's wgmma takes A and B K-major only: B stored N x K and A stored M x K
    ({}, "e4m3", "e4m3's wgmma reads A and B K-major only (8-bit types have no transpose bit): it computes "
                 "trans=nt (B stored N x K, as torch's linear weight), not trans=nn"),
    ({"trans": "tt", "out": "bf16"}, "e4m3", "not trans=tt"),
    ({"BM": 64, "swap": 1, "trans": "tn"}, "e4m3", "not trans=tn"),
    # promotion: FP8 only, beside the accumulators, without overlap's stores in the k loop
    ({"promote": 1}, "fp16", "promote=1 adds k tiles' sums in fp32 for FP8, whose tensor cores accumulate in "
                             "about 14 bits; fp16's accumulate in fp32 already: use promote=0"),
    ({"promote": 4, "trans": "nt"}, "e4m3", "promote=4 holds an interval's sums beside the accumulators: 2*128 = 256 "
                                            "registers"),
    ({"BN": 128, "promote": 2, "overlap": 1, "trans": "nt"}, "e4m3", "promote=2 waits for an interval's wgmmas, "
                                                                      "where overlap=1 stores a box per k tile: use "
                                                                      "overlap=0"),
])
def test_constraints_name_the_values(params, precision, expected):
    with pytest.raises(InvalidPoint) as err:
        make_config("hopper", {**DEFAULT, **params}, precision, "sm_90")
    assert expected in str(err.value)


@pytest.mark.parametrize("precision, instruction", [
    ("fp16", "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16"),
    ("bf16", "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"),
    ("tf32", "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32"),  # C^T: wgmma N is BM
])
def test_source_uses_the_precisions_wgmma_tma_and_register_handoff(precision, instruction):
    source = render_kernel(make_config("hopper", DEFAULT, precision, "sm_90"))
    assert instruction in source
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in source
    assert "setmaxnreg.dec.sync.aligned.u32" in source and "setmaxnreg.inc.sync.aligned.u32" in source
    assert "const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b" in source
    # fp16/bf16 B is N-major (transpose bit set); tf32 takes no transpose arguments
    assert ("acc, 1, 1, 0, 1;" in source) == (precision != "tf32")
    assert "-gencode=arch=compute_90a,code=sm_90a" in source


def test_promote_sums_each_interval_apart_and_adds_it_in_fp32():
    """promote=P: an interval's wgmmas start from zero in `part` (accumulate flag off on its first k
    tile's first k step), and part is added to the accumulators once they are done; promote=0
    leaves only the plain k loop. The name carries the interval."""
    params = {**DEFAULT, "BN": 128, "stages": 6, "trans": "nt", "out": "bf16"}
    promoted = render_kernel(make_config("hopper", {**params, "promote": 4}, "e4m3", "sm_90"))
    plain = render_kernel(make_config("hopper", params, "e4m3", "sm_90"))
    assert "for (; kt + HP_PROMOTE <= k_end; kt += HP_PROMOTE)" in promoted and "issue_part(j == 0);" in promoted
    assert "hp_wgmma(part[mi]" in promoted and "acc[mi][i] += part[mi][i];" in promoted
    assert "part[" not in plain
    assert make_config("hopper", {**params, "promote": 4}, "e4m3", "sm_90").name == \
        "hopper_128x128_c2_s6_pr4_e4m3_nt_obf16"


def test_block_scales_multiply_each_k_tiles_sums_as_they_are_promoted():
    """scale=block: each k tile's scales are loaded before its wgmmas are issued and multiply its
    sums as they are added (promote=1: a k tile is one 128 of K, a block); elsewhere the sums are
    added as they are."""
    params = {**DEFAULT, "BN": 128, "stages": 6, "trans": "nt", "out": "bf16", "promote": 1}
    block = render_kernel(make_config("hopper", {**params, "scale": "block"}, "e4m3", "sm_90"))
    row = render_kernel(make_config("hopper", {**params, "scale": "row"}, "e4m3", "sm_90"))
    assert "constexpr bool HP_BLOCK_SCALE = true;" in block and "constexpr bool HP_BLOCK_SCALE = false;" in row
    assert "sc.load(scale_a, scale_b, M, N, K, scale_r0, scale_c0, kt);" in block
    assert "sc.add(acc[mi], p[mi], mi);" in block and "sc.add(" not in row
    # promote=1: k tiles in pairs, the first added while the second's wgmmas run
    for source in (block, row):
        assert "issue(part1, scales1, stage1, kt + 1);\n                    gg_wgmma_wait<1>();\n" \
               "                    add(part0, scales0, stage0, true);" in source
    assert "scale_b ceil(N/128) x KBP values" in block  # the launcher's message when a scale pointer is null
    with pytest.raises(InvalidPoint, match="promote=4 must be 1"):
        make_config("hopper", {**params, "promote": 4, "scale": "block"}, "e4m3", "sm_90")
    make_config("hopper", {**params, "BM": 64, "BN": 128, "swap": 1, "scale": "block"}, "e4m3", "sm_90")


@pytest.mark.parametrize("swap, instruction", [(0, "m64n256k32.f32.e4m3.e4m3"), (1, "m64n64k32.f32.e4m3.e4m3")])
def test_e4m3_multiplies_k_major_operands_128_elements_a_stage(swap, instruction):
    """FP8: a 128-byte swizzled row is 128 elements of K (the stage's depth), wgmma takes 32 of them
    a step, both operands K-major (B stored N x K), with no transpose operands in the instruction;
    A and B are loaded as bytes."""
    params = {**DEFAULT, "trans": "nt", "out": "bf16"} if not swap else \
        {**DEFAULT, "BM": 64, "BN": 128, "swap": 1, "trans": "nt", "out": "bf16"}
    config = make_config("hopper", params, "e4m3", "sm_90")
    source = render_kernel(config)
    assert config.derived["BK"] == 128 and config.derived["WGMMA_K"] == 32
    assert f"wgmma.mma_async.sync.aligned.{instruction}" in source and "acc, 1, 1;" in source
    assert "CU_TENSOR_MAP_DATA_TYPE_UINT8" in source and "#include <cuda_fp8.h>" in source
    assert config.name.endswith("_e4m3_nt_obf16")


def test_fp8_takes_b_tiles_of_64_rows_and_deep_rings_for_thin_problems():
    """B stored N x K arrives in TMA boxes of 64 rows of 128 bytes whatever the element size, so FP8
    takes BN = 64 (one box, one m64 wgmma of B^T with swap): 64 tiles of N = 4096 rather than 32, and
    tiles of 16 x 64 are small enough (9 KB a stage with 8 rows) for a ring of 16 stages."""
    config = make_config("hopper", {**DEFAULT, "BM": 16, "BN": 64, "consumers": 1, "stages": 16, "swap": 1,
                                    "trans": "nt", "out": "bf16", "scale": "tensor"}, "e4m3", "sm_90")
    assert config.name == "hopper_16x64_c1_s16_sw_e4m3_nt_obf16_stensor"
    assert config.derived["B_LOADS"] == 1 and config.derived["B_BYTES"] == 64 * 128 and config.derived["MI"] == 1
    assert config.geometry.smem_bytes == 16 * (16 * 128 + 64 * 128 + 16) + 1024
    assert "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3" in render_kernel(config)
    # in a cluster of 2 the one box becomes two of 32 rows, one multicast by each block
    pair = make_config("hopper", {**DEFAULT, "BM": 16, "BN": 64, "consumers": 1, "swap": 1, "cluster": 2,
                                  "trans": "nt", "out": "bf16"}, "e4m3", "sm_90")
    assert (pair.derived["B_LOADS"], pair.derived["B_BOX_N"]) == (2, 32) and pair.derived["B_BYTES"] == 64 * 128


@pytest.mark.parametrize("precision, swap, instruction, a_type, b_type", [
    ("e5m2e4m3", 0, "m64n256k32.f32.e5m2.e4m3", "__nv_fp8_e5m2", "__nv_fp8_e4m3"),
    ("e5m2e4m3", 1, "m64n64k32.f32.e4m3.e5m2", "__nv_fp8_e5m2", "__nv_fp8_e4m3"),  # wgmma's A: the B tile
    ("e4m3e5m2", 0, "m64n256k32.f32.e4m3.e5m2", "__nv_fp8_e4m3", "__nv_fp8_e5m2")])
def test_fp8_of_two_formats_types_each_operand_its_own(precision, swap, instruction, a_type, b_type):
    """A in one FP8 format, B in the other: wgmma's operand types in its operands' order, the
    launcher's and the pack kernel's B pointer of B's type, B's tensor map sized by it."""
    params = {**DEFAULT, "trans": "nt", "out": "bf16"} if not swap else \
        {**DEFAULT, "BM": 64, "BN": 128, "swap": 1, "trans": "nt", "out": "bf16"}
    config = make_config("hopper", params, precision, "sm_90")
    source = render_kernel(config)
    assert f"wgmma.mma_async.sync.aligned.{instruction}" in source
    assert f"const {a_type}* A, const {b_type}* B" in source  # the launcher
    assert f"const {b_type}* __restrict__ B, void* __restrict__ packed" in source  # the pack kernel
    assert f"gg_tensor_map(&maps.map[1], type, sizeof({b_type})," in source
    assert config.name.endswith(f"_{precision}_nt_obf16") and config.element_type_b == b_type


@pytest.mark.parametrize("params", [DEFAULT, {**DEFAULT, "BN": 128, "stages": 6, "schedule": "pingpong"}],
                         ids=["coop", "pingpong"])
def test_tma_store_epilogue_and_its_map(params):
    source = render_kernel(make_config("hopper", params, "fp16", "sm_90"))
    # the third map (and the fourth, over A's last tile row), in the kernel, the launch and the header
    assert ("const __grid_constant__ CUtensorMap tma_b,\n    const __grid_constant__ CUtensorMap tma_c, "
            "const __grid_constant__ CUtensorMap tma_a_tail,\n    int M") in source
    assert "p.maps.map[0], p.maps.map[1], p.maps.map[2], p.maps.map[3], p.ops.M, p.ops.N, p.ops.K" in source
    assert "C (M x N fp32, box 16 x 32), 128-byte swizzle" in source
    # the kernel and the launcher decide by one rule; the launcher passes zeros where it fails
    # one rule for the kernel and the launcher
    assert ("return beta == 0.0f && N % (16 / sizeof(CT)) == 0 && reinterpret_cast<uintptr_t>(C) % 16 == 0 &&\n"
            "           (batch <= 1 || stride_c * (long long)sizeof(CT) % 16 == 0);") in source
    assert "const bool c_tma = gg_tma_stores_c(beta, N, C, batch, stride_c);" in source  # batch 1 here
    assert "return map_over_c && gg_tma_stores_c(o.beta, o.N, o.C, o.batch, o.stride_c);" in source  # gg_stores_c
    assert "out.stores_c = gg_stores_c(o);" in source
    assert "if (!info.stores_c)\n        memset(&maps.map[2], 0, sizeof(maps.map[2]));" in source
    assert ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32, sizeof(float), o.C, o.M, o.N, (size_t)o.N,\n"
            "                            16, 32, c_mats, c_step);") in source
    # staging (per consumer warp) after the ring, then the barriers; stores, bulk groups, the proxy
    # fence; each warp stores its own boxes: it synchronizes itself only, never the warpgroup
    assert "const unsigned full_bar = c_stage + CONSUMERS * 4 * HP_C_BUFFERS * HP_C_BOX_BYTES" in source
    assert "constexpr int HP_C_BUFFERS = HP_SWAP ? 0 : 2, HP_C_BOX_COLS = 32;" in source
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, { %1, %2 }], [%3];" in source
    assert "cp.async.bulk.commit_group;" in source and "fence.proxy.async.shared::cta;" in source
    assert "cp.async.bulk.wait_group.read %0;" in source and "cp.async.bulk.wait_group %0;" in source
    assert "gg_bulk_wait_read<HP_C_BUFFERS - 1>();" in source and "gg_bulk_wait<0>();" in source
    assert "__syncwarp();" in source and "HP_STREAM_K" not in source  # no stream-K: every use decided, trimmed
    # the direct stores stay for beta != 0 and misaligned C
    assert "v0 += beta * old.x" in source


@pytest.mark.nvcc
def test_tma_stores_c_only_where_the_kernel_does():
    launcher = launcher_of(make_config("hopper", DEFAULT, "fp16", "sm_90"))

    def stores_c(n, beta, c):
        return launcher.describe(64, n, 64, beta=beta, c=c, resident=132).stores_c == 1

    assert stores_c(4096, 0.0, 0x10000) and stores_c(4, -0.0, 16)
    assert not stores_c(4096, 0.5, 0x10000)  # C is read
    assert not stores_c(4098, 0.0, 0x10000)  # rows of 16392 bytes
    assert not stores_c(4096, 0.0, 0x10008)  # base 8-byte aligned only
    # tf32 holds C^T in its accumulators and stores it directly: no map over C, no staging
    tf32 = make_config("hopper", DEFAULT, "tf32", "sm_90")
    assert tf32.geometry.tma.box_c is None
    assert launcher_of(NAMED_POINTS["hopper_tf32"].config("sm_90")).describe(64, 4096, 64, resident=132).stores_c == 0
    assert tf32.geometry.smem_bytes == 4 * (128 * 32 * 4 + 32 * 256 * 4 + 16) + 1024
    assert "tma_c" not in render_kernel(tf32)


# A stored K x M, by the HGMMA transpose flags they take (test_sass_transposes_..., below)
A_STORED_K_BY_M = {
    "tn": ("fp16", {**DEFAULT, "trans": "tn"}),
    "tt": ("bf16", {**DEFAULT, "swizzle": 16, "trans": "tt", "out": "bf16", "bias": "col", "act": "gelu"}),
    "tn-swap": ("fp16", {"BM": 64, "BN": 128, "consumers": 1, "stages": 8, "swizzle": 1, "streamk": 1, "swap": 1,
                         "trans": "tn"}),
    "tt-swap": ("bf16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swizzle": 8, "swap": 1, "trans": "tt",
                         "out": "bf16"}),
}
VARIANTS = [
    ("fp16", DEFAULT),
    ("bf16", {"BM": 128, "BN": 128, "consumers": 1, "stages": 3, "swizzle": 8}),
    ("fp16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swizzle": 4}),
    ("bf16", {"BM": 128, "BN": 192, "consumers": 2, "stages": 4, "swizzle": 1}),
    ("tf32", DEFAULT),
    ("tf32", {"BM": 64, "BN": 64, "consumers": 1, "stages": 6, "swizzle": 16}),
    ("fp16", {**DEFAULT, "cluster": 2}),
    ("tf32", {"BM": 128, "BN": 128, "consumers": 1, "stages": 4, "swizzle": 1, "cluster": 2}),
    ("bf16", {**DEFAULT, "BN": 128, "stages": 6, "schedule": "pingpong"}),
    ("bf16", {**DEFAULT, "swizzle": 8, "cluster": 2, "streamk": 1}),
    ("tf32", {**DEFAULT, "cluster": 2, "streamk": 1}),
    ("fp16", {**DEFAULT, "swizzle": 8, "overlap": 1}),
    ("bf16", {**DEFAULT, "cluster": 2, "overlap": 1}),
    ("fp16", {"BM": 64, "BN": 128, "consumers": 1, "stages": 5, "swizzle": 4, "overlap": 1}),
    ("fp16", {"BM": 16, "BN": 128, "consumers": 1, "stages": 8, "swizzle": 1, "streamk": 1, "swap": 1}),
    ("bf16", {"BM": 32, "BN": 256, "consumers": 2, "stages": 6, "swizzle": 4, "cluster": 2, "swap": 1}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 4, "schedule": "pingpong", "swap": 1}),
    ("tf32", {"BM": 16, "BN": 64, "consumers": 1, "stages": 8, "swizzle": 1, "streamk": 1}),
    # A stored K x M (trans tn, tt), with each schedule, swap, clusters, overlap and the epilogue
    *A_STORED_K_BY_M.values(),
    ("bf16", {**DEFAULT, "BN": 128, "stages": 6, "schedule": "pingpong", "trans": "tn", "out": "fp16", "bias": "row",
              "act": "relu"}),
    ("fp16", {**DEFAULT, "swizzle": 8, "cluster": 2, "streamk": 1, "trans": "tt"}),
    ("fp16", {**DEFAULT, "swizzle": 8, "overlap": 1, "trans": "tn", "out": "fp16"}),
    ("fp16", {"BM": 128, "BN": 128, "consumers": 2, "stages": 4, "schedule": "pingpong", "cluster": 2, "swap": 1,
              "trans": "tt", "bias": "col", "act": "silu"}),
]


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("precision, params", VARIANTS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(VARIANTS)])
def test_variants_compile_for_sm90a_without_spills(precision, params):
    config = make_config("hopper", params, precision, "sm_90")
    result = build_kernel(config)
    assert result.ok, result.log
    usage = kernel_usage(config, result)
    if precision == "tf32" and params.get("streamk") and params.get("cluster") == 2:  # see test_stream_k_..._k_loop
        assert usage.spill_store_bytes <= 24 and usage.spill_load_bytes <= 48, usage
    else:
        assert usage is not None and not usage.spills, usage
    # the register cap of __launch_bounds__(threads, 1) is what setmaxnreg redistributes
    assert "C7508" not in result.log  # ptxas: setmaxnreg ignored
    # ptxas: wgmmas serialized (e.g. accumulators touched while in flight, waits or fences injected
    # where they cannot be proven needless)
    assert not any(code in result.log for code in ("C7510", "C7517", "C7518", "C7520")), result.log


def _nvdisasm() -> str | None:
    try:
        return find_tool("nvdisasm")
    except ToolNotFound:
        return None


@pytest.mark.nvcc
@pytest.mark.skipif(_nvdisasm() is None, reason="nvdisasm is not installed (the CUDA toolkit, or "
                                                "`pip install nvidia-cuda-nvdisasm`, which the test extra does)")
@pytest.mark.parametrize("precision, swap, hgmma", slow_after(1, [("fp16", 0, "HGMMA.64x256x16.F32"),
                                                                 ("tf32", 0, "HGMMA.64x128x8.F32.TF32"),
                                                                 ("fp16", 1, "HGMMA.64x128x16.F32")]))
def test_sass_has_hgmma_and_tma_loads(precision, swap, hgmma):
    config = make_config("hopper", {**DEFAULT, "swap": swap}, precision, "sm_90")
    result = build_kernel(config)
    assert result.ok, result.log
    sass = subprocess.run([_nvdisasm(), str(result.cubin)], capture_output=True, text=True, check=True).stdout
    kernel = sass[sass.index(f".text.{config.name}:"):]
    assert hgmma in kernel and "UTMALDG.2D" in kernel and "USETMAXREG" in kernel
    # fp16's epilogue: TMA stores, their commit and wait, and the proxy fence before them; tf32
    # stores C^T fragments directly
    stores = "UTMASTG.2D" in kernel and "UTMACMDFLUSH" in kernel and "FENCE.VIEW.ASYNC.S" in kernel
    assert stores == (precision == "fp16" and not swap)
    assert "LDL" not in kernel and "STL" not in kernel  # no local-memory spills


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(_nvdisasm() is None, reason="nvdisasm is not installed")
def test_e4m3_sass_has_qgmma_tma_loads_and_stores():
    config = resolve_point("hopper_e4m3", "sm_90")
    result = build_kernel(config)
    assert result.ok, result.log
    sass = subprocess.run([_nvdisasm(), str(result.cubin)], capture_output=True, text=True, check=True).stdout
    kernel = sass[sass.index(f".text.{config.name}:"):]
    assert "QGMMA.64x128x32.F32.E4M3.E4M3" in kernel and "UTMALDG.2D" in kernel and "UTMASTG.2D" in kernel
    assert "LDL" not in kernel and "STL" not in kernel


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(_nvdisasm() is None, reason="nvdisasm is not installed")
def test_fp8_of_two_formats_sass_has_qgmma_of_both():
    named = NAMED_POINTS["hopper_e4m3"]
    config = make_config("hopper", named.params, "e5m2e4m3", "sm_90", named.variant)
    result = build_kernel(config)
    assert result.ok, result.log
    sass = subprocess.run([_nvdisasm(), str(result.cubin)], capture_output=True, text=True, check=True).stdout
    kernel = sass[sass.index(f".text.{config.name}:"):]
    assert "QGMMA.64x128x32.F32.E5M2.E4M3" in kernel and "LDL" not in kernel and "STL" not in kernel


@pytest.mark.nvcc
@pytest.mark.skipif(_nvdisasm() is None, reason="nvdisasm is not installed")
@pytest.mark.parametrize("params, pingpong, stream_k", slow_after(2, [
    ({}, False, False),
    ({"BN": 128, "stages": 6, "schedule": "pingpong"}, True, False),
    ({"streamk": 1}, False, True),
    ({"streamk": 1, "cluster": 2}, False, True),
]))
def test_variants_branch_in_cpp_and_compile_only_their_own_code(params, pingpong, stream_k):
    """The variation lives in `if constexpr` on HP_PINGPONG / HP_STREAM_K, so every variant's
    source holds every branch; the machine code must hold only its own: the consumers' named
    barrier of 256 threads (bar 0x100) with ping-pong only, the warpgroup's (0x80) with stream-K only."""
    config = make_config("hopper", {**DEFAULT, **params}, "fp16", "sm_90")
    source = render_kernel(config, untrimmed=True)
    assert f"constexpr bool HP_PINGPONG = {str(pingpong).lower()};" in source
    assert f"constexpr bool HP_STREAM_K = {str(stream_k).lower()};" in source
    result = build_kernel(config)
    assert result.ok, result.log
    sass = subprocess.run([_nvdisasm(), str(result.cubin)], capture_output=True, text=True, check=True).stdout
    kernel = sass[sass.index(f".text.{config.name}:"):]
    named = [line for line in kernel.splitlines() if "BAR.SYNC" in line or "BAR.ARV" in line]
    assert any(line.rstrip(" ;").endswith("0x100") for line in named) == pingpong, named
    assert any(line.rstrip(" ;").endswith("0x80") for line in named) == stream_k, named


def test_ptx_wrappers_have_one_home():
    """hopper and mma emit the same shared-memory address, cp.async and ldmatrix wrappers
    (templates/ptx.cuh), and hopper the sm_90a ones (ptx_sm90.cuh): no family defines its own."""
    hopper = render_kernel(make_config("hopper", DEFAULT, "fp16", "sm_90"))
    mma = render_kernel(make_config("mma", {}, "fp16", "sm_90"))
    for source in (hopper, mma):
        assert source.count("__device__ __forceinline__ unsigned gg_smem_addr(const void* p)") == 1
        assert "hp_smem_addr" not in source and "mma_smem_addr" not in source
    assert hopper.count("__device__ __forceinline__ void gg_tma_load(") == 1
    assert "mbarrier" not in mma  # the sm_90a wrappers stay out of the sm_80 family's file


@pytest.mark.nvcc
def test_stream_k_point_name_geometry_and_workspace():
    c = make_config("hopper", {**DEFAULT, "swizzle": 8, "cluster": 2, "streamk": 1}, "bf16", "sm_90")
    assert c.name == "hopper_128x256_c2_s4_g8_x2_sk_bf16"
    assert point_spec(c.name) == ("hopper", "bf16", {"BM": "128", "BN": "256", "consumers": "2", "stages": "4",
                                                     "swizzle": "8", "cluster": "2", "schedule": "coop",
                                                     "streamk": "1", "overlap": "0", "swap": "0", "promote": "0",
                                                     "abox": "0"})
    assert resolve_point(c.name, "sm_90") == c
    assert c.geometry.stream_k
    info = launcher_of(c).describe(4096, 4096, 4096, resident=132)
    # a 4-byte flag per block and consumer, and a 128 x 256 fp32 partial tile per block
    assert tuple(info.grid) == (132, 1, 1) and info.flag_words == 132 * 2
    assert info.partial_bytes == 132 * 128 * 256 * 4
    big = launcher_of(c).describe(1 << 20, 1 << 20, 64, resident=2000)  # a GPU of 2000 SMs: no cap
    assert tuple(big.grid) == (2000, 1, 1) and big.flag_words == 4000
    whole = launcher_of(make_config("hopper", DEFAULT, "fp16", "sm_90")).describe(4096, 4096, 4096, resident=132)
    assert whole.flag_words == 0 and whole.partial_bytes == 0


def test_stream_k_source_and_launcher():
    source = render_kernel(make_config("hopper", {**DEFAULT, "streamk": 1}, "fp16", "sm_90"))
    # the schedule: whole units, then a range taken from its end; stream-K only for a last wave at most 3/4 full
    # and units of 8 k tiles or more; the last full wave joins a tail under half a wave (the hybrid)
    assert "if (tail == 0 || 4 * tail > 3 * workers || k_tiles < 2 * SK_MIN_K_TILES)" in source
    assert "const int sk_units = 2 * tail < workers && units >= tail + workers ? tail + workers : tail;" in source
    assert "const int unit_start = (it_end - 1) / k_tiles * k_tiles, from = max(it, unit_start);" in source
    # partial sums out with a release, in with an acquire (a lane per holder), flags reset by the finishing block
    assert "st.release.gpu.global.u32" in source and "ld.acquire.gpu.global.u32" in source
    assert "unsigned* const flag = sk_flags + holder_block(i) * 2 + consumer;" in source and "*flag = 0;" in source
    assert "unsigned* const sk_flags = ws.flags;" in source
    assert "float4* const sk_slots = reinterpret_cast<float4*>(ws.partials);" in source
    # the launcher sizes both from the grid it launches
    assert "out.flag_words = out.grid[0] * 2ULL;" in source
    assert "out.partial_bytes = out.grid[0] * 131072ULL;" in source
    whole = render_kernel(make_config("hopper", DEFAULT, "fp16", "sm_90"))
    # without stream-K the branches are trimmed away (HP_STREAM_K, and the flags' release and
    # acquire with them; see the SASS test) and the launcher asks for no workspace: its stream-K
    # rule (an if constexpr) is trimmed away
    assert "HP_STREAM_K" not in whole and "static constexpr bool stream_k = false;" in whole
    assert "st.release.gpu.global.u32" not in whole and "sk_flags" not in whole
    assert "out.flag_words" not in whole and "out.partial_bytes" not in whole


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("precision, params, stores, loads", [
    ("fp16", {**DEFAULT, "swizzle": 8, "cluster": 2, "streamk": 1, "overlap": 1}, 16, 16),
    ("tf32", {**DEFAULT, "cluster": 2, "streamk": 1}, 24, 48)])
def test_stream_k_with_a_cluster_spills_at_most_a_few_words_outside_the_k_loop(precision, params, stores, loads):
    """128x256 with stream-K and a cluster at 168 registers per thread (384 threads; setmaxnreg
    raises the consumers' later): ptxas keeps two or three words of the item loop's state in local
    memory across setmaxnreg, reloaded once per item, never between the HGMMAs of the k loop; fp16
    with overlap=1 has 64 more live registers for the held right half."""
    config = make_config("hopper", params, precision, "sm_90")
    result = build_kernel(config)
    assert result.ok, result.log
    usage = kernel_usage(config, result)
    assert usage.spill_store_bytes <= stores and usage.spill_load_bytes <= loads, usage
    assert not any(code in result.log for code in ("C7508", "C7510", "C7517", "C7518", "C7520")), result.log
    if _nvdisasm() is not None:
        sass = subprocess.run([_nvdisasm(), str(result.cubin)], capture_output=True, text=True, check=True).stdout
        code = [line for line in sass.splitlines() if "/*" in line and ";" in line]
        hgmma = [i for i, line in enumerate(code) if "HGMMA" in line]
        assert hgmma and not any("LDL" in line or "STL" in line for line in code[hgmma[0]:hgmma[-1]])


@pytest.mark.slow
@pytest.mark.nvcc
def test_stream_k_harness_compiles(tmp_path):
    config = make_config("hopper", {**DEFAULT, "cluster": 2, "streamk": 1}, "bf16", "sm_90")
    # as the file's build line says (-arch=sm_90a would add compute_90 PTX, which has no wgmma)
    assert nvcc_compile(render_kernel(config, harness=True), tmp_path / "gemm", None,
                        "-gencode=arch=compute_90a,code=sm_90a").is_file()


def test_overlap_point_name_and_source():
    c = make_config("hopper", {**DEFAULT, "swizzle": 8, "cluster": 2, "overlap": 1}, "fp16", "sm_90")
    assert c.name == "hopper_128x256_c2_s4_g8_x2_ov_fp16"
    assert resolve_point(c.name, "sm_90") == c and point_spec(c.name)[2]["overlap"] == "1"
    assert c.geometry == make_config("hopper", {**DEFAULT, "swizzle": 8, "cluster": 2}, "fp16", "sm_90").geometry
    source = render_kernel(c)
    # the right half (64 of the 128 accumulators) moves to registers of its own, alpha applied; the
    # left half (4 of the 8 boxes of 32 columns) is stored at once; the 4 held boxes go out one per k
    # tile of the next item, after its wgmmas are committed, and whatever is left after its k loop
    # or the last item
    assert "constexpr bool HP_OVERLAP = true;" in source and "constexpr int HP_NACC = 128;" in source
    assert "held[i] = alpha * acc[0][HP_NACC / 2 + i];" in source  # HP_EPILOGUE ? ... : ..., decided
    assert "for (int j = 0; j < (HP_OVERLAP ? BN / 2 : BN) / HP_C_BOX_COLS; ++j)" in source
    assert "constexpr int HELD_BOXES = 4;" in source and "HP_C_BOX_COLS = 32;" in source
    assert "switch (kt - k_begin) {" in source and "case 3:\n                        store_held_box(3);" in source
    # the reset after the last box only (an if constexpr in each case, decided); and where it starts
    # and after a short item's boxes
    assert source.count("pending_unit = -1;") == 3 and "== HELD_BOXES - 1" not in source
    assert "case 4:" not in source
    assert "if (k_end - k_begin <= 3)" in source and "if (pending_unit >= 0) {  // the last tile's right half" in source
    plain = render_kernel(make_config("hopper", {**DEFAULT, "swizzle": 8, "cluster": 2}, "fp16", "sm_90"))
    assert "constexpr bool HP_OVERLAP = false;" in plain and "constexpr int HELD_BOXES = 0;" in plain
    assert "case 0:" not in plain


def test_swap_point_computes_c_transposed_from_shared_memory():
    c = make_config("hopper", {"BM": 16, "BN": 128, "consumers": 1, "stages": 8, "streamk": 1, "swap": 1}, "fp16",
                    "sm_90")
    assert c.name == "hopper_16x128_c1_s8_sk_sw_fp16"
    d = c.derived
    assert (d["SWAP_AB"], d["TF32_FRAGS"], d["WGMMA_N"], d["COLS"], d["MI"], d["ACC"]) == (True, False, 16, 128, 2, 16)
    assert c.geometry.tma.box_a == (64, 16) and c.geometry.tma.box_c is None  # C stored directly
    source = render_kernel(c)
    # B^T as wgmma's A, M-major (transpose bit 1); the A tile as its B, K-major (0)
    assert "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16" in source and "acc, 1, 1, 1, 0;" in source
    assert "constexpr bool HP_SWAP = true;" in source and "constexpr bool HP_TF32 = false;" in source
    assert "tma_c" not in source and "constexpr int HP_C_BUFFERS = HP_SWAP ? 0 : 2" in source  # no staging


@pytest.mark.parametrize("params, precision, wgmma, derived", [
    # swap: the tile's rows are wgmma's N, so 48, 96 and 192 rows are one instruction wide
    ({"BM": 96, "BN": 192, "consumers": 1, "stages": 5, "swap": 1}, "fp16", "m64n96k16", (96, 192, 3, 144)),
    ({"BM": 192, "BN": 128, "consumers": 2, "stages": 5, "swap": 1}, "bf16", "m64n192k16", (192, 64, 1, 96)),
    ({"BM": 48, "BN": 128, "consumers": 2, "stages": 6}, "tf32", "m64n48k8", (48, 64, 1, 24)),
    # no swap: 192 rows are three m64 blocks of one consumer (or of each ping-pong consumer)
    ({"BM": 192, "BN": 64, "consumers": 1, "stages": 6}, "fp16", "m64n64k16", (64, 64, 3, 96)),
])
def test_tiles_of_48_96_and_192_rows(params, precision, wgmma, derived):
    c = make_config("hopper", params, precision, "sm_90")
    d = c.derived
    assert (d["WGMMA_N"], d["COLS"], d["MI"], d["ACC"]) == derived  # COLS: a consumer's columns of C
    assert f"wgmma.mma_async.sync.aligned.{wgmma}" in render_kernel(c)


@pytest.mark.parametrize("params, precision, expected", [
    ({"BM": 16}, "fp16", "BM=16 is not a multiple of 64: it fits only with swap=1"),
    ({"BM": 48}, "bf16", "BM=48 is not a multiple of 64: it fits only with swap=1"),
    ({"BM": 96, "consumers": 1}, "fp16", "BM=96 is not a multiple of 64: it fits only with swap=1"),
    ({"BM": 192, "consumers": 2}, "fp16", r"BM=192 must be a multiple of 64\*consumers"),
    ({"BM": 96, "BN": 256, "consumers": 1, "swap": 1}, "fp16", "= 4\\*48 = 192 registers per consumer thread; at most 160"),
    ({"swap": 1}, "tf32", r"tf32 always computes C\^T = B\^T A\^T"),
    ({"swap": 1, "overlap": 1}, "fp16", "use overlap=0 there"),
])
def test_swap_constraints(params, precision, expected):
    with pytest.raises(InvalidPoint, match=expected):
        make_config("hopper", {**DEFAULT, **params}, precision, "sm_90")


def test_bm_is_any_multiple_of_8_with_swap():
    assert make_config("hopper", {**DEFAULT, "BM": 104, "BN": 128, "swap": 1}, "fp16", "sm_90").derived["WGMMA_N"] == 104
    with pytest.raises(InvalidParameter, match="BM=100 is not allowed; BM must be one of: 8, 16, 24, .*, 248, 256"):
        make_config("hopper", {**DEFAULT, "BM": 100, "swap": 1}, "fp16", "sm_90")


# ---- A stored K x M (trans tn, tt) ----------------------------------------------------------------

@pytest.mark.parametrize("trans, swap, bits", [
    ("nn", 0, "0, 1"), ("nt", 0, "0, 0"), ("tn", 0, "1, 1"), ("tt", 0, "1, 0"),
    ("nn", 1, "1, 0"), ("nt", 1, "0, 0"), ("tn", 1, "1, 1"), ("tt", 1, "0, 1"),
])
def test_transpose_bits_name_the_operands_that_lie_mn_major(trans, swap, bits):
    """wgmma's A and B transpose bits are set where that operand's tile lies MN-major: the A tile
    where A is stored K x M, the B tile where B is stored K x N; swap=1 hands the B tile to
    wgmma's A and the A tile to its B."""
    config = make_config("hopper", {**DEFAULT, "swap": swap, "trans": trans}, "fp16", "sm_90")
    assert (config.derived["TRANSPOSE_A"], config.derived["TRANSPOSE_B"]) == tuple(int(b) for b in bits.split(", "))
    assert f"acc, 1, 1, {bits};" in render_kernel(config)


@pytest.mark.parametrize("precision, params, loads, rows", [
    ("e4m3", {"BM": 64, "BN": 64, "consumers": 1, "stages": 8, "cluster": 2}, 2, 32),  # cuBLASLt's 128-token tile
    ("bf16", {"BM": 16, "BN": 64, "consumers": 1, "stages": 16, "swap": 1, "cluster": 2}, 2, 32),
    ("fp16", {"BM": 128, "BN": 192, "consumers": 2, "stages": 3, "cluster": 2}, 6, 32),
    ("e4m3", {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "cluster": 2}, 2, 64),
    ("e4m3", {"BM": 128, "BN": 192, "consumers": 2, "stages": 4}, 3, 64),
])
def test_b_stored_n_by_k_arrives_in_as_many_boxes_as_the_cluster_has_blocks(precision, params, loads, rows):
    """B stored N x K comes in boxes of 64 rows of N, split further where the blocks of a cluster
    would otherwise not share them out evenly (BN = 64 or 192 in a cluster of 2): each box a whole
    number of 8-row swizzle atoms, landing where one box of BN rows would put those rows."""
    c = make_config("hopper", {**params, "trans": "nt", "out": "bf16"}, precision, "sm_90")
    d = c.derived
    assert (d["B_LOADS"], d["B_BOX_N"]) == (loads, rows) and loads * rows == params["BN"]
    assert c.geometry.tma.box_b == (d["BK"], rows) and d["B_BYTES"] // loads == rows * 128
    source = render_kernel(c)
    assert f"constexpr int B_LOADS = {loads}, B_BOX_N = {rows};" in source
    assert "HP_B_T ? tn * BN + j * B_BOX_N : kt * BK" in source
    assert f"B (N x K as stored, box {rows} x {d['BK']})" in source


@pytest.mark.parametrize("precision, params, loads", [
    ("e4m3", {"BM": 128, "BN": 64, "stages": 6, "promote": 4, "abox": 16, "trans": "nt", "out": "bf16"}, 8),
    ("bf16", {"BM": 32, "BN": 64, "consumers": 1, "stages": 8, "swap": 1, "abox": 8, "trans": "nt"}, 4),
    ("fp16", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "abox": 128}, 2),
])
def test_a_in_row_boxes_loads_only_those_holding_a_row_before_m(precision, params, loads):
    """abox: A stored M x K arrives in BM / abox boxes of abox rows, each whole 8-row swizzle atoms
    landing where one box of BM rows puts them; the producer loads those that start before M and
    expects only their bytes (a tile past M, none)."""
    c = make_config("hopper", {**DEFAULT, **params}, precision, "sm_90")
    assert c.name.split(f"_{precision}")[0].endswith(f"_ab{params['abox']}") and resolve_point(c.name, "sm_90") == c
    d = c.derived
    assert (d["A_LOADS"], d["A_BOX_M"]) == (loads, params["abox"]) and loads * params["abox"] == params["BM"]
    assert c.geometry.tma.box_a == (d["BK"], params["abox"]) and d["A_BYTES"] // loads == params["abox"] * 128
    source = render_kernel(c)
    assert f"HP_A_LOADS = {loads}," in source and f"constexpr int HP_A_BOX_M = {params['abox']};" in source
    assert "return max(0, min(HP_A_LOADS, (rows_left + HP_A_BOX_M - 1) / HP_A_BOX_M));" in source
    assert "const int a_boxes = hp_a_boxes(M - tm * BM);" in source  # once per tile, for the loads and the bytes
    assert re.search(r"stage_bytes =\s+STAGE_BYTES - \(HP_A_LOADS - a_boxes\) \* HP_A_BOX_BYTES - b_unloaded;", source)
    assert "gg_bar_expect(bar, stage_bytes);" in source and source.count("hp_a_boxes(M - tm * BM)") == 1
    assert "hp_load(a_dst + j * HP_A_BOX_BYTES, &tma_a, kt * BK, tm * BM + j * HP_A_BOX_M, za, bar);" in source
    assert f"over A (M x K, box {params['abox']} x {d['BK']})" in source
    whole = make_config("hopper", {**DEFAULT, **params, "abox": 0}, precision, "sm_90")
    assert whole.name == c.name.replace(f"_ab{params['abox']}", "")
    assert whole.derived["A_LOADS"] == 1 and whole.geometry.tma.box_a == (d["BK"], params["BM"])
    plain = render_kernel(whole)
    assert "hp_a_boxes(" not in plain and "HP_A_BOX_M =" not in plain
    # abox and the map over the last tile row are two answers to one question: a kernel has one
    assert not c.geometry.tma.tail_a and "tma_a_tail" not in source and whole.geometry.tma.tail_a


@pytest.mark.parametrize("precision, params, trans", [
    ("fp16", {}, "nn"), ("bf16", {"BN": 128, "stages": 6, "schedule": "pingpong"}, "nt"),
    ("e4m3", {"BM": 128, "BN": 64, "stages": 6, "cluster": 2}, "nt"), ("fp16", {"BM": 64, "swap": 1}, "nt"),
    ("tf32", {"BM": 128, "BN": 128, "stages": 4}, "nn")])
def test_a_partial_last_tile_row_loads_through_a_map_of_its_rows(precision, params, trans):
    """A stored M x K in one box per tile: the launcher builds a fourth map over A whose box is M % BM
    rows (zeros where M % BM == 0), the kernel loads the last tile row through it and expects only
    its rows' bytes, and loads no A at all for a cluster's tile row wholly past M."""
    c = make_config("hopper", {**DEFAULT, **params, "trans": trans}, precision, "sm_90")
    tma, bm = c.geometry.tma, c.params["BM"]
    assert tma.tail_a and tma.maps[-1] == "a_tail" and tma.box_a == (c.derived["BK"], bm)
    source = render_kernel(c)
    assert "const __grid_constant__ CUtensorMap tma_a_tail," in source and ", p.maps.map[3], p.ops.M," in source
    assert f"if (o.M % {bm} == 0)\n        memset(&maps.map[3], 0, sizeof(maps.map[3]));" in source
    # over A exactly as the map of whole tiles is (a_base, a_ld: one rule for both), its box M % BM rows
    assert re.search(rf"err = gg_tensor_map\(&maps\.map\[3\], type, sizeof\({c.element_type}\), a_base, a_rows, "
                     rf"a_cols, a_ld,\n\s+o\.M % {bm}, {c.derived['BK']}, a_mats, a_step\);", source)
    assert re.search(rf"gg_tensor_map\(&maps\.map\[0\], type, sizeof\({c.element_type}\), a_base, a_rows, a_cols, "
                     rf"a_ld,\n\s+{bm}, {c.derived['BK']}, a_mats, a_step\);", source)
    assert "const int a_rows = max(0, min(BM, M - tm * BM));" in source
    assert re.search(r"stage_bytes =\s+STAGE_BYTES - \(unsigned\)\(BM - a_rows\) \* \(A_BYTES / BM\) - b_unloaded;",
                     source)
    assert "if (a_rows > 0) {\n                        hp_load(a_dst, a_rows < BM ? map_a_tail : &tma_a," in source
    assert f"and one over A's last tile row: box (M % {bm}) x {c.derived['BK']}" in source  # the header
    # A stored K x M arrives in column boxes already: no such map
    tn = make_config("hopper", {**DEFAULT, "trans": "tn"}, "fp16", "sm_90")
    assert not tn.geometry.tma.tail_a and "tma_a_tail" not in render_kernel(tn)


@pytest.mark.parametrize("precision, params, trans", [
    ("fp16", {"BM": 64, "BN": 192, "consumers": 1, "stages": 6}, "nn"), ("bf16", {"BN": 192, "stages": 4}, "nt"),
    ("e4m3", {"BM": 128, "BN": 128, "stages": 6, "cluster": 2}, "nt"), ("fp16", {"BM": 64, "swap": 1}, "tn"),
    ("tf32", {"BM": 128, "BN": 128, "stages": 4}, "nn")])
def test_b_boxes_wholly_past_n_are_not_loaded(precision, params, trans):
    """A partial last tile column: the producer loads only B's boxes that start before N (each
    B_BOX_N columns of C: BK where B is stored K x N, 64 or fewer rows where it is stored N x K),
    in a cluster each block its share of them, and expects only their bytes with A's."""
    c = make_config("hopper", {**DEFAULT, **params, "trans": trans}, precision, "sm_90")
    d = c.derived
    assert d["B_BOX_N"] * d["B_LOADS"] == c.params["BN"]
    assert d["B_BOX_N"] == (c.params["BN"] // d["B_LOADS"] if trans[1] == "t" else d["BK"])
    source = render_kernel(c)
    assert "const int b_boxes = min(B_LOADS, max(0, (N - tn * BN + B_BOX_N - 1) / B_BOX_N));" in source
    assert "const unsigned b_unloaded = (unsigned)(B_LOADS - b_boxes) * B_BOX_BYTES;" in source
    assert re.search(r"stage_bytes =\s+STAGE_BYTES - .* - b_unloaded;", source)
    loop = source.index("for (int j = rank * (B_LOADS / CLUSTER); j < (rank + 1) * (B_LOADS / CLUSTER); ++j) {")
    assert source.index("if (j >= b_boxes)\n                            break;", loop) < source.index("hp_load", loop)
    assert source.count("gg_bar_expect(bar, stage_bytes);") == 1


@pytest.mark.parametrize("params, trans, expected", [
    ({"abox": 128}, "nn", "abox=128 must divide BM=128 and be smaller"),
    ({"BM": 192, "abox": 128}, "nn", "abox=128 must divide BM=192 and be smaller"),
    ({"abox": 16}, "tn", "A stored K x M (trans=tn) arrives in boxes of 64 columns of M already: use abox=0"),
])
def test_a_row_boxes_constraints(params, trans, expected):
    with pytest.raises(InvalidPoint, match=re.escape(expected)):
        make_config("hopper", {**DEFAULT, "BN": 128, **params, "trans": trans}, "fp16", "sm_90")


def test_a_stored_k_by_m_arrives_in_column_chunks_as_b_stored_k_by_n_does():
    c = make_config("hopper", {**DEFAULT, "trans": "tn"}, "fp16", "sm_90")
    assert c.name == "hopper_128x256_c2_s4_fp16_tn" and resolve_point(c.name, "sm_90") == c
    d, g = c.derived, c.geometry
    # boxes of 64 k-rows x 64 columns (128 bytes of M), two per A tile, the same box as B's
    assert g.tma.box_a == (64, 64) == g.tma.box_b and d["A_LOADS"] == 2 and d["B_LOADS"] == 4
    assert g.smem_bytes == make_config("hopper", DEFAULT, "fp16", "sm_90").geometry.smem_bytes
    source = render_kernel(c)
    assert "hp_load(a_dst + j * HP_A_BOX_BYTES, &tma_a, tm * BM + j * BK, kt * BK, za, bar);" in source
    assert "constexpr bool HP_B_T = false;" in source and "HP_A_T" not in source  # decided, trimmed away
    assert "HP_A_LOADS = 2," in source and "constexpr unsigned HP_A_BOX_BYTES = 8192," in source
    # wgmma's A reads the chunks M-major (LBO: the chunk size), 16 k-rows per k step; each 64 rows of
    # a consumer are one chunk, as large as 64 K-major rows of 128 bytes
    assert "constexpr bool HP_TRANSPOSE_A = true, HP_TRANSPOSE_B = true;" in source
    assert "HP_TRANSPOSE_A ? (HP_SWAP ? B_BOX_BYTES : HP_A_BOX_BYTES) : 16, 1024);" in source
    assert "constexpr unsigned A_STEP = HP_TRANSPOSE_A ? HP_WGMMA_K * 128 : HP_WGMMA_K * HP_ESIZE," in source
    # the launcher's map over A as stored (K rows of M) or over its packed copy (rows of mp), which the
    # pack kernel makes of A as stored
    assert "constexpr bool GG_A_T = true;" in source and "constexpr bool GG_B_T = false;" in source
    assert "const int a_rows = o.K, a_cols = o.M;" in source  # GG_A_T ? o.K : o.M, decided
    assert "const size_t a_ld = a_bytes ? gg_packed_ld<8>(a_cols) : (size_t)a_cols;" in source
    assert re.search(r"a_rows, a_cols, a_ld,\s+64, 64,", source)
    assert "over A (K x M as stored, box 64 x 64)" in source
    assert "gg_pack_plan<8, __half, GG_B_T, GG_A_T>(M, N, K, A, B, a_bytes, b_bytes);" in source  # the pack kernel
    assert "gg_pack_plan<8, __half, GG_B_T, GG_A_T>(o.M, o.N, o.K, o.A, o.B, out.a_bytes, out.b_bytes);" in source
    assert "gg_pack_rows<8>(reinterpret_cast<__half*>(ws), A, GG_A_T ? K : M, GG_A_T ? M : K);" in source
    nn = render_kernel(make_config("hopper", DEFAULT, "fp16", "sm_90"))
    assert "HP_A_T" not in nn and "HP_A_LOADS" not in nn
    assert "hp_load(a_dst, a_rows < BM ? map_a_tail : &tma_a, kt * BK, tm * BM, za, bar);" in nn
    assert "constexpr bool GG_A_T = false;" in nn and "over A (M x K, box 128 x 64)" in nn
    assert "const size_t a_ld = a_bytes ? gg_packed_ld<8>(a_cols) : (size_t)a_cols;" in nn
    assert re.search(r"a_rows, a_cols, a_ld,\s+128, 64,", nn)


def test_swap_reads_a_stored_k_by_m_as_wgmmas_n_major_b():
    c = make_config("hopper", {"BM": 256, "BN": 128, "consumers": 2, "stages": 3, "swap": 1, "trans": "tt"}, "bf16",
                    "sm_90")
    assert c.name == "hopper_256x128_c2_s3_sw_bf16_tt" and c.derived["A_LOADS"] == 4
    source = render_kernel(c)
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in source and "acc, 1, 1, 0, 1;" in source
    # B stored N x K as wgmma's A, K-major; the A tile as its B, N-major in 64-column chunks
    assert "constexpr bool HP_TRANSPOSE_A = false, HP_TRANSPOSE_B = true;" in source
    assert "const uint64_t desc_b = gg_wgmma_desc(HP_SWAP ? smem : smem + A_BYTES," in source
    assert "HP_TRANSPOSE_B ? (HP_SWAP ? HP_A_BOX_BYTES : B_BOX_BYTES) : 16, 1024);" in source
    assert "HP_A_LOADS = 4," in source and "constexpr unsigned HP_A_BOX_BYTES = 8192," in source
    # the launcher's maps: A K x M, B N x K, both as stored
    assert "constexpr bool GG_A_T = true;" in source and "constexpr bool GG_B_T = true;" in source
    assert "const int a_rows = o.K, a_cols = o.M;" in source  # GG_A_T ? o.K : o.M, decided
    assert "const int b_rows = o.N, b_cols = o.K;" in source


@pytest.mark.slow
@pytest.mark.nvcc
def test_packs_a_stored_k_by_m_where_its_rows_of_m_break_16_bytes():
    tn = launcher_of(make_config("hopper", {**DEFAULT, "trans": "tn"}, "fp16", "sm_90"))
    assert packed(tn, 4096, 4096, 4096) == (0, 0)
    assert packed(tn, 96, 32, 63) == (0, 0)  # K % 8 breaks no stored row: A's are M long, B's N
    assert packed(tn, 100, 32, 63) == (-(-63 * 104 * 2 // 256) * 256, 0)  # M % 8: K rows of 104 halves
    assert packed(tn, 96, 32, 64, a=2) == (64 * 96 * 2, 0)  # A's pointer not 16-byte aligned
    tt = launcher_of(make_config("hopper", {**DEFAULT, "trans": "tt"}, "bf16", "sm_90"))
    # both as stored: A K x M (M = 7), B N x K (K = 63)
    assert packed(tt, 7, 33, 63) == (-(-63 * 8 * 2 // 256) * 256, -(-33 * 64 * 2 // 256) * 256)


@pytest.mark.nvcc
@pytest.mark.skipif(_nvdisasm() is None, reason="nvdisasm is not installed")
@pytest.mark.parametrize("key, flags", slow_after(1, [("nn", ".tnspB"), ("nn-swap", ".tnspA"), ("tn", ".tnspA.tnspB"),
                                                     ("tt", ".tnspA"), ("tn-swap", ".tnspA.tnspB"), ("tt-swap", ".tnspB")]))
def test_sass_transposes_exactly_the_operands_stored_mn_major(key, flags):
    """Every HGMMA of the kernel carries the transpose flags of its variant's operands (the
    builds of test_variants_compile_for_sm90a_without_spills, cached), and A stored K x M arrives
    through TMA loads like the other operands."""
    nn_swap = {"BM": 32, "BN": 256, "consumers": 2, "stages": 6, "swizzle": 4, "cluster": 2, "swap": 1}
    precision, params = {"nn": ("fp16", DEFAULT), "nn-swap": ("bf16", nn_swap), **A_STORED_K_BY_M}[key]
    config = make_config("hopper", params, precision, "sm_90")
    result = build_kernel(config)
    assert result.ok, result.log
    sass = subprocess.run([_nvdisasm(), str(result.cubin)], capture_output=True, text=True, check=True).stdout
    kernel = sass[sass.index(f".text.{config.name}:"):]
    found = set(re.findall(r"HGMMA\.\S+ R\d+, gdesc\[UR\d+\]((?:\.tnsp[AB])*)", kernel))
    assert found == {flags}, found
    assert "UTMALDG.2D" in kernel and "LDL" not in kernel and "STL" not in kernel
