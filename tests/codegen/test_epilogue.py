"""The fused epilogue (bias and activation) without a GPU: names and their parsing, the families
that refuse it, the hopper, mma and warp sources and launcher ABI (the bias right after C; mma
and warp apply it at their one store, after the split-K reduction), that they compile without
spilling, the host reference and the tolerance it adds, and cuBLASLt's coverage."""

import math
import re

import numpy as np
import pytest
from conftest import assert_compiles_without_spills, build_all

from gemmgen.codegen.render import render_kernel
from gemmgen.describe import tolerance
from gemmgen.describe.config import make_config
from gemmgen.describe.problem import ACTIVATIONS, BIASES, Variant
from gemmgen.errors import InvalidPoint
from gemmgen.measure import verify
from gemmgen.measure.cublaslt import supported

POINT = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "trans": "nt", "out": "bf16"}


def test_names_gain_the_epilogue_only_where_there_is_one():
    config = make_config("hopper", {**POINT, "bias": "col", "act": "gelu"}, "bf16")
    assert config.name == "hopper_128x256_c2_s4_g16_bf16_nt_obf16_bcol_gelu"
    assert make_config("hopper", {**POINT, "act": "silu"}, "bf16").name.endswith("_bf16_nt_obf16_silu")
    assert make_config("hopper", {"bias": "row"}, "fp16").name.endswith("_fp16_brow")
    assert make_config("hopper", POINT, "bf16").name.endswith("_bf16_nt_obf16")
    assert Variant("nt", "bf16", "col", "gelu").items == (("trans", "nt"), ("out", "bf16"), ("bias", "col"),
                                                          ("act", "gelu"))


@pytest.mark.parametrize("family, precision", [("naive", "fp32"), ("shared", "fp32"), ("register", "fp32"),
                                               ("wmma", "fp16"), ("fastgemm", "fp32")])
def test_families_refuse_an_epilogue_they_do_not_fuse(family, precision):
    with pytest.raises(InvalidPoint, match=f"family {family} computes bias=none only, not bias=col"):
        make_config(family, {"bias": "col"}, precision)
    with pytest.raises(InvalidPoint, match=f"family {family} computes act=none only, not act=gelu"):
        make_config(family, {"act": "gelu"}, precision)


def test_others_refuse_while_hopper_mma_and_warp_take_every_epilogue():
    from gemmgen.describe.families import FAMILIES

    fusing = {name for name, f in FAMILIES.items() if f.computes.values("bias") != ("none",)
              or f.computes.values("act") != ("none",)}
    assert fusing == {"hopper", "mma", "warp"}
    for name in fusing:
        assert FAMILIES[name].computes.values("bias") == BIASES and FAMILIES[name].computes.values("act") == ACTIVATIONS


def test_hopper_refuses_the_epilogue_where_overlap_cannot_hold_it():
    with pytest.raises(InvalidPoint, match="overlap=1 staggers the TMA-store epilogue"):
        make_config("hopper", {"overlap": 1, "swap": 1, "BM": 32, "BN": 128, "act": "relu"}, "fp16")


def test_hopper_source_takes_the_bias_after_c_everywhere():
    source = render_kernel(make_config("hopper", {**POINT, "bias": "col", "act": "gelu"}, "bf16"))
    assert "__nv_bfloat16* __restrict__ C, const __nv_bfloat16* __restrict__ bias, const gg_workspace ws)" in source
    flat = re.sub(r"\s+", " ", source)
    # launcher, _plan, _launch_workspace, _plan_workspace; each hands the bias to the plan's operands
    assert flat.count("float beta, __nv_bfloat16* C, const __nv_bfloat16* bias, cudaStream_t stream)") == 4
    assert source.count("gg_operands{M, N, K, 1, alpha, beta, A, B, C, bias, 0, 0, 0, 0, nullptr, nullptr}") == 4
    assert "constexpr gg_bias GG_BIAS = GG_BIAS_COL;" in source
    assert_activation_is(source, "gelu")
    assert "constexpr bool HP_EPILOGUE = true, HP_ROW_BIAS = false, HP_COL_BIAS = true;" in source
    # in the registers, before the TMA-store boxes
    assert ("x = hp_activate(HP_ROW_BIAS ? alpha * x + row_bias[mi][h] : HP_COL_BIAS ? alpha * x + col_bias[e] : "
            "alpha * x);") in source
    # the direct stores (bias_mat: bias unbatched)
    assert "hp_store_pair(c_row + c, v0, v1, beta, bias_mat, r, c);" in source
    assert "return gg_epilogue<CT>(x, bias, r, c);" in source
    assert 'return "nt bf16 col gelu";' in source
    assert "C = gelu(alpha * A @ B + beta * C + bias)" in source
    held = render_kernel(make_config("hopper", {**POINT, "overlap": 1, "bias": "col", "act": "gelu"}, "bf16"))
    # alpha and the epilogue already applied in the registers
    assert "held[i] = acc[0][HP_NACC / 2 + i];" in held  # HP_EPILOGUE ? ... : alpha * ..., decided
    # the right half (columns 128..255) in two boxes of 64 bf16 columns
    assert "constexpr int HELD_BOXES = 2;" in held and "HP_C_BOX_COLS = 64;" in held
    assert "store_held_box(1);" in held and "store_held_box(2);" not in held
    plain = render_kernel(make_config("hopper", POINT, "bf16"))
    assert "constexpr bool HP_EPILOGUE = false;" in plain and "__restrict__ bias" not in plain
    assert re.sub(r"\s+", " ", plain).count("__nv_bfloat16* C, cudaStream_t stream)") == 4
    assert plain.count("gg_operands{M, N, K, 1, alpha, beta, A, B, C, nullptr, 0, 0, 0, 0, nullptr, nullptr}") == 4


MMA = {"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2}
MMA_TF32 = {"BM": 128, "BN": 128, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 4, "frags": 2}
MMA_SPLIT = {"BM": 32, "BN": 128, "BK": 16, "WARPS_M": 1, "WARPS_N": 4, "stages": 4, "frags": 1, "split_k": 4}
WARP = {"BM": 128, "BN": 128, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "buffers": 2}  # v4
# Each of mma's stores (fp16/bf16 fragments; tf32 nn's C^T form; tf32 B stored K x N, 4-element
# rows; tf32 A stored K x M, row pairs; tf32 nt, plain) into fp32 and 16-bit C, split-K, and warp's.
EPILOGUE_POINTS = [
    ("mma", "fp16", {**MMA, "bias": "col", "act": "gelu"}),
    ("mma", "bf16", {**MMA, "trans": "nt", "out": "bf16", "bias": "col", "act": "gelu"}),
    ("mma", "fp16", {**MMA, "trans": "tn", "out": "fp16", "bias": "row", "act": "silu"}),
    ("mma", "tf32", {**MMA_TF32, "bias": "row", "act": "relu"}),
    ("mma", "tf32", {**MMA_TF32, "out": "bf16", "bias": "col", "act": "silu"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "tn", "out": "fp16", "bias": "col", "act": "gelu"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "tt", "bias": "row", "act": "gelu"}),
    ("mma", "tf32", {**MMA_TF32, "trans": "nt", "act": "silu"}),
    ("mma", "tf32", {**MMA_SPLIT, "trans": "tn", "bias": "col", "act": "relu"}),
    ("mma", "bf16", {**MMA, "split_k": 2, "out": "bf16", "bias": "row", "act": "gelu"}),
    ("warp", "fp32", {**WARP, "bias": "col", "act": "gelu"}),
    ("warp", "fp32", {**WARP, "trans": "tt", "split_k": 4, "bias": "row", "act": "silu"}),
    ("warp", "fp32", {**WARP, "split_k": 2, "act": "relu"}),
]


# A line of each activation's code in gg_activate (common.cuh.j2)
ACTIVATION_CODE = {"relu": "return x < 0.0f ? 0.0f : x;", "gelu": "0.7978845608028654f", "silu": "x * sigmoid(x)"}


def assert_activation_is(source: str, act: str):
    """gg_activate holds the code of the variant's activation alone (its if constexpr decided)."""
    for name, code in ACTIVATION_CODE.items():
        assert (code in source) == (name == act), name
    assert "GG_ACT" not in re.sub(r"//[^\n]*", "", source)


def _point_ids(points):
    return [f"{f}-{p}-{q.get('trans', 'nn')}-o{q.get('out', 'fp32')}-b{q.get('bias', 'none')}-{q.get('act', 'none')}"
            f"-k{q.get('split_k', 1)}" for f, p, q in points]


def _kernel_body(source: str) -> str:
    return source.split('extern "C" __global__')[1].split("#ifndef GEMMGEN_LAUNCHER")[0]


@pytest.mark.parametrize("family, precision, params", EPILOGUE_POINTS, ids=_point_ids(EPILOGUE_POINTS))
def test_mma_and_warp_apply_the_epilogue_once_at_the_store(family, precision, params):
    """The bias comes right after C; each thread loads its bias values in one place (bias_of), before
    its stores, along the bias's dimension; every store applies the epilogue, and where there is
    split-K only after the reduction (gg_splitk_reduce itself never sees it): partial sums never go
    through it."""
    config = make_config(family, params, precision)
    v, ct = config.variant, config.output_type
    source = render_kernel(config)
    body = _kernel_body(source)
    assert config.name.endswith(v.suffix)
    assert f'return "{v.text}";' in source
    if v.bias != "none":
        assert f"{ct}* __restrict__ C, const {ct}* __restrict__ bias, const gg_workspace ws)" in source
        assert f"float beta, {ct}* C, const {ct}* bias, cudaStream_t stream)" in re.sub(r"\s+", " ", source)
        assert body.count("gg_bias_value(bias") == 1
        assert "auto bias_of = [&](int i, int n) -> float { return gg_bias_value(bias, i, n); };" in body
        loads = re.findall(r"bias_of\(([^;]*), ([MN])\)", body)  # of M rows (ROW_BIAS), or N columns
        assert 1 <= len(loads) <= 2 and ("M" if v.bias == "row" else "N") in {count for _, count in loads}, loads
        assert "x += b;" in source  # gg_bias_act adds it
    else:
        assert "__restrict__ bias" not in source and "gg_bias_value(bias" not in body
        assert f"float beta, {ct}* C, cudaStream_t stream)" in re.sub(r"\s+", " ", source)
    assert ("ROW_BIAS = true" not in body or v.bias == "row") and ("COL_BIAS = true" not in body or v.bias == "col")
    if v.bias == "none":
        assert "x += b;" not in source
    assert_activation_is(source, v.act)
    stores = [m.start() for m in re.finditer(r"gg_store_c<|store_c\(std::integral_constant|bias_of\(", body)]
    assert stores
    if v.out == "fp32":  # gg_store_c: the sum first, then bias and act
        assert "gg_bias_act(alpha * acc[i] + beta * out[i]" in source
    if family == "mma" and v.out != "fp32":  # 16-bit C: in fp32 before the one rounding
        assert "out[e] = gg_bias_act(out[e], " in body and "x = gg_bias_act(x, " in body
    if config.geometry.split_k == 1:
        assert "gg_splitk_reduce" not in source
        return
    reduce_helper = source.split("GG_DEVICE bool gg_splitk_reduce")[1].split("\n}\n")[0]
    assert "gg_bias_act" not in reduce_helper and "gg_activate" not in reduce_helper
    reduce = body.index("gg_splitk_reduce<")
    assert all(i > reduce for i in stores)
    assert body.count("gg_splitk_reduce<") == 1


@pytest.mark.parametrize("family, precision, params", [("mma", "fp16", MMA), ("mma", "tf32", {**MMA_TF32, "trans": "tn"}),
                                                       ("mma", "bf16", {**MMA, "out": "bf16", "split_k": 2}),
                                                       ("warp", "fp32", {**WARP, "split_k": 4})])
def test_mma_and_warp_without_an_epilogue_have_no_epilogue_code(family, precision, params):
    source = render_kernel(make_config(family, params, precision))
    assert "gg_bias_act" not in source and "gg_activate" not in source
    assert "bias" not in _kernel_body(source).split("{", 1)[0]  # the kernel's parameters
    assert "bool vec_ok)\n" in source  # gg_store_c takes no bias value
    assert "ROW_BIAS = true" not in source and "COL_BIAS = true" not in source


@pytest.mark.slow
@pytest.mark.nvcc
def test_mma_and_warp_epilogues_compile_without_spills():
    """One point of each of mma's stores and of warp, with an epilogue, for sm_80, sm_89 and sm_90:
    no spills (their variants without one spill nowhere either)."""
    targets = ["sm_80", "sm_89", "sm_90"]
    configs = {i: make_config(f, q, p, targets[i % 3]) for i, (f, p, q) in enumerate(EPILOGUE_POINTS)
               if i in (1, 3, 5, 6, 8, 9, 11)}
    for config, result in build_all(configs).values():
        assert_compiles_without_spills(config, result)


def test_activation_reference_values():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    assert verify.activation(x, "relu").tolist() == [0.0, 0.0, 0.0, 0.5, 2.0]
    gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert np.allclose(verify.activation(x, "gelu"), gelu) and verify.activation(x, "gelu")[3] == pytest.approx(0.3457, abs=1e-4)
    assert np.allclose(verify.activation(x, "silu"), x / (1 + np.exp(-x)))
    assert np.isfinite(verify.activation(np.array([-1e300]), "silu")).all()


def test_epilogue_reference_adds_the_bias_along_the_right_axis():
    ref, scale = np.zeros((2, 3)), np.ones((2, 3))
    r, s = verify.epilogue(ref, scale, np.array([1.0, -2.0]), "row", "none")
    assert r.tolist() == [[1, 1, 1], [-2, -2, -2]] and s.tolist() == [[2, 2, 2], [3, 3, 3]]
    r, s = verify.epilogue(ref, scale, np.array([1.0, -2.0, 3.0]), "col", "relu")
    assert r.tolist() == [[1, 0, 3], [1, 0, 3]] and s.tolist() == [[2, 3, 4], [2, 3, 4]]


def test_tolerance_of_an_activation():
    base = tolerance.elementwise_tolerance("bf16", 512, "bf16")
    assert tolerance.elementwise_tolerance("bf16", 512, "bf16", "relu") == base
    assert tolerance.elementwise_tolerance("bf16", 512, "bf16", "gelu") == pytest.approx(1.13 * base + 2.0**-11)
    assert tolerance.elementwise_tolerance("bf16", 512, "fp32", "gelu") == pytest.approx(
        1.13 * tolerance.elementwise_tolerance("bf16", 512) + 2.0**-18)
    assert tolerance.normwise_tolerance("fp32", 1, "fp32", "silu") == pytest.approx(
        1.1 * tolerance.normwise_tolerance("fp32", 1) + 2.0**-18)


def test_an_activation_error_beyond_rounding_fails():
    """A kernel whose GELU were off by 1e-3 relative (say, a wrong constant) fails the check."""
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (64, 256)), rng.uniform(-1, 1, (256, 48))
    ref, scale = verify.host_reference(a, b, None, 1.0, 0.0)
    ref, scale = verify.epilogue(ref, scale, None, "none", "gelu")
    assert verify.compare(ref.astype(np.float32), ref, scale, "fp32", 256, act="gelu").ok
    assert not verify.compare((ref * (1 + 1e-3)).astype(np.float32), ref, scale, "fp32", 256, act="gelu").ok


def test_cublaslt_covers_column_bias_relu_and_gelu():
    assert supported(Variant("nt", "bf16", "col", "gelu")) is None
    assert supported(Variant(act="relu")) is None
    assert "no cuBLASLt baseline" in supported(Variant(bias="row"))
    assert "no cuBLASLt baseline" in supported(Variant(act="silu"))


def test_fp8s_baseline_is_cublaslt_with_k_major_operands():
    from gemmgen.measure.cublas import baseline_api, uses_cublaslt

    assert uses_cublaslt("e4m3") and baseline_api("e4m3", Variant("nt", "bf16")) == "cublasLtMatmul"
    assert not uses_cublaslt("bf16", Variant("nt", "bf16")) and uses_cublaslt("bf16", Variant(bias="col"))
    assert supported(Variant("nt", "bf16"), "e4m3") is None and supported(Variant("nt", "fp32"), "e4m3") is None
    assert "gave wrong results" in supported(Variant("nt", "fp32", "col", "gelu"), "e4m3")
    assert "K-major only (trans=nt: B stored N x K), not trans=nn" in supported(Variant(), "e4m3")


@pytest.mark.nvcc
def test_launcher_reads_the_epilogue_and_wants_its_bias():
    """The launcher says its variant, all four keys, and refuses a launch without the bias it adds
    or with one it does not (kernels other tests build: test_workspace's stream-K point of
    F.linear's layout, and the named hopper_fp16)."""
    from conftest import launcher_of

    from gemmgen.describe.points import NAMED_POINTS

    config = make_config("hopper", {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "streamk": 1, "trans": "nt",
                                    "out": "bf16", "bias": "col", "act": "gelu"}, "bf16")
    launcher = launcher_of(config)
    assert launcher.variant == Variant("nt", "bf16", "col", "gelu")
    with pytest.raises(ValueError, match="adds a bias per col of C"):
        launcher.launch(8, 8, 8, 1.0, 0, 0, 0.0, 0)
    with pytest.raises(ValueError, match="adds no bias"):
        launcher_of(NAMED_POINTS["hopper_fp16"].config("sm_90")).launch(8, 8, 8, 1.0, 0, 0, 0.0, 0, bias=4096)
