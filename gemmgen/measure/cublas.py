"""cuBLAS from the CUDA toolkit through ctypes: the baseline of every benchmark, and the
float64 reference for large verification problems.

gemmgen's matrices are row-major; cuBLAS is column-major. Row-major C = A @ B is column-major
C^T = B^T @ A^T, so every call passes (N, M, K) with B first and leading dimensions N, K, N; an
operand stored transposed (the variant's trans: A stored K x M, B stored N x K) is passed as
stored with op T and its own leading dimension (M for A, K for B).
All calls run on the default stream of the CUDA context current on the calling thread.
"""

import ctypes
import ctypes.util
import glob
import os
from functools import lru_cache

from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Variant
from gemmgen.errors import GemmgenError

_OP_N, _OP_T = 0, 1
_CUBLAS_DEFAULT_MATH = 0
# the types of A, B and C and the compute type are in gemmgen.describe.dtypes
_GEMM_DEFAULT = -1


class CublasError(GemmgenError):
    pass


# A folder whose cuBLAS and cuBLASLt the baselines load instead of the toolkit's: e.g. those of the
# nvidia-cublas wheel, which torch loads, and whose heuristics can differ from the toolkit's.
CUBLAS_DIR_ENV = "GEMMGEN_CUBLAS_DIR"


def load_cublas_library(pattern: str, fallback: str) -> ctypes.CDLL:
    """cuBLAS or cuBLASLt: the newest ``<pattern>`` in $GEMMGEN_CUBLAS_DIR where that is set (and
    nothing else), else the newest ``lib64/<pattern>`` under $CUDA_HOME, $CUDA_PATH or
    /usr/local/cuda, else ``fallback`` as the loader finds it. Raises CublasError."""
    names = []
    folder = os.environ.get(CUBLAS_DIR_ENV)
    if folder:
        names = sorted(glob.glob(os.path.join(folder, pattern)), reverse=True)
        if not names:
            raise CublasError(f"${CUBLAS_DIR_ENV}={folder} holds no {pattern}: name the folder of the cuBLAS to "
                              "compare with (e.g. the nvidia-cublas wheel's lib folder), or unset it for the "
                              "toolkit's")
    else:
        for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if root:
                names += sorted(glob.glob(os.path.join(root, "lib64", pattern)), reverse=True)
        names += [n for n in (ctypes.util.find_library(fallback.removeprefix("lib").split(".so")[0]), fallback) if n]
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as err:
            errors.append(f"{name}: {err}")
    where = f"${CUBLAS_DIR_ENV}={folder}" if folder else "the CUDA toolkit (set CUDA_HOME)"
    raise CublasError(f"cannot load {fallback} from {where}; tried: " + ("; ".join(errors) or "no candidates found"))


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    return load_cublas_library("libcublas.so*", "libcublas.so")


@lru_cache(maxsize=1)
def lt_library() -> ctypes.CDLL:
    """The cuBLASLt the baselines call (gemmgen.measure.cublaslt)."""
    return load_cublas_library("libcublasLt.so*", "libcublasLt.so")


def library_version(lib: ctypes.CDLL, prefix: str = "cublas") -> str:
    """``major.minor.patch`` of a loaded cuBLAS (``prefix`` "cublas") or cuBLASLt ("cublasLt"), from
    its GetProperty call. Raises CublasError where the library does not say."""
    try:
        get = getattr(lib, f"{prefix}GetProperty")
    except AttributeError:
        raise CublasError(f"{lib._name} has no {prefix}GetProperty") from None
    parts = []
    for prop in (0, 1, 2):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        value = ctypes.c_int()
        if get(prop, ctypes.byref(value)) != 0:
            raise CublasError(f"{prefix}GetProperty({prop}) failed")
        parts.append(str(value.value))
    return ".".join(parts)


def baseline_build(precision: str, variant: Variant = Variant()) -> str:
    """What the baseline of ``precision`` and ``variant`` runs, as its results-database rows record it
    (the cuBLAS kernel row's source hash): the library and its version, ``cuBLAS <major>.<minor>.<patch>``. A
    cuBLAS of another version picks other kernels; its rows are another kernel row."""
    return _build(uses_cublaslt(precision, variant))


@lru_cache(maxsize=2)
def _build(lt: bool) -> str:  # a loaded library's version does not change: asked once (errors are not kept)
    if lt:
        return f"cuBLASLt {library_version(lt_library(), 'cublasLt')}"
    return f"cuBLAS {library_version(_library())}"


# The workspace cuBLAS and cuBLASLt get: what torch gives cuBLAS on Hopper by default. Without one
# cublasGemmEx ran 1-5% slower than torch.mm at some shapes on the H100 (e.g. 64x4096x14336).
WORKSPACE_BYTES = 32 << 20


@lru_cache(maxsize=1)
def driver_library() -> ctypes.CDLL:
    """The CUDA driver (libcuda), for the workspaces' memory."""
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    return cuda


def uses_cublaslt(precision: str, variant: Variant = Variant()) -> bool:
    """Whether the baseline of ``precision`` and ``variant`` is cuBLASLt's matmul
    (gemmgen.measure.cublaslt): where the variant fuses an epilogue, and for a precision whose
    baseline is it (FP8: cublasGemmEx takes no 8-bit types)."""
    return variant.has_epilogue or dict(PRECISIONS[precision].baseline)["api"] == "cublasLtMatmul"


def baseline_api(precision: str, variant: Variant = Variant()) -> str:
    """The cuBLAS function the baseline of ``precision`` and ``variant`` calls (stored with its
    rows): cublasLtMatmul where uses_cublaslt, else the precision's (gemmgen.describe.dtypes),
    its strided-batched form for a batched variant."""
    if uses_cublaslt(precision, variant):
        return "cublasLtMatmul"
    one = dict(PRECISIONS[precision].baseline)["api"]
    return {"cublasSgemm": "cublasSgemmStridedBatched", "cublasGemmEx": "cublasGemmStridedBatchedEx"}[one] \
        if variant.batched else one


def check_batch(variant: Variant, batch: int, strides) -> None:
    """Raises CublasError unless strides (and a batch count other than 1) are given exactly where
    ``variant`` is batched: a baseline call computes the product(s) its variant names."""
    if variant.batched != (strides is not None) or (batch != 1 and not variant.batched) or batch < 0:
        raise CublasError(f"variant {variant.text}: give strides (and a batch count, 0 or more) exactly where the "
                          f"variant is batched (batch=strided); got batch {batch}, strides {strides}")


class Cublas:
    """A cuBLAS handle in the current CUDA context; with ``workspace_bytes``, a workspace of that
    size of its own (cublasSetWorkspace), as torch gives its handles: the baseline gemmgen times
    (gemmgen.measure.bench). Raises CublasError where the handle or the workspace cannot be made."""

    def __init__(self, workspace_bytes: int = 0):
        self._lib = _library()
        self._handle = ctypes.c_void_p()
        self._workspace = ctypes.c_uint64()
        self._check(self._lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        self._check(self._lib.cublasSetMathMode(self._handle, _CUBLAS_DEFAULT_MATH), "cublasSetMathMode")
        if workspace_bytes:
            if driver_library().cuMemAlloc_v2(ctypes.byref(self._workspace), ctypes.c_size_t(workspace_bytes)) != 0:
                self.close()
                raise CublasError(f"cuMemAlloc of cuBLAS's {workspace_bytes}-byte workspace failed")
            status = self._lib.cublasSetWorkspace_v2(self._handle, ctypes.c_void_p(self._workspace.value),
                                                     ctypes.c_size_t(workspace_bytes))
            if status != 0:
                self.close()
                self._check(status, "cublasSetWorkspace")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CublasError(f"{what} failed with cuBLAS status {status}")

    def gemm(self, precision: str, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float,
             c: int, variant: Variant = Variant(), batch: int = 1,
             strides: tuple[int, int, int] | None = None) -> None:
        """Row-major C = alpha * A @ B + beta * C for device pointers a, b, c (ints), with the
        baseline of ``precision`` (gemmgen.describe.dtypes: cublasSgemm for fp32, else cublasGemmEx).
        ``variant``: A stored K x M and/or B stored N x K (trans tn, nt, tt), and C of type ``out``
        (fp32 accumulation); fp32 (cublasSgemm) takes every layout into fp32 C (CublasError
        otherwise). A batched ``variant`` (batch=strided) computes ``batch`` such products in one
        call, matrix i of each at its pointer + i * its stride (``strides``: (stride_a, stride_b,
        stride_c) in elements, as the variant stores them; 0 for A or B: one for every product):
        cublasGemmStridedBatchedEx, or cublasSgemmStridedBatched for fp32. Raises CublasError for a
        batch other than 1 where the variant is not batched, or a batched variant without strides."""
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        pa, pb, pc = ctypes.c_void_p(a), ctypes.c_void_p(b), ctypes.c_void_p(c)
        dt = PRECISIONS[precision]
        if variant.out not in ("fp32", precision):
            raise CublasError(f"cuBLAS has no {precision} GEMM into {variant.out} C (cublasGemmEx stores C as fp32 or "
                              f"as the inputs' type): no baseline for out={variant.out} with {precision} inputs")
        check_batch(variant, batch, strides)
        # Column-major C^T = B^T A^T: B^T is B as stored (nn), or B stored N x K read transposed (nt);
        # A^T likewise A as stored, or A stored K x M read transposed (tn).
        op_b, ldb = (_OP_T, k) if variant.b_transposed else (_OP_N, n)
        op_a, lda = (_OP_T, m) if variant.a_transposed else (_OP_N, k)
        # a strided batch: each operand's stride after its leading dimension, the count last
        sa, sb, sc = (ctypes.c_longlong(int(s)) for s in (strides or (0, 0, 0)))
        if dt.cublas_compute is None:
            if variant.has_epilogue or variant.out != "fp32":
                raise CublasError(f"the fp32 baseline (cublasSgemm) computes into fp32 C only, not {variant}")
            common = (self._handle, op_b, op_a, n, m, k, ctypes.byref(al))
            if variant.batched:
                status = self._lib.cublasSgemmStridedBatched(*common, pb, ldb, sb, pa, lda, sa, ctypes.byref(be), pc,
                                                             n, sc, int(batch))
                self._check(status, "cublasSgemmStridedBatched")
                return
            status = self._lib.cublasSgemm_v2(*common, pb, ldb, pa, lda, ctypes.byref(be), pc, n)
            self._check(status, "cublasSgemm")
            return
        dtype, compute, c_type = dt.cuda_type, dt.cublas_compute, PRECISIONS[variant.out].cuda_type
        if variant.batched:
            status = self._lib.cublasGemmStridedBatchedEx(self._handle, op_b, op_a, n, m, k, ctypes.byref(al), pb,
                                                          dtype, ldb, sb, pa, dtype, lda, sa, ctypes.byref(be), pc,
                                                          c_type, n, sc, int(batch), compute, _GEMM_DEFAULT)
            self._check(status, f"cublasGemmStridedBatchedEx ({precision})")
            return
        status = self._lib.cublasGemmEx(self._handle, op_b, op_a, n, m, k, ctypes.byref(al), pb, dtype, ldb, pa,
                                         dtype, lda, ctypes.byref(be), pc, c_type, n, compute, _GEMM_DEFAULT)
        self._check(status, f"cublasGemmEx ({precision})")

    def dgemm(self, m: int, n: int, k: int, a: int, b: int, c: int, b_transposed: bool = False,
              a_transposed: bool = False, batch: int = 1) -> None:
        """Row-major float64 C = A @ B (the verification reference for large problems); B is
        stored N x K where ``b_transposed``, A stored K x M where ``a_transposed``. With ``batch``
        > 1, that many products of packed matrices (A, B and C each one after another:
        cublasDgemmStridedBatched)."""
        one, zero = ctypes.c_double(1.0), ctypes.c_double(0.0)
        op_b, ldb = (_OP_T, k) if b_transposed else (_OP_N, n)
        op_a, lda = (_OP_T, m) if a_transposed else (_OP_N, k)
        head = (self._handle, op_b, op_a, n, m, k, ctypes.byref(one))
        if batch != 1:
            status = self._lib.cublasDgemmStridedBatched(*head, ctypes.c_void_p(b), ldb, ctypes.c_longlong(k * n),
                                                         ctypes.c_void_p(a), lda, ctypes.c_longlong(m * k),
                                                         ctypes.byref(zero), ctypes.c_void_p(c), n,
                                                         ctypes.c_longlong(m * n), int(batch))
            self._check(status, "cublasDgemmStridedBatched")
            return
        status = self._lib.cublasDgemm_v2(*head, ctypes.c_void_p(b), ldb, ctypes.c_void_p(a), lda, ctypes.byref(zero),
                                          ctypes.c_void_p(c), n)
        self._check(status, "cublasDgemm")

    def close(self) -> None:
        if self._handle:
            self._lib.cublasDestroy_v2(self._handle)
            self._handle = ctypes.c_void_p()
        if self._workspace.value:  # after the handle, which may still use it
            driver_library().cuMemFree_v2(self._workspace)
            self._workspace = ctypes.c_uint64()
