"""gemmgen.torch's rules for tensors and targets (gemmgen.torch.checks), on plain values: no torch,
no GPU. Each message is asserted with its text; tests/pytorch/test_gpu_torch.py raises them through the
tensors themselves."""

import re
import subprocess
import sys

import pytest

from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.describe.problem import Variant
from gemmgen.errors import GemmgenError, InvalidParameter
from gemmgen.measure.device import GpuUnavailable
from gemmgen.torch.checks import (Operand, TargetMismatch, TensorError, build_target, check_call, dtype_for,
                                  is_row_major, out_dtype, row_major_strides, runs_on, source_target)

ITEMSIZE = {"torch.float32": 4, "torch.float16": 2, "torch.bfloat16": 2, "torch.float64": 8, "torch.float8_e4m3fn": 1,
            "torch.float8_e5m2": 1}


def mat(shape, dtype="torch.float16", *, address, stride=None, device="cuda:0", **kw) -> Operand:
    """A dense tensor's facts: row-major unless ``stride`` is given."""
    return Operand(tuple(shape), tuple(stride) if stride is not None else row_major_strides(tuple(shape)), dtype,
                   device, address, ITEMSIZE[dtype], **kw)


# a 100 x 64 fp16 A, a 64 x 32 fp16 B and a 100 x 32 fp32 C, in separate allocations
A = mat((100, 64), address=0x100000)
B = mat((64, 32), address=0x200000)
C = mat((100, 32), "torch.float32", address=0x300000)


def refused(message: str):
    return pytest.raises(TensorError, match=f"^{re.escape(message)}$")


def test_the_module_imports_without_torch():
    code = "import sys, gemmgen.torch.checks; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_dtypes_come_from_the_element_types():
    assert [dtype_for(p) for p in ("fp32", "tf32", "fp16", "bf16", "e4m3")] == [
        "torch.float32", "torch.float32", "torch.float16", "torch.bfloat16", "torch.float8_e4m3fn"]
    # FP8 of two formats: A's and B's differ
    assert [(dtype_for(p), dtype_for(p, "b")) for p in ("e4m3e5m2", "e5m2e4m3")] == [
        ("torch.float8_e4m3fn", "torch.float8_e5m2"), ("torch.float8_e5m2", "torch.float8_e4m3fn")]
    with pytest.raises(GemmgenError, match=re.escape(
            "gemmgen.torch does not know precision 'fp8' (it knows fp32, tf32, fp16, bf16, e4m3, e4m3e5m2, e5m2e4m3); "
            "is the library from a newer gemmgen?")):
        dtype_for("fp8")


def test_row_major_strides_ignore_dimensions_of_one():
    assert row_major_strides((3, 4)) == (4, 1)
    assert row_major_strides((0, 4)) == (4, 1)
    assert is_row_major((3, 4), (4, 1))
    assert not is_row_major((4, 3), (1, 4))  # a transposed 3 x 4
    assert not is_row_major((3, 2), (4, 1))  # two columns of a 3 x 4
    assert is_row_major((5, 1), (1, 7))  # one column of a 5 x 7 matrix's transpose: never stepped along
    assert is_row_major((1, 5), (99, 1))  # one row of a wider matrix
    assert is_row_major((0, 5), (1, 1))  # empty


def test_a_good_call_gives_m_n_k():
    assert check_call("fp16", A, B, None, 0.0) == (100, 32, 64)
    assert check_call("fp16", A, B, C, -0.75) == (100, 32, 64)
    tf32 = check_call("tf32", mat((7, 3), "torch.float32", address=0x100), mat((3, 5), "torch.float32", address=0x200),
                      None, 0.0)
    assert tf32 == (7, 5, 3)
    bf16 = mat((2, 2), "torch.bfloat16", address=0x100)
    assert check_call("bf16", bf16, mat((2, 1), "torch.bfloat16", address=0x200), None, 0.0) == (2, 1, 2)


def test_empty_dimensions_pass_to_the_caller():
    assert check_call("fp16", mat((0, 64), address=0), B, None, 0.0) == (0, 32, 64)
    assert check_call("fp16", mat((100, 0), address=0), mat((0, 32), address=0), C, 0.5) == (100, 32, 0)
    # an empty out shares no byte with anything, wherever it points
    assert check_call("fp16", A, mat((64, 0), address=0x200000), mat((100, 0), "torch.float32", address=0x100000),
                      0.0) == (100, 0, 64)


def test_inputs_must_be_2d_of_the_kernels_dtype():
    with refused("a must be a 2-D matrix; it has 3 dimension(s) (shape (2, 100, 64))"):
        check_call("fp16", mat((2, 100, 64), address=0x1000), B, None, 0.0)
    with refused("b must be a 2-D matrix; it has 1 dimension(s) (shape (64,))"):
        check_call("fp16", A, mat((64,), address=0x1000), None, 0.0)
    with refused("a is torch.float32, but this kernel's precision is fp16, which takes torch.float16: convert it "
                 "with a.to(torch.float16)"):
        check_call("fp16", mat((100, 64), "torch.float32", address=0x1000), B, None, 0.0)
    with refused("b is torch.float16, but this kernel's precision is tf32, which takes torch.float32: convert it "
                 "with b.to(torch.float32)"):
        check_call("tf32", mat((100, 64), "torch.float32", address=0x1000), B, None, 0.0)
    with refused("b is torch.float16, but this kernel's precision is bf16, which takes torch.bfloat16: convert it "
                 "with b.to(torch.bfloat16)"):
        check_call("bf16", mat((100, 64), "torch.bfloat16", address=0x1000), B, None, 0.0)
    # FP8 of two formats: B in its own (e4m3e5m2: A E4M3, B E5M2)
    a8 = mat((100, 64), "torch.float8_e4m3fn", address=0x1000)
    with refused("b is torch.float8_e4m3fn, but this kernel's precision is e4m3e5m2, which takes torch.float8_e5m2: "
                 "convert it with b.to(torch.float8_e5m2)"):
        check_call("e4m3e5m2", a8, mat((64, 48), "torch.float8_e4m3fn", address=0x100000), None, 0.0)
    with refused("a is torch.float8_e5m2, but this kernel's precision is e4m3e5m2, which takes torch.float8_e4m3fn: "
                 "convert it with a.to(torch.float8_e4m3fn)"):
        check_call("e4m3e5m2", mat((100, 64), "torch.float8_e5m2", address=0x1000),
                   mat((64, 48), "torch.float8_e5m2", address=0x100000), None, 0.0)


def test_inputs_must_be_dense_cuda_tensors_without_grad():
    with refused("a is on cpu; gemmgen kernels take CUDA tensors: move it with a.cuda() (or .to('cuda:N'))"):
        check_call("fp16", mat((100, 64), address=0x1000, device="cpu"), B, None, 0.0)
    with refused("b is on meta; gemmgen kernels take CUDA tensors: move it with b.cuda() (or .to('cuda:N'))"):
        check_call("fp16", A, mat((64, 32), address=0, device="meta"), None, 0.0)
    with refused("a is a torch.sparse_coo tensor; gemmgen kernels take dense (torch.strided) tensors: pass "
                 "a.to_dense()"):
        check_call("fp16", Operand((100, 64), (), "torch.float16", "cuda:0", 0, 2, "torch.sparse_coo"), B, None, 0.0)
    with refused("b requires grad, and gemmgen kernels have no backward: call under torch.no_grad() or "
                 "torch.inference_mode(), or pass b.detach()"):
        check_call("fp16", A, mat((64, 32), address=0x200000, needs_grad=True), None, 0.0)


def test_inputs_must_be_contiguous_row_major():
    with refused("b is not contiguous row-major: shape (64, 32) with strides (1, 64), where row-major has (32, 1); "
                 "pass b.contiguous() (gemmgen does not copy it for you)"):
        check_call("fp16", A, mat((64, 32), address=0x200000, stride=(1, 64)), None, 0.0)
    with refused("a is not contiguous row-major: shape (100, 64) with strides (128, 1), where row-major has (64, 1); "
                 "pass a.contiguous() (gemmgen does not copy it for you)"):
        check_call("fp16", mat((100, 64), address=0x1000, stride=(128, 1)), B, None, 0.0)


def test_inputs_must_share_a_device_and_their_inner_dimension():
    with refused("a is on cuda:0 and b on cuda:1; put both on one device"):
        check_call("fp16", A, mat((64, 32), address=0x200000, device="cuda:1"), None, 0.0)
    with refused("a is 100 x 64 and b is 65 x 32: a's columns (K=64) must equal b's rows (65)"):
        check_call("fp16", A, mat((65, 32), address=0x200000), None, 0.0)


def test_dimensions_must_fit_the_launchers_int():
    wide = mat((1, 2**31), address=0x1000)
    with refused("K=2147483648 is larger than the launcher's int takes (2147483647); split the product"):
        check_call("fp16", wide, mat((2**31, 1), address=0x200000), None, 0.0)
    with refused("N=2147483648 is larger than the launcher's int takes (2147483647); split the product"):
        check_call("fp16", mat((1, 1), address=0x200000), wide, None, 0.0)


def test_beta_needs_an_out():
    with refused("beta=0.5 adds beta * out to the product, and no out was given: pass out (fp32, M x N), or beta=0"):
        check_call("fp16", A, B, None, 0.5)


def test_out_must_be_fp32_m_by_n_contiguous_on_a_device():
    with refused("out must be 100 x 32 (a's rows x b's columns); it has shape (32, 100)"):
        check_call("fp16", A, B, mat((32, 100), "torch.float32", address=0x300000), 0.0)
    with refused("out is torch.float16; this kernel writes C in torch.float32 (out=fp32): make it with "
                 "torch.empty(100, 32, dtype=torch.float32, device=a.device)"):
        check_call("fp16", A, B, mat((100, 32), "torch.float16", address=0x300000), 0.0)
    with refused("out is on cpu; gemmgen kernels take CUDA tensors: move it with out.cuda() (or .to('cuda:N'))"):
        check_call("fp16", A, B, mat((100, 32), "torch.float32", address=0x300000, device="cpu"), 0.0)
    with refused("out is on cuda:1 and a on cuda:0; put them on one device"):
        check_call("fp16", A, B, mat((100, 32), "torch.float32", address=0x300000, device="cuda:1"), 0.0)
    with refused("out requires grad, and gemmgen kernels have no backward: call under torch.no_grad() or "
                 "torch.inference_mode(), or pass out.detach()"):
        check_call("fp16", A, B, mat((100, 32), "torch.float32", address=0x300000, needs_grad=True), 0.0)
    with refused("out is not contiguous row-major: shape (100, 32) with strides (1, 100), where row-major has "
                 "(32, 1); pass out.contiguous() (gemmgen does not copy it for you)"):
        check_call("fp16", A, B, mat((100, 32), "torch.float32", address=0x300000, stride=(1, 100)), 0.0)


def test_out_must_not_overlap_a_or_b():
    a_end = A.address + 100 * 64 * 2
    with refused("out overlaps a in memory; C is written while A and B are read: pass an out of its own"):
        check_call("fp16", A, B, mat((100, 32), "torch.float32", address=a_end - 4), 0.0)
    with refused("out overlaps b in memory; C is written while A and B are read: pass an out of its own"):
        check_call("fp16", A, B, mat((100, 32), "torch.float32", address=B.address - 100 * 32 * 4 + 4), 0.0)
    # right after A and right before B: no byte shared
    assert check_call("fp16", A, B, mat((100, 32), "torch.float32", address=a_end), 0.0) == (100, 32, 64)
    assert check_call("fp16", A, B, mat((100, 32), "torch.float32", address=B.address - 100 * 32 * 4),
                      0.0) == (100, 32, 64)
    # tensors without data (traced by torch.compile): where addresses are not known, nothing overlaps
    unknown = [mat(t.shape, t.dtype, address=None) for t in (A, B)]
    assert check_call("fp16", *unknown, mat((100, 32), "torch.float32", address=None), 0.0) == (100, 32, 64)
    assert check_call("fp16", *unknown, mat((100, 32), "torch.float32", address=A.address), 0.0) == (100, 32, 64)


def test_source_target_reads_the_emitted_header():
    assert source_target(render_kernel(NAMED_POINTS["hopper_fp16"].config("sm_90"))) == "sm_90a"
    assert source_target(render_kernel(NAMED_POINTS["v4"].config("sm_89"))) == "sm_89"
    assert source_target("__global__ void k() {}\n") is None
    # a dispatcher: one header per kernel; the architecture-specific target builds them all
    mma, hopper = (render_kernel(NAMED_POINTS[p].config("sm_90")) for p in ("mma_fp16", "hopper_fp16"))
    assert source_target(mma + hopper) == "sm_90a" and source_target(mma + mma) == "sm_90"


def test_code_runs_on_its_own_cc_and_plain_targets_on_newer_ones():
    assert runs_on(parse_arch("sm_90"), 90) and runs_on(parse_arch("sm_80"), 90)
    assert runs_on(parse_arch("sm_90a"), 90) and not runs_on(parse_arch("sm_90a"), 100)
    assert not runs_on(parse_arch("sm_90"), 89)


def test_build_target_prefers_gpu_then_the_file_then_the_device():
    assert build_target("sm_89", "sm_80", 90).name == "sm_80"
    assert build_target("sm_90a", None, 90).name == "sm_90a"
    assert build_target(None, None, 89).name == "sm_89"
    assert build_target("sm_90a", None, None).name == "sm_90a"  # no GPU: built, not checked
    with pytest.raises(GpuUnavailable, match=re.escape(
            "no CUDA device is visible to PyTorch and the file names no target: pass gpu= (e.g. gpu='sm_90') to "
            "build it anyway")):
        build_target(None, None, None)
    with pytest.raises(InvalidParameter, match="unknown GPU architecture 'sm_91'"):
        build_target(None, "sm_91", 90)


def test_build_target_refuses_what_the_gpu_cannot_run():
    with pytest.raises(TargetMismatch, match=re.escape(
            "a kernel built for sm_90a cannot run on this GPU (sm_100): sm_90a code runs on sm_90 alone; emit it "
            "for this GPU (gemmgen emit ... --gpu sm_100)")):
        build_target("sm_90a", None, 100)
    with pytest.raises(TargetMismatch, match=re.escape(
            "a kernel built for sm_90 cannot run on this GPU (sm_80): code for a newer GPU does not run on an older "
            "one; emit it for this GPU (gemmgen emit ... --gpu sm_80)")):
        build_target(None, "sm_90", 80)



# ---- problem variants: layouts, C's type, the bias ----

LINEAR = Variant("nt", "bf16", "col", "gelu")  # F.gelu(F.linear(x, w, b), approximate="tanh")
X = mat((100, 64), "torch.bfloat16", address=0x100000)  # M x K
W = mat((32, 64), "torch.bfloat16", address=0x200000)  # N x K: F.linear's weight
Y = mat((100, 32), "torch.bfloat16", address=0x300000)
BIAS = mat((32,), "torch.bfloat16", address=0x400000)


def test_out_dtype_is_the_variants():
    assert [out_dtype(Variant(out=o)) for o in ("fp32", "fp16", "bf16")] == [
        "torch.float32", "torch.float16", "torch.bfloat16"]


def test_each_layout_reads_a_and_b_as_stored():
    assert check_call("bf16", X, W, Y, 0.5, LINEAR, BIAS) == (100, 32, 64)
    assert check_call("bf16", X, W, None, 0.0, LINEAR, BIAS) == (100, 32, 64)
    xt = mat((64, 100), "torch.bfloat16", address=0x100000)  # K x M
    b = mat((64, 32), "torch.bfloat16", address=0x200000)
    assert check_call("bf16", xt, b, None, 0.0, Variant("tn", "bf16")) == (100, 32, 64)
    assert check_call("bf16", xt, W, None, 0.0, Variant("tt")) == (100, 32, 64)
    with refused("a is 100 x 64 and b is 64 x 32 (N x K: trans=nt takes B stored transposed, as F.linear's "
                 "weight): a's columns (K=64) must equal b's columns (32)"):
        check_call("bf16", X, b, None, 0.0, Variant("nt", "bf16"))
    with refused("a is 100 x 64 (K x M: trans=tn takes A stored transposed) and b is 64 x 32: a's rows (K=100) must "
                 "equal b's rows (64)"):
        check_call("bf16", X, b, None, 0.0, Variant("tn"))
    with refused("out must be 100 x 32 (a's rows x b's rows); it has shape (32, 100)"):
        check_call("bf16", X, W, mat((32, 100), "torch.bfloat16", address=0x300000), 0.0, LINEAR, BIAS)


def test_out_is_of_the_variants_type():
    with refused("out is torch.float32; this kernel writes C in torch.bfloat16 (out=bf16): make it with "
                 "torch.empty(100, 32, dtype=torch.bfloat16, device=a.device)"):
        check_call("bf16", X, W, mat((100, 32), "torch.float32", address=0x300000), 0.0, LINEAR, BIAS)
    with refused("beta=0.5 adds beta * out to the product, and no out was given: pass out (bf16, M x N), or beta=0"):
        check_call("bf16", X, W, None, 0.5, LINEAR, BIAS)
    fp16_c = Variant("nn", "fp16")
    with refused("out is torch.bfloat16; this kernel writes C in torch.float16 (out=fp16): make it with "
                 "torch.empty(100, 32, dtype=torch.float16, device=a.device)"):
        check_call("fp16", A, B, mat((100, 32), "torch.bfloat16", address=0x300000), 0.0, fp16_c)


def test_the_bias_is_what_the_variant_adds():
    with refused("this kernel adds a bias (variant nt bf16 col gelu): pass bias=, a tensor of shape (32,) (N values, "
                 "one per column of C) of torch.bfloat16"):
        check_call("bf16", X, W, Y, 0.0, LINEAR)
    with refused("bias was given, but this kernel adds no bias (variant nt bf16 none gelu): pass no bias, or emit a "
                 "kernel that adds one (gemmgen emit ... --bias col: N values, one per column of C; --bias row: M "
                 "values)"):
        check_call("bf16", X, W, Y, 0.0, Variant("nt", "bf16", act="gelu"), BIAS)
    with refused("bias must have shape (32,) (N values, one per column of C, bias=col); it has shape (100,)"):
        check_call("bf16", X, W, Y, 0.0, LINEAR, mat((100,), "torch.bfloat16", address=0x400000))
    with refused("bias must have shape (100,) (M values, one per row of C, bias=row); it has shape (32,)"):
        check_call("bf16", X, W, Y, 0.0, Variant("nt", "bf16", "row"), BIAS)
    assert check_call("bf16", X, W, Y, 0.0, Variant("nt", "bf16", "row"),
                      mat((100,), "torch.bfloat16", address=0x400000)) == (100, 32, 64)
    with refused("bias must have shape (32,) (N values, one per column of C, bias=col); it has shape (1, 32)"):
        check_call("bf16", X, W, Y, 0.0, LINEAR, mat((1, 32), "torch.bfloat16", address=0x400000))
    with refused("bias is torch.float32; this kernel reads the bias in C's type, torch.bfloat16: convert it with "
                 "bias.to(torch.bfloat16)"):
        check_call("bf16", X, W, Y, 0.0, LINEAR, mat((32,), "torch.float32", address=0x400000))
    with refused("bias is on cpu; gemmgen kernels take CUDA tensors: move it with bias.cuda() (or .to('cuda:N'))"):
        check_call("bf16", X, W, Y, 0.0, LINEAR, mat((32,), "torch.bfloat16", address=0x400000, device="cpu"))
    with refused("bias is on cuda:1 and a on cuda:0; put them on one device"):
        check_call("bf16", X, W, Y, 0.0, LINEAR, mat((32,), "torch.bfloat16", address=0x400000, device="cuda:1"))
    with refused("bias requires grad, and gemmgen kernels have no backward: call under torch.no_grad() or "
                 "torch.inference_mode(), or pass bias.detach()"):
        check_call("bf16", X, W, Y, 0.0, LINEAR, mat((32,), "torch.bfloat16", address=0x400000, needs_grad=True))
    with refused("bias is not contiguous row-major: shape (32,) with strides (2,), where row-major has (1,); pass "
                 "bias.contiguous() (gemmgen does not copy it for you)"):
        check_call("bf16", X, W, Y, 0.0, LINEAR, mat((32,), "torch.bfloat16", address=0x400000, stride=(2,)))
    with refused("out overlaps bias in memory; C is written while the bias is read: pass an out of its own"):
        check_call("bf16", X, W, Y, 0.0, LINEAR, mat((32,), "torch.bfloat16", address=0x300000 + 100 * 32 * 2 - 2))
    # the bias may share memory with A or B (all are read)
    assert check_call("bf16", X, W, Y, 0.0, LINEAR, mat((32,), "torch.bfloat16", address=0x200000)) == (100, 32, 64)


# FP8 with row-wise scales: a 100 x 64 e4m3 A, a 32 x 64 e4m3 B (N x K), bf16 C, float32 scales
ROWWISE = Variant("nt", "bf16", scale="row")
QA, QB = mat((100, 64), "torch.float8_e4m3fn", address=0x100000), mat((32, 64), "torch.float8_e4m3fn", address=0x200000)
SA, SB = mat((100, 1), "torch.float32", address=0x500000), mat((1, 32), "torch.float32", address=0x600000)


def test_fp8_scales_are_what_the_variant_reads():
    assert check_call("e4m3", QA, QB, Y, 0.0, ROWWISE, None, SA, SB) == (100, 32, 64)
    vectors = mat((100,), "torch.float32", address=0x500000), mat((32,), "torch.float32", address=0x600000)
    assert check_call("e4m3", QA, QB, Y, 0.0, ROWWISE, None, *vectors) == (100, 32, 64)
    one = mat((), "torch.float32", address=0x500000), mat((1,), "torch.float32", address=0x600000)
    assert check_call("e4m3", QA, QB, Y, 0.0, Variant("nt", "bf16", scale="tensor"), None, *one) == (100, 32, 64)
    with refused("this kernel reads FP8 scales (variant nt bf16 none none row): pass scale_b=, a float32 tensor of 32 "
                 "values, one per column of C"):
        check_call("e4m3", QA, QB, Y, 0.0, ROWWISE, None, SA, None)
    with refused("scale_a must hold 100 values, one per row of C (scale=row) along one dimension; it has shape "
                 "(1, 32)"):
        check_call("e4m3", QA, QB, Y, 0.0, ROWWISE, None, SB, SB)
    with refused("scale_a must hold one value (scale=tensor) along one dimension; it has shape (100, 1)"):
        check_call("e4m3", QA, QB, Y, 0.0, Variant("nt", "bf16", scale="tensor"), None, SA, SB)
    with refused("scale_b is torch.bfloat16; scales are float32: convert it with scale_b.float()"):
        check_call("e4m3", QA, QB, Y, 0.0, ROWWISE, None, SA, mat((32,), "torch.bfloat16", address=0x600000))
    with refused("scale_b is on cuda:1 and a on cuda:0; put them on one device"):
        check_call("e4m3", QA, QB, Y, 0.0, ROWWISE, None, SA, mat((32,), "torch.float32", address=0x600000,
                                                                  device="cuda:1"))
    with refused("out overlaps scale_a in memory; C is written while the scales are read: pass an out of its own"):
        check_call("e4m3", QA, QB, Y, 0.0, ROWWISE, None, mat((100,), "torch.float32", address=0x300000), SB)
    with refused("scale_a or scale_b was given, but this kernel is not scaled (variant nt bf16 none none): pass no "
                 "scales, or emit an FP8 kernel that reads them (gemmgen emit ... --scale row: M and N values; --scale "
                 "tensor: one each; --scale block: 1x128 and 128x128 blocks)"):
        check_call("bf16", X, W, Y, 0.0, Variant("nt", "bf16"), None, SA, SB)
    with refused("a is torch.bfloat16, but this kernel's precision is e4m3, which takes torch.float8_e4m3fn: convert "
                 "it with a.to(torch.float8_e4m3fn)"):
        check_call("e4m3", X, QB, Y, 0.0, ROWWISE, None, SA, SB)


def test_fp8_block_scales_take_torch_scaled_mms_1x128_and_128x128_layouts():
    """scale=block: scale_a (M, ceil(K/128)) with strides (1, M), scale_b (KBP, ceil(N/128)) with
    strides (1, KBP), KBP = ceil(K/128) rounded up to 4: what torch._scaled_mm takes."""
    block = Variant("nt", "bf16", scale="block")
    a, b = mat((100, 300), "torch.float8_e4m3fn", address=0x100000), mat((260, 300), "torch.float8_e4m3fn",
                                                                          address=0x200000)
    y = mat((100, 260), "torch.bfloat16", address=0x300000)
    sa = mat((100, 3), "torch.float32", address=0x500000, stride=(1, 100))
    sb = mat((4, 3), "torch.float32", address=0x600000, stride=(1, 4))
    assert check_call("e4m3", a, b, y, 0.0, block, None, sa, sb) == (100, 260, 300)
    with refused("scale_a must have strides (1, 100) (column-major, as torch._scaled_mm takes block scales); it has "
                 "(3, 1): pass scale_a.t().contiguous().t()"):
        check_call("e4m3", a, b, y, 0.0, block, None, mat((100, 3), "torch.float32", address=0x500000), sb)
    with refused("scale_b must have shape (4, 3) (scale=block: scale_b holds a scale per 128 x 128 block of B, K's "
                 "blocks padded to a multiple of 4, as torch._scaled_mm takes it); it has shape (3, 3)"):
        check_call("e4m3", a, b, y, 0.0, block, None, sa, mat((3, 3), "torch.float32", address=0x600000,
                                                              stride=(1, 3)))
    with refused("this kernel reads FP8 scales (variant nt bf16 none none block): pass scale_b=, a float32 tensor of "
                 "shape (4, 3)"):
        check_call("e4m3", a, b, y, 0.0, block, None, sa, None)


# ---- a batched launcher: 3-D tensors ----

BATCHED = Variant(batch="strided")


def test_a_batched_call_gives_the_batch_shape_and_the_launchers_strides():
    from gemmgen.torch.checks import check_batched_call

    a, b = mat((4, 10, 6), address=0x100000), mat((4, 6, 8), address=0x200000)
    assert check_batched_call("fp16", a, b, None, 0.0, BATCHED) == (4, 10, 8, 6, (60, 48, 80, 0))
    # expand: stride 0 for a shared matrix; a padded out (batch stride 96 >= M * N = 80)
    shared = mat((4, 6, 8), address=0x200000, stride=(0, 8, 1))
    out = mat((4, 10, 8), "torch.float32", address=0x300000, stride=(96, 8, 1))
    assert check_batched_call("fp16", a, shared, out, 1.0, BATCHED) == (4, 10, 8, 6, (60, 0, 96, 0))
    # trans tt: a (batch, K, M), b (batch, N, K); a bias per product or one for all
    col = Variant("tt", bias="col", batch="strided")
    at, bt = mat((3, 6, 10), address=0x100000), mat((3, 8, 6), address=0x200000)
    assert check_batched_call("fp16", at, bt, None, 0.0, col, mat((3, 8), "torch.float32", address=0x400000)) == \
        (3, 10, 8, 6, (60, 48, 80, 8))
    assert check_batched_call("fp16", at, bt, None, 0.0, col, mat((8,), "torch.float32", address=0x400000))[4][3] == 0
    # one matrix in the batch: its batch stride is free
    one = mat((1, 10, 6), address=0x100000, stride=(7, 6, 1))
    assert check_batched_call("fp16", one, mat((1, 6, 8), address=0x200000), None, 0.0, BATCHED)[4][0] == 0


def test_a_batched_call_refuses_in_one_message():
    from gemmgen.torch.checks import check_batched_call

    a, b = mat((4, 10, 6), address=0x100000), mat((4, 6, 8), address=0x200000)
    row = Variant(bias="row", batch="strided")
    cases = [
        ((A, b, None, 0.0, BATCHED), "a must be a 3-D batch (batch, M, K) for this batched kernel; it has 2 "
                                     "dimension(s) (shape (100, 64)): for one matrix pass a.unsqueeze(0), or "
                                     "a.expand(batch, -1, -1) to share it"),
        ((a, mat((4, 8, 6), address=0x200000), None, 0.0, Variant("nt", batch="strided")), None),
        ((a, mat((3, 6, 8), address=0x200000), None, 0.0, BATCHED),
         "a holds 4 matrices and b 3; give both the same batch (expand the one shared: b.expand(batch, -1, -1))"),
        ((a, mat((4, 7, 8), address=0x200000), None, 0.0, BATCHED),
         "a is a batch of (10, 6) (M, K) and b of (7, 8) (K, N) for trans=nn: their K sides (6 and 7) must be equal"),
        ((mat((4, 10, 6), address=0x100000, stride=(60, 1, 10)), b, None, 0.0, BATCHED),
         "a's matrices are not contiguous row-major: shape (4, 10, 6) with strides (60, 1, 10), where each matrix "
         "needs strides (6, 1) after the batch's (any); pass a.contiguous()"),
        ((a, b, None, 0.5, BATCHED), "beta=0.5 adds beta * out to the product, and no out was given: pass out (fp32, "
                                     "batch x M x N), or beta=0"),
        ((a, b, mat((4, 8, 10), "torch.float32", address=0x300000), 0.0, BATCHED),
         "out must be (4, 10, 8) (batch, M, N); it has shape (4, 8, 10)"),
        ((a, b, mat((4, 10, 8), "torch.float32", address=0x300000, stride=(40, 8, 1)), 0.0, BATCHED),
         "out's matrices overlap: its batch stride is 40 elements, and each matrix of C holds M * N = 80; pass an "
         "out whose matrices lie apart (torch.empty(batch, M, N))"),
        ((a, b, mat((4, 10, 8), "torch.float32", address=0x100000 + 8), 0.0, BATCHED),
         "out overlaps a in memory; C is written while A and B are read: pass an out of its own"),
        ((a, b, None, 0.0, row, mat((4, 8), "torch.float32", address=0x400000)),
         "bias must have shape (4, 10) (a vector per product, bias=row) or (10,) (one for every product); it has "
         "shape (4, 8)"),
        ((a, b, None, 0.0, row, None), "this kernel adds a bias (variant nn fp32 row none strided): pass bias=, a "
                                       "tensor of shape (10,) (M values, one per row of C) of torch.float32"),
        ((a, b, None, 0.0, row, mat((4, 10), "torch.float32", address=0x400000, stride=(10, 2))),
         "bias is not contiguous row-major: shape (10,) with strides (2,), where row-major has (1,); pass "
         "bias.contiguous() (gemmgen does not copy it for you)"),
    ]
    for args, message in cases:
        if message is None:
            assert check_batched_call("fp16", *args)[:4] == (4, 10, 8, 6)  # nt: b is (batch, N, K)
            continue
        with refused(message):
            check_batched_call("fp16", *args)
