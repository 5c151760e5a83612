"""The L2 flush between timed runs: every timed run starts with its operands out of L2 and with no
dirty lines of anyone else's there, and with the GPU held long enough after the flush that the
host has queued the timed call before the GPU reaches the start event (templates/flush.cu says
how). Needs a GPU."""

from gemmgen.paths import templates_dir

THREADS = 256
HOLD_US = 100.0  # well above one call's host time through PyCUDA or ctypes (5-30 us), on a busy CPU too


class L2Flush:
    """A zeroed buffer of twice ``gpu``'s L2, read in full by each call (on the current stream,
    asynchronously), then ``hold_us`` microseconds of one thread waiting (0: none)."""

    def __init__(self, gpu, hold_us: float = HOLD_US):
        from pycuda.compiler import SourceModule

        drv, info = gpu.drv, gpu.info
        self.bytes = 2 * info.l2_bytes // 16 * 16
        self.buffer = drv.mem_alloc(self.bytes)
        self.sink = drv.mem_alloc(4)
        drv.memset_d8(self.buffer, 0, self.bytes)
        self._module = SourceModule((templates_dir() / "flush.cu").read_text(), no_extern_c=True)
        self._sweep = self._module.get_function("gg_read_sweep")
        self._sweep.prepare("PqP")
        self._hold = self._module.get_function("gg_hold")
        self._hold.prepare("Q")
        self.hold_ns = int(hold_us * 1000)
        self._grid = (4 * info.sm_count, 1, 1)

    def __call__(self) -> None:
        self._sweep.prepared_call(self._grid, (THREADS, 1, 1), self.buffer, self.bytes // 16, self.sink)
        if self.hold_ns:
            self._hold.prepared_call((1, 1, 1), (1, 1, 1), self.hold_ns)

    def free(self) -> None:
        self.buffer.free()
        self.sink.free()
