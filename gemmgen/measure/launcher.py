"""The GPU: device facts, device memory, calling kernels, timing.

Kernels run through their emitted launcher: the file gemmgen emits, built as a shared library
(:func:`gemmgen.build.nvcc.build_library`) and called through ctypes (:class:`Launcher`). The launcher
holds every launch rule -- grid, workspace, packing, tensor maps, which shapes are refused -- so
the runtime decides none of them. PyCUDA gives the context, device memory and timing events; the
launcher's CUDA runtime works in the same (primary) context.

Importing this module needs no GPU, nor does :class:`Launcher` (its ``describe`` is host
arithmetic); constructing :class:`Gpu` does, and raises GpuUnavailable (one line naming the fix)
where PyCUDA or a GPU is missing.
"""

import ctypes
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gemmgen.describe.arch import Arch, parse_arch
from gemmgen.describe.config import KernelConfig
from gemmgen.describe.problem import Variant
from gemmgen.errors import GemmgenError


class GpuUnavailable(GemmgenError):
    """No GPU can be used here: PyCUDA missing, no driver, or no device."""


class ShapeRefused(GemmgenError):
    """The kernel cannot take this M, N, K (the message names the constraint)."""


class LaunchFailed(GemmgenError):
    """A launch or the work it queued failed in the driver (the message is the driver's)."""


def _driver():
    try:
        import pycuda.driver as drv
    except ImportError as err:
        raise GpuUnavailable(f"PyCUDA is not importable ({err}); on a machine with an NVIDIA driver run "
                             "`pip install 'gemmgen[cuda]'`") from None
    return drv


def device_count() -> int:
    """How many CUDA devices this process sees; raises GpuUnavailable where it cannot ask."""
    drv = _driver()
    try:
        drv.init()
        return drv.Device.count()
    except drv.Error as err:
        raise GpuUnavailable(f"no usable NVIDIA GPU: {err}") from None


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    arch: Arch
    sm_count: int
    clock_mhz: int
    memory_clock_mhz: int
    driver_version: str
    cuda_version: str
    l2_bytes: int
    memory_bus_bits: int = 0

    @property
    def peak_bandwidth(self) -> float | None:
        """The memory's peak bandwidth in bytes/s from its clock and bus width (double data
        rate: H100 SXM, 2619 MHz x 5120 bits, 3.35e12), or None where the driver reports neither."""
        if not (self.memory_clock_mhz and self.memory_bus_bits):
            return None
        return 2 * self.memory_clock_mhz * 1e6 * self.memory_bus_bits / 8


def _nvidia_smi_driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True,
                         check=False, timeout=20).stdout.split()
    return out[0] if out else None


class Gpu:
    """Device ``index``'s primary context, current on this thread while the object is open.

    The primary context is the one the CUDA runtime (and so cuBLAS) uses: kernels loaded here
    and cuBLAS calls share memory, stream and timing events.
    """

    def __init__(self, index: int = 0):
        drv = self.drv = _driver()
        try:
            drv.init()
            if drv.Device.count() <= index:
                raise GpuUnavailable(f"no CUDA device {index}: {drv.Device.count()} device(s) present")
            self.device = drv.Device(index)
            self.context = self.device.retain_primary_context()
            self.context.push()
        except drv.Error as err:
            raise GpuUnavailable(f"no usable NVIDIA GPU: {err}") from None
        attr = drv.device_attribute
        major, minor = self.device.compute_capability()
        version = drv.get_driver_version()
        self.info = DeviceInfo(
            name=self.device.name(),
            arch=parse_arch(f"{major}{minor}"),
            sm_count=self.device.get_attribute(attr.MULTIPROCESSOR_COUNT),
            clock_mhz=self.device.get_attribute(attr.CLOCK_RATE) // 1000,
            memory_clock_mhz=self.device.get_attribute(attr.MEMORY_CLOCK_RATE) // 1000,
            driver_version=_nvidia_smi_driver_version() or f"driver API {version}",
            cuda_version=f"{version // 1000}.{version % 1000 // 10}",
            l2_bytes=self.device.get_attribute(attr.L2_CACHE_SIZE),
            memory_bus_bits=self.device.get_attribute(attr.GLOBAL_MEMORY_BUS_WIDTH),
        )

    def close(self) -> None:
        if getattr(self, "context", None) is not None:
            self.context.pop()
            self.context = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def synchronize(self) -> None:
        """Wait for all queued work; raises LaunchFailed with the driver's message on a fault."""
        try:
            self.drv.Context.synchronize()
        except self.drv.Error as err:
            raise LaunchFailed(str(err)) from None

    def healthy(self) -> bool:
        """False once a fault (e.g. an illegal address) has made the context unusable."""
        try:
            self.drv.Context.synchronize()
            return True
        except self.drv.Error:
            return False


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
_VP, _INT, _FLOAT, _LL, _ULL = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong, ctypes.c_ulonglong
_PROBLEM = [_INT, _INT, _INT, _FLOAT, _VP, _VP, _FLOAT, _VP, _VP]  # M, N, K, alpha, A, B, beta, C, stream
# A batched launcher's (docs/problems.md): M, N, K, batch, alpha, A, stride_a, B, stride_b, beta, C, stride_c,
# then [bias, stride_bias,] stream
_BATCHED = [_INT, _INT, _INT, _INT, _FLOAT, _VP, _LL, _VP, _LL, _FLOAT, _VP, _LL]


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
        # A launcher whose variant adds a bias takes its address right after C (and its stride, batched).
        if self.variant.batched:
            problem = _BATCHED + ([_VP, _LL] if self.variant.bias != "none" else []) + [_VP]
        else:
            problem = _PROBLEM[:8] + [_VP] + _PROBLEM[8:] if self.variant.bias != "none" else _PROBLEM
        self._launch = fn("", ctypes.c_int, problem)
        self._plan = fn("_plan", ctypes.c_int, [ctypes.POINTER(_VP), *problem])
        self._run = fn("_run", ctypes.c_int, [_VP])
        self._plan_free = fn("_plan_free", None, [_VP])
        shape_args = ([_INT, _INT, _INT, _INT, _VP, _LL, _VP, _LL, _FLOAT, _VP, _LL, _INT] if self.variant.batched else
                      [_INT, _INT, _INT, _VP, _VP, _FLOAT, _VP, _INT])  # _describe's, up to and with resident
        self._describe = fn("_describe", ctypes.c_char_p, [*shape_args, ctypes.POINTER(LaunchInfo)])
        # The launch in the caller's workspace (CUDA-graph safe); absent from libraries of earlier gemmgen.
        try:
            self._workspace_size = fn("_workspace_size", ctypes.c_char_p, [*shape_args, ctypes.POINTER(_ULL)])
            self._launch_ws = fn("_launch_workspace", ctypes.c_int, [_VP, _ULL, *problem])
            self._plan_ws = fn("_plan_workspace", ctypes.c_int, [ctypes.POINTER(_VP), ctypes.POINTER(_ULL), *problem])
            self._run_ws = fn("_run_workspace", ctypes.c_int, [_VP, _VP, _ULL])
        except LaunchFailed:
            self._workspace_size = self._launch_ws = self._plan_ws = self._run_ws = None
        self._error = fn("_error", ctypes.c_char_p, [])
        self._held = fn("_held", None, [_VP, ctypes.POINTER(Held)])
        self._release = fn("_release", ctypes.c_int, [])
        self.precision = fn("_precision", ctypes.c_char_p, [])().decode()  # "fp32", "tf32", "fp16" or "bf16"
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

    def _problem(self, m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides) -> tuple:
        """The launcher's arguments, in its ABI's order (batched or not)."""
        if not self.variant.batched:
            self._strides(m, n, k, batch, strides)
            return (m, n, k, alpha, a, b, beta, *self._args(c, bias), stream)
        sa, sb, sc, sbias = self._strides(m, n, k, batch, strides)
        tail = self._args(c, bias)
        return (m, n, k, batch, alpha, a, sa, b, sb, beta, c, sc, *((tail[1], sbias) if len(tail) > 1 else ()), stream)

    def launch(self, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float, c: int,
               stream: int = 0, bias: int | None = None, batch: int = 1, strides=None) -> None:
        """Queue C = act(alpha * A @ B + beta * C + bias) on ``stream`` (0: the default stream); a,
        b, c are device addresses of A, B and C as the launcher's variant stores them (row-major
        A: M x K, or K x M for trans tn/tt; B: K x N, or N x K for nt/tt; C: M x N of the
        variant's ``out`` type), ``bias`` that of the bias vector (M or N values of C's type)
        where the variant adds one. A batched launcher computes ``batch`` such products, matrix i
        of each at its address + i * its stride (elements; ``strides`` = (stride_a, stride_b,
        stride_c[, stride_bias]), default packed_strides). Raises ValueError for a bias missing or
        not taken, or a batch given to a launcher that is not batched."""
        self._check(self._launch(*self._problem(m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides)))

    def plan(self, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float, c: int,
             stream: int = 0, bias: int | None = None, batch: int = 1, strides=None) -> "Plan":
        """The same launch with its host work done now (checks, grid, workspace, tensor maps), to
        be queued later by Plan.run, as often as wanted."""
        handle = _VP()
        self._check(self._plan(ctypes.byref(handle),
                               *self._problem(m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides)))
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
            return (m, n, k, batch, a, sa, b, sb, beta, c, sc, resident)
        self._strides(m, n, k, batch, None if strides == (None,) * 3 else strides)  # refuses a batch or strides
        return (m, n, k, a, b, beta, c, resident)

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
                         strides=None) -> None:
        """:meth:`launch`, with the workspace at device address ``workspace`` (256-byte aligned,
        ``workspace_bytes`` >= workspace_size(); 0 where that is 0) instead of the launcher's own:
        its flags are zeroed on ``stream`` first, and nothing allocates, frees or waits, so the
        launch can be captured into a CUDA graph. The workspace must stay untouched by anything
        else until the launch is done."""
        self._needs_workspace_functions()
        self._check(self._launch_ws(workspace, workspace_bytes,
                                    *self._problem(m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides)))

    def plan_workspace(self, m: int, n: int, k: int, alpha: float, a: int, b: int, beta: float, c: int,
                       stream: int = 0, bias: int | None = None, batch: int = 1, strides=None) -> "WorkspacePlan":
        """launch_workspace's launch with its host work done now; WorkspacePlan.run(workspace,
        bytes) queues it, and ``workspace_bytes`` says what each run takes. Making the plan
        touches neither the stream nor device memory."""
        self._needs_workspace_functions()
        handle, need = _VP(), _ULL()
        self._check(self._plan_ws(ctypes.byref(handle), ctypes.byref(need),
                                  *self._problem(m, n, k, alpha, a, b, beta, c, stream, bias, batch, strides)))
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
    ``run(0, 0)``)."""

    def __init__(self, launcher: Launcher, handle, workspace_bytes: int):
        super().__init__(launcher, handle)
        self._run = launcher._run_ws
        self.workspace_bytes = workspace_bytes

    def run(self, workspace: int = 0, workspace_bytes: int = 0) -> None:
        err = self._run(self._handle, workspace, workspace_bytes)
        if err:
            self._launcher._check(err)


class LoadedKernel(Launcher):
    """A point's emitted launcher, built as a library (BuildResult.library) and loaded."""

    def __init__(self, gpu: "Gpu", config: KernelConfig, library: str | Path):
        super().__init__(library)
        self.gpu, self.config = gpu, config

    def close(self) -> None:
        """Free the launcher's workspace; the library stays loaded (its CUDA runtime with it)."""
        if self.gpu.healthy():
            self.release()


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int


def time_interleaved(gpu: Gpu, launches: Sequence[Callable[[], None]], before: Callable[[], None], *,
                     warmup: int = 3, min_runs: int = 10, max_runs: int = 500,
                     min_total_ms: float = 300.0, give_up_ms: float | None = None,
                     probe_runs: int = 5) -> list[Timing]:
    """Time launches in alternation with a CUDA event pair around each run, after ``warmup``
    untimed rounds: one Timing per launch.

    ``before`` runs before every run, outside the events (gemmgen uses it to poison C and flush
    L2). Each round runs every launch once (``before`` ahead of each), in turn forward and backward,
    so that the clock and temperature drift of a long measurement falls on all of them alike and
    none always follows the same neighbour: the way to compare two kernels (a point and cuBLAS).
    Rounds continue until each launch has ``min_runs`` runs and the first has ``min_total_ms`` of
    kernel time, or ``max_runs``. With ``give_up_ms``, they stop after ``probe_runs`` rounds where
    the first launch's median is above it (a tuner's candidate clearly slower than its best so
    far): its Timing then has those runs only. Raises LaunchFailed if any run faults.
    """
    drv = gpu.drv
    for _ in range(warmup):
        for launch in launches:
            before()
            launch()
    gpu.synchronize()
    start, stop = drv.Event(), drv.Event()
    times: list[list[float]] = [[] for _ in launches]
    order = list(range(len(launches)))
    while len(times[0]) < max_runs and (len(times[0]) < min_runs or sum(times[0]) < min_total_ms):
        if give_up_ms is not None and len(times[0]) == probe_runs and sorted(times[0])[probe_runs // 2] > give_up_ms:
            break
        for i in order:
            before()
            start.record()
            launches[i]()
            stop.record()
            try:
                stop.synchronize()
            except drv.Error as err:
                raise LaunchFailed(str(err)) from None
            times[i].append(stop.time_since(start))
        order.reverse()
    result = []
    for ts in times:
        ts.sort()
        result.append(Timing(ts[len(ts) // 2], ts[0], ts[-1], len(ts)))
    return result
