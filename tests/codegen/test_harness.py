"""`emit --harness` for every problem variant, without a GPU: the main() templates/harness.cuh.j2
adds reads A and B as the variant stores them, keeps C and the bias in C's type, applies the
variant's epilogue in its float64 reference and judges by gemmgen/describe/tolerance.py's numbers and
gemmgen/measure/verify.py's checks (rendered from them); single kernels and dispatchers of a variant
compile and link with it. tests/codegen/test_gpu_harness.py runs these programs (POINTS, DISPATCHERS)."""

import re

import pytest
from conftest import nvcc_compile, slow_after, table_plan

from gemmgen.cli.main import main
from gemmgen.codegen.render import harness_checks, render_kernel
from gemmgen.describe import tolerance
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.config import make_config
from gemmgen.describe.points import resolve_point
from gemmgen.describe.problem import Shape, Variant
from gemmgen.measure import verify
from gemmgen.selection.dispatch.emit import render_dispatcher
from gemmgen.selection.dispatch.select import DispatchPlan

SM90 = parse_arch("sm_90")
MARKER = "// ---- gemmgen harness:"  # the harness's first line: what follows it is the harness

# label -> (family, precision, variant and parameters): points of several families and variants
# whose --harness program the GPU twin builds and runs (hopper on sm_90 only)
POINTS = {
    "hopper_nt_obf16_bcol_gelu": ("hopper", "bf16", {"trans": "nt", "out": "bf16", "bias": "col", "act": "gelu"}),
    "hopper_ofp16_brow_silu": ("hopper", "fp16", {"out": "fp16", "bias": "row", "act": "silu"}),
    "hopper_tf32_bcol_relu": ("hopper", "tf32", {"bias": "col", "act": "relu"}),
    "hopper_tn_obf16_bcol_gelu": ("hopper", "bf16", {"trans": "tn", "out": "bf16", "bias": "col", "act": "gelu"}),
    "hopper_tt_brow_relu": ("hopper", "fp16", {"trans": "tt", "bias": "row", "act": "relu"}),
    "mma_tn_ofp16": ("mma", "fp16", {"trans": "tn", "out": "fp16"}),
    "mma_tt_obf16_brow_relu": ("mma", "bf16", {"trans": "tt", "out": "bf16", "bias": "row", "act": "relu"}),
    "mma_tf32_nt_bcol_gelu": ("mma", "tf32", {"trans": "nt", "bias": "col", "act": "gelu"}),
    "warp_tt": ("warp", "fp32", {"trans": "tt"}),
    "warp_nt": ("warp", "fp32", {"trans": "nt"}),
    "warp_tn_bcol_silu": ("warp", "fp32", {"trans": "tn", "bias": "col", "act": "silu"}),
    # FP8 with its scales (random fp32 values the harness makes): row-wise, and one per tensor
    "hopper_e4m3_nt_obf16_bcol_gelu_srow": ("hopper", "e4m3", {"trans": "nt", "out": "bf16", "bias": "col",
                                                               "act": "gelu", "scale": "row"}),
    "hopper_e4m3_nt_stensor": ("hopper", "e4m3", {"trans": "nt", "scale": "tensor"}),
    # a strided batch (./gemm M N K runs [batch], 3 by default): every matrix checked
    "mma_batched_nt_obf16_bcol_gelu_k2": ("mma", "bf16", {"trans": "nt", "out": "bf16", "bias": "col", "act": "gelu",
                                                          "split_k": 2, "batch": "strided"}),
    "warp_batched_tt_brow": ("warp", "fp32", {"trans": "tt", "bias": "row", "batch": "strided"}),
}
# dispatchers of a variant: label -> (the kernels' canonical names, one shape each serves)
DISPATCHERS = {
    "hopper_nt_obf16_bcol_gelu": (("hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol_gelu",
                                   "hopper_64x128_c1_s5_bf16_nt_obf16_bcol_gelu"),
                                  (Shape(1024, 1024, 1024), Shape(16, 1024, 1024))),
    "mma_tn_ofp16": (("mma_128x128x32_w2x2_s3_f2_fp16_tn_ofp16", "mma_64x64x32_w2x2_s3_f2_fp16_tn_ofp16"),
                     (Shape(1024, 1024, 1024), Shape(16, 1024, 1024))),
    # a strided batch: its harness (./gemm M N K [runs [batch]]) checks every matrix
    "hopper_batched_nt_obf16_bcol_gelu": (("hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol_gelu_batched",
                                           "hopper_64x128_c1_s5_bf16_nt_obf16_bcol_gelu_batched"),
                                          (Shape(1024, 1024, 1024), Shape(16, 1024, 1024))),
    # FP8 with row-wise scales: the dispatcher passes scale_a and scale_b on to the kernel it picks
    "hopper_e4m3_nt_obf16_bcol_srow": (("hopper_128x128_c2_s6_g8_sk_pr4_e4m3_nt_obf16_bcol_srow",
                                        "hopper_64x128_c2_s6_g8_sw_pr4_e4m3_nt_obf16_bcol_srow"),
                                       (Shape(1024, 1024, 1024), Shape(16, 1024, 1024))),
}


def point_config(label: str, arch=SM90):
    family, precision, params = POINTS[label]
    return make_config(family, params, precision, arch)


def dispatch_plan(label: str, arch=SM90) -> DispatchPlan:
    """A dispatcher of DISPATCHERS[label]: kernel i serves shape i."""
    names, shapes = DISPATCHERS[label]
    kernels = tuple(resolve_point(name, arch.name) for name in names)
    return table_plan(kernels, {shape: i for i, shape in enumerate(shapes)}, ("H100",))


def spliced(kernel_config, judge_config) -> str:
    """``kernel_config``'s kernel and launcher with the harness of ``judge_config`` (of the same
    launcher ABI): a program whose kernel computes another variant than its harness checks."""
    kernel, judge = render_kernel(kernel_config, harness=True), render_kernel(judge_config, harness=True)
    return kernel[:kernel.index(MARKER)] + judge[judge.index(MARKER):]


def build_flags(source: str) -> list[str]:
    """nvcc's flags for a --harness program, as its harness's header gives them
    (nvcc -O3 <flags> gemm.cu -o gemm)."""
    return re.search(r"Build: nvcc -O3 (.+) gemm\.cu -o gemm", source)[1].split()


def harness_of(source: str) -> str:
    return source[source.index(MARKER):]


def tolerance_coefficients(source: str) -> tuple[float, float, float, float]:
    """(e0, e1, n0, n1) of the harness's elem_tol = e0 + e1 * K and norm_tol = n0 + n1 * sqrt(K)."""
    elem = re.search(r"const double elem_tol = (\S+) \+ (\S+) \* K;", source)
    norm = re.search(r"const double norm_tol = (\S+) \+ (\S+) \* sqrt\(\(double\)K\);", source)
    return float(elem[1]), float(elem[2]), float(norm[1]), float(norm[2])


VARIANTS = [("hopper", "bf16", Variant(trans, out, bias, act)) for trans in ("nn", "nt", "tn", "tt")
            for out in ("fp32", "bf16") for bias in ("none", "row", "col") for act in ("none", "gelu")] + \
    [("mma", precision, Variant(trans, out, bias, act)) for precision in ("fp16", "tf32")
     for trans in ("nn", "nt", "tn", "tt") for out in (("fp32", "fp16") if precision == "fp16" else ("fp32",))
     for bias, act in (("none", "none"), ("row", "silu"))] + \
    [("warp", "fp32", Variant(trans, "fp32", bias, act)) for trans in ("nn", "nt", "tn", "tt")
     for bias, act in (("none", "none"), ("col", "relu"))]


# every seventh variant every time (each family, layout, C type, bias and activation among them),
# all of them with -m slow: a render and trim each, 80 of them a minute and a half
@pytest.mark.parametrize("family, precision, variant",
                         slow_after(12, VARIANTS[::7] + [v for i, v in enumerate(VARIANTS) if i % 7]),
                         ids=lambda x: x.text.replace(" ", "-") if isinstance(x, Variant) else x)
def test_every_variant_gets_a_harness_of_its_own_variant(family, precision, variant):
    config = make_config(family, dict(variant.items), precision, SM90)
    harness = harness_of(render_kernel(config, harness=True))
    assert harness.count("int main(") == 1 and "{{" not in harness and "{%" not in harness
    assert f"checks {config.name}\n" in harness and f"// Variant {variant.text}: " in harness
    # its own variant's codes (vocab.cuh.j2), in its own namespace: a kernel of another variant spliced
    # in (the GPU twin's planted bugs) does not change what the harness checks
    assert f"typedef {config.element_type} gg_elem;" in harness and f"typedef {config.output_type} gg_out;" in harness
    assert harness.index("namespace gg_harness {") < harness.index("constexpr gg_trans GG_TRANS")
    assert f"constexpr bool GG_A_T = {str(variant.a_transposed).lower()};" in harness
    assert f"constexpr bool GG_B_T = {str(variant.b_transposed).lower()};" in harness
    assert f"constexpr gg_bias GG_BIAS = GG_BIAS_{variant.bias.upper()};" in harness
    assert f"constexpr gg_act GG_ACT = GG_ACT_{variant.act.upper()};" in harness
    # the bias goes right after C, as the launcher's ABI has it, in the checks and the timed plan
    assert harness.count("dC, dBias, 0)" if variant.bias != "none" else "dC, 0)") == 2


@pytest.mark.parametrize("precision, out, act", [
    ("fp32", "fp32", "none"), ("tf32", "fp32", "relu"), ("fp16", "fp16", "silu"), ("bf16", "bf16", "gelu"),
    ("bf16", "fp32", "gelu"), ("fp16", "fp32", "none")])
def test_the_tolerance_is_tolerance_py_at_every_k(precision, out, act):
    """The harness takes K at run time: its bounds are tolerance.py's at any K, from one source."""
    config = make_config("warp" if precision == "fp32" else "hopper", {"out": out, "act": act}, precision, SM90)
    e0, e1, n0, n1 = tolerance_coefficients(render_kernel(config, harness=True))
    for k in (1, 2, 17, 1000, 4093, 65536, 2**31 - 1):
        assert e0 + e1 * k == pytest.approx(tolerance.elementwise_tolerance(precision, k, out, act), rel=1e-9)
        assert n0 + n1 * k**0.5 == pytest.approx(tolerance.normwise_tolerance(precision, k, out, act), rel=1e-9)


def test_the_checks_are_verify_checks_first_into_a_poisoned_c():
    harness = harness_of(render_kernel(point_config("hopper_nt_obf16_bcol_gelu"), harness=True))
    calls = re.findall(r"ok = gg_check\(M, N, K, (\S+)f, (\S+)f, dA, dB, dC, dC0, dBias, dScaleA, dScaleB, dRef,\s+"
                       r"dScale\) && ok;", harness)
    assert [(float(a), float(b)) for a, b in calls] == [tuple(map(float, c)) for c in verify.CHECKS]
    assert verify.CHECKS[0][1] == 0.0 and "cudaMemset(dC, 0xFF" in harness


def test_a_tolerance_that_is_not_affine_in_k_is_a_bug_not_a_wrong_bound(monkeypatch):
    monkeypatch.setattr(tolerance, "normwise_tolerance", lambda precision, k, out="fp32", act="none": 1e-6 * k)
    with pytest.raises(ValueError, match=r"tolerance for fp16 nn fp32 none none is not affine in K and sqrt\(K\)"):
        harness_checks("fp16", Variant())


def test_a_dispatchers_harness_checks_its_variant():
    plan = dispatch_plan("hopper_nt_obf16_bcol_gelu")
    harness = harness_of(render_dispatcher(plan, ["--dispatch"], harness=True))
    assert "checks dispatcher\n" in harness and "// Variant nt bf16 col gelu: " in harness
    assert "typedef __nv_bfloat16 gg_out;" in harness and "dC, dBias, 0)" in harness
    single = harness_of(render_kernel(plan.kernels[0], harness=True))
    assert tolerance_coefficients(harness) == tolerance_coefficients(single)


def test_emit_dispatch_harness_of_a_variant_from_the_cli(capsys, tmp_path):
    from stored import V_BIG, V_THIN, stored_variant

    _, url = stored_variant(tmp_path)
    argv = ["emit", "--dispatch", "--shape", "4096", "--shape", "16x4096x4096", "--precision", "bf16", "--gpu",
            "sm_90", "--trans", "nt", "--out", "bf16", "--bias", "col", "--act", "gelu", "--db", url, "--harness"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("int main(") == 1 and "// Variant nt bf16 col gelu: " in harness_of(out)
    assert set(re.findall(r"^//   \d  (\S+)$", out, re.M)) == {V_BIG, V_THIN}
    assert "//   gemmgen emit --dispatch --shape 4096 --shape 16x4096x4096 --precision bf16 --gpu sm_90 --trans nt " \
           "--out bf16 --bias col --act gelu --harness" in out


# ---- nvcc: the programs compile and link as their headers say ----

BUILDS = {  # the first in every run (a layout and split-K's workspace in one program), the others in the slow run
    "warp_tt_k4_g8": lambda: render_kernel(make_config("warp", {"trans": "tt", "split_k": 4, "swizzle": 8}, "fp32", SM90),
                                           harness=True),
    "warp_tt": lambda: render_kernel(point_config("warp_tt"), harness=True),
    "hopper_nt_obf16_bcol_gelu": lambda: render_kernel(point_config("hopper_nt_obf16_bcol_gelu"), harness=True),
    "mma_tn_ofp16": lambda: render_kernel(point_config("mma_tn_ofp16"), harness=True),
    "dispatcher_hopper_nt_obf16_bcol_gelu": lambda: render_dispatcher(dispatch_plan("hopper_nt_obf16_bcol_gelu"),
                                                                      ["--dispatch"], harness=True),
    "dispatcher_hopper_batched_nt_obf16_bcol_gelu": lambda: render_dispatcher(
        dispatch_plan("hopper_batched_nt_obf16_bcol_gelu"), ["--dispatch"], harness=True),
    "dispatcher_hopper_e4m3_nt_obf16_bcol_srow": lambda: render_dispatcher(
        dispatch_plan("hopper_e4m3_nt_obf16_bcol_srow"), ["--dispatch"], harness=True),
}


@pytest.mark.nvcc
@pytest.mark.parametrize("label", slow_after(1, list(BUILDS)))
def test_a_variants_harness_compiles_and_links(tmp_path, label):
    source = BUILDS[label]()
    assert nvcc_compile(source, tmp_path / label, None, *build_flags(source)).is_file()
