"""gemmgen kernels called on PyTorch tensors (``pip install 'gemmgen[torch]'``)::

    $ gemmgen emit hopper_fp16 > gemm.cu
    >>> import torch, gemmgen.torch
    >>> gemm = gemmgen.torch.load("gemm.cu")   # nvcc builds it once (cached), then it is loaded
    >>> a = torch.rand(4096, 1024, device="cuda", dtype=torch.float16)
    >>> b = torch.rand(1024, 2048, device="cuda", dtype=torch.float16)
    >>> c = gemm(a, b)                          # fp32 a @ b, 4096 x 2048, on the current stream

A kernel of another problem variant (gemmgen.describe.problem.Variant: ``gemmgen emit ... --trans nt --out
bf16 --bias col --act gelu``) takes its operands as it stores them and gives C in its type: for
that one, ``gemm(x, w, bias=b)`` is ``F.gelu(F.linear(x, w, b), approximate="tanh")`` in bf16,
with w of shape (N, K) as nn.Linear keeps it.

:func:`load` takes an emitted file or a library built from one (a dispatcher too: it exports the
same functions) and returns a :class:`GemmOp` (a :class:`BatchedGemmOp`, taking 3-D tensors, for a
batched launcher: ``gemmgen emit ... --batch-mode strided``), which calls the launcher through
:class:`gemmgen.measure.launcher.Launcher` on the current torch stream of A's device. The rules it checks
tensors by, and their messages, are in :mod:`gemmgen.torch.checks` (importable without torch).

Every call is a registered torch operator, ``torch.ops.gemmgen.gemm`` (C new) or
``torch.ops.gemmgen.gemm_out`` (into a given C), keyed by the loaded library (``GemmOp.key``), with
a fake implementation that gives C's shape, dtype and strides: ``torch.compile(fullgraph=True)``
traces a GemmOp call, with static or dynamic shapes, as one node. Eager calls skip torch's
dispatcher and call the launcher straight away (host time), unless a torch dispatch mode is active
(FakeTensorMode, make_fx), which then sees the operator. Every launch takes its workspace (split-K
partial sums, stream-K flags, packed operands) from torch's caching allocator, on the launch's
stream, and zeroes its flags there: so a call can be captured into a CUDA graph on any stream,
first-seen shapes included (inside ``torch.cuda.graph`` the workspace comes from the graph's pool).

:class:`gemmgen.torch.Linear` is nn.Linear through such a launcher (trans nt), and
:func:`gemmgen.torch.patch` swaps a model's nn.Linear modules for it where a launcher serves them
(gemmgen/torch/modules.py).

A GemmOp is no autograd function: it refuses tensors that need grad, and the operators have no
backward.
"""

import re
import threading
from pathlib import Path
from typing import Optional

import torch

from gemmgen.build.nvcc import DEFAULT_FLAGS, build_library
from gemmgen.describe.problem import Variant
from gemmgen.errors import GemmgenError, InvalidParameter
from gemmgen.measure.launcher import Launcher
from gemmgen.torch.checks import (Operand, TensorError, build_target, check_batched_call, check_call, check_scales,
                                  dtype_for, out_dtype, source_target)

__all__ = ["BatchedGemmOp", "BuildFailed", "GemmOp", "NotCapturable", "TensorError", "load"]

DEFAULT_LAUNCHER = "gemmgen_gemm"
_PLANS_KEPT = 256  # launches whose host work a GemmOp keeps, for calls that repeat them
_INT_MAX = 2**31 - 1
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)  # the tensors GemmOp._plain takes on its quick path

# GemmOp.key -> the GemmOp made for it last: what the registered operators call (the operator
# names its library by key, a string, so that torch.compile keeps it as a constant of the graph).
_LOADED: dict[str, "GemmOp"] = {}

# A call's host time is what a small product costs in eager mode, where the GPU waits for the
# host: torch.cuda.current_stream() builds a Stream object per call (microseconds), the raw
# getters that torch's own generated code (Inductor) and Triton use do not. Public API where a
# torch lacks them.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_raw_device = getattr(torch._C, "_cuda_getDevice", None)
# How many torch dispatch modes are active (FakeTensorMode, make_fx's proxy mode, ...); an eager
# call only skips torch's dispatcher where there are none.
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
# Whether torch's current stream is capturing a CUDA graph, without building a Stream object.
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


def _current_stream(index: int) -> int:
    """The cudaStream_t of torch's current stream on device ``index``."""
    return _raw_stream(index) if _raw_stream is not None else torch.cuda.current_stream(index).cuda_stream


def _current_device() -> int:
    return _raw_device() if _raw_device is not None else torch.cuda.current_device()


class BuildFailed(GemmgenError):
    """nvcc could not build a .cu file given to :func:`load` (the message holds its log)."""


class NotCapturable(GemmgenError, RuntimeError):
    """A call that cannot be captured into a CUDA graph was made while torch's current stream is
    capturing; it is refused before it touches the stream, so the capture stays valid."""


def _operand(name: str, t, fake: bool = False) -> Operand:
    """The check's view of ``t``; ``fake``: a tensor without data (FakeTensor), whose address is
    not known and whose grad is autograd's business (the operator has no backward)."""
    if not isinstance(t, torch.Tensor):
        raise TensorError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    strided = t.layout == torch.strided  # only dense tensors have strides and one data pointer
    address = None if fake else t.data_ptr() if strided else 0
    return Operand(shape=tuple(t.shape), stride=tuple(t.stride()) if strided else (), dtype=str(t.dtype),
                   device=str(t.device), address=address, itemsize=t.element_size(), layout=str(t.layout),
                   needs_grad=not fake and t.requires_grad and torch.is_grad_enabled())


def _operands(a, b, out, fake: bool = False) -> tuple:
    """(a, b, out or None) as Operands."""
    return _operand("a", a, fake), _operand("b", b, fake), None if out is None else _operand("out", out, fake)


def _optional(fake: bool = False, **tensors) -> tuple:
    """The optional tensors (the bias, FP8's scales) as Operands, None where not given, in order."""
    return tuple(None if t is None else _operand(name, t, fake) for name, t in tensors.items())


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


class GemmOp:
    """One loaded launcher: ``op(a, b)`` is ``a @ b`` through the gemmgen kernel, in the kernel's
    problem variant (``variant``, gemmgen.describe.problem.Variant): A and B as it stores them, C in its
    type, the bias and activation it fuses.

    ``precision`` is the launcher's ("fp32", "tf32", "fp16" or "bf16") and ``dtype`` the torch
    dtype it takes for A and B (tf32 kernels take torch.float32); ``out_dtype`` that of C and the
    bias (the variant's ``out``); ``launcher`` is the gemmgen.measure.launcher.Launcher underneath, ``path``
    the library. ``key`` ("<library path>:<launcher name>") names the library to the registered
    operators (torch.ops.gemmgen.gemm and gemm_out take it first); a GemmOp made for it registers
    itself under it, in this process.
    """

    _batched_abi = False  # the launcher ABI this class calls: one product per launch

    def __init__(self, launcher: Launcher, path: str | Path):
        self.launcher = launcher
        self.path = Path(path)
        self.precision = launcher.precision
        self.variant: Variant = launcher.variant
        if self.variant.batched != self._batched_abi:  # load() picks the class by the launcher's variant
            raise TensorError(f"{self.path}'s launcher (variant {self.variant.text}) is "
                              f"{'' if self.variant.batched else 'not '}batched: wrap it with "
                              f"{'BatchedGemmOp' if self.variant.batched else 'GemmOp'} (gemmgen.torch.load picks)")
        self.dtype: torch.dtype = _dtype(dtype_for(self.precision))  # A's
        self.dtype_b: torch.dtype = _dtype(dtype_for(self.precision, "b"))  # B's: A's, but for FP8 of two formats
        self.out_dtype: torch.dtype = _dtype(out_dtype(self.variant))
        # this thread's .plans (launch arguments -> Plan, oldest first) and .buffers (_workspace)
        self._local = threading.local()
        self.key = f"{self.path}:{launcher.name}"
        _LOADED[self.key] = self

    def __deepcopy__(self, memo) -> "GemmOp":
        """The same op: it is a handle on a loaded library (so a deep copy of a patched model works)."""
        return self

    def __reduce__(self):
        """Pickled as its library's path and launcher name, loaded again when unpickled."""
        return _reload, (str(self.path), self.launcher.name)

    def __repr__(self) -> str:
        variant = "" if self.variant == Variant() else f", variant={self.variant.text!r}"
        return f"GemmOp({str(self.path)!r}, precision={self.precision!r}{variant})"

    def __call__(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
                 alpha: float = 1, beta: float = 0, bias: torch.Tensor | None = None,
                 scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None) -> torch.Tensor:
        """``out = act(alpha * op(a) @ op(b) + beta * out + bias)``; returns ``out``.

        a and b: tensors of ``self.dtype`` (b: ``self.dtype_b``, another FP8 format in a precision
        of two such as e5m2e4m3) on one CUDA device, contiguous row-major (a transposed
        view is refused: pass ``.contiguous()``; nothing is copied), as the variant stores them:
        a is M x K (K x M for trans tn, tt), b is K x N (N x K for nt, tt: F.linear's weight, so
        that a kernel of trans nt computes ``a @ b.T``). out: ``self.out_dtype`` (M x N),
        contiguous, on that device, sharing no memory with a, b or bias; None: a new one (then
        beta must be 0). bias: for a variant that adds one, a 1-D tensor of ``self.out_dtype``
        with N values (bias=col: nn.Linear's bias, one per column of C) or M values (bias=row);
        None otherwise. The activation (relu, gelu with the tanh approximation, silu) is the
        variant's. With beta == 0 out is not read (NaN in it does not matter). alpha and beta
        reach the kernel as fp32; C is rounded to its type once, at the end.

        An FP8 kernel of a scaled variant (``gemmgen emit ... --precision e4m3 --scale row``)
        takes a and b of torch.float8_e4m3fn (or of torch.float8_e5m2 where the precision says:
        e5m2e4m3's a, e4m3e5m2's b) and float32 device tensors scale_a and scale_b, as
        torch._scaled_mm does: one value each (scale=tensor), or M and N (scale=row: (M, 1) and
        (1, N), or vectors); the product is ``scale_a[i] * scale_b[j] * (a @ b.T)[i][j]``. With
        scale=block, scale_a (M, ceil(K/128)) scales row i of a and 128 of K, and scale_b
        (KBP, ceil(N/128)) each 128 x 128 block of b, column-major, as torch._scaled_mm's 1x128
        and 128x128 block scales (gemmgen.describe.scaling). The kernel reads them at every launch
        (a CUDA graph replays new values).

        The work is queued on ``torch.cuda.current_stream(a.device)`` and the call returns
        without waiting, as torch's own operations do. Empty products follow torch.addmm: M or
        N == 0 returns out as it is; K == 0 makes out ``act(beta * out + bias)`` (``beta * out``,
        zeros where beta == 0, for the variants without a bias or activation), computed by torch.

        The workspace a launch needs comes from torch's caching allocator on that stream, and
        nothing in a call waits for the device: a call can be captured into a CUDA graph
        (``torch.cuda.graph``) on any stream, any shape, first seen or not.

        Under torch.compile (and under a torch dispatch mode) the call is the registered operator
        torch.ops.gemmgen.gemm (out None) or gemm_out (out given, which it writes), which the
        compiler traces with its fake implementation: the same rules but those about addresses,
        checked on the traced tensors.

        Raises TensorError (gemmgen.torch.checks: the first rule broken, with the fix) before
        any work is queued, gemmgen.measure.launcher.ShapeRefused where the kernel cannot take M, N, K
        (the launcher's reason), NotCapturable where the library (one of an earlier gemmgen,
        without the caller's workspace) cannot launch during a capture, and
        gemmgen.measure.device.LaunchFailed for any other CUDA error.
        """
        # alpha and beta default to ints: torch.compile reads float defaults (__kwdefaults__) as
        # dynamic inputs of the graph, 0-dim tensors, then compiles once more without them.
        if torch.compiler.is_compiling() or _dispatch_modes():
            return self._through_op(a, b, out, alpha, beta, bias, scale_a, scale_b)
        return self._eager(a, b, out, alpha, beta, bias, keep=True, scale_a=scale_a, scale_b=scale_b)

    def _through_op(self, a, b, out, alpha, beta, bias, scale_a=None, scale_b=None) -> torch.Tensor:
        """The call as the registered operator (which torch.compile and dispatch modes see)."""
        if out is None:
            return torch.ops.gemmgen.gemm(self.key, a, b, bias, float(alpha), float(beta), scale_a, scale_b)
        torch.ops.gemmgen.gemm_out(self.key, a, b, out, bias, float(alpha), float(beta), scale_a, scale_b)
        return out

    def _eager(self, a, b, out, alpha, beta, bias, keep: bool = False, scale_a=None, scale_b=None) -> torch.Tensor:
        """The call on tensors with data: checks, then the launch (or torch's work where empty).
        ``keep``: the launch may use this thread's kept workspace buffer (_workspace); the
        operators pass False, since torch.compile's CUDA graphs (mode="reduce-overhead") run
        them where every allocation that outlives a call must be an output."""
        plain = None if self.variant.scaled else self._plain(a, b, out, beta, bias)
        if plain is None:
            m, n, k = check_call(self.precision, *_operands(a, b, out), beta, self.variant,
                                 *_optional(bias=bias, scale_a=scale_a, scale_b=scale_b))
            addresses = (a.data_ptr(), b.data_ptr(), None if out is None else out.data_ptr(),
                         None if bias is None else bias.data_ptr())
        else:
            m, n, k, addresses = plain
        if out is None:
            out = torch.empty((m, n), dtype=self.out_dtype, device=a.device)
        if m == 0 or n == 0:
            return out
        if k == 0:
            return self._no_product(out, beta, bias)
        pa, pb, pc, pbias = addresses
        scales = (scale_a.data_ptr(), scale_b.data_ptr()) if self.variant.scaled else None
        self._queue(a.device, (m, n, k, float(alpha), pa, pb, float(beta), out.data_ptr() if pc is None else pc,
                               pbias, scales), keep)
        return out

    def _fake(self, a, b, out, beta, bias, scale_a=None, scale_b=None) -> torch.Tensor | None:
        """The operators' fake implementation: the rules of the call (but those about addresses)
        on tensors without data, and C as the call makes it: a new contiguous (M, N) tensor of
        ``out_dtype`` on a's device where ``out`` is None; None where it is given (written in
        place)."""
        m, n, _ = check_call(self.precision, *_operands(a, b, out, fake=True), beta, self.variant,
                             *_optional(True, bias=bias, scale_a=scale_a, scale_b=scale_b))
        return a.new_empty((m, n), dtype=self.out_dtype) if out is None else None

    def _no_product(self, out: torch.Tensor, beta: float, bias: torch.Tensor | None) -> torch.Tensor:
        """K == 0: C = act(beta * C + bias), in fp32, rounded once into out (an FP8 kernel's
        scales multiply the empty product, zero, so they do not count)."""
        if not self.variant.has_epilogue:
            return out.zero_() if beta == 0 else out.mul_(beta)
        x = out.float() * beta if beta != 0 else torch.zeros(out.shape, dtype=torch.float32, device=out.device)
        if bias is not None:  # a vector (or, batched, a vector per matrix) along C's rows or columns
            x += bias.float().unsqueeze(-2) if self.variant.bias == "col" else bias.float().unsqueeze(-1)
        act = {"none": lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu,
               "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[self.variant.act]
        return out.copy_(act(x))

    def _plain(self, a, b, out, beta, bias) -> tuple | None:
        """(M, N, K, (the addresses of a, b, out and bias, None for those not given)) for the
        everyday call -- dense, contiguous CUDA tensors of this op's dtypes on one device, fitting
        shapes, an out apart from them, the bias the variant takes, no grad -- judged with torch's
        own cheap predicates (a Parameter counts as a tensor: nn.Linear's weight and bias are);
        None for anything else. It accepts a subset of what check_call accepts
        (test_gpu_torch.py checks that on many tensors); anything else goes through check_call,
        which says what is wrong. Each tensor's address is read once: this is the host time of
        every eager call."""
        v, strided = self.variant, torch.strided
        if not (type(a) in _PLAIN_TYPES and type(b) in _PLAIN_TYPES and a.dtype is self.dtype
                and b.dtype is self.dtype_b
                and a.layout is strided and b.layout is strided and a.dim() == 2 and b.dim() == 2 and a.is_cuda
                and a.get_device() == b.get_device() and a.is_contiguous() and b.is_contiguous()
                and not ((a.requires_grad or b.requires_grad) and torch.is_grad_enabled())):
            return None
        if v.a_transposed:
            k, m = a.shape
        else:
            m, k = a.shape
        if v.b_transposed:
            n, k_b = b.shape
        else:
            k_b, n = b.shape
        if k != k_b or m > _INT_MAX or n > _INT_MAX or k > _INT_MAX:
            return None
        device = a.get_device()
        if v.bias == "none":
            if bias is not None:
                return None
            pbias = None
        elif not (type(bias) in _PLAIN_TYPES and bias.dtype is self.out_dtype and bias.layout is strided
                  and bias.dim() == 1 and bias.shape[0] == (n if v.bias == "col" else m)
                  and bias.get_device() == device and bias.is_contiguous()
                  and not (bias.requires_grad and torch.is_grad_enabled())):
            return None
        else:
            pbias = bias.data_ptr()
        pa, pb = a.data_ptr(), b.data_ptr()
        if out is None:
            return (m, n, k, (pa, pb, None, pbias)) if beta == 0 else None
        if not (type(out) in _PLAIN_TYPES and out.dtype is self.out_dtype and out.layout is strided
                and out.get_device() == device and out.shape == (m, n) and out.is_contiguous()):
            return None
        lo = out.data_ptr()
        hi = lo + out.nbytes
        if (pa < hi and pa + a.nbytes > lo) or (pb < hi and pb + b.nbytes > lo) or (
                pbias is not None and pbias < hi and pbias + bias.nbytes > lo):
            return None
        return m, n, k, (pa, pb, lo, pbias)

    def _queue(self, device: torch.device, args: tuple, keep: bool) -> None:
        """Queue the launch of ``args`` on torch's current stream of CUDA ``device``. The
        launcher's CUDA runtime works on the current device's primary context, torch's own;
        switching devices costs microseconds, so only where the operands are on another one."""
        index = device.index
        if index == _current_device():
            self._launch(args, _current_stream(index), device, keep)
        else:
            with torch.cuda.device(index):
                self._launch(args, _current_stream(index), device, keep)

    def _launch(self, args: tuple, stream: int, device: torch.device, keep: bool) -> None:
        """Queue the launch of ``args`` (M, N, K, alpha, A, B, beta, C, bias or None: addresses;
        a batched op's add the batch and strides, _new_plan) on ``stream`` of ``device``: through
        a plan made earlier for the same arguments (the launcher's host work -- checks, grid,
        tensor maps -- done once), else a new one, kept for next time. A plan is the launch it was
        made for, so reusing one is the same launch. Each thread keeps its own plans (at most
        _PLANS_KEPT), so that no thread frees a plan another is running.

        The workspace a plan's run takes (plan.workspace_bytes) is torch memory on ``device``,
        allocated while ``stream`` is current (_workspace: ``keep`` says whether a kept buffer
        may serve); with ``keep``, outside a capture, its flags are this thread's kept ones
        (_kept_flags), so no memset is queued. A library of an earlier gemmgen keeps its own
        workspace per stream (a plain Plan), which a capture cannot hold: refused then
        (NotCapturable)."""
        if not self.launcher.takes_workspace:
            self._refuse_capture(f"{self.path} was built by a gemmgen whose launches keep a workspace of their own and "
                                 "grow it (waiting for the stream) where a shape needs more, which a CUDA graph capture "
                                 "cannot hold: emit and build it again with this gemmgen (its launches then take their "
                                 "workspace from torch), or call it outside the capture")
        plans = self._plans()
        key = (*args, stream)
        plan = plans.get(key)
        if plan is None:
            plan = self._new_plan(args, stream)
            if len(plans) >= _PLANS_KEPT:
                plans.pop(next(iter(plans))).close()
            plans[key] = plan
        need = plan.workspace_bytes
        if not need:
            plan.run()
            return
        workspace = self._workspace(need, stream, device, keep)
        flags = plan.flag_bytes
        if flags and keep and not _capturing():
            plan.run_kept(self._kept_flags(flags, stream, device), flags, workspace, need)
        else:
            plan.run(workspace, need)

    def _workspace(self, need: int, stream: int, device: torch.device, keep: bool) -> int:
        """The address of ``need`` bytes of workspace for a launch queued next on ``stream``.

        During a CUDA-graph capture, or where ``keep`` is False: a new tensor from torch's
        allocator, given back once the launch is queued (in a capture the allocator draws it from
        the graph's pool, which keeps it for the replays). Otherwise this thread's buffer for
        ``stream`` (grown where a launch needs more; the old one goes back to torch's allocator,
        stream-ordered): launches on one stream run in order, so they can share it, and an eager
        call allocates nothing most of the time (an allocation costs microseconds of host time).
        release() drops the buffers."""
        if not keep or _capturing():
            return torch.empty(need, dtype=torch.uint8, device=device).data_ptr()
        return self._kept_buffer((device.index, stream), need,
                                 lambda: torch.empty(need, dtype=torch.uint8, device=device))

    def _kept_flags(self, need: int, stream: int, device: torch.device) -> int:
        """The address of ``need`` bytes of flags, zero, for a launch queued next on ``stream`` outside
        a capture: this thread's buffer for ``stream``, made zero once (replaced by a larger zeroed one
        where a launch needs more) and left zero by every launch (WorkspacePlan.run_kept), so an eager
        call queues no memset of its flags. A capture takes the memset instead (_launch): its graph
        would hold a buffer that this thread may replace."""
        return self._kept_buffer((device.index, stream, "flags"), need,
                                 lambda: torch.zeros(max(need, 4096), dtype=torch.uint8, device=device))

    def _kept_buffer(self, key: tuple, need: int, make) -> int:
        """The address of this thread's buffer ``key`` (_buffers), replaced by ``make()`` where it is
        missing or shorter than ``need`` bytes."""
        buffers = self._buffers()
        buffer = buffers.get(key)
        if buffer is None or buffer.numel() < need:
            buffer = buffers[key] = make()
        return buffer.data_ptr()

    def _new_plan(self, args: tuple, stream: int):
        """The launcher's plan of ``args`` (as _launch takes them) on ``stream``: in the caller's
        workspace (a WorkspacePlan), or for a library without that, in its own (a Plan)."""
        *problem, bias, scales = args
        if not self.launcher.takes_workspace:
            return self.launcher.plan(*problem, stream, bias=bias, scales=scales)
        return self.launcher.plan_workspace(*problem, stream, bias=bias, scales=scales)

    @staticmethod
    def _refuse_capture(message: str) -> None:
        """Raise NotCapturable(``message``: what the call would do that a capture cannot hold, and
        the fix) where torch's current stream is capturing a CUDA graph; call it before anything
        touches the stream."""
        if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
            raise NotCapturable(message)

    def _plans(self) -> dict:
        """This thread's launch plans (made on first use)."""
        if not hasattr(self._local, "plans"):
            self._local.plans = {}
        return self._local.plans

    def _buffers(self) -> dict:
        """This thread's workspace buffers: (device index, stream) -> uint8 tensor, and its kept
        flags: (device index, stream, "flags") -> uint8 tensor (_kept_flags)."""
        if not hasattr(self._local, "buffers"):
            self._local.buffers = {}
        return self._local.buffers

    mm = __call__

    def choice(self, m: int, n: int, k: int) -> str | None:
        """For a dispatcher (`emit --dispatch`), the kernel an M x N x K call goes to; None for a
        single kernel."""
        return self.launcher.choice(m, n, k)

    def release(self) -> None:
        """Free the workspace the launcher keeps per stream and device for its C callers and
        libraries of earlier gemmgen (it waits for each such device's work first), and give this
        thread's workspace buffers (GemmOp._workspace) back to torch's allocator. Raises NotCapturable during a capture, which
        that wait would break."""
        self._refuse_capture("release() waits for the device's work, which would break the CUDA graph capture "
                             "under way: call it outside the capture")
        self._buffers().clear()
        self.launcher.release()


class BatchedGemmOp(GemmOp):
    """A loaded batched launcher (variant batch=strided): ``op(a, b)`` is ``torch.bmm(a, b)``
    through one launch of the gemmgen kernel, in its problem variant (layouts, C's type, bias,
    activation) as GemmOp's; ``load`` returns one for a batched library."""

    _batched_abi = True

    def __call__(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, *,
                 alpha: float = 1, beta: float = 0, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``out[i] = act(alpha * op(a[i]) @ op(b[i]) + beta * out[i] + bias[i])`` for every i of
        the batch, in one launch; returns ``out``.

        a: (batch, M, K), or (batch, K, M) for trans tn/tt; b: (batch, K, N), or (batch, N, K)
        for nt/tt; tensors of ``self.dtype`` on one CUDA device whose matrices are contiguous
        row-major, the batch stride any (``x.expand(batch, -1, -1)``: one matrix for all). out:
        (batch, M, N) of ``self.out_dtype``, each matrix contiguous and the batch stride at least
        M * N, sharing no memory with a, b or bias; None: a new contiguous one (then beta must
        be 0). bias, for a variant that adds one: (batch, N) (bias=col; (batch, M) for row), a
        vector per product, or (N,) / (M,), one for all. The rest (stream, alpha and beta, the
        empty cases: batch, M or N == 0 returns out as it is, K == 0 as GemmOp) is GemmOp's.
        The rules and their messages are gemmgen.torch.checks.check_batched_call's (TensorError,
        before any work is queued); ShapeRefused, LaunchFailed, NotCapturable, CUDA graphs and
        torch.compile (the same operators, with a (batch, M, N) C) as GemmOp."""
        return super().__call__(a, b, out, alpha=alpha, beta=beta, bias=bias)

    def _eager(self, a, b, out, alpha, beta, bias, keep: bool = False, scale_a=None, scale_b=None) -> torch.Tensor:
        check_scales(*_optional(scale_a=scale_a, scale_b=scale_b), 0, 0, None, None, self.variant)  # none taken
        batch, m, n, k, strides = check_batched_call(self.precision, *_operands(a, b, out), beta, self.variant,
                                                     None if bias is None else _operand("bias", bias))
        if out is None:
            out = torch.empty((batch, m, n), dtype=self.out_dtype, device=a.device)
        if batch == 0 or m == 0 or n == 0:
            return out
        if k == 0:
            return self._no_product(out, beta, bias)
        self._queue(a.device, (m, n, k, float(alpha), a.data_ptr(), b.data_ptr(), float(beta), out.data_ptr(),
                               None if bias is None else bias.data_ptr(), batch, strides), keep)
        return out

    def _fake(self, a, b, out, beta, bias, scale_a=None, scale_b=None) -> torch.Tensor | None:
        check_scales(*_optional(True, scale_a=scale_a, scale_b=scale_b), 0, 0, None, None, self.variant)
        batch, m, n, _, _ = check_batched_call(self.precision, *_operands(a, b, out, fake=True), beta,
                                               self.variant, None if bias is None else _operand("bias", bias, fake=True))
        return a.new_empty((batch, m, n), dtype=self.out_dtype) if out is None else None

    def _new_plan(self, args: tuple, stream: int):
        *problem, bias, batch, strides = args
        if not self.launcher.takes_workspace:
            return self.launcher.plan(*problem, stream, bias=bias, batch=batch, strides=strides)
        return self.launcher.plan_workspace(*problem, stream, bias=bias, batch=batch, strides=strides)

    mm = bmm = __call__


def load(path: str | Path, *, gpu: str | None = None, launcher: str = DEFAULT_LAUNCHER) -> GemmOp:
    """A GemmOp for ``path``: a library built from an emitted file (any name but ``*.cu``), or an
    emitted ``.cu`` file, which is built first with gemmgen.build.nvcc.build_library (nvcc, cached).

    A .cu file is built for ``gpu`` (e.g. "sm_90") where given, else for the target its header
    names (``gemmgen emit --gpu``), else for torch's current CUDA device; it is refused when that
    device cannot run the result. ``launcher``: the name of the launcher's functions (a library
    built with -DGEMMGEN_LAUNCHER=name; a .cu file is then built with that name).

    Raises BuildFailed (nvcc's log), gemmgen.torch.checks.TargetMismatch,
    gemmgen.errors.InvalidParameter (an unknown ``gpu`` or a malformed ``launcher``),
    gemmgen.errors.ToolNotFound (no nvcc), gemmgen.measure.device.LaunchFailed where the library
    cannot be loaded or is no gemmgen launcher, and OSError where ``path`` cannot be read.
    """
    if not re.fullmatch(r"[A-Za-z_]\w*", launcher):
        raise InvalidParameter(f"launcher={launcher!r} is not a C name (letters, digits and _, not first a digit)")
    path = Path(path)
    library = path
    if path.suffix == ".cu":
        source = path.read_text()
        device_cc = None
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            device_cc = major * 10 + minor
        arch = build_target(source_target(source), gpu, device_cc)
        flags = DEFAULT_FLAGS if launcher == DEFAULT_LAUNCHER else (*DEFAULT_FLAGS, f"-DGEMMGEN_LAUNCHER={launcher}")
        result = build_library(source, arch, flags)
        if not result.ok:
            raise BuildFailed(f"nvcc could not build {path} for {arch.name}:\n{result.log}")
        library = result.library
    loaded = Launcher(library, launcher)
    return (BatchedGemmOp if loaded.variant.batched else GemmOp)(loaded, library)


def _reload(path: str, launcher: str) -> GemmOp:
    """A pickled GemmOp, loaded again (GemmOp.__reduce__)."""
    return load(path, launcher=launcher)


# ---- the registered operators: what torch.compile traces, and dispatch modes see ----

def _loaded(key: str) -> GemmOp:
    """The GemmOp registered under ``key``; GemmgenError where this process has none."""
    op = _LOADED.get(key)
    if op is None:
        path, _, launcher = key.rpartition(":")
        raise GemmgenError(f"the gemmgen library {path!r} (launcher {launcher}) is not loaded in this process: call "
                           f"gemmgen.torch.load({path!r}, launcher={launcher!r}) before running a graph that calls it")
    return op


# One operator pair for every library, the library named by its key (a string argument): torch.compile
# treats it as a constant, so each call site traces to one node of a fixed schema, whatever was loaded
# and when; an operator per library would register a new schema at every load, under a name made up
# from the path. The fake implementations give C's shape, dtype and strides from the traced tensors.
@torch.library.custom_op("gemmgen::gemm", mutates_args=())
def _gemm(lib: str, a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor], alpha: float,
          beta: float, scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """C = act(alpha * op(a) @ op(b) + bias) through the library ``lib`` (GemmOp.key), in a new
    tensor (FP8's scales where the kernel reads them); beta must be 0 (there is no C to read)."""
    return _loaded(lib)._eager(a, b, None, alpha, beta, bias, scale_a=scale_a, scale_b=scale_b)


@_gemm.register_fake
def _gemm_fake(lib, a, b, bias, alpha, beta, scale_a=None, scale_b=None):
    return _loaded(lib)._fake(a, b, None, beta, bias, scale_a, scale_b)


@torch.library.custom_op("gemmgen::gemm_out", mutates_args=("out",))
def _gemm_out(lib: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor],
              alpha: float, beta: float, scale_a: Optional[torch.Tensor] = None,
              scale_b: Optional[torch.Tensor] = None) -> None:
    """out = act(alpha * op(a) @ op(b) + beta * out + bias) through the library ``lib``, in place."""
    _loaded(lib)._eager(a, b, out, alpha, beta, bias, scale_a=scale_a, scale_b=scale_b)


@_gemm_out.register_fake
def _gemm_out_fake(lib, a, b, out, bias, alpha, beta, scale_a=None, scale_b=None):
    _loaded(lib)._fake(a, b, out, beta, bias, scale_a, scale_b)
