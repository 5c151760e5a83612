"""Verification without a GPU: tolerances, the comparison, inputs, shapes."""

import numpy as np
import pytest

from gemmgen import tolerance, verify
from gemmgen.errors import InvalidParameter
from gemmgen.problem import Shape, parse_shape


def _case(rng, m=64, n=48, k=96, precision="fp32"):
    a = verify.random_matrix(rng, m, k, precision)
    b = verify.random_matrix(rng, k, n, precision)
    c0 = rng.uniform(-1, 1, size=(m, n)).astype(np.float32)
    ref, scale = verify.host_reference(verify.as_float64(a, precision), verify.as_float64(b, precision), c0, 1.25, -0.75)
    return a, b, c0, ref, scale


def test_float32_product_passes():
    rng = np.random.default_rng(0)
    a, b, c0, ref, scale = _case(rng)
    c = (1.25 * (a @ b) - 0.75 * c0).astype(np.float32)
    v = verify.compare(c, ref, scale, "fp32", 96)
    assert v.ok and v.bad == 0 and 0 < v.rel_error < tolerance.normwise_tolerance("fp32", 96)


def test_one_wrong_element_fails():
    rng = np.random.default_rng(1)
    a, b, c0, ref, scale = _case(rng)
    c = (1.25 * (a @ b) - 0.75 * c0).astype(np.float32)
    c[5, 7] += 1e-3
    v = verify.compare(c, ref, scale, "fp32", 96)
    assert not v.ok and v.bad == 1 and "C[5][7]" in v.message


def test_nan_fails_even_if_everything_else_is_right():
    rng = np.random.default_rng(2)
    a, b, c0, ref, scale = _case(rng)
    c = (1.25 * (a @ b) - 0.75 * c0).astype(np.float32)
    c[-1, -1] = np.nan
    v = verify.compare(c, ref, scale, "fp32", 96)
    assert not v.ok and v.nonfinite == 1


def test_tf32_rounding_passes_but_fp32_tolerance_rejects_it():
    rng = np.random.default_rng(3)
    a, b, c0, ref, scale = _case(rng, k=512)
    truncate = lambda x: (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)  # keep 10 mantissa bits
    c = (1.25 * (truncate(a) @ truncate(b)) - 0.75 * c0).astype(np.float32)
    assert verify.compare(c, ref, scale, "tf32", 512).ok
    assert not verify.compare(c, ref, scale, "fp32", 512).ok


def test_dropping_one_k_term_fails():
    rng = np.random.default_rng(4)
    a, b, c0, ref, scale = _case(rng, k=256)
    c = (1.25 * (a[:, :-1] @ b[:-1, :]) - 0.75 * c0).astype(np.float32)
    assert not verify.compare(c, ref, scale, "fp32", 256).ok


def test_bf16_round_trip_and_rounding():
    x = np.array([1.0, -2.5, 3.14159, 1e-3], dtype=np.float32)
    back = verify.from_bf16_bits(verify.to_bf16_bits(x))
    assert back[0] == 1.0 and back[1] == -2.5
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0**-8)
    assert verify.to_bf16_bits(np.array([1.0], np.float32))[0] == 0x3F80


def test_random_inputs_are_never_zero_matrices():
    rng = np.random.default_rng(5)
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        m = verify.as_float64(verify.random_matrix(rng, 33, 17, precision), precision)
        assert m.shape == (33, 17) and np.count_nonzero(m) > 500 and np.all(np.abs(m) <= 1.0)


def test_tolerances_grow_with_k_and_precision():
    assert tolerance.normwise_tolerance("fp32", 4096) < tolerance.normwise_tolerance("fp16", 4096)
    assert tolerance.normwise_tolerance("fp16", 4096) < tolerance.normwise_tolerance("tf32", 4096)
    assert tolerance.elementwise_tolerance("fp32", 1024) < tolerance.elementwise_tolerance("fp32", 4096)


@pytest.mark.parametrize("text,shape", [("4096", Shape(4096, 4096, 4096)), ("4095x4097x4093", Shape(4095, 4097, 4093)),
                                        (" 16X4096x4096 ", Shape(16, 4096, 4096))])
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "0", "4x4", "4x4x0", "axbxc", "-1x2x3"])
def test_parse_shape_rejects(text):
    with pytest.raises(InvalidParameter):
        parse_shape(text)
