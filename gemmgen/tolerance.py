"""How far a correct kernel's C may be from an exact (float64) reference, per precision.

Two checks, both must pass (and no element may be NaN or Inf):

* elementwise, the classical error bound of a dot product:
  ``|C - ref| <= elem_tol * (|alpha| * (|A| @ |B|) + |beta * C0|)`` with
  ``elem_tol = 2 * (2 * u_in + (K + 2) * u_acc)``. ``u_in`` is the rounding of A and B
  on their way into the multiplier (tf32 keeps 10 mantissa bits: 2^-10, which covers
  truncation as well as rounding; fp32, fp16 and bf16 inputs reach the multiplier exactly, the
  reference reading the same fp16/bf16 values); ``K * u_acc`` bounds the accumulation in any
  order (Higham, gamma_K), ``+ 2`` the epilogue's two roundings, and the factor 2 is margin.
  u_acc is 2^-24 (fp32 FFMA) or 2^-22 for tensor cores, whose adders may keep fewer guard bits.
  This catches any single wrong element whose error is larger than rounding can explain.
* normwise, ``||C - ref||_F / ||ref||_F <= 2 * u_in + 4 * sqrt(K) * u_acc``: rounding errors
  of random data grow like sqrt(K) * u_acc, several times below this; a kernel that drops or
  repeats a K tile, or a row or column of tiles, lands orders of magnitude above it.
"""

import math

# precision -> (u_in, u_acc)
UNIT_ROUNDOFF = {
    "fp32": (0.0, 2.0**-24),
    "tf32": (2.0**-10, 2.0**-22),
    "fp16": (0.0, 2.0**-22),
    "bf16": (0.0, 2.0**-22),
}


def elementwise_tolerance(precision: str, k: int) -> float:
    u_in, u_acc = UNIT_ROUNDOFF[precision]
    return 2.0 * (2.0 * u_in + (k + 2) * u_acc)


def normwise_tolerance(precision: str, k: int) -> float:
    u_in, u_acc = UNIT_ROUNDOFF[precision]
    return 2.0 * u_in + 4.0 * math.sqrt(k) * u_acc
