"""The problem variant without a GPU: names gain parts only away from (nn, fp32) (they parse back:
tests/describe/test_config.py), families that do not compute a variant refuse it in one line, the hopper source for B stored
N x K and 16-bit C says so (TMA map, transpose bits, C type), the tolerance grows by the store's
rounding only for 16-bit C, and the policy never ranks a kernel of another variant."""

import re

import pytest

from gemmgen.codegen.render import render_kernel
from gemmgen.describe import tolerance
from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import InvalidParameter, InvalidPoint

NT_BF16 = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "trans": "nt", "out": "bf16"}


def test_names_change_only_away_from_the_default():
    plain = make_config("hopper", {k: v for k, v in NT_BF16.items() if k not in ("trans", "out")}, "bf16")
    assert plain.name == "hopper_128x256_c2_s4_g8_bf16" and plain.variant == Variant()
    nt = make_config("hopper", NT_BF16, "bf16")
    assert nt.name == "hopper_128x256_c2_s4_g8_bf16_nt_obf16"
    assert make_config("hopper", {**NT_BF16, "out": "fp32"}, "bf16").name == "hopper_128x256_c2_s4_g8_bf16_nt"
    assert make_config("hopper", {**NT_BF16, "trans": "nn"}, "bf16").name == "hopper_128x256_c2_s4_g8_bf16_obf16"


def test_families_refuse_what_they_do_not_compute():
    with pytest.raises(InvalidPoint, match=r"family wmma computes trans=nn only, not trans=nt"):
        make_config("wmma", {"trans": "nt"}, "fp16")
    with pytest.raises(InvalidPoint, match=r"family wmma computes out=fp32 only, not out=bf16"):
        make_config("wmma", {"out": "bf16"}, "fp16", "sm_80")
    with pytest.raises(InvalidPoint, match=r"family warp computes out=fp32 only, not out=fp16"):
        make_config("warp", {"trans": "tn", "out": "fp16"}, "fp32")
    assert make_config("hopper", {**NT_BF16, "overlap": 1}, "bf16").name == "hopper_128x256_c2_s4_g8_ov_bf16_nt_obf16"
    with pytest.raises(InvalidPoint, match=r"tf32 computes trans=nn into fp32 C only"):
        make_config("hopper", {"trans": "nt"}, "tf32")


def test_hopper_source_for_b_stored_transposed_and_bf16_c():
    source = render_kernel(make_config("hopper", NT_BF16, "bf16"))
    # C's type in the kernel and every launcher function, and what the launcher says it computes
    assert "float beta, __nv_bfloat16* __restrict__ C, const gg_workspace ws)" in source
    assert "float beta, __nv_bfloat16* C, cudaStream_t stream)" in re.sub(r"\s+", " ", source)
    assert 'return "nt bf16 none none";' in source
    # B's map is N x K with K inner; C's map is bf16 in 64-column boxes; no transpose bit
    assert "constexpr bool GG_A_T = false;" in source and "constexpr bool GG_B_T = true;" in source
    assert "const int b_rows = o.N, b_cols = o.K;" in source  # GG_B_T ? o.N : o.K, decided
    assert re.search(r"CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof\(__nv_bfloat16\), o.C, o.M, o.N, \(size_t\)o.N,"
                     r"\s+16, 64, "
                     r"c_mats, c_step\);", source)
    assert re.search(r"m64n256k16\.f32\.bf16\.bf16.*acc, 1, 1, 0, 0;", source, re.S)
    assert "gg_pack_plan<8, __nv_bfloat16, GG_B_T, GG_A_T>" in source
    assert "B, GG_B_T ? N : K, GG_B_T ? K : N);" in source
    assert "gg_pack2<__nv_bfloat16>" in source
    plain = render_kernel(make_config("hopper", {"BM": 128, "BN": 256}, "bf16"))
    assert "acc, 1, 1, 0, 1;" in plain and 'return "nn fp32 none none";' in plain and "float* __restrict__ C" in plain


def test_tolerance_grows_by_the_store_only_for_16_bit_c():
    k = 4096
    assert tolerance.elementwise_tolerance("bf16", k, "fp32") == tolerance.elementwise_tolerance("bf16", k)
    assert tolerance.elementwise_tolerance("bf16", k, "bf16") == pytest.approx(
        tolerance.elementwise_tolerance("bf16", k) + 2 * 2.0**-8)
    assert tolerance.normwise_tolerance("fp16", k, "fp16") == pytest.approx(
        tolerance.normwise_tolerance("fp16", k) + 2 * 2.0**-11)


def test_variant_dims():
    s = Shape(3, 5, 7)
    assert Variant("nt").b_dims(s) == (5, 7) and Variant().b_dims(s) == (7, 5)
    assert Variant("tn").a_dims(s) == (7, 3) and Variant().a_dims(s) == (3, 7)


def test_best_never_ranks_another_variant(tmp_path):

    from gemmgen.describe.arch import parse_arch
    from gemmgen.selection.best import ranked
    from gemmgen.store.db import ResultsDB

    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    device = db.device(name="H100", arch="sm_90", sm_count=132, clock_mhz=1, memory_clock_mhz=1, driver_version="x",
                       cuda_version="x")
    problem = db.problem(4096, 4096, 4096, 1.0, 0.0)
    for name, tflops in (("cublas_bf16", 700.0), ("cublas_bf16_nt_obf16", 770.0),
                         ("hopper_128x256_c2_s4_g8_bf16", 720.0), ("hopper_128x256_c2_s4_g8_bf16_nt_obf16", 750.0)):
        kernel = db.kernel(name=name, family="cublas" if name.startswith("cublas") else "hopper", precision="bf16",
                           arch="sm_90", params={})
        db.record(kernel_id=kernel, device_id=device, problem_id=problem, status="ok", median_ms=1.0, min_ms=1.0,
                  max_ms=1.0, runs=1, tflops=tflops, rel_error=0.0, message="", tag="t")
    plain = ranked(db, "bf16", Shape(4096, 4096, 4096), parse_arch("sm_90"))
    nt = ranked(db, "bf16", Shape(4096, 4096, 4096), parse_arch("sm_90"), variant=Variant("nt", "bf16"))
    assert [r.kernel for r in plain] == ["hopper_128x256_c2_s4_g8_bf16"]
    assert [r.kernel for r in nt] == ["hopper_128x256_c2_s4_g8_bf16_nt_obf16"]
    assert nt[0].score == pytest.approx(750 / 770) and plain[0].score == pytest.approx(720 / 700)



def test_what_a_family_computes_is_its_one_declaration():
    """Family.computes is read by make_config's constraints, the tuner's check and the default
    family of a workload alike: a variant of one key away from the default is refused by each
    exactly where the declaration leaves it out, with the same line."""
    from gemmgen.describe.arch import parse_arch
    from gemmgen.describe.families import FAMILIES
    from gemmgen.describe.problem import FIELDS
    from gemmgen.tune.loop import check_variant
    from gemmgen.tune.space import load_space
    from gemmgen.tune.workload import default_family

    assert {name for name, f in FAMILIES.items() if f.computes.refused(Variant(out="bf16"))} == {
        "naive", "shared", "register", "warp", "wmma", "fastgemm"}
    arch = parse_arch("sm_90")
    for name, fam in FAMILIES.items():
        for f in FIELDS:
            for value in f.choices:
                variant = Variant(**{f.key: value})
                line = f"family {name} computes {f.key}={' or '.join(fam.computes.values(f.key))} only, not {f.key}={value}"
                computed = value in fam.computes.values(f.key)
                assert (variant in fam.computes) == computed
                try:
                    make_config(fam, {}, fam.precisions[-1], "sm_90a" if fam.arch_specific else "sm_90", variant)
                    refused = []
                except InvalidPoint as err:
                    refused = [v for v in err.violations if v.startswith(f"family {name} computes ")]
                assert refused == ([] if computed else [line])
                if not computed:
                    with pytest.raises(InvalidParameter, match=f"^{re.escape(line)}; see gemmgen list"):
                        check_variant(load_space(name), fam.precisions[-1], arch, variant)
    wanted = Variant(out="bf16", batch="strided")  # fp32's default family (warp) stores C as fp32 only
    assert [default_family(p, arch, wanted) for p in ("tf32", "fp16", "bf16")] == ["hopper"] * 3
    assert default_family("bf16", parse_arch("sm_80"), wanted) == "mma"
    with pytest.raises(InvalidParameter, match="no default family tunes fp32 \\(nn bf16 none none strided\\)"):
        default_family("fp32", arch, wanted)
