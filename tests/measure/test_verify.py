"""Verification without a GPU: tolerances, the comparison, inputs, shapes."""

import numpy as np
import pytest

from gemmgen.describe import tolerance
from gemmgen.describe.problem import Shape, parse_shape
from gemmgen.errors import InvalidParameter
from gemmgen.measure import verify


def keep_tf32_bits(x):
    """float32 -> float32 with 10 mantissa bits (truncated), as a tf32 multiplier may read it."""
    return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def float32_gemm(a, b, c0, alpha, beta):
    """C as a correct fp32 kernel gives it: A @ B accumulated in float32, then alpha * acc + beta * C0
    with every operation rounded to float32 (C0 not read when beta == 0)."""
    out = np.float32(alpha) * (a @ b)
    return out + np.float32(beta) * c0 if beta != 0.0 else out


def relative_to_result(c, ref):
    """||C - ref||_F / ||ref||_F: the measure the normwise check used before it allowed for cancellation."""
    return float(np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref))


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
    c = (1.25 * (keep_tf32_bits(a) @ keep_tf32_bits(b)) - 0.75 * c0).astype(np.float32)
    assert verify.compare(c, ref, scale, "tf32", 512).ok
    assert not verify.compare(c, ref, scale, "fp32", 512).ok


def test_dropping_one_k_term_fails():
    rng = np.random.default_rng(4)
    a, b, c0, ref, scale = _case(rng, k=256)
    c = (1.25 * (a[:, :-1] @ b[:-1, :]) - 0.75 * c0).astype(np.float32)
    assert not verify.compare(c, ref, scale, "fp32", 256).ok


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_near_cancellation_at_k1_passes(precision):
    """K = 1, beta * c0 within rounding of -alpha * a * b: the result is tiny against its terms, so
    the float32 roundings of alpha * a * b and beta * c0 are large relative to it, yet C is what a
    correct kernel gives. (Relative to ||ref|| the error is far over the tolerance.)"""
    rng = np.random.default_rng(6)
    alpha, beta = verify.CHECKS[1]
    a, b = verify.random_matrix(rng, 64, 1, precision), verify.random_matrix(rng, 1, 48, precision)
    c0 = (alpha * (a.astype(np.float64) @ b.astype(np.float64)) / -beta).astype(np.float32)
    ref, scale = verify.host_reference(a.astype(np.float64), b.astype(np.float64), c0, alpha, beta)
    read = keep_tf32_bits if precision == "tf32" else (lambda x: x)
    c = float32_gemm(read(a), read(b), c0, alpha, beta)
    assert relative_to_result(c, ref) > 100 * tolerance.normwise_tolerance(precision, 1)
    v = verify.compare(c, ref, scale, precision, 1)
    assert v.ok, v.message


@pytest.mark.parametrize("k", [1, 2, 8])
def test_one_element_results_pass_whatever_the_draw(k):
    """1 x 1 x K, as the GPU tests run it: over many draws of both checks, the float32 result always
    passes, including the draws where the result is small against its terms (counted: there must be
    some, or this test would not test the cancellation)."""
    rng = np.random.default_rng(7)
    cancelling = 0
    for _ in range(500):
        for alpha, beta in verify.CHECKS:
            a, b = verify.random_matrix(rng, 1, k, "fp32"), verify.random_matrix(rng, k, 1, "fp32")
            c0 = verify.random_matrix(rng, 1, 1, "fp32")
            ref, scale = verify.host_reference(a.astype(np.float64), b.astype(np.float64), c0, alpha, beta)
            c = float32_gemm(a, b, c0, alpha, beta)
            cancelling += relative_to_result(c, ref) > tolerance.normwise_tolerance("fp32", k)
            v = verify.compare(c, ref, scale, "fp32", k)
            assert v.ok, (alpha, beta, a, b, c0, v.message)
    assert cancelling > 0


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
@pytest.mark.parametrize("fault", ["drop", "repeat"])
def test_a_dropped_or_repeated_k_tile_fails_the_normwise_check(precision, fault):
    """K = 4096, one tile of 8 k steps left out or summed twice: over the whole matrix, the normwise
    check alone rejects it (tf32's loose tolerance at large K is the hard case), and the correct
    result passes."""
    rng = np.random.default_rng(8)
    k, tile = 4096, slice(2048, 2056)
    a, b, c0, ref, scale = _case(rng, m=64, n=64, k=k, precision=precision)
    a32, b32 = verify.as_float64(a, precision).astype(np.float32), verify.as_float64(b, precision).astype(np.float32)
    if precision == "tf32":
        a32, b32 = keep_tf32_bits(a32), keep_tf32_bits(b32)
    good = float32_gemm(a32, b32, c0, 1.25, -0.75)
    assert verify.compare(good, ref, scale, precision, k).ok
    tile_product = a32[:, tile] @ b32[tile, :]
    wrong = good + np.float32(1.25) * (-tile_product if fault == "drop" else tile_product)
    v = verify.compare(wrong, ref, scale, precision, k)
    assert not v.ok and v.rel_error > 3 * tolerance.normwise_tolerance(precision, k), v


@pytest.mark.parametrize("wrong_tiles", ["row", "column"])
def test_one_row_or_column_of_tiles_missing_a_k_tile_fails(wrong_tiles):
    """tf32 at K = 4096, 128 x 128 in 16 x 16 tiles: one row (or column) of tiles leaves out its
    last K tile. The elementwise bound cannot see it; the normwise check does."""
    rng = np.random.default_rng(9)
    k = 4096
    a, b, c0, ref, scale = _case(rng, m=128, n=128, k=k, precision="tf32")
    a32, b32 = keep_tf32_bits(a), keep_tf32_bits(b)
    c = float32_gemm(a32, b32, c0, 1.25, -0.75)
    band = (slice(32, 48), slice(None)) if wrong_tiles == "row" else (slice(None), slice(32, 48))
    c[band] -= np.float32(1.25) * (a32[band[0], -8:] @ b32[-8:, band[1]])
    v = verify.compare(c, ref, scale, "tf32", k)
    assert not v.ok and v.bad == 0 and v.rel_error > tolerance.normwise_tolerance("tf32", k), v


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


# ---- FP8 E4M3 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits, value", [(0x00, 0.0), (0x01, 2.0**-9), (0x07, 7 * 2.0**-9), (0x08, 2.0**-6),
                                         (0x38, 1.0), (0x39, 1.125), (0xB8, -1.0), (0x7E, 448.0), (0xFE, -448.0)])
def test_e4m3_patterns_are_ocps_e4m3fn(bits, value):
    assert verify.E4M3_VALUES[bits] == value
    assert verify.as_float64(np.array([bits], dtype=np.uint8), "e4m3")[0] == value


def test_e4m3_has_nan_and_no_infinity():
    assert np.isnan(verify.E4M3_VALUES[[0x7F, 0xFF]]).all()
    assert np.isfinite(np.delete(verify.E4M3_VALUES, [0x7F, 0xFF])).all()


def test_e4m3_rounds_to_nearest_ties_to_even_and_saturates():
    finite = np.array([b for b in range(256) if b not in (0x7F, 0x80, 0xFF)], dtype=np.uint8)
    assert (verify.to_e4m3_bits(verify.E4M3_VALUES[finite]) == finite).all()  # every value is its own pattern
    # halfway between 1 (0x38) and 1.125 (0x39): the even pattern; between 1.125 and 1.25 (0x3A) likewise
    assert verify.to_e4m3_bits(np.array([1.0625, 1.1875, 1.07, -1.0625])).tolist() == [0x38, 0x3A, 0x39, 0xB8]
    assert verify.to_e4m3_bits(np.array([1000.0, -1e9, 2.0**-11])).tolist() == [0x7E, 0xFE, 0x00]


def test_e4m3_inputs_are_uniform_values_as_the_kernel_reads_them():
    x = verify.random_matrix(np.random.default_rng(1), 64, 64, "e4m3")
    assert x.dtype == np.uint8 and verify.host_dtype("e4m3") == np.uint8
    values = verify.as_float64(x, "e4m3")
    assert np.abs(values).max() <= 1.0 and len(np.unique(values)) > 50


# ---- FP8 E5M2 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits, value", [(0x00, 0.0), (0x01, 2.0**-16), (0x03, 3 * 2.0**-16), (0x04, 2.0**-14),
                                         (0x3C, 1.0), (0x3D, 1.25), (0xBC, -1.0), (0x7B, 57344.0),
                                         (0x7C, np.inf), (0xFC, -np.inf)])
def test_e5m2_patterns_are_ocps_e5m2(bits, value):
    assert verify.E5M2_VALUES[bits] == value
    assert verify.as_float64(np.array([bits], dtype=np.uint8), "e5m2e4m3")[0] == value  # e5m2e4m3's A


def test_e5m2_rounds_to_nearest_ties_to_even_and_saturates():
    finite = np.array([b for b in range(256) if np.isfinite(verify.E5M2_VALUES[b]) and b != 0x80], dtype=np.uint8)
    assert (verify.to_e5m2_bits(verify.E5M2_VALUES[finite]) == finite).all()
    assert np.isnan(verify.E5M2_VALUES[[0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]]).all()
    # halfway between 1 (0x3C) and 1.25 (0x3D): the even pattern; between 1.25 and 1.5 (0x3E): 0x3E
    assert verify.to_e5m2_bits(np.array([1.125, 1.375, 1.2, -1.125])).tolist() == [0x3C, 0x3E, 0x3D, 0xBC]
    assert verify.to_e5m2_bits(np.array([1e6, -1e9, 2.0**-17])).tolist() == [0x7B, 0xFB, 0x00]


def test_a_precision_of_two_fp8_formats_holds_each_operand_in_its_own():
    """e4m3e5m2: A in E4M3, B in E5M2; host arrays and their exact values per operand."""
    a = verify.random_matrix(np.random.default_rng(1), 64, 64, "e4m3e5m2")
    b = verify.random_matrix(np.random.default_rng(1), 64, 64, "e4m3e5m2", "b")
    assert verify.host_dtype("e4m3e5m2") == verify.host_dtype("e4m3e5m2", "b") == np.uint8
    assert (a == verify.to_e4m3_bits(verify.as_float64(a, "e4m3e5m2"))).all()
    assert (b == verify.to_e5m2_bits(verify.as_float64(b, "e4m3e5m2", "b"))).all()
    assert not (a == b).all()  # the same uniform draws, rounded to 3 and to 2 mantissa bits
    e5m2 = verify.as_float64(b, "e4m3e5m2", "b")
    assert np.abs(e5m2).max() <= 1.0 and set(np.unique(np.abs(e5m2))) <= set(np.abs(verify.E5M2_VALUES))


def _nearest_pattern(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The encoding by definition: the finite pattern nearest to |x| (clamped to the largest),
    the even one of two as near, with x's sign (none for zero)."""
    finite = values[:int(np.argmax(~np.isfinite(values)))]  # non-negative finite patterns, increasing
    magnitude = np.minimum(np.abs(x), finite[-1])
    gap = np.abs(finite[None, :] - magnitude[:, None])
    nearest = gap == gap.min(axis=1, keepdims=True)
    pick = np.where(nearest & (np.arange(len(finite)) % 2 == 0), np.arange(len(finite)), 10**6).min(axis=1)
    pick = np.where(nearest.sum(axis=1) == 1, nearest.argmax(axis=1), pick)
    return (pick | np.where(np.signbit(x) & (pick > 0), 0x80, 0)).astype(np.uint8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fp8_encoding_is_the_nearest_pattern_ties_to_even(dtype):
    """to_e4m3_bits and to_e5m2_bits (rounding the float's own bits) against the definition, on
    random values of every scale, every value, every tie between neighbours and the floats just
    beside each tie, in float32 and float64."""
    rng = np.random.default_rng(3)
    for values, encode in ((verify.E4M3_VALUES, verify.to_e4m3_bits), (verify.E5M2_VALUES, verify.to_e5m2_bits)):
        finite = np.unique(values[np.isfinite(values)])
        ties = (finite[1:] + finite[:-1]) / 2
        x = np.concatenate([rng.random(4000) * 2 - 1, rng.standard_normal(4000) * 10.0 ** rng.integers(-6, 6, 4000),
                            finite, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf),
                            [1e12, -1e12, 0.0, -0.0]]).astype(dtype)
        assert (encode(x) == _nearest_pattern(x.astype(np.float64), values)).all()
