"""The L2 flush between timed runs: every timed run starts with its operands out of L2 and with no
dirty lines of anyone else's there (templates/flush.cu says how). Needs a GPU."""

from gemmgen.paths import templates_dir

THREADS = 256


class L2Flush:
    """A zeroed buffer of twice ``gpu``'s L2, read in full by each call (on the current stream,
    asynchronously)."""

    def __init__(self, gpu):
        from pycuda.compiler import SourceModule

        drv, info = gpu.drv, gpu.info
        self.bytes = 2 * info.l2_bytes // 16 * 16
        self.buffer = drv.mem_alloc(self.bytes)
        self.sink = drv.mem_alloc(4)
        drv.memset_d8(self.buffer, 0, self.bytes)
        self._module = SourceModule((templates_dir() / "flush.cu").read_text(), no_extern_c=True)
        self._sweep = self._module.get_function("gg_read_sweep")
        self._sweep.prepare("PqP")
        self._grid = (4 * info.sm_count, 1, 1)

    def __call__(self) -> None:
        self._sweep.prepared_call(self._grid, (THREADS, 1, 1), self.buffer, self.bytes // 16, self.sink)

    def free(self) -> None:
        self.buffer.free()
        self.sink.free()
