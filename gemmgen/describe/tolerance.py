"""How far a correct kernel's C may be from an exact (float64) reference, per precision (and,
where C is stored as fp16 or bf16, plus that store's rounding: ``2 * u_store`` in both checks).

Two checks, both must pass (and no element may be NaN or Inf). Both measure error against
``scale = |alpha| * (|A| @ |B|) + |beta * C0|``, the size of the terms that are rounded, or
against the result ``ref``:

* elementwise, the classical error bound of a dot product:
  ``|C - ref| <= elem_tol * scale`` with ``elem_tol = 2 * (2 * u_in + (K + 2) * u_acc)``.
  ``u_in`` is the rounding of A and B on their way into the multiplier (tf32 keeps 10 mantissa
  bits: 2^-10, which covers truncation as well as rounding; fp32, fp16 and bf16 inputs reach the
  multiplier exactly, the reference reading the same fp16/bf16 values); ``K * u_acc`` bounds the
  accumulation in any order (Higham, gamma_K), ``+ 2`` the epilogue's two roundings, and the
  factor 2 is margin. u_acc is 2^-24 (fp32 FFMA) or 2^-22 for tensor cores, whose adders may keep
  fewer guard bits. This catches any single wrong element whose error is larger than rounding can
  explain.
* normwise, ``||C - ref||_F <= norm_tol * max(||ref||_F, ||scale||_F / sqrt(K))`` with
  ``norm_tol = 2 * u_in + 4 * sqrt(K) * u_acc`` (see :func:`normwise_norm`). Rounding errors are
  proportional to the values rounded (products, partial sums, ``alpha * acc``, ``beta * C0``),
  not to the result. On the random inputs of the checks (uniform(-1, 1), zero mean, many
  elements) the result is as large as those values, ``||ref||_F`` is the larger of the two norms
  (about 4/3 of ``||scale||_F / sqrt(K)``), and errors grow like ``sqrt(K) * u_acc`` relative to
  it, several times below ``norm_tol``. Where the result is small against its terms (few
  elements, with ``alpha * A @ B`` and ``beta * C0`` nearly cancelling, or a dot product that
  sums to nearly zero), ``||scale||_F / sqrt(K)`` is the larger: the terms' size at K = 1
  (``|alpha a b| + |beta c0|``), and the size of a random dot product's partial sums for any K.
  At K = 1 the bound holds for any data: C computed with correctly rounded operations (the
  product, ``alpha * acc``, ``beta * c0``, their sum) is within ``(2 u_in + 3 u_acc) * scale``
  of ref in every element, to first order. A kernel that drops or repeats a K tile, or a row or column of tiles,
  lands orders of magnitude above the bound, which on such data is the same as
  ``norm_tol * ||ref||_F``.

With an epilogue (gemmgen.describe.problem.Variant: C = act(x + bias), x = alpha * A @ B + beta * C0), the
bias joins the terms (``scale`` gains ``|bias|``: it is added in fp32, one more rounding, within
the ``+ 2``) and the activation passes x's error on, at most ``lipschitz`` times (the largest
slope of ReLU is 1, of tanh-GELU 1.13, of SiLU 1.1), and adds its own: ``u_act * scale``, with
``u_act`` = 2^-18 for GELU and SiLU into fp32 C (the kernels' exp is the fast hardware one, a
few ulp off, more for large |x|; |x| <= scale), 2^-11 into fp16/bf16 C (the hardware tanh, about
2^-11 relative, times 0.5 |x|: below the store's own rounding), and 0 for ReLU. Both tolerances
become ``lipschitz * tol + u_act``.
"""

import math

from gemmgen.describe.dtypes import PRECISIONS

# (alpha, beta) of the two checks every judge of a kernel runs (gemmgen.measure on the GPU, the
# emitted harness): the plain product into a NaN-poisoned C (catches unwritten elements and reads
# of C when beta == 0), then scaling and accumulation into C.
CHECKS = ((1.0, 0.0), (1.25, -0.75))

# Per activation (gemmgen.describe.problem.ACTIVATIONS): the largest |act'(x)| (rounded up), and the
# error of the kernels' fp32 evaluation relative to scale, as described above.
LIPSCHITZ = {"none": 1.0, "relu": 1.0, "gelu": 1.13, "silu": 1.1}
U_ACT = {"none": 0.0, "relu": 0.0, "gelu": 2.0**-18, "silu": 2.0**-18}
U_ACT_16 = {"none": 0.0, "relu": 0.0, "gelu": 2.0**-11, "silu": 2.0**-11}  # into fp16/bf16 C


def _u_act(act: str, out: str) -> float:
    return (U_ACT if out == "fp32" else U_ACT_16)[act]


def _u_out(out: str) -> float:
    """The rounding of storing C as ``out`` beyond the fp32 epilogue's own (already in the
    ``+ 2`` u_acc): 0 for fp32, else that type's unit roundoff (|C| <= scale, so it is bounded
    by ``u_store * scale`` elementwise and by ``u_store * ||ref||_F`` normwise)."""
    return 0.0 if out == "fp32" else PRECISIONS[out].u_store


def elementwise_tolerance(precision: str, k: int, out: str = "fp32", act: str = "none") -> float:
    """elem_tol: ``|C - ref| <= elem_tol * scale`` must hold for every element; ``out`` is the
    type C is stored in, ``act`` the epilogue's activation."""
    u_in, u_acc = PRECISIONS[precision].u_in, PRECISIONS[precision].u_acc
    return LIPSCHITZ[act] * 2.0 * (2.0 * u_in + (k + 2) * u_acc + _u_out(out)) + _u_act(act, out)


def normwise_tolerance(precision: str, k: int, out: str = "fp32", act: str = "none") -> float:
    """norm_tol: ``||C - ref||_F <= norm_tol * normwise_norm(...)`` must hold; ``out``, ``act``
    as above."""
    u_in, u_acc = PRECISIONS[precision].u_in, PRECISIONS[precision].u_acc
    return LIPSCHITZ[act] * (2.0 * u_in + 4.0 * math.sqrt(k) * u_acc + 2.0 * _u_out(out)) + _u_act(act, out)


def normwise_norm(ref_norm: float, scale_norm: float, k: int) -> float:
    """What ``||C - ref||_F`` is measured against: ``max(||ref||_F, ||scale||_F / sqrt(K))``,
    given ``ref_norm = ||ref||_F`` and ``scale_norm = ||scale||_F`` (over the same elements)."""
    return max(ref_norm, scale_norm / math.sqrt(k))
