"""The hopper family's strided batch (batch=strided) without a GPU: names and the source it renders
(3-D tensor maps, the matrix's coordinate in every TMA load and store, the unbatched kernel's
constants), the launcher's rules (grid over batch x units, batch 0, packing of strides TMA cannot
take, C stored directly where its stride is not 16-byte multiples, the int-count refusal), and the
sm_90a build of batched points (no spills; where nvdisasm is installed, 3-D TMA in the SASS).
The GPU twin is test_gpu_batched_hopper.py."""

import re
import subprocess

import pytest

from conftest import assert_compiles_without_spills, build_all, launcher_of

from gemmgen.build.nvcc import find_tool
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.families import FAMILIES
from gemmgen.errors import ToolNotFound
from gemmgen.measure.launcher import ShapeRefused

BASE = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "batch": "strided"}
# batched points over the schedules: coop nn, nt into bf16 with a column bias and GELU, stream-K
# (whose thin problems are split-K), overlap, ping-pong, swap-AB (thin M), A stored K x M with swap,
# a cluster of 2 with tt, tf32 (C^T from registers)
POINTS = {
    "nn": ("fp16", {}),
    "nt_obf16_bcol_gelu": ("bf16", {"BM": 256, "BN": 128, "trans": "nt", "out": "bf16", "bias": "col", "act": "gelu"}),
    "sk": ("fp16", {"streamk": 1}),
    "ov": ("fp16", {"overlap": 1}),
    "pingpong": ("fp16", {"BN": 128, "stages": 6, "schedule": "pingpong"}),
    "sw": ("bf16", {"BM": 32, "BN": 128, "swap": 1}),
    "sw_tn": ("fp16", {"BM": 64, "BN": 128, "swap": 1, "trans": "tn", "bias": "row"}),
    "x2_tt": ("bf16", {"cluster": 2, "trans": "tt", "out": "fp16", "bias": "row", "act": "relu"}),
    "tf32": ("tf32", {"cluster": 2, "act": "silu"}),
}


def config(label):
    precision, params = POINTS[label]
    return make_config("hopper", {**BASE, **params}, precision, "sm_90")


def test_hopper_computes_a_strided_batch_and_names_it():
    assert "strided" in FAMILIES["hopper"].computes.values("batch")
    c = config("nt_obf16_bcol_gelu")
    assert c.name == "hopper_256x128_c2_s4_g8_bf16_nt_obf16_bcol_gelu_batched"
    assert c.variant.text == "nt bf16 col gelu strided"
    for label in POINTS:  # every schedule, layout and precision takes it
        assert config(label).name.endswith("_batched")


def test_batched_source_uses_3d_maps_and_the_matrix_coordinate():
    source = render_kernel(config("nt_obf16_bcol_gelu"))
    assert "    b = unit / batch_units;\n    unit -= b * batch_units;" in source  # if constexpr (HP_BATCHED), decided
    assert "int M, int N, int K, int batch, float alpha, const __nv_bfloat16* __restrict__ A, long long stride_a," in source
    assert "__nv_bfloat16* __restrict__ C, long long stride_c, const __nv_bfloat16* __restrict__ bias, long long stride_bias" in source
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3, %4 }]" in source
    assert "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group" in source
    # batch x units, one list; an operand of stride 0 is read at coordinate 0
    assert "const int units = batch_units * batch;" in source  # HP_BATCHED ? ... : batch_units, decided
    assert "const int za = stride_a != 0 ? b : 0, zb = stride_b != 0 ? b : 0;" in source
    assert "gg_grouped_tile(hp_in_matrix(work.unit, batch_units, b), unit_rows, tiles_n, group, um, tn);" in source
    assert "<= HP_ONE_GROUP_BYTES ? unit_rows : 8;" in source  # the point's swizzle where A is larger
    assert "using CT = __nv_bfloat16;" in source and "const CT* const bias_mat = hp_matrix(bias, b, stride_bias);" in source
    assert "const bool c_tma = gg_tma_stores_c(beta, N, C, batch, stride_c);" in source
    # the launcher: 3-D maps over the batch (or the packed copies), C's rule with its stride
    assert "{{" not in source and "a_mats, a_step);" in source and "b_mats, b_step);" in source
    assert "c_mats, c_step);" in source
    assert "map_over_c && gg_tma_stores_c(o.beta, o.N, o.C, o.batch, o.stride_c);" in source
    # one product: the same code, batch 1 and zero strides as constants, 2-D maps
    plain = render_kernel(make_config("hopper", {**BASE, **POINTS["nt_obf16_bcol_gelu"][1], "batch": "none"}, "bf16",
                                      "sm_90"))
    assert "const int units = batch_units;" in plain  # HP_BATCHED ? ... : batch_units, decided
    assert "constexpr bool HP_BATCHED" not in plain and "GG_BATCH =" not in plain  # every use decided, trimmed
    assert "unsigned long long a_mats = 0, b_mats = 0, c_mats = 0" in plain  # 2-D maps unless batched
    assert "[[maybe_unused]] constexpr int batch = 1;" in plain
    assert "[[maybe_unused]] constexpr long long stride_a = 0, stride_b = 0, stride_c = 0, stride_bias = 0;" in plain


def test_overlap_stores_the_held_half_into_its_own_matrix():
    source = render_kernel(config("ov"))
    assert "gg_grouped_tile(hp_in_matrix(pending_unit, batch_units, held_b), unit_rows, tiles_n, group, pm, pn);" in source
    # the right half's boxes (4..7 of 32 columns) into the held tile's matrix; the left half now, into this one's
    assert "constexpr int HELD_BOXES = 4;" in source and "HP_C_BOX_COLS = 32;" in source
    assert ("staging.store_box<CT, false>(map_c, N, HELD_BOXES + i, held_row, held_col, held_b, held, HP_NACC / 2, "
            "alpha);") in source
    assert "staging.store_box<CT, !HP_EPILOGUE>(map_c, N, j, box_row, tile_col, b, acc[mi], 0, alpha);" in source
    assert "hp_store(at + box, map, col + j * HP_C_BOX_COLS, row, z);" in source


def describe(launcher, m, n, k, batch, **strides):
    info = launcher.describe(m, n, k, resident=132, batch=batch, **strides)
    return tuple(info.grid), info.packed_a_bytes, info.packed_b_bytes, info.stores_c, info.flag_words


@pytest.mark.nvcc
def test_launcher_rules_of_a_batch():
    launcher = launcher_of(config("nt_obf16_bcol_gelu"))  # 256 x 128 tiles
    # the persistent grid covers batch x tiles, at most one block per SM
    assert describe(launcher, 256, 128, 64, 8) == ((8, 1, 1), 0, 0, 1, 0)
    assert describe(launcher, 256, 128, 64, 200)[0] == (132, 1, 1)
    assert describe(launcher, 1, 1, 1, 3)[0] == (3, 1, 1)
    assert describe(launcher, 256, 128, 64, 0) == ((0, 0, 0), 0, 0, 0, 0)  # nothing to launch
    # a stride TMA cannot take (bytes not a multiple of 16): that operand is packed, matrix by matrix
    _, a, b, _, _ = describe(launcher, 256, 128, 64, 8, stride_a=256 * 64 + 4)
    assert a == 8 * 256 * 64 * 2 and b == 0
    _, a, b, _, _ = describe(launcher, 256, 128, 64, 8, stride_b=128 * 64 + 1)
    assert a == 0 and b == 8 * 128 * 64 * 2
    # stride 0: one matrix for all, read in place; padded strides of 16-byte multiples too
    assert describe(launcher, 256, 128, 64, 8, stride_a=0, stride_b=0)[1:3] == (0, 0)
    assert describe(launcher, 256, 128, 64, 8, stride_a=256 * 64 + 8, stride_b=128 * 64 + 64)[1:3] == (0, 0)
    # C: through TMA only where its stride is 16-byte multiples too (one product: any stride)
    assert describe(launcher, 256, 128, 64, 8, stride_c=256 * 128 + 4)[3] == 0
    assert describe(launcher, 256, 128, 64, 8, stride_c=256 * 128 + 8)[3] == 1
    assert describe(launcher, 256, 128, 64, 1, stride_c=3)[3] == 1
    with pytest.raises(ShapeRefused, match="batch must be >= 0"):
        launcher.describe(256, 128, 64, resident=132, batch=-1)
    with pytest.raises(ShapeRefused, match="C's matrices overlap: with batch > 1, stride_c must be >= M \\* N"):
        launcher.describe(256, 128, 64, resident=132, batch=2, stride_c=256 * 128 - 1)
    with pytest.raises(ShapeRefused, match="batch times the 256 x 128 units of one product must be < 2\\^30"):
        launcher.describe(2**20, 2**20, 64, resident=132, batch=2**10)


@pytest.mark.nvcc
def test_stream_k_and_cluster_grids_of_a_batch():
    sk = launcher_of(config("sk"))
    # stream-K: every SM, flags and partial slots per block (so per unit of any matrix)
    grid, _, _, _, flags = describe(sk, 128, 256, 4096, 3)
    assert grid == (132, 1, 1) and flags == 132 * 2
    x2 = launcher_of(config("x2_tt"))
    # a unit is 2 tile rows of one tile column: 129 rows are one unit per matrix, 5 matrices 5 units
    assert describe(x2, 129, 256, 64, 5)[0] == (10, 1, 1)
    assert describe(x2, 129, 256, 64, 100)[0] == (132, 1, 1)


def _nvdisasm() -> str | None:
    try:
        return find_tool("nvdisasm")
    except ToolNotFound:
        return None


@pytest.mark.slow
@pytest.mark.nvcc
def test_batched_points_compile_without_spills_with_3d_tma():
    results = build_all({label: config(label) for label in POINTS})
    for label, (c, result) in results.items():
        assert_compiles_without_spills(c, result)
        if _nvdisasm() is None:
            continue
        sass = subprocess.run([_nvdisasm(), str(result.cubin)], capture_output=True, text=True, check=True).stdout
        kernel = sass[sass.index(f".text.{c.name}:"):]
        assert "UTMALDG.3D" in kernel and "UTMALDG.2D" not in kernel, label
        assert ("UTMALDG.3D.MULTICAST" in kernel) == (c.params["cluster"] > 1), label
        assert ("UTMASTG.3D" in kernel) == (not c.derived["SWAP_AB"]), label
        assert "LDL" not in kernel and "STL" not in kernel, label
