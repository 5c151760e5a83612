"""cuBLASLt through ctypes: the baseline of a variant with a fused epilogue (bias, ReLU, GELU),
and of FP8 (e4m3) inputs, which cublasGemmEx does not take.

cuBLASLt computes D = epilogue(alpha * op(A) op(B) + beta * C) with bias and activation fused
into the store, as a gemmgen kernel whose variant adds them. gemmgen's row-major C = A @ B is
column-major C^T = B^T A^T, so B goes first (as in gemmgen.measure.cublas) and a bias per column of the
row-major C is cuBLASLt's bias per row of D. What cuBLASLt does not fuse (a bias per row of C,
SiLU) has no baseline: CublasError says so.

A batched variant (batch=strided) is one cublasLtMatmul of ``batch`` products: each layout gets
the batch count and its operand's stride (CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
STRIDED_BATCH_OFFSET), the bias its own (CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE).

FP8's row-wise scales (scale=row: element (i, j) times scale_a[i] * scale_b[j]) are cuBLASLt's
outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, cuBLAS 12.9 and later): its "A"
is gemmgen's B, so its A scale vector (N values) is scale_b and its B scale vector (M values)
scale_a. Block scales (scale=block: A in 1 x 128 blocks, B in 128 x 128; gemmgen.describe.scaling)
are its VEC128_32F and BLK128x128_32F modes in the layouts torch._scaled_mm passes them in, which
are gemmgen's: its A (gemmgen's B) takes the 128 x 128 blocks, its B the 1 x 128. Per-tensor scales
are folded into alpha by the caller (gemmgen.measure.bench).

A plan (descriptors, the algorithm cuBLASLt's heuristic picks with a 32 MiB workspace) is made
once per problem and kept, so that a timed call queues the matmul only. Calls run on the default
stream of the CUDA context current on the calling thread.
"""

import ctypes

from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Variant
from gemmgen.measure.cublas import WORKSPACE_BYTES, CublasError, check_batch, driver_library, lt_library

_OP_N, _OP_T = 0, 1
_COMPUTE_32F = 68  # CUBLAS_COMPUTE_32F, the compute type where gemmgen.describe.dtypes names none (fp32)
_CUDA_R_32F = 0
# cublasLtMatmulDescAttributes_t
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER, _DESC_BIAS_BATCH_STRIDE = 3, 4, 7, 8, 10
_DESC_A_SCALE_POINTER, _DESC_B_SCALE_POINTER, _DESC_A_SCALE_MODE, _DESC_B_SCALE_MODE = 17, 18, 31, 32
# cublasLtMatmulMatrixScale_t: a vector of fp32 scales along M, and along N; one per 128 of K (and
# row or column); one per 128 x 128 block
_SCALE_OUTER_VEC_32F, _SCALE_VEC128_32F, _SCALE_BLK128x128_32F = 3, 4, 5
# the scale modes of cuBLASLt's A (gemmgen's B) and B (gemmgen's A), by Variant.scale
_SCALE_MODES = {"row": (_SCALE_OUTER_VEC_32F, _SCALE_OUTER_VEC_32F), "block": (_SCALE_BLK128x128_32F, _SCALE_VEC128_32F)}
# cublasLtMatrixLayoutAttribute_t: a strided batch's count (int32) and stride in elements (int64)
_LAYOUT_BATCH_COUNT, _LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
_PREF_MAX_WORKSPACE_BYTES = 1
_STATUS_NOT_SUPPORTED = 15  # CUBLAS_STATUS_NOT_SUPPORTED: no algorithm takes the problem
# cublasLtEpilogue_t, by (bias, act)
EPILOGUES = {("none", "none"): 1, ("none", "relu"): 2, ("col", "none"): 4, ("col", "relu"): 6,
             ("none", "gelu"): 32, ("col", "gelu"): 36}


class _Heuristic(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    return lt_library(), driver_library()


def precision_refused(variant: Variant, precision: str) -> str | None:
    """Why cuBLASLt is no baseline for ``precision``'s inputs in ``variant``, or None: 8-bit inputs
    are taken K-major only (A stored M x K, B stored N x K: trans=nt), without an epilogue."""
    if not PRECISIONS[precision].fp8:
        return None
    if variant.trans != "nt":
        return (f"cuBLASLt multiplies {precision} with A and B K-major only (trans=nt: B stored N x K), not "
                f"trans={variant.trans}")
    if variant.has_epilogue:
        # seen on an H200 with CUDA 13.0's cuBLASLt, 2026-11-28: e4m3, a column bias and GELU into
        # fp32 C at 129x6144x4096 was far from the float64 reference (and the check said so)
        return (f"no cuBLASLt baseline for {precision} with an epilogue (bias={variant.bias}, act={variant.act}): "
                "its FP8 matmul with a fused bias and GELU gave wrong results")
    return None


def supported(variant: Variant, precision: str = "fp16") -> str | None:
    """Why cuBLASLt has no baseline for ``variant`` (its epilogue, its layouts) with ``precision``'s
    inputs, or None where it has one."""
    if why := precision_refused(variant, precision):
        return why
    if (variant.bias, variant.act) not in EPILOGUES:
        return (f"cuBLASLt fuses a bias per column of C and ReLU or GELU; bias={variant.bias}, act={variant.act} "
                "has no cuBLASLt baseline")
    if variant.a_transposed:
        return f"no cuBLASLt baseline for trans={variant.trans} yet (A stored transposed)"
    return None


class CublasLt:
    """A cuBLASLt handle and a 32 MiB workspace in the current CUDA context."""

    def __init__(self):
        self._lib, self._cuda = _libraries()
        self._handle = ctypes.c_void_p()
        self._check(self._lib.cublasLtCreate(ctypes.byref(self._handle)), "cublasLtCreate")
        self._workspace = ctypes.c_uint64()
        if self._cuda.cuMemAlloc_v2(ctypes.byref(self._workspace), ctypes.c_size_t(WORKSPACE_BYTES)) != 0:
            raise CublasError("cuMemAlloc of cuBLASLt's workspace failed")
        self._plans: dict[tuple, tuple] = {}

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise CublasError(f"{what} failed with cuBLAS status {status}")

    def _set(self, desc, attribute: int, value) -> None:
        self._check(self._lib.cublasLtMatmulDescSetAttribute(desc, attribute, ctypes.byref(value),
                                                              ctypes.c_size_t(ctypes.sizeof(value))),
                    "cublasLtMatmulDescSetAttribute")

    def _layout(self, cuda_type: int, rows: int, cols: int, ld: int, batch: int = 1, stride: int = 0):
        layout = ctypes.c_void_p()
        self._check(self._lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), cuda_type, ctypes.c_uint64(rows),
                                                          ctypes.c_uint64(cols), ctypes.c_int64(ld)),
                    "cublasLtMatrixLayoutCreate")
        if batch != 1:
            for attribute, value in ((_LAYOUT_BATCH_COUNT, ctypes.c_int32(batch)),
                                     (_LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(stride))):
                self._check(self._lib.cublasLtMatrixLayoutSetAttribute(layout, attribute, ctypes.byref(value),
                                                                        ctypes.c_size_t(ctypes.sizeof(value))),
                            "cublasLtMatrixLayoutSetAttribute")
        return layout

    def _plan(self, precision: str, m: int, n: int, k: int, variant: Variant, bias: int, batch: int,
              strides: tuple[int, int, int, int], scales: tuple[int, int]) -> tuple:
        key = (precision, m, n, k, variant, bias, batch, strides, scales)
        if key in self._plans:
            return self._plans[key]
        dt = PRECISIONS[precision]
        a_type, b_type, c_type = dt.cuda_type, dt.b.cuda_type, PRECISIONS[variant.out].cuda_type
        compute = dt.cublas_compute if dt.cublas_compute is not None else _COMPUTE_32F
        stride_a, stride_b, stride_c, stride_bias = strides
        desc = ctypes.c_void_p()
        self._check(self._lib.cublasLtMatmulDescCreate(ctypes.byref(desc), compute, _CUDA_R_32F),
                    "cublasLtMatmulDescCreate")
        # Column-major C^T (N x M) = B^T (N x K) A^T (K x M): "A" is B as stored, read transposed for nt.
        op_b = _OP_T if variant.b_transposed else _OP_N
        self._set(desc, _DESC_TRANSA, ctypes.c_int(op_b))
        self._set(desc, _DESC_TRANSB, ctypes.c_int(_OP_N))
        self._set(desc, _DESC_EPILOGUE, ctypes.c_int(EPILOGUES[(variant.bias, variant.act)]))
        if variant.bias != "none":
            self._set(desc, _DESC_BIAS_POINTER, ctypes.c_void_p(bias))
            if batch != 1:
                self._set(desc, _DESC_BIAS_BATCH_STRIDE, ctypes.c_int64(stride_bias))
        if variant.scale in _SCALE_MODES:
            scale_a, scale_b = scales
            mode_a, mode_b = _SCALE_MODES[variant.scale]
            for attribute, value in ((_DESC_A_SCALE_MODE, ctypes.c_int(mode_a)),
                                     (_DESC_B_SCALE_MODE, ctypes.c_int(mode_b)),
                                     (_DESC_A_SCALE_POINTER, ctypes.c_void_p(scale_b)),  # cuBLASLt's A is our B
                                     (_DESC_B_SCALE_POINTER, ctypes.c_void_p(scale_a))):
                self._set(desc, attribute, value)
        layout_b = (self._layout(b_type, k, n, k, batch, stride_b) if variant.b_transposed
                    else self._layout(b_type, n, k, n, batch, stride_b))
        layout_a = self._layout(a_type, k, m, k, batch, stride_a)
        layout_c = self._layout(c_type, n, m, n, batch, stride_c)
        pref = ctypes.c_void_p()
        self._check(self._lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        size = ctypes.c_uint64(WORKSPACE_BYTES)
        self._check(self._lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size),
                                                                    ctypes.c_size_t(8)),
                    "cublasLtMatmulPreferenceSetAttribute")
        found, count = _Heuristic(), ctypes.c_int(0)
        status = self._lib.cublasLtMatmulAlgoGetHeuristic(self._handle, desc, layout_b, layout_a, layout_c, layout_c,
                                                          pref, 1, ctypes.byref(found), ctypes.byref(count))
        self._lib.cublasLtMatmulPreferenceDestroy(pref)
        if status == _STATUS_NOT_SUPPORTED or (status == 0 and count.value < 1):
            self._lib.cublasLtMatmulDescDestroy(desc)
            for layout in (layout_b, layout_a, layout_c):
                self._lib.cublasLtMatrixLayoutDestroy(layout)
            raise CublasError(f"cuBLASLt has no algorithm for {precision} {m}x{n}x{k} {variant.text}"
                              + (f" (batch {batch})" if batch != 1 else "")
                              + (" (FP8 wants rows of 16-byte multiples)" if PRECISIONS[precision].fp8 else ""))
        self._check(status, "cublasLtMatmulAlgoGetHeuristic")
        plan = (desc, layout_b, layout_a, layout_c, found)
        self._plans[key] = plan
        return plan

    def prepare(self, precision: str, m: int, n: int, k: int, variant: Variant, bias: int | None = None,
                batch: int = 1, strides: tuple[int, int, int, int] | None = None,
                scales: tuple[int, int] | None = None) -> tuple:
        """The plan of gemm's call with these arguments, made now (and kept): raises CublasError
        where cuBLASLt fuses no such epilogue (``supported``), has no algorithm for the problem
        (FP8, for one, wants leading dimensions of 16-byte multiples; outer-vector scales want
        cuBLAS 12.9), strides are given where the variant is not batched or missing where it is,
        or scale=row or block comes without ``scales`` (the device addresses of scale_a's and
        scale_b's fp32 values)."""
        why = supported(variant, precision)
        if why:
            raise CublasError(why)
        if variant.bias != "none" and not bias:
            raise CublasError(f"variant {variant.text} adds a bias: pass its device address")
        if variant.scale in _SCALE_MODES and not (scales and all(scales)):
            raise CublasError(f"variant {variant.text} reads scale vectors: pass scale_a's and scale_b's "
                              "device addresses")
        check_batch(variant, batch, strides)
        strides = tuple(int(s) for s in strides) if strides is not None else (0, 0, 0, 0)
        vectors = tuple(int(s) for s in scales) if variant.scale in _SCALE_MODES else (0, 0)
        return self._plan(precision, m, n, k, variant, bias or 0, int(batch), strides, vectors)

    def gemm(self, precision: str, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float, c: int,
             variant: Variant, bias: int | None = None, batch: int = 1,
             strides: tuple[int, int, int, int] | None = None, scales: tuple[int, int] | None = None) -> None:
        """Row-major C = act(alpha * A @ B + beta * C + bias) for device pointers a, b, c and bias
        (N values of C's type, one per column), as gemmgen.measure.cublas.Cublas.gemm for the rest; a
        batched variant computes ``batch`` products in one call, ``strides`` = (stride_a, stride_b,
        stride_c, stride_bias) in elements (0 for A, B or the bias: one for every product);
        scale=row multiplies element (i, j) of A @ B by scale_a[i] * scale_b[j], scale=block each
        element of A and B by its block's scale (``scales``: their device addresses). Raises CublasError as :meth:`prepare` does."""
        desc, layout_b, layout_a, layout_c, found = self.prepare(precision, m, n, k, variant, bias, batch, strides,
                                                                 scales)
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        self._check(self._lib.cublasLtMatmul(self._handle, desc, ctypes.byref(al), ctypes.c_void_p(b), layout_b,
                                             ctypes.c_void_p(a), layout_a, ctypes.byref(be), ctypes.c_void_p(c),
                                             layout_c, ctypes.c_void_p(c), layout_c, ctypes.byref(found),  # its algo is first
                                             ctypes.c_void_p(self._workspace.value),
                                             ctypes.c_size_t(WORKSPACE_BYTES), ctypes.c_void_p(0)),
                    f"cublasLtMatmul ({precision}, {variant.text})")

    def close(self) -> None:
        for desc, *layouts, _ in self._plans.values():
            self._lib.cublasLtMatmulDescDestroy(desc)
            for layout in layouts:
                self._lib.cublasLtMatrixLayoutDestroy(layout)
        self._plans.clear()
        if self._workspace.value:
            self._cuda.cuMemFree_v2(self._workspace)
            self._workspace = ctypes.c_uint64()
        if self._handle:
            self._lib.cublasLtDestroy(self._handle)
            self._handle = ctypes.c_void_p()
