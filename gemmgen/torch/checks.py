"""What :mod:`gemmgen.torch` requires of its tensors and of the files it loads, checked on plain
values (shapes, strides, dtype and device names, addresses, compute capabilities), so that the
rules and their messages hold without PyTorch or a GPU, and tests can reach every one of them.

gemmgen.torch reads the values off a tensor into an :class:`Operand` and calls
:func:`check_call`; nothing here imports torch.

An emitted launcher (``gemmgen_gemm`` in templates/base.cu.j2) computes
C = act(alpha * A @ B + beta * C + bias) for its problem variant (gemmgen.describe.problem.Variant): it
takes A and B of its precision's element type, contiguous row-major as the variant stores them
(A: M x K, or K x M for trans tn/tt; B: K x N, or N x K for nt/tt -- F.linear's weight), C
(M x N, contiguous) of the variant's ``out`` type, where the variant adds a bias a vector of C's
type (M values for bias=row, N for col) right after C, and M, N, K as C ``int``. Every rule below
follows from that signature; the rules of the kernel itself (which M, N, K it takes) stay in the
launcher, which refuses a shape with its own message (gemmgen.measure.launcher.ShapeRefused).
"""

import math
import re
from dataclasses import dataclass

from gemmgen.describe import scaling
from gemmgen.describe.arch import Arch, parse_arch
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Variant
from gemmgen.errors import GemmgenError
from gemmgen.measure.device import GpuUnavailable

INT_MAX = 2**31 - 1  # the launcher takes M, N and K as C int

C_DTYPE = "torch.float32"  # C's dtype in the default variant (out=fp32)


class TensorError(GemmgenError, ValueError):
    """A tensor gemmgen.torch cannot pass to the launcher (wrong rank, dtype, device, layout or
    shape); the message names the tensor, what it is, what is needed and the fix. A ValueError
    too, so that code catching PyTorch-style argument errors catches it."""


class TargetMismatch(GemmgenError):
    """A kernel would be built for an architecture the GPU present cannot run."""


@dataclass(frozen=True)
class Operand:
    """What the checks need of one tensor, as plain values.

    ``dtype`` and ``device`` are PyTorch's names (``str(t.dtype)``: "torch.float16";
    ``str(t.device)``: "cuda:0", "cpu"); ``layout`` likewise ("torch.strided" for dense tensors);
    ``stride`` is in elements (empty for a tensor that has none); ``address`` is ``t.data_ptr()``
    in bytes, or None for a tensor without data (a FakeTensor, as torch.compile traces with:
    the rules about addresses are then not checked); ``itemsize`` the bytes per element; ``needs_grad``: autograd would record the
    product (``t.requires_grad`` with grad mode on)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    device: str
    address: int | None
    itemsize: int
    layout: str = "torch.strided"
    needs_grad: bool = False

    @property
    def span_bytes(self) -> int:
        """Bytes from ``address`` to the end of the last element (0 for an empty tensor)."""
        if any(size == 0 for size in self.shape):
            return 0
        return (1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.stride))) * self.itemsize


def dtype_for(precision: str, operand: str = "a") -> str:
    """The torch dtype name of A (or of B, ``operand`` "b") for a launcher of ``precision``
    ("fp32", "tf32", "fp16", "bf16", "e4m3", "e4m3e5m2", "e5m2e4m3"): "torch.float32",
    "torch.float16", "torch.bfloat16", "torch.float8_e4m3fn" or "torch.float8_e5m2". Raises
    GemmgenError for a precision gemmgen.torch does not know (a library newer than this gemmgen)."""
    if precision not in PRECISIONS:
        raise GemmgenError(f"gemmgen.torch does not know precision {precision!r} (it knows "
                           f"{', '.join(PRECISIONS)}); is the library from a newer gemmgen?")
    p = PRECISIONS[precision]
    return (p.b if operand == "b" else p).torch_dtype


def out_dtype(variant: Variant) -> str:
    """The torch dtype name of C (and of the bias) for a launcher of ``variant``:
    "torch.float32", "torch.float16" or "torch.bfloat16"."""
    return PRECISIONS[variant.out].torch_dtype


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a contiguous row-major tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def is_row_major(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether elements lie where contiguous row-major ones do. A dimension of size 1 is never
    stepped over, so its stride is free (as in torch's is_contiguous); an empty tensor is
    contiguous."""
    if any(size == 0 for size in shape):
        return True
    return all(size == 1 or got == want for size, got, want in zip(shape, stride, row_major_strides(shape)))


def _check_dense_cuda(name: str, t: Operand) -> None:
    if t.layout != "torch.strided":
        raise TensorError(f"{name} is a {t.layout} tensor; gemmgen kernels take dense (torch.strided) tensors: "
                          f"pass {name}.to_dense()")
    if not t.device.startswith("cuda"):
        raise TensorError(f"{name} is on {t.device}; gemmgen kernels take CUDA tensors: move it with "
                          f"{name}.cuda() (or .to('cuda:N'))")
    if t.needs_grad:
        raise TensorError(f"{name} requires grad, and gemmgen kernels have no backward: call under "
                          f"torch.no_grad() or torch.inference_mode(), or pass {name}.detach()")


def _check_row_major(name: str, t: Operand) -> None:
    if not is_row_major(t.shape, t.stride):
        raise TensorError(f"{name} is not contiguous row-major: shape {tuple(t.shape)} with strides "
                          f"{tuple(t.stride)}, where row-major has {row_major_strides(t.shape)}; pass "
                          f"{name}.contiguous() (gemmgen does not copy it for you)")


def check_input(name: str, t: Operand, precision: str) -> None:
    """Raise TensorError unless ``t`` can be the launcher's A or B (``name``: "a" or "b"): a dense
    2-D CUDA tensor of ``precision``'s dtype (:func:`dtype_for`), contiguous row-major, not
    needing grad."""
    if len(t.shape) != 2:
        raise TensorError(f"{name} must be a 2-D matrix; it has {len(t.shape)} dimension(s) (shape {tuple(t.shape)})")
    _check_operand(name, t, precision, _check_row_major)


def _check_operand(name: str, t: Operand, precision: str, check_layout) -> None:
    """A or B, of one product or a batch, past its rank: the precision's dtype, dense CUDA, no
    grad, laid out as ``check_layout`` wants."""
    want = dtype_for(precision, "b" if name == "b" else "a")
    if t.dtype != want:
        raise TensorError(f"{name} is {t.dtype}, but this kernel's precision is {precision}, which takes {want}: "
                          f"convert it with {name}.to({want})")
    _check_dense_cuda(name, t)
    check_layout(name, t)


def _overlaps(x: Operand, y: Operand) -> bool:
    """Whether x and y share a byte; False where either address is not known."""
    if x.address is None or y.address is None:
        return False
    return x.span_bytes > 0 and y.span_bytes > 0 and x.address < y.address + y.span_bytes \
        and y.address < x.address + x.span_bytes


# what M and N are of the stored A and B, per layout (the shape message of out)
_MN_OF = {"nn": "a's rows x b's columns", "nt": "a's rows x b's rows", "tn": "a's columns x b's columns",
          "tt": "a's columns x b's rows"}


def check_out(out: Operand, m: int, n: int, a: Operand, b: Operand, variant: Variant = Variant()) -> None:
    """Raise TensorError unless ``out`` can be C of M x N for A and B: a dense CUDA tensor of
    C's dtype for ``variant`` (:func:`out_dtype`) of shape (M, N), contiguous row-major, on A's
    device, sharing no byte with A or B."""
    _check_c(out, (m, n), f"{m} x {n} ({_MN_OF[variant.trans]})", a, b, variant, _check_row_major)


def _check_c(out: Operand, shape: tuple[int, ...], what: str, a: Operand, b: Operand, variant: Variant,
             check_layout) -> None:
    """C's rules, of one product or a batch: ``shape`` (``what`` says it in the message), C's
    dtype, dense CUDA on a's device, laid out as ``check_layout`` wants, apart from A and B."""
    if tuple(out.shape) != shape:
        raise TensorError(f"out must be {what}; it has shape {tuple(out.shape)}")
    want = out_dtype(variant)
    if out.dtype != want:
        raise TensorError(f"out is {out.dtype}; this kernel writes C in {want} (out={variant.out}): make it with "
                          f"torch.empty({', '.join(map(str, shape))}, dtype={want}, device=a.device)")
    _check_dense_cuda("out", out)
    if out.device != a.device:
        raise TensorError(f"out is on {out.device} and a on {a.device}; put them on one device")
    check_layout("out", out)
    for name, t in (("a", a), ("b", b)):
        if _overlaps(out, t):
            raise TensorError(f"out overlaps {name} in memory; C is written while A and B are read: "
                              "pass an out of its own")


def check_bias(bias: Operand | None, m: int, n: int, a: Operand, out: Operand | None,
               variant: Variant = Variant()) -> None:
    """Raise TensorError unless ``bias`` is what ``variant`` adds: None where it adds none; else a
    dense 1-D CUDA tensor of C's dtype with M values (bias=row) or N values (bias=col),
    contiguous, on A's device, sharing no byte with out (C is written while the bias is read)."""
    if variant.bias == "none":
        if bias is not None:
            raise TensorError(f"bias was given, but this kernel adds no bias (variant {variant.text}): pass no bias, "
                              "or emit a kernel that adds one (gemmgen emit ... --bias col: N values, one per column "
                              "of C; --bias row: M values)")
        return
    count, what = (n, "N values, one per column of C") if variant.bias == "col" else (m, "M values, one per row of C")
    want = out_dtype(variant)
    if bias is None:
        raise TensorError(f"this kernel adds a bias (variant {variant.text}): pass bias=, a tensor of shape ({count},) "
                          f"({what}) of {want}")
    if tuple(bias.shape) != (count,):
        raise TensorError(f"bias must have shape ({count},) ({what}, bias={variant.bias}); it has shape "
                          f"{tuple(bias.shape)}")
    if bias.dtype != want:
        raise TensorError(f"bias is {bias.dtype}; this kernel reads the bias in C's type, {want}: convert it with "
                          f"bias.to({want})")
    _check_dense_cuda("bias", bias)
    if bias.device != a.device:
        raise TensorError(f"bias is on {bias.device} and a on {a.device}; put them on one device")
    _check_row_major("bias", bias)
    if out is not None and _overlaps(out, bias):
        raise TensorError("out overlaps bias in memory; C is written while the bias is read: pass an out of its own")


def _block_layout(name: str, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(shape, strides) of torch._scaled_mm's block scales, gemmgen's layout (gemmgen.describe.scaling):
    scale_a (M, KB) with strides (1, M); scale_b (KBP, ceil(N/128)) with strides (1, KBP)."""
    kb, kbp = scaling.blocks(k), scaling.k_blocks_padded(k)
    return ((m, kb), (1, m)) if name == "scale_a" else ((kbp, scaling.blocks(n)), (1, kbp))


def _check_block_scale(name: str, t: Operand, m: int, n: int, k: int) -> None:
    shape, stride = _block_layout(name, m, n, k)
    what = ("scale_a holds a scale per row of A and 128 of K" if name == "scale_a"
            else "scale_b holds a scale per 128 x 128 block of B, K's blocks padded to a multiple of 4")
    if tuple(t.shape) != shape:
        raise TensorError(f"{name} must have shape {shape} (scale=block: {what}, as torch._scaled_mm takes it); "
                          f"it has shape {tuple(t.shape)}")
    if any(size > 1 and have != want for size, have, want in zip(t.shape, t.stride, stride)):
        raise TensorError(f"{name} must have strides {stride} (column-major, as torch._scaled_mm takes block "
                          f"scales); it has {tuple(t.stride)}: pass {name}.t().contiguous().t()")


def check_scales(scale_a: Operand | None, scale_b: Operand | None, m: int, n: int, a: Operand,
                 out: Operand | None, variant: Variant = Variant(), k: int = 0) -> None:
    """Raise TensorError unless scale_a and scale_b are what ``variant`` reads: None for a kernel
    that is not scaled; else float32 tensors, dense, on A's device, apart from out: one value
    each for scale=tensor (shape (), (1,) or (1, 1)), M values for scale_a and N for scale_b for
    scale=row (a vector, or torch._scaled_mm's (M, 1) and (1, N)), both contiguous; for
    scale=block (K needed) torch._scaled_mm's 1x128 and 128x128 layouts (_block_layout)."""
    if not variant.scaled:
        if scale_a is not None or scale_b is not None:
            raise TensorError(f"scale_a or scale_b was given, but this kernel is not scaled (variant {variant.text}): "
                              "pass no scales, or emit an FP8 kernel that reads them (gemmgen emit ... --scale row: "
                              "M and N values; --scale tensor: one each; --scale block: 1x128 and 128x128 blocks)")
        return
    counts = dict(zip(("scale_a", "scale_b"), variant.scale_lengths(m, n, k)))
    block = variant.scale == "block"
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        count = counts[name]
        per = "row" if name == "scale_a" else "column"
        what = ("one value" if variant.scale == "tensor" else f"{count} values, one per {per} of C" if not block
                else f"shape {_block_layout(name, m, n, k)[0]}")
        if t is None:
            raise TensorError(f"this kernel reads FP8 scales (variant {variant.text}): pass {name}=, a float32 "
                              f"tensor of {what}")
        if block:
            _check_block_scale(name, t, m, n, k)
        elif len(t.shape) > 2 or math.prod(t.shape) != count or sum(size != 1 for size in t.shape) > 1:
            raise TensorError(f"{name} must hold {what} (scale={variant.scale}) along one dimension; it has shape "
                              f"{tuple(t.shape)}")
        if t.dtype != "torch.float32":
            raise TensorError(f"{name} is {t.dtype}; scales are float32: convert it with {name}.float()")
        _check_dense_cuda(name, t)
        if t.device != a.device:
            raise TensorError(f"{name} is on {t.device} and a on {a.device}; put them on one device")
        if not block:
            _check_row_major(name, t)
        if out is not None and _overlaps(out, t):
            raise TensorError(f"out overlaps {name} in memory; C is written while the scales are read: pass an out "
                              "of its own")


def _dims(name: str, t: Operand, transposed: bool, trans: str) -> str:
    rows, cols = t.shape
    if not transposed:
        return f"{name} is {rows} x {cols}"
    stored = "K x M" if name == "a" else "N x K"
    linear = "" if name == "a" else ", as F.linear's weight"
    return f"{name} is {rows} x {cols} ({stored}: trans={trans} takes {name.upper()} stored transposed{linear})"


def check_call(precision: str, a: Operand, b: Operand, out: Operand | None, beta: float,
               variant: Variant = Variant(), bias: Operand | None = None, scale_a: Operand | None = None,
               scale_b: Operand | None = None) -> tuple[int, int, int]:
    """Check the operands of C = act(alpha * A @ B + beta * C + bias) for a launcher of
    ``precision`` and ``variant``; return (M, N, K). A and B are as the variant stores them (A:
    M x K, or K x M for trans tn/tt; B: K x N, or N x K for nt/tt). ``out`` None: gemmgen.torch
    allocates C, which needs ``beta == 0``.

    Raises TensorError (one message, naming the tensor and the fix) for the first rule broken:
    A and B as :func:`check_input` says, on one device, their K sides equal, each of M, N, K at
    most 2^31 - 1; then C as :func:`check_out` says, then the bias as :func:`check_bias` says,
    then FP8's scales as :func:`check_scales` says.
    Empty dimensions pass (M, N or K may be 0); whether the kernel takes a shape is the
    launcher's to say.
    """
    check_input("a", a, precision)
    check_input("b", b, precision)
    if a.device != b.device:
        raise TensorError(f"a is on {a.device} and b on {b.device}; put both on one device")
    (m, k) = reversed(a.shape) if variant.a_transposed else a.shape
    (k_b, n) = reversed(b.shape) if variant.b_transposed else b.shape
    if k != k_b:
        raise TensorError(f"{_dims('a', a, variant.a_transposed, variant.trans)} and "
                          f"{_dims('b', b, variant.b_transposed, variant.trans)}: "
                          f"a's {'rows' if variant.a_transposed else 'columns'} (K={k}) must equal "
                          f"b's {'columns' if variant.b_transposed else 'rows'} ({k_b})")
    for dim, size in (("M", m), ("N", n), ("K", k)):
        if size > INT_MAX:
            raise TensorError(f"{dim}={size} is larger than the launcher's int takes ({INT_MAX}); split the product")
    if out is None:
        if beta != 0:
            raise TensorError(f"beta={beta!r} adds beta * out to the product, and no out was given: pass out "
                              f"({variant.out}, M x N), or beta=0")
    else:
        check_out(out, m, n, a, b, variant)
    check_bias(bias, m, n, a, out, variant)
    check_scales(scale_a, scale_b, m, n, a, out, variant, k)
    return m, n, k


# ---- a batched launcher (batch=strided): 3-D tensors, one matrix per index of the first dimension ----

_STORED = {"a": ("M, K", "K, M"), "b": ("K, N", "N, K")}  # a batch's shape as stored, by the operand's layout


def _check_batch_input(name: str, t: Operand, precision: str, transposed: bool) -> None:
    """Raise TensorError unless ``t`` can be a batched launcher's A or B: a dense 3-D CUDA
    tensor of the precision's dtype whose matrices (the last two dimensions) are contiguous
    row-major; the batch stride is free (0 from expand: one matrix for every product)."""
    stored = _STORED[name][transposed]
    if len(t.shape) != 3:
        raise TensorError(f"{name} must be a 3-D batch (batch, {stored}) for this batched kernel; it has "
                          f"{len(t.shape)} dimension(s) (shape {tuple(t.shape)}): for one matrix pass "
                          f"{name}.unsqueeze(0), or {name}.expand(batch, -1, -1) to share it")
    _check_operand(name, t, precision, _check_matrices)


def _check_matrices(name: str, t: Operand) -> None:
    """Each matrix of the batch ``t`` (its last two dimensions) contiguous row-major."""
    if not is_row_major(t.shape[1:], t.stride[1:]):
        raise TensorError(f"{name}'s matrices are not contiguous row-major: shape {tuple(t.shape)} with strides "
                          f"{tuple(t.stride)}, where each matrix needs strides {row_major_strides(t.shape[1:])} "
                          f"after the batch's (any); pass {name}.contiguous()")


def _batch_stride(t: Operand) -> int:
    """The elements between consecutive matrices (or vectors) of ``t``: 0 where it has one."""
    return t.stride[0] if t.shape[0] > 1 else 0


def check_batched_call(precision: str, a: Operand, b: Operand, out: Operand | None, beta: float, variant: Variant,
                       bias: Operand | None = None) -> tuple[int, int, int, int, tuple[int, int, int, int]]:
    """Check the operands of a batched launcher (``variant.batch == "strided"``) of ``precision``:
    C[i] = act(alpha * A[i] @ B[i] + beta * C[i] + bias[i]) for every i < batch; return
    (batch, M, N, K, (stride_a, stride_b, stride_c, stride_bias)), strides in elements as the
    launcher takes them.

    a: (batch, M, K), or (batch, K, M) for trans tn/tt; b: (batch, K, N), or (batch, N, K) for
    nt/tt; each matrix contiguous row-major, the batch stride any (0: one matrix for all, as
    expand gives). out: None (gemmgen.torch allocates (batch, M, N), which needs beta == 0), or
    (batch, M, N) of C's dtype, each matrix contiguous row-major and apart from the next (batch
    stride >= M * N), on a's device, sharing no byte with a, b or the bias. bias (a variant that
    adds one): (batch, N) or (batch, M) for bias=row, each vector contiguous, or one vector (N,)
    or (M,) for every product (stride 0). Batch, M, N and K are each at most 2^31 - 1.

    Raises TensorError for the first rule broken (one message, naming the tensor and the fix)."""
    _check_batch_input("a", a, precision, variant.a_transposed)
    _check_batch_input("b", b, precision, variant.b_transposed)
    if a.device != b.device:
        raise TensorError(f"a is on {a.device} and b on {b.device}; put both on one device")
    if a.shape[0] != b.shape[0]:
        raise TensorError(f"a holds {a.shape[0]} matrices and b {b.shape[0]}; give both the same batch (expand the "
                          "one shared: b.expand(batch, -1, -1))")
    batch = a.shape[0]
    (m, k) = reversed(a.shape[1:]) if variant.a_transposed else a.shape[1:]
    (k_b, n) = reversed(b.shape[1:]) if variant.b_transposed else b.shape[1:]
    if k != k_b:
        raise TensorError(f"a is a batch of ({', '.join(map(str, a.shape[1:]))}) ({_STORED['a'][variant.a_transposed]}) "
                          f"and b of ({', '.join(map(str, b.shape[1:]))}) ({_STORED['b'][variant.b_transposed]}) for "
                          f"trans={variant.trans}: their K sides ({k} and {k_b}) must be equal")
    for dim, size in (("batch", batch), ("M", m), ("N", n), ("K", k)):
        if size > INT_MAX:
            raise TensorError(f"{dim}={size} is larger than the launcher's int takes ({INT_MAX}); split the product")
    stride_c = m * n
    if out is None:
        if beta != 0:
            raise TensorError(f"beta={beta!r} adds beta * out to the product, and no out was given: pass out "
                              f"({variant.out}, batch x M x N), or beta=0")
    else:
        _check_c(out, (batch, m, n), f"({batch}, {m}, {n}) (batch, M, N)", a, b, variant, _check_matrices)
        stride_c = _batch_stride(out) if batch > 1 else m * n
        if batch > 1 and stride_c < m * n:
            raise TensorError(f"out's matrices overlap: its batch stride is {stride_c} elements, and each matrix of C "
                              f"holds M * N = {m * n}; pass an out whose matrices lie apart (torch.empty(batch, M, N))")
    return batch, m, n, k, (_batch_stride(a), _batch_stride(b), stride_c,
                            _check_batch_bias(bias, batch, m, n, a, out, variant))


def _check_batch_bias(bias: Operand | None, batch: int, m: int, n: int, a: Operand, out: Operand | None,
                      variant: Variant) -> int:
    """check_bias for a batch: one vector for every product (its rules, stride 0) or a
    (batch, count) tensor of contiguous vectors; returns the bias's batch stride."""
    if bias is None or len(bias.shape) != 2:
        check_bias(bias, m, n, a, out, variant)
        return 0
    if variant.bias == "none":
        check_bias(bias, m, n, a, out, variant)  # refuses it
    count = n if variant.bias == "col" else m
    if tuple(bias.shape) != (batch, count):
        raise TensorError(f"bias must have shape ({batch}, {count}) (a vector per product, bias={variant.bias}) or "
                          f"({count},) (one for every product); it has shape {tuple(bias.shape)}")
    check_bias(Operand((count,), bias.stride[1:], bias.dtype, bias.device, bias.address, bias.itemsize, bias.layout,
                       bias.needs_grad), m, n, a, None, variant)  # each vector as one product's bias
    if out is not None and _overlaps(out, bias):
        raise TensorError("out overlaps bias in memory; C is written while the bias is read: pass an out of its own")
    return _batch_stride(bias)


_TARGET_LINE = re.compile(r"^// target\s*:\s*(\S+)", re.MULTILINE)


def source_target(source: str) -> str | None:
    """The target an emitted file's header names (``// target     : sm_90a``), or None where it
    names none (a file gemmgen did not write). A dispatcher holds one such header per kernel:
    where one names an architecture-specific target (a hopper kernel's sm_90a), that one, whose
    code the other kernels build for too."""
    targets = _TARGET_LINE.findall(source)
    return next((t for t in targets if t.endswith("a")), targets[0] if targets else None)


def runs_on(arch: Arch, cc: int) -> bool:
    """Whether code built for ``arch`` runs on a GPU of compute capability ``cc``. build_library
    embeds the target's machine code and, for a plain target, its PTX, which the driver compiles
    for newer GPUs; an architecture-specific target (sm_90a) runs on its own cc alone."""
    return cc == arch.cc or (not arch.suffix and cc > arch.cc)


def build_target(file_target: str | None, gpu: str | None, device_cc: int | None) -> Arch:
    """The architecture to build a .cu file for: ``gpu`` where given, else the file's own target
    (:func:`source_target`: what it was emitted and checked for, sm_90a for hopper kernels), else
    the GPU present (compute capability ``device_cc``; None: no GPU).

    Raises InvalidParameter for an unknown architecture, TargetMismatch where the GPU present
    cannot run the result (:func:`runs_on`), and GpuUnavailable where neither a target nor a GPU
    is known."""
    if gpu is not None:
        arch = parse_arch(gpu)
    elif file_target is not None:
        arch = parse_arch(file_target)
    elif device_cc is not None:
        arch = parse_arch(device_cc)
    else:
        raise GpuUnavailable("no CUDA device is visible to PyTorch and the file names no target: pass gpu= "
                             "(e.g. gpu='sm_90') to build it anyway")
    if device_cc is not None and not runs_on(arch, device_cc):
        why = (f"{arch.name} code runs on sm_{arch.cc} alone" if arch.suffix
               else "code for a newer GPU does not run on an older one")
        raise TargetMismatch(f"a kernel built for {arch.name} cannot run on this GPU (sm_{device_cc}): {why}; "
                             f"emit it for this GPU (gemmgen emit ... --gpu sm_{device_cc})")
    return arch
