"""Checking a kernel's C against a float64 reference (see gemmgen/describe/tolerance.py for the bounds).

Inputs are uniform(-1, 1) random numbers, never zeros. The reference is computed from exactly the
values the kernel reads (fp16/bf16 inputs are upcast exactly; tf32 kernels are compared with the
fp32 inputs, so their input rounding counts as error, as it should). The statistics of C against
it come from the host (:func:`host_stats`) or the GPU (gemmgen.measure.gpucheck); :func:`judge` decides.

The rule -- :func:`host_reference`, :func:`epilogue` (:func:`activation`) and :func:`host_stats`'
elementwise count -- is written once more, in C++, for the GPU: templates/reference.cuh, which the
GPU check (templates/check.cu) and the emitted harness share; tests/test_reference.py runs that
C++ on the host against these functions.
"""

import math
from dataclasses import dataclass

import numpy as np

from gemmgen.describe import tolerance
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.tolerance import CHECKS  # noqa: F401 (the checks a kernel is judged by; the harness's too)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even), as uint16 bit patterns."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _e4m3_values() -> np.ndarray:
    """The values of the 256 FP8 E4M3 bit patterns (OCP's E4M3FN, torch.float8_e4m3fn): sign,
    4 exponent bits (bias 7), 3 mantissa bits; subnormals at exponent 0; S.1111.111 is NaN and
    there is no infinity (the largest value is 448)."""
    code = np.arange(256)
    exponent, mantissa = (code >> 3) & 0xF, (code & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8.0 * 2.0**-6, (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7.0))
    magnitude[(code & 0x7F) == 0x7F] = np.nan
    return np.where(code & 0x80, -magnitude, magnitude)


def _e5m2_values() -> np.ndarray:
    """The values of the 256 FP8 E5M2 bit patterns (OCP's E5M2, torch.float8_e5m2): sign, 5
    exponent bits (bias 15), 2 mantissa bits, as IEEE: subnormals at exponent 0, infinities at
    S.11111.00 and NaN above (the largest finite value is 57344)."""
    code = np.arange(256)
    exponent, mantissa = (code >> 2) & 0x1F, (code & 3).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 4.0 * 2.0**-14, (1.0 + mantissa / 4.0) * 2.0 ** (exponent - 15.0))
    magnitude[exponent == 31] = np.where(mantissa[exponent == 31] == 0, np.inf, np.nan)
    return np.where(code & 0x80, -magnitude, magnitude)


E4M3_VALUES = _e4m3_values()
E5M2_VALUES = _e5m2_values()


# (mantissa bits, exponent bias, largest finite value) of FP8's formats
_E4M3_FORMAT, _E5M2_FORMAT = (3, 7, 448.0), (2, 15, 57344.0)


def _to_fp8_bits(x: np.ndarray, mantissa: int, bias: int, largest: float) -> np.ndarray:
    """float -> the bit patterns (uint8) of the FP8 format of ``mantissa`` bits and exponent
    ``bias``, rounded to nearest, ties to the even pattern (the IEEE rounding of the float's own
    bits, its mantissa cut to ``mantissa`` bits, for normal results; subnormals in steps of the
    smallest); magnitudes beyond ``largest`` give it. Works on float32 bits for float32 input
    (exact, and 8x faster than a search of the values on a 117M-element operand), else on float64's."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        x = x.astype(np.float64)
    wide = x.dtype == np.float64
    uint, sint = (np.uint64, np.int64) if wide else (np.uint32, np.int32)
    fraction, offset = (52, 1023) if wide else (23, 127)
    a = np.minimum(np.abs(x), x.dtype.type(largest))
    bits = a.view(uint)
    drop = uint(fraction - mantissa)
    rounded = (bits + ((uint(1) << (drop - uint(1))) - uint(1)) + ((bits >> drop) & uint(1))) >> drop
    normal = rounded.astype(sint) - sint((offset - bias) << mantissa)
    smallest_normal = x.dtype.type(2.0 ** (1 - bias))
    sub = np.rint(np.minimum(a, smallest_normal) * x.dtype.type(2.0 ** (bias - 1 + mantissa))).astype(sint)
    pick = np.where(a < smallest_normal, sub, normal)
    return (pick | np.where(np.signbit(x) & (pick > 0), 0x80, 0)).astype(np.uint8)


def to_e4m3_bits(x: np.ndarray) -> np.ndarray:
    """float -> FP8 E4M3 bit patterns (uint8), rounded to nearest, ties to the even pattern;
    magnitudes beyond 448, the largest value, give 448."""
    return _to_fp8_bits(x, *_E4M3_FORMAT)


def to_e5m2_bits(x: np.ndarray) -> np.ndarray:
    """float -> FP8 E5M2 bit patterns (uint8), rounded to nearest, ties to the even pattern;
    magnitudes beyond 57344, the largest finite value, give 57344 (saturated, as E4M3's)."""
    return _to_fp8_bits(x, *_E5M2_FORMAT)


# The storages NumPy has no float type for, held as bit patterns: (the patterns' dtype, float32
# values -> patterns, patterns -> their exact float64 values).
_BITS = {
    "bf16-bits": (np.uint16, to_bf16_bits, lambda bits: from_bf16_bits(bits).astype(np.float64)),
    "e4m3-bits": (np.uint8, to_e4m3_bits, lambda bits: E4M3_VALUES[bits]),
    "e5m2-bits": (np.uint8, to_e5m2_bits, lambda bits: E5M2_VALUES[bits]),
}


def _storage(precision: str, operand: str) -> str:
    """How host arrays hold ``operand`` ("a", or "b": B's elements, another FP8 format in a
    precision of two) of ``precision``; C's type is a precision of its own (operand "a")."""
    p = PRECISIONS[precision]
    return (p.b if operand == "b" else p).numpy_storage


def host_dtype(precision: str, operand: str = "a") -> np.dtype:
    """The NumPy dtype of host arrays of ``precision``'s elements (of A, or of B with operand="b"):
    float32, float16, or the bit patterns of bf16 (uint16) or FP8 (uint8)."""
    storage = _storage(precision, operand)
    return np.dtype(_BITS[storage][0] if storage in _BITS else storage)


def random_matrix(rng: np.random.Generator, rows: int, cols: int, precision: str, operand: str = "a") -> np.ndarray:
    """Uniform(-1, 1) values rounded to the storage format of ``precision``'s inputs (of A, or of B
    with operand="b"; bf16: uint16 bits; FP8: uint8 bits)."""
    x = rng.random((rows, cols), dtype=np.float32) * np.float32(2.0) - np.float32(1.0)
    storage = _storage(precision, operand)
    return _BITS[storage][1](x) if storage in _BITS else x.astype(storage)


def as_float64(x: np.ndarray, precision: str, operand: str = "a") -> np.ndarray:
    """The exact values a kernel reads from ``x`` (A's elements, or B's with operand="b"), in float64."""
    storage = _storage(precision, operand)
    return _BITS[storage][2](x) if storage in _BITS else x.astype(np.float64)


def product_operands(a64: np.ndarray, b64: np.ndarray, variant) -> tuple[np.ndarray, np.ndarray]:
    """A (M x K) and B (K x N) of the product, from A and B as ``variant`` (gemmgen.describe.problem.Variant)
    stores them (Variant.a_dims, b_dims): transposed views of an operand stored transposed. For
    host_reference."""
    return (a64.T if variant.a_transposed else a64), (b64.T if variant.b_transposed else b64)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    # ||C - ref||_F / tolerance.normwise_norm(||ref||_F, ||scale||_F, K) over the finite elements:
    # the normwise check passes at <= tolerance.normwise_tolerance. Where the result is not small
    # against its terms (the random inputs of the checks, beyond a few elements) this is
    # ||C - ref||_F / ||ref||_F.
    rel_error: float
    worst: float  # largest |C - ref| / (elementwise bound); <= 1 passes
    bad: int  # elements over the elementwise bound
    nonfinite: int  # NaN or Inf elements
    message: str


@dataclass(frozen=True)
class Stats:
    """What the checks need of C against (ref, scale), over its M x N elements: sums over the
    finite elements of |C - ref|^2, ref^2 and scale^2; the count of elements over the elementwise
    bound and of NaN/Inf ones; the largest |C - ref| / bound; and the first element (row-major)
    that fails either way, with its value and the expected one. Computed on the host (host_stats)
    or on the GPU (gpucheck); judged by :func:`judge`."""

    err2: float
    ref2: float
    scale2: float
    bad: int
    nonfinite: int
    worst: float
    first_bad: tuple[int, int, float, float] | None = None  # (row, column, C, expected)


def host_stats(c: np.ndarray, ref: np.ndarray, scale: np.ndarray, precision: str, k: int, out: str = "fp32",
               act: str = "none") -> Stats:
    """Stats of C (M x N, float32 or float64 holding C's values) against ref and scale (float64)
    on the host; ``out`` is the type C was stored in, ``act`` the epilogue's activation."""
    finite = np.isfinite(c)
    nonfinite = int(c.size - np.count_nonzero(finite))
    err = np.abs(np.where(finite, c, 0).astype(np.float64) - ref)
    bound = tolerance.elementwise_tolerance(precision, k, out, act) * scale
    over = finite & (err > bound)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(bound > 0, err / bound, np.where(err > 0, np.inf, 0.0))
    worst = float(np.max(np.where(finite, ratios, 0.0))) if c.size else 0.0
    first = np.argwhere(~finite | over)
    first_bad = None
    if len(first):
        i, j = (int(v) for v in first[0])
        first_bad = (i, j, float(c[i, j]), float(ref[i, j]))
    return Stats(float(np.sum(err[finite] ** 2)), float(np.sum(ref[finite] ** 2)), float(np.sum(scale[finite] ** 2)),
                 int(np.count_nonzero(over)), nonfinite, worst, first_bad)


def judge(stats: Stats, precision: str, k: int, out: str = "fp32", act: str = "none") -> Verdict:
    """The verdict on C from its Stats: ok when no element is NaN or Inf and both checks of
    gemmgen/describe/tolerance.py pass over the finite elements."""
    err_norm = math.sqrt(stats.err2)
    norm = tolerance.normwise_norm(math.sqrt(stats.ref2), math.sqrt(stats.scale2), k)
    rel = err_norm / norm if norm > 0 else err_norm
    norm_tol = tolerance.normwise_tolerance(precision, k, out, act)
    ok = stats.nonfinite == 0 and stats.bad == 0 and rel <= norm_tol
    message = ""
    if not ok:
        where = ""
        if stats.first_bad:
            i, j, got, expected = stats.first_bad
            where = f"; first bad C[{i}][{j}] = {got!r}, expected {expected!r}"
        message = (f"wrong result: rel_err {rel:.3e} (tolerance {norm_tol:.1e}), {stats.bad} element(s) over the "
                   f"elementwise bound, {stats.nonfinite} NaN/Inf{where}")
    return Verdict(ok, rel, stats.worst, stats.bad, stats.nonfinite, message)


def compare(c: np.ndarray, ref: np.ndarray, scale: np.ndarray, precision: str, k: int, out: str = "fp32",
            act: str = "none") -> Verdict:
    """Judge C (float32, M x N) against ref and scale = |alpha| |A||B| + |beta C0| (+ |bias|)
    (float64, as host_reference and epilogue give them) by both checks of gemmgen/describe/tolerance.py,
    for inner dimension k. ok when no element is NaN or Inf and both checks pass over the finite
    elements."""
    return judge(host_stats(c, ref, scale, precision, k, out, act), precision, k, out, act)


def host_reference(a64: np.ndarray, b64: np.ndarray, c0: np.ndarray, alpha: float, beta: float):
    """(ref, scale) in float64 on the host: ref = alpha * A @ B + beta * C0 and
    scale = |alpha| * |A| @ |B| + |beta * C0|, from the float64 A (M x K) and B (K x N: for a variant,
    product_operands of A and B as stored); C0 is not read when beta == 0."""
    ref = alpha * (a64 @ b64)
    scale = abs(alpha) * (np.abs(a64) @ np.abs(b64))
    if beta != 0.0:
        ref += beta * c0.astype(np.float64)
        scale += np.abs(beta * c0.astype(np.float64))
    return ref, scale


def activation(x: np.ndarray, act: str) -> np.ndarray:
    """The activation of gemmgen.describe.problem.FIELD["act"], exactly (float64): none, relu, gelu (the
    tanh approximation, as torch's gelu(approximate="tanh")), silu."""
    if act == "none":
        return x
    if act == "relu":
        return np.where(x < 0.0, 0.0, x)
    if act == "gelu":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    if act == "silu":
        return x / (1.0 + np.exp(-np.clip(x, -700.0, None)))
    raise ValueError(f"unknown activation {act!r}")


def epilogue(ref: np.ndarray, scale: np.ndarray, bias64: np.ndarray | None, bias: str, act: str):
    """(ref, scale) of C = act(x + bias) from those of x = alpha * A @ B + beta * C0 (host_reference):
    ``bias64`` holds M values (bias ``row``) or N values (``col``), float64; ``scale`` gains |bias|."""
    if bias != "none":
        vec = bias64.reshape(-1, 1) if bias == "row" else bias64.reshape(1, -1)
        ref, scale = ref + vec, scale + np.abs(vec)
    return activation(ref, act), scale
