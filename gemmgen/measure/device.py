"""The GPU through PyCUDA: a device's primary context (:class:`Gpu`), its facts
(:class:`DeviceInfo`: name, architecture, SMs, clocks, L2, the memory's peak bandwidth), how many
devices there are, and the errors of the driver. The context is the one the CUDA runtime (so
cuBLAS and the emitted launchers) uses.

Importing this module needs no GPU; constructing :class:`Gpu` does, and raises GpuUnavailable
(one line naming the fix) where PyCUDA or a GPU is missing.
"""

import shutil
import subprocess
from dataclasses import dataclass

from gemmgen.describe.arch import Arch, parse_arch
from gemmgen.errors import GemmgenError


class GpuUnavailable(GemmgenError):
    """No GPU can be used here: PyCUDA missing, no driver, or no device."""


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
