"""What :mod:`gemmgen.torch` requires of its tensors and of the files it loads, checked on plain
values (shapes, strides, dtype and device names, addresses, compute capabilities), so that the
rules and their messages hold without PyTorch or a GPU, and tests can reach every one of them.

gemmgen.torch reads the values off a tensor into an :class:`Operand` and calls
:func:`check_call`; nothing here imports torch.

An emitted launcher (``gemmgen_gemm`` in templates/base.cu.j2) takes row-major A (M x K) and
B (K x N) of its precision's element type and fp32 C (M x N), all contiguous (leading dimensions
K, N and N), and M, N, K as C ``int``. Every rule below follows from that signature; the rules
of the kernel itself (which M, N, K it takes) stay in the launcher, which refuses a shape with
its own message (gemmgen.runtime.ShapeRefused).
"""

import re
from dataclasses import dataclass

from gemmgen.arch import Arch, parse_arch
from gemmgen.errors import GemmgenError
from gemmgen.dtypes import PRECISIONS
from gemmgen.runtime import GpuUnavailable

INT_MAX = 2**31 - 1  # the launcher takes M, N and K as C int

C_DTYPE = "torch.float32"  # C is fp32 in every precision


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
    in bytes and ``itemsize`` the bytes per element; ``needs_grad``: autograd would record the
    product (``t.requires_grad`` with grad mode on)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    device: str
    address: int
    itemsize: int
    layout: str = "torch.strided"
    needs_grad: bool = False

    @property
    def span_bytes(self) -> int:
        """Bytes from ``address`` to the end of the last element (0 for an empty tensor)."""
        if any(size == 0 for size in self.shape):
            return 0
        return (1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.stride))) * self.itemsize


def dtype_for(precision: str) -> str:
    """The torch dtype name of A and B for a launcher of ``precision`` ("fp32", "tf32", "fp16",
    "bf16"): "torch.float32", "torch.float16" or "torch.bfloat16". Raises GemmgenError for a
    precision gemmgen.torch does not know (a library newer than this gemmgen)."""
    if precision not in PRECISIONS:
        raise GemmgenError(f"gemmgen.torch does not know precision {precision!r} (it knows "
                           f"{', '.join(PRECISIONS)}); is the library from a newer gemmgen?")
    return PRECISIONS[precision].torch_dtype


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
    want = dtype_for(precision)
    if t.dtype != want:
        raise TensorError(f"{name} is {t.dtype}, but this kernel's precision is {precision}, which takes {want}: "
                          f"convert it with {name}.to({want})")
    _check_dense_cuda(name, t)
    _check_row_major(name, t)


def _overlaps(x: Operand, y: Operand) -> bool:
    return x.span_bytes > 0 and y.span_bytes > 0 and x.address < y.address + y.span_bytes \
        and y.address < x.address + x.span_bytes


def check_out(out: Operand, m: int, n: int, a: Operand, b: Operand) -> None:
    """Raise TensorError unless ``out`` can be C for A (M x K) and B (K x N): a dense fp32 CUDA
    tensor of shape (M, N), contiguous row-major, on A's device, sharing no byte with A or B."""
    if tuple(out.shape) != (m, n):
        raise TensorError(f"out must be {m} x {n} (a's rows x b's columns); it has shape {tuple(out.shape)}")
    if out.dtype != C_DTYPE:
        raise TensorError(f"out is {out.dtype}; gemmgen kernels write C in {C_DTYPE}: make it with "
                          f"torch.empty({m}, {n}, dtype={C_DTYPE}, device=a.device)")
    _check_dense_cuda("out", out)
    if out.device != a.device:
        raise TensorError(f"out is on {out.device} and a on {a.device}; put them on one device")
    _check_row_major("out", out)
    for name, t in (("a", a), ("b", b)):
        if _overlaps(out, t):
            raise TensorError(f"out overlaps {name} in memory; C is written while A and B are read: "
                              "pass an out of its own")


def check_call(precision: str, a: Operand, b: Operand, out: Operand | None, beta: float) -> tuple[int, int, int]:
    """Check the operands of C = alpha * A @ B + beta * C for a launcher of ``precision``;
    return (M, N, K). ``out`` None: gemmgen.torch allocates C, which needs ``beta == 0``.

    Raises TensorError (one message, naming the tensor and the fix) for the first rule broken:
    A and B as :func:`check_input` says, on one device, A's columns equal to B's rows, each of
    M, N, K at most 2^31 - 1; then C as :func:`check_out` says. Empty dimensions pass (M, N or
    K may be 0); whether the kernel takes a shape is the launcher's to say.
    """
    check_input("a", a, precision)
    check_input("b", b, precision)
    if a.device != b.device:
        raise TensorError(f"a is on {a.device} and b on {b.device}; put both on one device")
    (m, k), (k_b, n) = a.shape, b.shape
    if k != k_b:
        raise TensorError(f"a is {m} x {k} and b is {k_b} x {n}: a's columns (K={k}) must equal b's rows ({k_b})")
    for dim, size in (("M", m), ("N", n), ("K", k)):
        if size > INT_MAX:
            raise TensorError(f"{dim}={size} is larger than the launcher's int takes ({INT_MAX}); split the product")
    if out is None:
        if beta != 0:
            raise TensorError(f"beta={beta!r} adds beta * out to the product, and no out was given: pass out "
                              "(fp32, M x N), or beta=0")
    else:
        check_out(out, m, n, a, b)
    return m, n, k


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
