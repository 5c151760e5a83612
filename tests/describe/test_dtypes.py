"""gemmgen.describe.dtypes, the one home of the facts about each precision: its values, and that the
modules that used to keep their own tables now give the same answers from it."""

import pytest

from gemmgen.describe import dtypes, tolerance
from gemmgen.describe.config import make_config
from gemmgen.errors import InvalidParameter


def test_the_facts_of_each_precision():
    got = {n: (p.c_type, p.bytes, p.min_cc, p.u_in, p.u_acc, p.ptx_type, p.mma_k, p.torch_dtype)
           for n, p in dtypes.PRECISIONS.items()}
    assert got == {
        "fp32": ("float", 4, 0, 0.0, 2.0**-24, None, None, "torch.float32"),
        "tf32": ("float", 4, 80, 2.0**-10, 2.0**-22, "tf32", 8, "torch.float32"),
        "fp16": ("__half", 2, 70, 0.0, 2.0**-22, "f16", 16, "torch.float16"),
        "bf16": ("__nv_bfloat16", 2, 80, 0.0, 2.0**-22, "bf16", 16, "torch.bfloat16"),
        "e4m3": ("__nv_fp8_e4m3", 1, 90, 0.0, 2.0**-13, "e4m3", 32, "torch.float8_e4m3fn"),
        "e4m3e5m2": ("__nv_fp8_e4m3", 1, 90, 0.0, 2.0**-13, "e4m3", 32, "torch.float8_e4m3fn"),  # A's
        "e5m2e4m3": ("__nv_fp8_e5m2", 1, 90, 0.0, 2.0**-13, "e5m2", 32, "torch.float8_e5m2"),
    }
    # B's elements: A's, but in the FP8 precisions of two formats
    assert {n: (p.b.c_type, p.b.ptx_type, p.b.torch_dtype, p.b.cuda_type, p.b.check_kind, p.b.numpy_storage)
            for n, p in dtypes.PRECISIONS.items() if p.b is not p} == {
        "e4m3e5m2": ("__nv_fp8_e5m2", "e5m2", "torch.float8_e5m2", 29, 4, "e5m2-bits"),
        "e5m2e4m3": ("__nv_fp8_e4m3", "e4m3", "torch.float8_e4m3fn", 28, 3, "e4m3-bits")}
    # cudaDataType / cublasComputeType_t codes of cuBLAS's headers
    assert [(p.cuda_type, p.cublas_compute) for p in dtypes.PRECISIONS.values()] == [
        (0, None), (0, 77), (2, 68), (14, 68), (28, 68), (28, 68), (29, 68)]
    assert dict(dtypes.get("e5m2e4m3").baseline)["types"] == "e5m2,e4m3->f32"
    assert dict(dtypes.get("bf16").baseline) == {"api": "cublasGemmEx", "compute": "CUBLAS_COMPUTE_32F",
                                                 "types": "bf16,bf16->f32"}


def test_an_unknown_precision_is_one_clear_error():
    with pytest.raises(InvalidParameter, match="precision 'fp8' is not one of fp32, tf32, fp16, bf16"):
        dtypes.get("fp8")


@pytest.mark.parametrize("precision", list(dtypes.PRECISIONS))
def test_the_modules_read_the_registry(precision):
    p = dtypes.get(precision)
    assert tolerance.elementwise_tolerance(precision, 100) == 2.0 * (2.0 * p.u_in + 102 * p.u_acc)
    fp8 = p.fp8
    family = "warp" if precision == "fp32" else "hopper" if fp8 else "mma"  # FP8: wgmma only, so far
    variant = {"trans": "nt"} if fp8 else {}
    config = make_config(family, variant, precision, "sm_90")
    assert config.element_type == p.c_type
    if p.mma_k and family == "mma":
        assert config.derived["MMA_K"] == p.mma_k
        assert config.derived["MMA_INSTRUCTION"] == f"mma.sync.aligned.m16n8k{p.mma_k}.row.col.f32.{p.ptx_type}.{p.ptx_type}.f32"
    if p.mma_k:
        hopper = make_config("hopper", variant, precision, "sm_90").derived
        assert (hopper["WGMMA_K"], hopper["WGMMA_TYPE_A"], hopper["WGMMA_TYPE_B"], hopper["TMA_TYPE"]) == (
            p.mma_k, p.ptx_type, p.b.ptx_type, p.tma_type)
        assert config.element_type_b == p.b.c_type
        if fp8:  # C^T = B^T A^T: wgmma's A operand is the B tile
            swapped = make_config("hopper", {**variant, "swap": 1, "BM": 64, "BN": 128, "consumers": 1}, precision,
                                  "sm_90").derived
            assert (swapped["WGMMA_TYPE_A"], swapped["WGMMA_TYPE_B"]) == (p.b.ptx_type, p.ptx_type)
