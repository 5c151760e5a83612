// gemmgen's verification on the GPU (gemmgen/gpucheck.py): the float64 inputs of the reference
// product, and the statistics of a result C against it, as gemmgen/verify.py's host_stats
// computes them: only a few numbers leave the GPU.
#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {

// x[i] as a float (exactly), for x of fp32, fp16 or bf16 (kind 0, 1, 2; bf16 as raw bits).
__device__ float gg_element(const void* x, int kind, long long i)
{
    if (kind == 0)
        return static_cast<const float*>(x)[i];
    if (kind == 1)
        return __half2float(static_cast<const __half*>(x)[i]);
    return __uint_as_float((unsigned)static_cast<const unsigned short*>(x)[i] << 16);
}

// y[i] = x[i] (or |x[i]|) in float64, for x of fp32, fp16 or bf16 (kind 0, 1, 2; as raw bits).
__global__ void gg_to_f64(const void* x, int kind, double* y, long long n, int absolute)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const double v = gg_element(x, kind, i);
        y[i] = absolute ? fabs(v) : v;
    }
}

// The activations of gemmgen.problem.ACTIVATIONS (0 none, 1 relu, 2 gelu with tanh, 3 silu), in
// float64: the reference's, as gemmgen/verify.py's activation.
__device__ double gg_activation(double x, int act)
{
    if (act == 1)
        return x < 0.0 ? 0.0 : x;
    if (act == 2)
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    if (act == 3)
        return x / (1.0 + exp(-x));
    return x;
}

// out: [0..2] the sums over finite elements of (C - ref)^2, ref^2, scale^2 (doubles); then as
// unsigned 64-bit words [3] elements over the elementwise bound, [4] NaN/Inf elements, [5] the
// first failing element (out[5] starts at ~0), [6] the largest |C - ref| / bound as the bits of a
// non-negative double (starts at 0). ref = alpha * prod + beta * c0 and scale = |alpha| * absprod
// + |beta * c0|, with c0 not read where beta == 0. C and C0 are of C's type (c_kind, as above).
// With an epilogue, ref = act(x + bias) for that x, and scale gains |bias|: bias (C's type) holds
// a value per row (bias_mode 1) or per column (2; columns: the row length of C) or is not read (0).
__global__ void gg_compare(const void* c, int c_kind, const double* prod, const double* absprod, const void* c0,
                           double alpha, double beta, double elem_tol, long long n, double* out,
                           const void* bias, int bias_mode, long long columns, int act)
{
    double err2 = 0.0, ref2 = 0.0, scale2 = 0.0, worst = 0.0;
    unsigned long long bad = 0, nonfinite = 0, first = ~0ull;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const double c0i = beta != 0.0 ? beta * (double)gg_element(c0, c_kind, i) : 0.0;
        const double b = bias_mode == 0 ? 0.0 : (double)gg_element(bias, c_kind, bias_mode == 1 ? i / columns : i % columns);
        const double ref = gg_activation(alpha * prod[i] + c0i + b, act);
        const double scale = fabs(alpha) * absprod[i] + fabs(c0i) + fabs(b);
        const float ci = gg_element(c, c_kind, i);
        if (!isfinite(ci)) {
            ++nonfinite;
            first = min(first, (unsigned long long)i);
            continue;
        }
        const double err = fabs((double)ci - ref), bound = elem_tol * scale;
        err2 += err * err, ref2 += ref * ref, scale2 += scale * scale;
        if (err > bound) {
            ++bad;
            first = min(first, (unsigned long long)i);
        }
        worst = fmax(worst, bound > 0.0 ? err / bound : (err > 0.0 ? INFINITY : 0.0));
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        err2 += __shfl_down_sync(0xffffffffu, err2, offset);
        ref2 += __shfl_down_sync(0xffffffffu, ref2, offset);
        scale2 += __shfl_down_sync(0xffffffffu, scale2, offset);
        bad += __shfl_down_sync(0xffffffffu, bad, offset);
        nonfinite += __shfl_down_sync(0xffffffffu, nonfinite, offset);
        first = min(first, __shfl_down_sync(0xffffffffu, first, offset));
        worst = fmax(worst, __shfl_down_sync(0xffffffffu, worst, offset));
    }
    if (threadIdx.x % 32 == 0) {
        unsigned long long* words = reinterpret_cast<unsigned long long*>(out);
        atomicAdd(out, err2), atomicAdd(out + 1, ref2), atomicAdd(out + 2, scale2);
        atomicAdd(words + 3, bad), atomicAdd(words + 4, nonfinite), atomicMin(words + 5, first);
        atomicMax(words + 6, (unsigned long long)__double_as_longlong(worst));  // non-negative: bits order as values
    }
}

}  // extern "C"
