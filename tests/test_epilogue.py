"""The fused epilogue (bias and activation) without a GPU: names and their parsing, the families
that refuse it, the hopper source and launcher ABI (the bias right after C), the host reference
and the tolerance it adds, and cuBLASLt's coverage."""

import math

import numpy as np
import pytest

from gemmgen import tolerance, verify
from gemmgen.config import make_config
from gemmgen.cublaslt import supported
from gemmgen.errors import InvalidParameter, InvalidPoint
from gemmgen.points import resolve_point
from gemmgen.problem import Variant, variant_of
from gemmgen.render import render_kernel

POINT = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "trans": "nt", "out": "bf16"}


def test_names_gain_the_epilogue_only_where_there_is_one():
    config = make_config("hopper", {**POINT, "bias": "col", "act": "gelu"}, "bf16")
    assert config.name == "hopper_128x256_c2_s4_g16_bf16_nt_obf16_bcol_gelu"
    assert make_config("hopper", {**POINT, "act": "silu"}, "bf16").name.endswith("_bf16_nt_obf16_silu")
    assert make_config("hopper", {"bias": "row"}, "fp16").name.endswith("_fp16_brow")
    assert make_config("hopper", POINT, "bf16").name.endswith("_bf16_nt_obf16")
    assert Variant("nt", "bf16", "col", "gelu").items == (("trans", "nt"), ("out", "bf16"), ("bias", "col"),
                                                          ("act", "gelu"))


@pytest.mark.parametrize("name", ["hopper_128x256_c2_s4_g16_bf16_nt_obf16_bcol_gelu", "hopper_64x128_c1_s5_fp16_brow",
                                  "hopper_128x128_c2_s6_g8_sk_fp16_nt_ofp16_bcol_relu", "hopper_128x128_c2_s4_tf32_silu"])
def test_names_parse_back(name):
    config = resolve_point(name)
    assert config.name == name and config.variant == variant_of(name)


def test_variant_text_round_trips_and_old_launchers_read_as_no_epilogue():
    v = Variant("nt", "fp16", "row", "relu")
    assert v.text == "nt fp16 row relu" and Variant.parse(v.text) == v
    assert Variant.parse("nt bf16") == Variant("nt", "bf16")
    with pytest.raises(InvalidParameter, match="cannot read variant"):
        Variant.parse("nt bf16 col")
    with pytest.raises(InvalidParameter, match="bias must be one of: none, row, col"):
        Variant(bias="both")
    with pytest.raises(InvalidParameter, match="act .* must be one of: none, relu, gelu, silu"):
        Variant(act="tanh")


def test_families_refuse_an_epilogue_they_do_not_fuse():
    with pytest.raises(InvalidPoint, match="family warp adds no bias in its epilogue"):
        make_config("warp", {"bias": "col"}, "fp32")
    with pytest.raises(InvalidPoint, match="family warp applies act=none only, not act=gelu"):
        make_config("warp", {"act": "gelu"}, "fp32")
    with pytest.raises(InvalidPoint, match="overlap=1 staggers the TMA-store epilogue"):
        make_config("hopper", {"overlap": 1, "swap": 1, "BM": 32, "BN": 128, "act": "relu"}, "fp16")


def test_hopper_source_takes_the_bias_after_c_everywhere():
    source = render_kernel(make_config("hopper", {**POINT, "bias": "col", "act": "gelu"}, "bf16"))
    assert "__nv_bfloat16* __restrict__ C, const __nv_bfloat16* __restrict__ bias, const gg_workspace ws)" in source
    assert "float beta, __nv_bfloat16* C, const __nv_bfloat16* bias, cudaStream_t stream)" in source  # launcher, _plan
    assert source.count("const __nv_bfloat16* bias, cudaStream_t stream)") == 3  # plan_init, launcher, _plan
    assert "constexpr int GG_BIAS = 2;" in source and "constexpr int GG_ACT = 2;" in source
    assert "x = gg_activate(alpha * x + col_bias[e]);" in source  # in the registers, before the TMA-store boxes
    assert "gg_epilogue<__nv_bfloat16>(v0, bias, r, c)" in source  # the direct stores
    assert 'return "nt bf16 col gelu";' in source
    assert "C = gelu(alpha * A @ B + beta * C + bias)" in source
    held = render_kernel(make_config("hopper", {**POINT, "overlap": 1, "bias": "col", "act": "gelu"}, "bf16"))
    assert "held[i] = acc[0][64 + i];" in held  # alpha and the epilogue already applied in the registers
    # the right half (columns 128..255) in two boxes of 64 bf16 columns
    assert "held_col + 2 * 64 < N" in held and "held_col + 3 * 64 < N" in held and "held_col + 4 * 64" not in held
    plain = render_kernel(make_config("hopper", POINT, "bf16"))
    assert "gg_epilogue<__nv_bfloat16>" not in plain and "const __nv_bfloat16* bias" not in plain
    assert "__nv_bfloat16* C, cudaStream_t stream)" in plain


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


@pytest.mark.nvcc
def test_launcher_reads_the_epilogue_and_wants_its_bias(build_cache):
    from gemmgen.build import build_kernel
    from gemmgen.runtime import Launcher

    config = make_config("hopper", {"BM": 64, "BN": 64, "consumers": 1, "stages": 2, "trans": "nt", "out": "fp16",
                                    "bias": "col", "act": "gelu"}, "fp16")
    build = build_kernel(config)
    assert build.ok, build.log
    launcher = Launcher(build.library)
    assert launcher.variant == Variant("nt", "fp16", "col", "gelu")
    with pytest.raises(ValueError, match="adds a bias per col of C"):
        launcher.launch(8, 8, 8, 1.0, 0, 0, 0.0, 0)
    plain = make_config("hopper", {"BM": 64, "BN": 64, "consumers": 1, "stages": 2}, "fp16")
    build = build_kernel(plain)
    assert build.ok, build.log
    with pytest.raises(ValueError, match="adds no bias"):
        Launcher(build.library).launch(8, 8, 8, 1.0, 0, 0, 0.0, 0, bias=4096)
