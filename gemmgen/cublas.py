"""cuBLAS from the CUDA toolkit through ctypes: the baseline of every benchmark, and the
float64 reference for large verification problems.

gemmgen's matrices are row-major; cuBLAS is column-major. Row-major C = A @ B is column-major
C^T = B^T @ A^T, so every call passes (N, M, K) with B first and leading dimensions N, K, N.
All calls run on the default stream of the CUDA context current on the calling thread.
"""

import ctypes
import ctypes.util
import glob
import os
from functools import lru_cache

from gemmgen.dtypes import PRECISIONS
from gemmgen.errors import GemmgenError

_OP_N = 0
_CUBLAS_DEFAULT_MATH = 0
_CUDA_R_32F = 0  # C; the types of A and B and the compute type are in gemmgen.dtypes
_GEMM_DEFAULT = -1


class CublasError(GemmgenError):
    pass


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    names = []
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            names += sorted(glob.glob(os.path.join(root, "lib64", "libcublas.so*")), reverse=True)
    names += [n for n in (ctypes.util.find_library("cublas"), "libcublas.so") if n]
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as err:
            errors.append(f"{name}: {err}")
    raise CublasError("cannot load libcublas from the CUDA toolkit (set CUDA_HOME); tried: "
                      + ("; ".join(errors) or "no candidates found"))


class Cublas:
    """A cuBLAS handle in the current CUDA context."""

    def __init__(self):
        self._lib = _library()
        self._handle = ctypes.c_void_p()
        self._check(self._lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self._check(self._lib.cublasSetMathMode(self._handle, _CUBLAS_DEFAULT_MATH), "cublasSetMathMode")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CublasError(f"{what} failed with cuBLAS status {status}")

    def gemm(self, precision: str, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float,
             c: int) -> None:
        """Row-major C = alpha * A @ B + beta * C for device pointers a, b, c (ints), with the
        baseline of ``precision`` (gemmgen.dtypes: cublasSgemm for fp32, else cublasGemmEx)."""
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        pa, pb, pc = ctypes.c_void_p(a), ctypes.c_void_p(b), ctypes.c_void_p(c)
        dt = PRECISIONS[precision]
        if dt.cublas_compute is None:
            status = self._lib.cublasSgemm_v2(self._handle, _OP_N, _OP_N, n, m, k, ctypes.byref(al), pb, n, pa, k,
                                              ctypes.byref(be), pc, n)
            self._check(status, "cublasSgemm")
            return
        dtype, compute = dt.cuda_type, dt.cublas_compute
        status = self._lib.cublasGemmEx(self._handle, _OP_N, _OP_N, n, m, k, ctypes.byref(al), pb, dtype, n, pa,
                                         dtype, k, ctypes.byref(be), pc, _CUDA_R_32F, n, compute, _GEMM_DEFAULT)
        self._check(status, f"cublasGemmEx ({precision})")

    def dgemm(self, m: int, n: int, k: int, a: int, b: int, c: int) -> None:
        """Row-major float64 C = A @ B (the verification reference for large problems)."""
        one, zero = ctypes.c_double(1.0), ctypes.c_double(0.0)
        status = self._lib.cublasDgemm_v2(self._handle, _OP_N, _OP_N, n, m, k, ctypes.byref(one), ctypes.c_void_p(b),
                                          n, ctypes.c_void_p(a), k, ctypes.byref(zero), ctypes.c_void_p(c), n)
        self._check(status, "cublasDgemm")

    def close(self) -> None:
        if self._handle:
            self._lib.cublasDestroy_v2(self._handle)
            self._handle = ctypes.c_void_p()
