"""One home for what gemmgen knows about each precision: the element type of A and B and its
codes for CUDA, cuBLAS, TMA, PTX and PyTorch, how the float64 reference reads it, the rounding
units the tolerance is built from, and the oldest GPU that computes in it. fp32, fp16 and bf16
are also the types C can be stored in (gemmgen.describe.problem.OUTPUTS); ``u_store`` is the rounding of
that store.

Every module reads these facts from here (``PRECISIONS[name]`` or :func:`get`); none keeps a
table of its own. tf32 is fp32 data that the tensor cores round to 10 mantissa bits. An FP8
precision of two formats (e5m2e4m3, e4m3e5m2) has A's facts and B's in ``Precision.b``; a
module that reads B's element (its type, its check, its storage) reads them there.
"""

from dataclasses import dataclass, replace

from gemmgen.errors import InvalidParameter


@dataclass(frozen=True)
class Precision:
    name: str
    c_type: str  # CUDA type of A and B in global memory
    bytes: int  # per element of A and B
    min_cc: int  # oldest compute capability whose tensor cores (FFMA for fp32) take it
    u_in: float  # unit roundoff of the inputs as the multiply reads them (0: exact; see tolerance.py)
    u_acc: float  # unit roundoff of the fp32 accumulation, with the tensor cores' own rounding
    numpy_storage: str  # how host arrays hold it: "float32", "float16" or "bf16-bits" (uint16)
    check_kind: int  # the C++ code of its storage type (gg_type in templates/vocab.cuh.j2; the `out` codes), by which templates/check.cu reads an element
    torch_dtype: str  # the torch dtype of A and B
    cuda_type: int  # cudaDataType of A and B (cublasGemmEx)
    cublas_compute: int | None  # cublasComputeType_t of cublasGemmEx; None: cublasSgemm
    baseline: tuple[tuple[str, str], ...]  # how the cuBLAS baseline is called, stored with its rows
    ptx_type: str | None  # the type in mma.sync / wgmma instruction names; None: no tensor cores
    mma_k: int | None  # K depth of one m16n8 mma.sync, wgmma or wmma step in this type
    tma_type: str | None  # CUtensorMapDataType of A and B (and of C stored in this type)
    u_store: float  # unit roundoff of storing an fp32 result as this type (C's type; tf32 is never one)
    header: str | None = None  # the CUDA header that declares c_type (None: a built-in type)
    b_elements: "Precision | None" = None  # B's element type where it is not A's (FP8 of two formats); the rest is A's

    @property
    def b(self) -> "Precision":
        """The facts of B's elements (c_type, check_kind, torch_dtype, cuda_type, numpy_storage,
        ptx_type): A's, but for an FP8 precision of two formats (``e5m2e4m3``: A E5M2, B E4M3)."""
        return self.b_elements or self

    @property
    def fp8(self) -> bool:
        """An 8-bit float: wgmma reads it K-major only, its tensor cores accumulate in about 14
        bits (promote), and its scales may be in device memory (Variant.scale)."""
        return self.bytes == 1


_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF, _CUDA_R_8F_E4M3, _CUDA_R_8F_E5M2 = 0, 2, 14, 28, 29
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77

# FP8's two formats, each the element facts of an operand. E4M3 (4 exponent bits, 3 mantissa bits,
# no infinities; torch.float8_e4m3fn) for weights and activations; E5M2 (5 exponent bits, 2
# mantissa bits, IEEE-like with infinities; torch.float8_e5m2) has the range gradients need.
# Inputs only, never C's type. Hopper's tensor cores add fp8 products into an accumulator that
# keeps about 14 bits (DeepSeek-V3's measurement; CUTLASS's mma_promotion_interval exists for it):
# u_acc is 2^-13, the rounding a kernel that accumulates all of K in the tensor cores owes. Their
# storage codes 3 and 4 follow the `out` codes (fp32 0, fp16 1, bf16 2) in templates/check.cu.
_LT_FP8 = (("api", "cublasLtMatmul"), ("compute", "CUBLAS_COMPUTE_32F"))  # + the types
_E4M3 = Precision("e4m3", "__nv_fp8_e4m3", 1, 90, 0.0, 2.0**-13, "e4m3-bits", 3, "torch.float8_e4m3fn", _CUDA_R_8F_E4M3,
                  _COMPUTE_32F, (*_LT_FP8, ("types", "e4m3,e4m3->f32")), "e4m3", 32, "CU_TENSOR_MAP_DATA_TYPE_UINT8",
                  2.0**-4, "cuda_fp8.h")
_E5M2 = Precision("e5m2", "__nv_fp8_e5m2", 1, 90, 0.0, 2.0**-13, "e5m2-bits", 4, "torch.float8_e5m2", _CUDA_R_8F_E5M2,
                  _COMPUTE_32F, (*_LT_FP8, ("types", "e5m2,e5m2->f32")), "e5m2", 32, "CU_TENSOR_MAP_DATA_TYPE_UINT8",
                  2.0**-3, "cuda_fp8.h")


FP8_FORMATS = {"e4m3": _E4M3, "e5m2": _E5M2}  # each operand format's facts (A's or B's of a precision)


def _mixed(a: Precision, b: Precision) -> Precision:
    """A precision of A in ``a``'s format and B in ``b``'s (wgmma takes any pair of FP8 formats;
    cuBLASLt and torch._scaled_mm take E4M3 with E5M2 either way, not E5M2 with E5M2)."""
    return replace(a, name=a.name + b.name, b_elements=b, baseline=(*_LT_FP8, ("types", f"{a.name},{b.name}->f32")))


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "float", 4, 0, 0.0, 2.0**-24, "float32", 0, "torch.float32", _CUDA_R_32F, None,
              (("api", "cublasSgemm"), ("math", "CUBLAS_DEFAULT_MATH")), None, None, "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
              2.0**-24),
    Precision("tf32", "float", 4, 80, 2.0**-10, 2.0**-22, "float32", 0, "torch.float32", _CUDA_R_32F,
              _COMPUTE_32F_FAST_TF32,
              (("api", "cublasGemmEx"), ("compute", "CUBLAS_COMPUTE_32F_FAST_TF32"), ("types", "f32,f32->f32")),
              "tf32", 8, "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", 2.0**-24),  # tf32 reads fp32 bits, ignoring the low 13
    Precision("fp16", "__half", 2, 70, 0.0, 2.0**-22, "float16", 1, "torch.float16", _CUDA_R_16F, _COMPUTE_32F,
              (("api", "cublasGemmEx"), ("compute", "CUBLAS_COMPUTE_32F"), ("types", "f16,f16->f32")),
              "f16", 16, "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 2.0**-11, "cuda_fp16.h"),
    Precision("bf16", "__nv_bfloat16", 2, 80, 0.0, 2.0**-22, "bf16-bits", 2, "torch.bfloat16", _CUDA_R_16BF,
              _COMPUTE_32F,
              (("api", "cublasGemmEx"), ("compute", "CUBLAS_COMPUTE_32F"), ("types", "bf16,bf16->f32")),
              "bf16", 16, "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 2.0**-8, "cuda_bf16.h"),
    _E4M3,
    _mixed(_E4M3, _E5M2),  # e4m3e5m2
    _mixed(_E5M2, _E4M3),  # e5m2e4m3: gradients (E5M2) times weights (E4M3), a backward pass's product
)}


def get(name: str) -> Precision:
    """The precision called ``name``; raises InvalidParameter naming the allowed ones."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise InvalidParameter(f"precision {name!r} is not one of {', '.join(PRECISIONS)}") from None
