"""Calling a kernel: the emitted launcher, built as a shared library
(:func:`gemmgen.build.nvcc.build_library`), through ctypes (:class:`Launcher`; its ABI: the
structures, the argument lists of single and batched launchers, the plan and workspace calls).
The launcher holds every launch rule -- grid, workspace, packing, tensor maps, which shapes are
refused -- so nothing here decides any of them.

Loading a library and asking :meth:`Launcher.describe` (host arithmetic) need no GPU; launching
needs the CUDA context current (a gemmgen.measure.device.Gpu open on this thread).
"""

import ctypes
import os
from pathlib import Path

from gemmgen.codegen.launcher_abi import launcher_abi
from gemmgen.describe.config import KernelConfig
from gemmgen.describe.problem import Variant
from gemmgen.errors import GemmgenError
from gemmgen.measure.device import Gpu, LaunchFailed


class ShapeRefused(GemmgenError):
    """The kernel cannot take this M, N, K (the message names the constraint)."""


class LaunchInfo(ctypes.Structure):
    """gemmgen_launch_info (launcher.cuh.j2): what one launch needs. grid: blocks along x, y, z;
    flag_words: 4-byte flags that are zero before it and that it leaves zero; partial_bytes:
    scratch for partial sums; packed_a_bytes / packed_b_bytes: the zero-padded copies of A and B
    (0: read in place); stores_c: C goes out through TMA."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("flag_words", ctypes.c_ulonglong),
                ("partial_bytes", ctypes.c_ulonglong), ("packed_a_bytes", ctypes.c_ulonglong),
                ("packed_b_bytes", ctypes.c_ulonglong), ("stores_c", ctypes.c_int)]


class Held(ctypes.Structure):
    """gemmgen_held (launcher.cuh.j2): the workspace a launcher keeps for one stream (device
    addresses and sizes in bytes; 0 where it keeps none)."""

    _fields_ = [("flags", ctypes.c_void_p), ("flag_bytes", ctypes.c_ulonglong), ("partials", ctypes.c_void_p),
                ("partial_bytes", ctypes.c_ulonglong), ("packed", ctypes.c_void_p),
                ("packed_bytes", ctypes.c_ulonglong)]


_CUDA_ERROR_INVALID_VALUE = 1  # what a launcher returns for a shape it refuses
_VP, _INT, _ULL = ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong


def packed_strides(variant: Variant, m: int, n: int, k: int) -> tuple[int, int, int, int]:
    """The strides (elements) of a batch whose matrices follow one another with no gap: M * K, K * N,
    M * N and the bias's M or N values (0 where the variant adds none)."""
    return m * k, k * n, m * n, {"row": m, "col": n}.get(variant.bias, 0)


class Launcher:
    """The C functions of an emitted file built as a shared library (names: the launcher's,
    gemmgen_gemm unless built with -DGEMMGEN_LAUNCHER). Loading needs no GPU; launching needs
    the CUDA context to be current (a :class:`Gpu` open on this thread).

    Calls that fail raise ShapeRefused (a shape the kernel cannot take, with the launcher's
    reason) or LaunchFailed (any other CUDA error, with the launcher's message).
    """

    def __init__(self, library: str | Path, name: str = "gemmgen_gemm"):
        try:
            self._lib = ctypes.CDLL(str(library), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as err:
            raise LaunchFailed(f"cannot load {library}: {err}") from None
        self.name = name
        fn = self._function
        try:  # "nn fp32 none none": the layouts of A and B, C's type, the bias and the activation
            self.variant = Variant.parse(fn("_variant", ctypes.c_char_p, [])().decode())
        except LaunchFailed:  # a dispatcher of earlier gemmgen, whose kernels compute the default variant
            self.variant = Variant()
        # the C parameters of the variant's launcher (gemmgen.codegen.launcher_abi): the operands, then the stream
        self._abi = launcher_abi(self.variant, "T", "CT")
        problem = self._abi.launch.ctypes() + [_VP]
        self._launch = fn("", ctypes.c_int, problem)
        self._plan = fn("_plan", ctypes.c_int, [ctypes.POINTER(_VP), *problem])
        self._run = fn("_run", ctypes.c_int, [_VP])
        self._plan_free = fn("_plan_free", None, [_VP])
        shape_args = self._abi.describe.ctypes() + [_INT]  # _describe's, up to and with resident
        self._describe = fn("_describe", ctypes.c_char_p, [*shape_args, ctypes.POINTER(LaunchInfo)])
        # The launch in the caller's workspace (CUDA-graph safe); absent from libraries of earlier gemmgen.
        try:
            self._workspace_size = fn("_workspace_size", ctypes.c_char_p, [*shape_args, ctypes.POINTER(_ULL)])
            self._launch_ws = fn("_launch_workspace", ctypes.c_int, [_VP, _ULL, *problem])
            self._plan_ws = fn("_plan_workspace", ctypes.c_int, [ctypes.POINTER(_VP), ctypes.POINTER(_ULL), *problem])
            self._run_ws = fn("_run_workspace", ctypes.c_int, [_VP, _VP, _ULL])
        except LaunchFailed:
            self._workspace_size = self._launch_ws = self._plan_ws = self._run_ws = None
        # A run with flags the caller keeps zero (no memset); absent from libraries of earlier gemmgen.
        try:
            self._plan_flag_bytes = fn("_plan_flag_bytes", _ULL, [_VP])
            self._run_ws_kept = fn("_run_workspace_kept", ctypes.c_int, [_VP, _VP, _ULL, _VP, _ULL])
        except LaunchFailed:
            self._plan_flag_bytes = self._run_ws_kept = None
        self._error = fn("_error", ctypes.c_char_p, [])
        self._held = fn("_held", None, [_VP, ctypes.POINTER(Held)])
        self._release = fn("_release", ctypes.c_int, [])
        self.precision = fn("_precision", ctypes.c_char_p, [])().decode()  # a precision's name ("fp16", "e4m3", ...)
        try:  # a dispatcher (emit --dispatch) names the kernel it gives a shape
            self._choice = fn("_choice", ctypes.c_char_p, [_INT, _INT, _INT])
        except LaunchFailed:
            self._choice = None

    def _function(self, suffix: str, restype, argtypes):
        try:
            f = getattr(self._lib, self.name + suffix)
        except AttributeError:
            raise LaunchFailed(f"the library has no {self.name + suffix}: not a gemmgen launcher") from None
        f.restype, f.argtypes = restype, argtypes
        return f

    def _check(self, err: int) -> None:
        if err:
            message = (self._error() or b"").decode(errors="replace") or f"CUDA error {err}"
            if err == _CUDA_ERROR_INVALID_VALUE and message.startswith("refused"):
                raise ShapeRefused(message)
            raise LaunchFailed(message)

    def _args(self, c: int, bias: int | None) -> tuple:
        """C's address, and the bias's after it where the variant adds one (ValueError where a
        bias is missing or not taken)."""
        if self.variant.bias == "none":
            if bias:
                raise ValueError(f"{self.name} adds no bias (variant {self.variant.text}); pass bias=None")
            return (c,)
        if not bias:
            raise ValueError(f"{self.name} adds a bias per {self.variant.bias} of C: pass its device address as bias=")
        return (c, bias)

    def _scales(self, scales) -> tuple[int | None, int | None]:
        """(scale_a, scale_b): the device addresses of FP8's fp32 scales where the variant is scaled
        (ValueError where they are missing or not taken)."""
        if not self.variant.scaled:
            if scales is not None:
                raise ValueError(f"{self.name} takes no scales (variant {self.variant.text}); pass scales=None")
            return None, None
        if scales is None or len(scales) != 2 or not all(scales):
            count = "one fp32 value each" if self.variant.scale == "tensor" else "M and N fp32 values"
            raise ValueError(f"{self.name} reads scale={self.variant.scale} scales ({count}): pass their device "
                             "addresses as scales=(scale_a, scale_b)")
        return int(scales[0]), int(scales[1])

    def _strides(self, m: int, n: int, k: int, batch: int, strides) -> tuple[int, int, int, int]:
        """(stride_a, stride_b, stride_c, stride_bias) of a batched launch: ``strides`` where given
        (a tuple of four, or of three without the bias's), else packed_strides. Raises ValueError
        for a batch other than 1, or strides, given to a launcher that is not batched."""
        if not self.variant.batched:
            if batch != 1 or strides is not None:
                raise ValueError(f"{self.name} computes one product per launch (variant {self.variant.text}): "
                                 "pass batch=1 and no strides")
            return (0, 0, 0, 0)
        if strides is None:
            return packed_strides(self.variant, m, n, k)
        strides = tuple(int(x) for x in strides)
        if len(strides) not in (3, 4):
            raise ValueError(f"strides must be (stride_a, stride_b, stride_c[, stride_bias]); got {strides}")
        return strides if len(strides) == 4 else (*strides, packed_strides(self.variant, m, n, k)[3])

    def _problem(self, m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides, scales=None) -> tuple:
        """The launcher's arguments, in its ABI's order (batched, biased, scaled or not)."""
        sa, sb, sc, sbias = self._strides(m, n, k, batch, strides)
        self._args(c, bias)  # refuses a bias missing or not taken
        scale_a, scale_b = self._scales(scales)
        given = {"M": m, "N": n, "K": k, "batch": batch, "alpha": alpha, "A": a, "stride_a": sa, "B": b,
                 "stride_b": sb, "beta": beta, "C": c, "stride_c": sc, "bias": bias, "stride_bias": sbias,
                 "scale_a": scale_a, "scale_b": scale_b}
        return (*(given[p.name] for p in self._abi.launch), stream)

    def launch(self, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float, c: int,
               stream: int = 0, bias: int | None = None, batch: int = 1, strides=None, scales=None) -> None:
        """Queue C = act(alpha * A @ B + beta * C + bias) on ``stream`` (0: the default stream); a,
        b, c are device addresses of A, B and C as the launcher's variant stores them (row-major
        A: M x K, or K x M for trans tn/tt; B: K x N, or N x K for nt/tt; C: M x N of the
        variant's ``out`` type), ``bias`` that of the bias vector (M or N values of C's type)
        where the variant adds one. A batched launcher computes ``batch`` such products, matrix i
        of each at its address + i * its stride (elements; ``strides`` = (stride_a, stride_b,
        stride_c[, stride_bias]), default packed_strides). A scaled (FP8) launcher multiplies A @ B
        by the fp32 scales at ``scales`` = (scale_a, scale_b) (Variant's scale: one value each, or
        M and N). Raises ValueError for a bias or scales missing or not taken, or a batch given to
        a launcher that is not batched."""
        self._check(self._launch(*self._problem(m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides,
                                                scales)))

    def plan(self, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float, c: int,
             stream: int = 0, bias: int | None = None, batch: int = 1, strides=None, scales=None) -> "Plan":
        """The same launch with its host work done now (checks, grid, workspace, tensor maps), to
        be queued later by Plan.run, as often as wanted."""
        handle = _VP()
        self._check(self._plan(ctypes.byref(handle),
                               *self._problem(m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides, scales)))
        return Plan(self, handle)

    def describe(self, m: int, n: int, k: int, a: int = 0, b: int = 0, beta: float = 0.0, c: int = 0,
                 resident: int = 0, batch: int = 1, stride_a: int | None = None, stride_b: int | None = None,
                 stride_c: int | None = None) -> LaunchInfo:
        """What a launch at M x N x K with these addresses (0: 16-byte aligned) would need, without
        launching; for a batched launcher, of ``batch`` products at these strides (None: packed).
        ``resident``: blocks of a persistent grid that run at once (0: ask the current device,
        which needs a GPU). Raises ShapeRefused with the launcher's reason."""
        info = LaunchInfo()
        args = self._shape_args(m, n, k, a, b, beta, c, resident, batch, (stride_a, stride_b, stride_c))
        self._refused(m, n, k, self._describe(*args, ctypes.byref(info)))
        return info

    def _shape_args(self, m, n, k, a, b, beta, c, resident, batch, strides) -> tuple:
        """_describe's arguments up to and with ``resident`` (strides: (stride_a, stride_b,
        stride_c), None each: packed), in its ABI's order (batched or not)."""
        if self.variant.batched:
            packed = packed_strides(self.variant, m, n, k)
            sa, sb, sc = (packed[i] if s is None else s for i, s in enumerate(strides))
        else:
            sa, sb, sc, _ = self._strides(m, n, k, batch, None if strides == (None,) * 3 else strides)  # refuses them
        given = {"M": m, "N": n, "K": k, "batch": batch, "A": a, "stride_a": sa, "B": b, "stride_b": sb, "beta": beta,
                 "C": c, "stride_c": sc}
        return (*(given[p.name] for p in self._abi.describe), resident)

    @staticmethod
    def _refused(m: int, n: int, k: int, why: bytes | None) -> None:
        if why is not None:
            raise ShapeRefused(f"refused M={m} N={n} K={k}: {why.decode()}")

    # ---- the launch in the caller's workspace: CUDA-graph safe (docs/design.md, "The workspace") ----

    @property
    def takes_workspace(self) -> bool:
        """Whether the library has the launch in the caller's workspace (_workspace_size,
        _launch_workspace, _plan_workspace, _run_workspace): every library of this gemmgen."""
        return self._plan_ws is not None

    def _needs_workspace_functions(self) -> None:
        if self._plan_ws is None:
            raise LaunchFailed(f"the library has no {self.name}_workspace_size: it was built by a gemmgen before "
                               "launches took the caller's workspace; emit and build it again")

    def workspace_size(self, m: int, n: int, k: int, a: int = 0, b: int = 0, beta: float = 0.0, c: int = 0,
                       resident: int = 0, batch: int = 1, stride_a: int | None = None, stride_b: int | None = None,
                       stride_c: int | None = None) -> int:
        """The bytes of workspace a launch in the caller's workspace (launch_workspace,
        plan_workspace) takes at M x N x K with these addresses (0: aligned), arguments as
        :meth:`describe`'s; 0 where it takes none. The launcher's rule (gg_ws_layout in
        templates/launcher.cuh.j2): the flags, the partial sums and the packed operands that
        describe() gives, each rounded up to 256 bytes. Raises ShapeRefused with the launcher's
        reason, LaunchFailed for a library without the function."""
        self._needs_workspace_functions()
        out = _ULL()
        args = self._shape_args(m, n, k, a, b, beta, c, resident, batch, (stride_a, stride_b, stride_c))
        self._refused(m, n, k, self._workspace_size(*args, ctypes.byref(out)))
        return out.value

    def launch_workspace(self, workspace: int, workspace_bytes: int, m: int, n: int, k: int, alpha: float, a: int,
                         b: int, beta: float, c: int, stream: int = 0, bias: int | None = None, batch: int = 1,
                         strides=None, scales=None) -> None:
        """:meth:`launch`, with the workspace at device address ``workspace`` (256-byte aligned,
        ``workspace_bytes`` >= workspace_size(); 0 where that is 0) instead of the launcher's own:
        its flags are zeroed on ``stream`` first, and nothing allocates, frees or waits, so the
        launch can be captured into a CUDA graph. The workspace must stay untouched by anything
        else until the launch is done."""
        self._needs_workspace_functions()
        self._check(self._launch_ws(workspace, workspace_bytes,
                                    *self._problem(m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides,
                                                   scales)))

    def plan_workspace(self, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float, c: int,
                       stream: int = 0, bias: int | None = None, batch: int = 1, strides=None,
                       scales=None) -> "WorkspacePlan":
        """launch_workspace's launch with its host work done now; WorkspacePlan.run(workspace,
        bytes) queues it, and ``workspace_bytes`` says what each run takes. Making the plan
        touches neither the stream nor device memory."""
        self._needs_workspace_functions()
        handle, need = _VP(), _ULL()
        self._check(self._plan_ws(ctypes.byref(handle), ctypes.byref(need),
                                  *self._problem(m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides,
                                                 scales)))
        return WorkspacePlan(self, handle, need.value)

    def choice(self, m: int, n: int, k: int) -> str | None:
        """The name of the kernel a dispatcher's launch at M x N x K goes to (its own rule), or
        None where the library is a single kernel."""
        return self._choice(m, n, k).decode() if self._choice else None

    def held(self, stream: int = 0) -> Held:
        """The workspace the launcher keeps for ``stream`` on the current device."""
        out = Held()
        self._held(stream, ctypes.byref(out))
        return out

    def release(self) -> None:
        """Free the workspace the launcher keeps (after the device's work is done)."""
        self._check(self._release())


class Plan:
    """One launch prepared by :meth:`Launcher.plan`; ``run`` queues it. Close it when done."""

    workspace_bytes = 0  # what a run takes from the caller (WorkspacePlan): this one uses the launcher's own

    def __init__(self, launcher: Launcher, handle):
        self._launcher, self._handle, self._run = launcher, handle, launcher._run

    def run(self) -> None:
        err = self._run(self._handle)
        if err:
            self._launcher._check(err)

    def close(self) -> None:
        if self._handle:
            self._launcher._plan_free(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class WorkspacePlan(Plan):
    """One launch prepared by :meth:`Launcher.plan_workspace`: ``run(workspace, workspace_bytes)``
    queues it in the caller's workspace, of at least ``workspace_bytes`` bytes (0: none, and
    ``run(0, 0)``), after a memset of its flags on the stream. ``flag_bytes``: the bytes of flags
    the launch takes (0: none, or a library of earlier gemmgen, which has no run_kept);
    ``run_kept(flags, flag_bytes, workspace, workspace_bytes)`` queues it with its flags at
    ``flags`` instead, at least ``flag_bytes`` bytes, 16-byte aligned, zero -- and left zero by the
    launch, so that a caller who keeps them for its next runs never clears them again."""

    def __init__(self, launcher: Launcher, handle, workspace_bytes: int):
        super().__init__(launcher, handle)
        self._run = launcher._run_ws
        self._run_kept = launcher._run_ws_kept
        self.workspace_bytes = workspace_bytes
        self.flag_bytes = launcher._plan_flag_bytes(handle) if launcher._plan_flag_bytes else 0

    def run(self, workspace: int = 0, workspace_bytes: int = 0) -> None:
        err = self._run(self._handle, workspace, workspace_bytes)
        if err:
            self._launcher._check(err)

    def run_kept(self, flags: int, flag_bytes: int, workspace: int, workspace_bytes: int) -> None:
        err = self._run_kept(self._handle, flags, flag_bytes, workspace, workspace_bytes)
        if err:
            self._launcher._check(err)


class LoadedKernel(Launcher):
    """A point's emitted launcher, built as a library (BuildResult.library) and loaded."""

    def __init__(self, gpu: Gpu, config: KernelConfig, library: str | Path):
        super().__init__(library)
        self.gpu, self.config = gpu, config

    def close(self) -> None:
        """Free the launcher's workspace; the library stays loaded (its CUDA runtime with it)."""
        if self.gpu.healthy():
            self.release()
