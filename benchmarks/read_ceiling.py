"""Issue 16's HBM bar: how fast can one launch, timed as bench times it (CUDA events, L2 flushed
before each run), read the bytes of 16x4096x4096 fp16 (A, B; and C written once)? A grid-stride
read of the same bytes (templates/flush.cu's sweep) at several grid sizes, and an empty launch."""
import sys
from gemmgen.describe.problem import Shape
from gemmgen.measure.device import Gpu
from gemmgen.measure.l2flush import L2Flush
from gemmgen.measure.timing import time_interleaved
from pycuda.compiler import SourceModule

gpu = Gpu(0)
drv, info = gpu.drv, gpu.info
peak = info.peak_bandwidth
flush = L2Flush(gpu)
mod = SourceModule("""
extern "C" __global__ void empty() {}
extern "C" __global__ void sweep(const uint4* p, long long n, unsigned* sink) {
    unsigned acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;
}""", no_extern_c=True)
empty, sweep = mod.get_function("empty"), mod.get_function("sweep")
sweep.prepare("PqP")
sink = drv.mem_alloc(4)
print(f"GPU {info.name}, {info.sm_count} SMs, peak {peak/1e9:.0f} GB/s")
for shape in (Shape(16, 4096, 4096), Shape(16, 8192, 8192)):
    nbytes = shape.bytes_moved(2)
    buf = drv.mem_alloc(nbytes)
    drv.memset_d8(buf, 0, nbytes)
    launches, labels = [], []
    for blocks_per_sm in (1, 2, 4, 8, 16):
        grid = (blocks_per_sm * info.sm_count, 1, 1)
        launches.append(lambda g=grid: sweep.prepared_call(g, (512, 1, 1), buf, nbytes // 16, sink))
        labels.append(f"read {nbytes/1e6:.1f} MB, {blocks_per_sm} x 512 threads/SM")
    launches.append(lambda: empty(block=(32, 1, 1), grid=(1, 1)))
    labels.append("empty launch")
    timings = time_interleaved(gpu, launches, flush, min_runs=50, min_total_ms=100)
    for label, t in zip(labels, timings):
        us = t.median_ms * 1e3
        bw = nbytes / (t.median_ms * 1e-3)
        print(f"{str(shape):>16}  {label:<34} {us:8.2f} us  {bw/1e9:7.0f} GB/s  {100*bw/peak:5.1f}% HBM"
              + ("" if "read" in label else "  (time only)"))
    buf.free()
sink.free()
flush.free()
del empty, sweep, mod  # unload the module while its context is current
gpu.close()
