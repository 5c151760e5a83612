// gemmgen's verification on the GPU (gemmgen/measure/gpucheck.py renders this file: Jinja includes the
// variant's codes and the float64 reference the harness uses too): the float64 inputs of the
// reference product, and the statistics of a result C against it, as gemmgen/measure/verify.py's
// host_stats computes them: only a few numbers leave the GPU.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

{% include "vocab.cuh.j2" %}

{% include "reference.cuh" %}

extern "C" {

// x[i] as a double (exactly), for x of fp32, fp16 or bf16 (kind: a gg_type code; tf32 inputs are
// fp32's) or, for A and B only, FP8 E4M3 or E5M2 (kind: GG_IN_E4M3 or GG_IN_E5M2, dtypes' check_kind).
constexpr int GG_IN_E4M3 = {{ e4m3_kind }};
constexpr int GG_IN_E5M2 = {{ e5m2_kind }};
__device__ double gg_element(const void* x, int kind, long long i)
{
    if (kind == GG_TYPE_FP16)
        return gg_ref_value(static_cast<const __half*>(x)[i]);
    if (kind == GG_TYPE_BF16)
        return gg_ref_value(static_cast<const __nv_bfloat16*>(x)[i]);
    if (kind == GG_IN_E4M3)
        return gg_ref_value(static_cast<const __nv_fp8_e4m3*>(x)[i]);
    if (kind == GG_IN_E5M2)
        return gg_ref_value(static_cast<const __nv_fp8_e5m2*>(x)[i]);
    return gg_ref_value(static_cast<const float*>(x)[i]);
}

// y[i] = x[i] (or |x[i]|) in float64, for x of any kind gg_element reads, times the fp32
// scale[(row / rdiv) * rmul + (col / cdiv) * cmul] where scale is not null, for element i at (row,
// col) of x stored row-major with `cols` columns (FP8's scale of that element of A or B:
// gemmgen/describe/scaling.py's stored_terms; the product of float64 copies so scaled is the scaled
// product, exactly).
__global__ void gg_to_f64(const void* x, int kind, double* y, long long n, int absolute, const float* scale,
                          long long cols, long long rdiv, long long rmul, long long cdiv, long long cmul)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / cols, col = i % cols;
        const double v = gg_element(x, kind, i) * (scale != nullptr ? (double)scale[row / rdiv * rmul + col / cdiv * cmul] : 1.0);
        y[i] = absolute ? fabs(v) : v;
    }
}

// out: gg_ref_stats of C against the reference (reference.cuh), summed over the grid: [0..2]
// err2, ref2, scale2 (doubles); then as unsigned 64-bit words [3] bad, [4] nonfinite, [5] first
// (out[5] starts at ~0), [6] worst as the bits of a non-negative double (starts at 0). C and C0
// are of C's type (c_kind, a gg_type code), C0 not read where beta == 0; bias (C's type too) holds
// a value per row (bias_mode GG_BIAS_ROW) or per column (GG_BIAS_COL; columns: the row length of
// C), or is not read (GG_BIAS_NONE); act is a gg_act code.
__global__ void gg_compare(const void* c, int c_kind, const double* prod, const double* absprod, const void* c0,
                           double alpha, double beta, double elem_tol, long long n, double* out,
                           const void* bias, int bias_mode, long long columns, int act)
{
    gg_ref_stats s;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const double beta_c0 = beta != 0.0 ? beta * gg_element(c0, c_kind, i) : 0.0;
        const double b = bias_mode == GG_BIAS_NONE ? 0.0
                         : gg_element(bias, c_kind, bias_mode == GG_BIAS_ROW ? i / columns : i % columns);
        gg_ref_count(s, i, gg_element(c, c_kind, i), gg_ref_element(alpha, prod[i], absprod[i], beta_c0, b, act),
                     elem_tol);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        s.err2 += __shfl_down_sync(0xffffffffu, s.err2, offset);
        s.ref2 += __shfl_down_sync(0xffffffffu, s.ref2, offset);
        s.scale2 += __shfl_down_sync(0xffffffffu, s.scale2, offset);
        s.bad += __shfl_down_sync(0xffffffffu, s.bad, offset);
        s.nonfinite += __shfl_down_sync(0xffffffffu, s.nonfinite, offset);
        s.first = min(s.first, __shfl_down_sync(0xffffffffu, s.first, offset));
        s.worst = fmax(s.worst, __shfl_down_sync(0xffffffffu, s.worst, offset));
    }
    if (threadIdx.x % 32 == 0) {
        unsigned long long* words = reinterpret_cast<unsigned long long*>(out);
        atomicAdd(out, s.err2), atomicAdd(out + 1, s.ref2), atomicAdd(out + 2, s.scale2);
        atomicAdd(words + 3, s.bad), atomicAdd(words + 4, s.nonfinite), atomicMin(words + 5, s.first);
        atomicMax(words + 6, (unsigned long long)__double_as_longlong(s.worst));  // non-negative: bits order as values
    }
}

}  // extern "C"
