// ---- gemmgen's float64 reference with the epilogue, and the statistics of C against it ----
// One source for the GPU check (templates/check.cu, run by gemmgen/measure/gpucheck.py) and the harness's
// main() (templates/harness.cuh.j2); needs the variant's codes (vocab.cuh.j2) and cuda_fp16.h and
// cuda_bf16.h (at file scope: the harness includes this in a namespace) before it. The rule
// is gemmgen/measure/verify.py's (host_reference, epilogue, host_stats), which the host checks use: from
// the exact products prod = A @ B and absprod = |A| @ |B| in float64,
//   ref   = act(alpha * prod + beta * C0 + bias)
//   scale = |alpha| * absprod + |beta * C0| + |bias|
// and an element of C passes where it is finite and |C - ref| <= elem_tol * scale; the normwise
// check over the sums below is the caller's (verify.judge; the harness's gg_check).

// An element of A, B, C or the bias as a double, exactly.
__host__ __device__ inline double gg_ref_value(float x) { return x; }
__host__ __device__ inline double gg_ref_value(__half x) { return __half2float(x); }
__host__ __device__ inline double gg_ref_value(__nv_bfloat16 x) { return __bfloat162float(x); }
#ifdef __CUDA_FP8_TYPES_EXIST__  // cuda_fp8.h is included where an operand is FP8
__host__ __device__ inline double gg_ref_value(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
__host__ __device__ inline double gg_ref_value(__nv_fp8_e5m2 x) { return static_cast<float>(x); }
#endif

// The activation `act` (a gg_act code) in float64, as verify.py's activation: gelu is the tanh
// approximation (torch's gelu(approximate="tanh")).
__host__ __device__ inline double gg_ref_activation(double x, int act)
{
    if (act == GG_ACT_RELU)
        return x < 0.0 ? 0.0 : x;
    if (act == GG_ACT_GELU)
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));  // sqrt(2 / pi)
    if (act == GG_ACT_SILU)
        return x / (1.0 + exp(-x));
    return x;
}

struct gg_ref_expected {
    double ref, scale;
};

// ref and scale of one element of C: prod and absprod its products, beta_c0 = beta * C0[i][j]
// (0 where beta == 0: C0 is then not read), b its bias value (0 without a bias), act a gg_act code.
__host__ __device__ inline gg_ref_expected gg_ref_element(double alpha, double prod, double absprod, double beta_c0,
                                                          double b, int act)
{
    return {gg_ref_activation(alpha * prod + beta_c0 + b, act), fabs(alpha) * absprod + fabs(beta_c0) + fabs(b)};
}

// What the checks need of C against the reference (verify.py's Stats): sums over the finite
// elements of (C - ref)^2, ref^2 and scale^2; the elements over the elementwise bound and the
// NaN/Inf ones; the first element that fails either way (~0: none); the largest |C - ref| / bound.
struct gg_ref_stats {
    double err2 = 0.0, ref2 = 0.0, scale2 = 0.0, worst = 0.0;
    unsigned long long bad = 0, nonfinite = 0, first = ~0ull;
};

// Counts element i of C, of value c, against its reference e, with the elementwise tolerance
// elem_tol (gemmgen/describe/tolerance.py's elementwise_tolerance at the product's K).
__host__ __device__ inline void gg_ref_count(gg_ref_stats& s, unsigned long long i, double c, gg_ref_expected e,
                                             double elem_tol)
{
    if (!isfinite(c)) {
        ++s.nonfinite;
        s.first = i < s.first ? i : s.first;
        return;
    }
    const double err = fabs(c - e.ref), bound = elem_tol * e.scale;
    s.err2 += err * err, s.ref2 += e.ref * e.ref, s.scale2 += e.scale * e.scale;
    if (err > bound) {
        ++s.bad;
        s.first = i < s.first ? i : s.first;
    }
    s.worst = fmax(s.worst, bound > 0.0 ? err / bound : (err > 0.0 ? INFINITY : 0.0));
}
