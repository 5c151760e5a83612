"""The GPU through PyCUDA: device facts, device memory, loading and launching kernels, timing.

Importing this module needs no GPU; constructing :class:`Gpu` does, and raises GpuUnavailable
(one line naming the fix) where PyCUDA or a GPU is missing. Launches use the launch geometry
that the emitted source documents (config.geometry).
"""

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gemmgen.arch import DEFAULT_SMEM_LIMIT, MAX_GRID_Y, Arch, parse_arch
from gemmgen.config import KernelConfig
from gemmgen.errors import GemmgenError
from gemmgen.driver import MAP_BYTES, DriverError, DriverKernel, encode_tiled


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


# Launch shape of a family's <name>_pack kernel (grid-stride; base.cu.j2's launcher uses the same).
PACK_GRID, PACK_BLOCK = (1024, 1, 1), (256, 1, 1)


class LoadedKernel:
    """A compiled point, loaded from its cubin and ready to launch."""

    def __init__(self, gpu: Gpu, config: KernelConfig, cubin_path):
        drv = gpu.drv
        self.config = config
        geometry = config.geometry
        try:
            self.module = drv.module_from_file(str(cubin_path))
            self.function = self.module.get_function(config.name)
            if geometry.smem_bytes > DEFAULT_SMEM_LIMIT:
                self.function.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, geometry.smem_bytes)
        except drv.Error as err:
            raise LaunchFailed(f"cannot load {config.name}: {err}") from None
        self.function.prepare("iiifPPfPP")  # M, N, K, alpha, A, B, beta, C, workspace
        self._resident = gpu.info.sm_count  # blocks of a persistent grid that run at once
        self._tma_function = None  # kernels taking tensor maps (first) launch through the driver module
        if geometry.tma:
            maps = "mmm" if geometry.tma.box_c else "mm"  # A, B (and C, where the kernel stores C through TMA)
            try:
                self._tma_function = DriverKernel(cubin_path, config.name, maps + "iiifPPfPP", geometry.smem_bytes)
                if geometry.cluster > 1:
                    self._resident = geometry.cluster * self._tma_function.max_active_clusters(geometry.cluster,
                                                                                               geometry.block)
            except DriverError as err:
                raise LaunchFailed(f"cannot load {config.name}: {err}") from None
            if self._resident < geometry.cluster:
                raise LaunchFailed(f"cannot run {config.name}: not one cluster of {geometry.cluster} blocks fits")
        self._maps: dict[tuple, tuple[bytes, ...]] = {}  # (A, B, C, M, N, K, ...) -> tensor maps
        self.pack = None
        if geometry.pack_vec:
            try:
                self.pack = self.module.get_function(f"{config.name}_pack")
            except drv.Error as err:
                raise LaunchFailed(f"cannot load {config.name}_pack: {err}") from None
            self.pack.prepare("iiiPPP")  # M, N, K, A, B, workspace
        self._drv = drv
        self._packed = None  # packed copies of misaligned operands (Geometry.pack_plan), grown as needed
        self._packed_bytes = 0
        self._workspace = None  # split-K / stream-K counters and partials: zeroed once, grown as needed
        self._workspace_bytes = 0

    def workspace(self, m: int, n: int) -> int:
        """The device address of a zeroed workspace of config.geometry.workspace_bytes bytes for
        a launch at M x N, or 0 where the kernel needs none. Allocated once and grown when a larger
        shape needs more; the kernel leaves its split-K counters or stream-K flags zero, so it is
        reused without clearing (launches on one stream)."""
        g = self.config.geometry
        need = g.workspace_bytes(m, n, g.launch_grid(m, n, self._resident)[0])
        if need == 0:
            return 0
        return self._grown("_workspace", need, zero=True)

    def _packed_buffer(self, need: int) -> int:
        return self._grown("_packed", need, zero=False)

    def _grown(self, attr: str, need: int, zero: bool) -> int:
        """The address of the buffer kept in ``attr`` (its size in ``attr + "_bytes"``), replaced by
        a new one of ``need`` bytes (zeroed if asked) when it is smaller, once the launches queued
        with it are done. A failed allocation leaves no buffer behind."""
        if need > getattr(self, attr + "_bytes"):
            drv = self._drv
            try:
                if getattr(self, attr) is not None:
                    drv.Context.synchronize()
                    getattr(self, attr).free()
                    setattr(self, attr, None)
                    setattr(self, attr + "_bytes", 0)
                setattr(self, attr, drv.mem_alloc(need))
                if zero:
                    drv.memset_d32(getattr(self, attr), 0, need // 4)
            except drv.Error as err:
                raise LaunchFailed(f"cannot allocate the {need}-byte workspace of {self.config.name}: {err}") from None
            setattr(self, attr + "_bytes", need)
        return int(getattr(self, attr))

    def check_shape(self, m: int, n: int, k: int) -> None:
        """Raise ShapeRefused naming the constraint when the kernel cannot take M, N, K."""
        if min(m, n, k) < 1:
            raise ShapeRefused(f"M, N and K must be >= 1, got {m}x{n}x{k}")
        gy = self.config.geometry.grid(m, n)[1]
        if gy > MAX_GRID_Y and not self.config.geometry.persistent:
            raise ShapeRefused(f"M={m} needs {gy} blocks along y; at most {MAX_GRID_Y} "
                               f"(M <= {MAX_GRID_Y * self.config.geometry.tile_m})")

    def launch(self, m: int, n: int, k: int, alpha: float, a, b, beta: float, c) -> None:
        """Queue C = alpha * A @ B + beta * C on the default stream (a, b, c: device pointers), with
        the kernel's workspace (see :meth:`workspace`)."""
        self.check_shape(m, n, k)
        g = self.config.geometry
        workspace = self.workspace(m, n)
        a_bytes, b_bytes = g.pack_plan(m, n, k, int(a), int(b))
        packed = 0  # the packed copies: read through the tensor maps, or else through the workspace argument
        if a_bytes + b_bytes:
            packed = self._packed_buffer(a_bytes + b_bytes)
            try:
                self.pack.prepared_call(PACK_GRID, PACK_BLOCK, np.int32(m), np.int32(n), np.int32(k), int(a), int(b),
                                        packed)
            except self._drv.Error as err:
                raise LaunchFailed(f"launch of {self.config.name}_pack failed: {err}") from None
            if self._tma_function is None:
                workspace = packed  # no pack_vec family splits K
        grid = g.launch_grid(m, n, self._resident)
        if self._tma_function is not None:
            maps = self._tensor_maps(m, n, k, int(a), int(b), packed, (a_bytes, b_bytes), int(c),
                                     g.tma.stores_c(n, float(np.float32(beta)), int(c)))
            try:
                self._tma_function.launch(grid, g.block, *maps, m, n, k, alpha, int(a), int(b), beta, int(c), workspace)
            except DriverError as err:
                raise LaunchFailed(str(err)) from None
            return
        try:
            self.function.prepared_call(grid, g.block, np.int32(m), np.int32(n), np.int32(k), np.float32(alpha),
                                        int(a), int(b), np.float32(beta), int(c), workspace, shared_size=g.smem_bytes)
        except self._drv.Error as err:
            raise LaunchFailed(f"launch of {self.config.name} failed: {err}") from None

    def _tensor_maps(self, m: int, n: int, k: int, a: int, b: int, workspace: int, packed: tuple[int, int],
                     c: int, store_c: bool) -> tuple[bytes, ...]:
        """The tensor maps (Geometry.tma) for this launch: of A and B, over A and B or over their
        copies in ``workspace`` (the packed buffer) where ``packed`` (pack_plan's bytes of A's and
        B's copies) says they were made; then, for a kernel with ``tma.box_c``, of C: over C where ``store_c``
        (Tma.stores_c, the kernel's own test), else 128 zero bytes, which the kernel never reads.
        Kept per buffers and shape, so a timed launch does not re-encode them. Raises
        LaunchFailed where the driver refuses a map."""
        key = (a, b, c, m, n, k, workspace, store_c)
        if key not in self._maps:
            g, precision = self.config.geometry, self.config.precision
            kp, np_ = g.packed_ld(k), g.packed_ld(n)
            a_bytes, b_bytes = packed
            box_a, box_b = g.tma.box_a, g.tma.box_b
            try:
                map_a = (encode_tiled(precision, workspace, m, k, kp, box_a, "packed A") if a_bytes
                         else encode_tiled(precision, a, m, k, k, box_a, "A"))
                map_b = (encode_tiled(precision, workspace + a_bytes, k, n, np_, box_b, "packed B") if b_bytes
                         else encode_tiled(precision, b, k, n, n, box_b, "B"))
                maps = (map_a, map_b)
                if g.tma.box_c:
                    maps += (encode_tiled("fp32", c, m, n, n, g.tma.box_c, "C") if store_c else bytes(MAP_BYTES),)
            except DriverError as err:
                raise LaunchFailed(str(err)) from None
            if len(self._maps) >= 64:  # one entry per set of buffers and shape; drop stale ones
                self._maps.clear()
            self._maps[key] = maps
        return self._maps[key]


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int


def time_interleaved(gpu: Gpu, launches: Sequence[Callable[[], None]], before: Callable[[], None], *,
                     warmup: int = 3, min_runs: int = 10, max_runs: int = 500,
                     min_total_ms: float = 300.0) -> list[Timing]:
    """Time launches in alternation with a CUDA event pair around each run, after ``warmup``
    untimed rounds: one Timing per launch.

    ``before`` runs before every run, outside the events (gemmgen uses it to poison C and flush
    L2). Each round runs every launch once (``before`` ahead of each), in turn forward and backward,
    so that the clock and temperature drift of a long measurement falls on all of them alike and
    none always follows the same neighbour: the way to compare two kernels (a point and cuBLAS).
    Rounds continue until each launch has ``min_runs`` runs and the first has ``min_total_ms`` of
    kernel time, or ``max_runs``. Raises LaunchFailed if any run faults.
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
