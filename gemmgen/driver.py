"""CUDA driver calls that PyCUDA does not offer, made through ctypes on libcuda: tensor maps for
TMA kernels, and launches of kernels that take them.

PyCUDA does not wrap ``cuTensorMapEncodeTiled``. Nor can it launch a kernel that takes a
``__grid_constant__ CUtensorMap``: it passes parameters as one packed buffer
(CU_LAUNCH_PARAM_BUFFER_POINTER), and on the H100 with CUDA 13.0 such a kernel then reads every
parameter as zero (measured: M = N = K = 0, C = null), while the same bytes given as
``kernelParams`` (one pointer per parameter) arrive intact. :class:`DriverKernel` launches that
way. The calls run in the current context, PyCUDA's, so memory, stream and events are shared.
Importing this module needs no GPU.
"""

import ctypes
from functools import lru_cache

from gemmgen.errors import GemmgenError

# CUtensorMapDataType values (cuda.h); tf32 kernels read fp32 bits, so tf32 maps are FLOAT32.
DATA_TYPE = {"fp16": 6, "tf32": 7, "fp32": 7, "bf16": 9}
ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "tf32": 4, "fp32": 4}
_SWIZZLE_128B, _L2_PROMOTION_256B = 3, 3
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute
MAP_BYTES = 128


class DriverError(GemmgenError):
    """A driver call failed (the message names the call, its object and the driver's error)."""


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


@lru_cache(maxsize=1)
def _libcuda():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise DriverError(f"cannot load the CUDA driver library libcuda.so.1 ({err})") from None
    u64p, u32p, vp = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p
    lib.cuTensorMapEncodeTiled.argtypes = [vp, ctypes.c_int, ctypes.c_uint32, vp, u64p, u64p, u32p, u32p,
                                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuModuleLoad.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
    lib.cuModuleUnload.argtypes = [vp]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
    lib.cuFuncSetAttribute.argtypes = [vp, ctypes.c_int, ctypes.c_int]
    lib.cuLaunchKernel.argtypes = [vp, *[ctypes.c_uint] * 7, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
    lib.cuOccupancyMaxActiveClusters.argtypes = [ctypes.POINTER(ctypes.c_int), vp, ctypes.POINTER(_LaunchConfig)]
    return lib


def _check(res: int, what: str) -> None:
    """Raise DriverError for a failed driver call ``what`` (its CUresult ``res``)."""
    if res != 0:
        text = ctypes.c_char_p()
        _libcuda().cuGetErrorName(res, ctypes.byref(text))
        raise DriverError(f"{what}: {(text.value or b'CUresult %d' % res).decode()}")


def encode_tiled(precision: str, address: int, rows: int, cols: int, ld: int, box: tuple[int, int],
                 what: str = "matrix") -> bytes:
    """The 128-byte tensor map of a row-major ``rows x cols`` matrix at device ``address`` with
    leading dimension ``ld`` elements, loading boxes of ``box`` = (inner, outer) elements
    (columns, rows) into 128-byte-swizzled shared memory, zeros outside the matrix.

    The driver needs ``address`` and ``ld * element size`` to be multiples of 16 bytes (the
    callers pack operands that are not). Raises DriverError with the driver's error name.
    """
    lib = _libcuda()
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(ld * ELEMENT_BYTES[precision])
    box_dims = (ctypes.c_uint32 * 2)(*box)
    steps = (ctypes.c_uint32 * 2)(1, 1)
    out = ctypes.create_string_buffer(MAP_BYTES + 64)
    aligned = -(-ctypes.addressof(out) // 64) * 64  # CUtensorMap is 64-byte aligned
    res = lib.cuTensorMapEncodeTiled(aligned, DATA_TYPE[precision], 2, address, dims, strides, box_dims, steps, 0,
                                     _SWIZZLE_128B, _L2_PROMOTION_256B, 0)
    _check(res, f"cuTensorMapEncodeTiled refused the map of {what} ({rows} x {cols}, ld {ld}, at 0x{address:x}, "
                f"box {box[1]} x {box[0]})")
    return ctypes.string_at(aligned, MAP_BYTES)


class _TensorMap(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * MAP_BYTES)]


# ctypes type of each parameter kind, by PyCUDA's prepare letters; "m" is a 128-byte tensor map.
_PARAM_TYPES = {"i": ctypes.c_int32, "f": ctypes.c_float, "P": ctypes.c_void_p, "m": _TensorMap}


class DriverKernel:
    """A kernel of a cubin, loaded and launched through the driver with one pointer per parameter.

    ``signature`` gives the parameters' kinds in order: ``m`` tensor map (128 bytes), ``i`` int32,
    ``f`` float, ``P`` pointer. Needs a current context; raises DriverError where a call fails.
    """

    def __init__(self, cubin_path, name: str, signature: str, smem_bytes: int):
        lib = _libcuda()
        self._lib, self.name, self._types = lib, name, [_PARAM_TYPES[c] for c in signature]
        self._module, self._function = ctypes.c_void_p(), ctypes.c_void_p()
        _check(lib.cuModuleLoad(ctypes.byref(self._module), str(cubin_path).encode()), f"cuModuleLoad of {name}")
        _check(lib.cuModuleGetFunction(ctypes.byref(self._function), self._module, name.encode()),
               f"cuModuleGetFunction of {name}")
        self.smem_bytes = smem_bytes
        _check(lib.cuFuncSetAttribute(self._function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
               f"setting {name}'s dynamic shared memory to {smem_bytes} bytes")

    def max_active_clusters(self, cluster: int, block: tuple[int, int, int]) -> int:
        """How many clusters of ``cluster`` blocks (the kernel's __cluster_dims__) can run at once on
        the device: fewer than SMs / cluster where the SMs of a GPC do not divide evenly."""
        config = _LaunchConfig((cluster, 1, 1), block, self.smem_bytes, None, None, 0)
        count = ctypes.c_int()
        _check(self._lib.cuOccupancyMaxActiveClusters(ctypes.byref(count), self._function, ctypes.byref(config)),
               f"cuOccupancyMaxActiveClusters of {self.name}")
        return count.value

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], *args) -> None:
        """Queue the kernel on the default stream with ``args`` (bytes for tensor maps, ints for
        int32 and pointers, floats)."""
        values = [t.from_buffer_copy(a) if t is _TensorMap else t(a) for t, a in zip(self._types, args, strict=True)]
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        _check(self._lib.cuLaunchKernel(self._function, *grid, *block, self.smem_bytes, None, pointers, None),
               f"launch of {self.name}")

    def __del__(self):
        if getattr(self, "_module", None) and self._module.value:
            self._lib.cuModuleUnload(self._module)  # a failure (context gone at exit) changes nothing

