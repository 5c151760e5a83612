"""Issue 32 on the GPU: FP8 e4m3 into bf16 C with block scales (scale=block: a scale per row of A
and 128 of K, one per 128 x 128 block of B -- DeepSeek-V3's recipe), hopper kernels against
torch._scaled_mm's block-scaled matmul (cuBLASLt's VEC128 / BLK128x128 scaling on Hopper) and
against cuBLASLt called directly (gemmgen.measure.cublaslt) in the same process, on the same
tensors: alternating, median after warm-up with the host's latency hidden, random data, L2 flushed
and C poisoned before every timed call. Every result is checked against the float64 product of
the exact fp8 values and scales first (gemmgen.describe.scaling expands the scales; the sums are
taken on the GPU), and each relative error is set beside torch's on the same inputs.

The scales are made once, in gemmgen's layout (which is torch's: scale_a (M, KB) with strides (1,
M), scale_b (KBP, ceil(N/128)) with strides (1, KBP)); torch._scaled_mm gets views of the same
memory. For each shape the table gives the best of a few candidate tiles (CANDIDATES), so it is a
tuned figure, not a dispatcher's; bf16 F.linear on the same (dequantized) operands is timed too
(the issue's fallback bar: 1.6x bf16 at the big shapes).
usage: python benchmarks/fp8_block.py OUT.json [MxNxK ...] (needs an H100/H200, torch and nvcc)"""
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F
from alternate import Alternate, checked_plans, device_verdict

from gemmgen.build.nvcc import build_kernel
from gemmgen.describe import scaling
from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape, Variant, parse_shape
from gemmgen.measure.cublaslt import CublasLt
from gemmgen.measure.launcher import Launcher

VARIANT = {"trans": "nt", "out": "bf16", "scale": "block", "promote": 1}
CANDIDATES = [
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "streamk": 1},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "cluster": 2},
    {"BM": 64, "BN": 128, "consumers": 2, "stages": 8, "swizzle": 8, "schedule": "pingpong"},
    {"BM": 64, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "swap": 1},
    {"BM": 64, "BN": 128, "consumers": 1, "stages": 8, "swizzle": 8, "streamk": 1},
    {"BM": 32, "BN": 256, "consumers": 2, "stages": 6, "swizzle": 8, "swap": 1, "streamk": 1},
]
LLAMA3_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # qkv, o, gate/up, down: N x K
SHAPES = [Shape(4096, 4096, 4096), Shape(8192, 8192, 8192),
          *(Shape(m, n, k) for m in (128, 777, 2048, 4096) for n, k in LLAMA3_8B)]


def build_all() -> list:
    """(name, Launcher) of every candidate, built in parallel."""
    configs = [make_config("hopper", {**params, **VARIANT}, "e4m3", "sm_90a") for params in CANDIDATES]
    with ThreadPoolExecutor(16) as pool:
        built = list(pool.map(build_kernel, configs))
    for b in built:
        assert b.ok, b.log
    return [(c.name, Launcher(b.library)) for c, b in zip(configs, built)]


def expanded(sa, sb, s, dev):
    """The scale of every element of A (M x K) and of W (N x K, B stored transposed), float64 on
    the GPU, by gemmgen.describe.scaling's rule."""
    (d0, m0), (d1, m1) = scaling.index_terms("block", "a", s.m, s.n, s.k)
    ia = (torch.arange(s.m, device=dev) // d0 * m0)[:, None] + (torch.arange(s.k, device=dev) // d1 * m1)[None, :]
    (e0, n0), (e1, n1) = scaling.index_terms("block", "b", s.m, s.n, s.k)  # over B's (k, j)
    ib = (torch.arange(s.n, device=dev) // e1 * n1)[:, None] + (torch.arange(s.k, device=dev) // e0 * n0)[None, :]
    return sa.double()[ia], sb.double()[ib]


def fp8_operands(scale: str, s, dev, gen):
    """(a, w, (scale_a, scale_b), a64, w64) at shape ``s``: e4m3 A (M x K) and W (B stored N x K),
    uniform in (-1, 1), drawn from ``gen``; fp32 scales in [0.25, 4) of ``scale`` ("tensor": one
    value each; "block": as torch._scaled_mm takes them, (M, KB) and (KBP, NB) column-major views
    of gemmgen's buffers, so the same memory serves both); and A and W in float64 times their
    scales (gemmgen.describe.scaling's rule), from which the reference is made."""
    a = (torch.rand(s.m, s.k, device=dev, generator=gen) * 2 - 1).to(torch.float8_e4m3fn)
    w = (torch.rand(s.n, s.k, device=dev, generator=gen) * 2 - 1).to(torch.float8_e4m3fn)
    len_a, len_b = scaling.lengths(scale, s.m, s.n, s.k)
    sa = torch.rand(len_a, device=dev, generator=gen) * 3.75 + 0.25
    sb = torch.rand(len_b, device=dev, generator=gen) * 3.75 + 0.25
    if scale == "block":
        big_a, big_w = expanded(sa, sb, s, dev)
        kb, kbp, nb = scaling.blocks(s.k), scaling.k_blocks_padded(s.k), scaling.blocks(s.n)
        sa, sb = sa.view(kb, s.m).t(), sb.view(nb, kbp).t()
    elif scale == "tensor":
        big_a, big_w = sa.double(), sb.double()
    else:
        raise ValueError(f"scale={scale}: the FP8 benchmarks compare tensor and block scales with torch._scaled_mm")
    return a, w, (sa, sb), a.double() * big_a, w.double() * big_w


def main():
    out_path = sys.argv[1]
    shapes = [parse_shape(s) for s in sys.argv[2:]] or SHAPES
    dev = torch.device("cuda:0")
    timed = Alternate(dev).timed_gpu
    kernels = build_all()
    lt = CublasLt()
    variant = Variant("nt", "bf16", scale="block")
    gen = torch.Generator(device=dev).manual_seed(32)
    rows, summary = [], []
    for index, s in enumerate([shapes[0], *shapes]):  # the first shape twice: torch warms up over seconds
        warming = index == 0
        a, w, (ts_a, ts_b), a64, w64 = fp8_operands("block", s, dev, gen)
        c = torch.empty(s.m, s.n, device=dev, dtype=torch.bfloat16)
        ref, bound = a64 @ w64.T, a64.abs() @ w64.abs().T
        a16, w16 = a64.to(torch.bfloat16), w64.to(torch.bfloat16)  # bf16 F.linear on the same values
        del a64, w64

        def check(got):
            return device_verdict(got, ref, bound, "e4m3", s.k, "bf16")

        def scaled_mm():
            return torch._scaled_mm(a, w.t(), ts_a, ts_b, out_dtype=torch.bfloat16)

        names, fns, errors = [], [], []
        try:
            v = check(scaled_mm())
            assert v.ok, f"torch._scaled_mm's block-scaled result at {s}: {v.message}"
            names.append("torch"), fns.append((lambda: None, scaled_mm)), errors.append(v.rel_error)
        except RuntimeError as e:  # torch without block scales here: say so, time the others
            print(f"torch._scaled_mm refused block scales at {s}: {str(e).splitlines()[0]}", flush=True)
        stream = torch.cuda.current_stream().cuda_stream
        scales = (ts_a.data_ptr(), ts_b.data_ptr())  # views of gemmgen's buffers, from their first element

        def cublaslt():
            lt.gemm("e4m3", s.m, s.n, s.k, 1.0, a.data_ptr(), w.data_ptr(), 0.0, c.data_ptr(), variant, scales=scales)

        try:
            c.fill_(float("nan"))
            cublaslt()
            v = check(c)
            assert v.ok, f"cuBLASLt's block-scaled result at {s}: {v.message}"
            names.append("cublaslt"), fns.append((lambda: c.fill_(float("nan")), cublaslt)), errors.append(v.rel_error)
        except Exception as e:  # CublasError: no algorithm
            print(f"cuBLASLt: {e}", flush=True)
        names.append("bf16 F.linear"), fns.append((lambda: None, lambda: F.linear(a16, w16))), errors.append(0.0)
        more = checked_plans(kernels, s, a, w, c, stream, scales, check)
        names, fns, errors, plans = names + more[0], fns + more[1], errors + more[2], more[3]
        times = timed(fns, rounds=30)
        for plan in plans:
            plan.close()
        if warming:
            continue
        base = dict(zip(names, times))
        base_err = dict(zip(names, errors))
        ours = [(n, t, e) for n, t, e in zip(names, times, errors) if n.startswith("hopper")]
        best = min(ours, key=lambda x: x[1])
        ref_err = base_err.get("torch", base_err.get("cublaslt"))
        for name, ms, err in zip(names, times, errors):
            rows.append({"shape": str(s), "kernel": name, "ms": ms, "tflops": s.flops / (ms * 1e-3) / 1e12,
                         "rel_err": err})
        summary.append({"shape": str(s), "best": best[0], "best_tflops": s.flops / (best[1] * 1e-3) / 1e12,
                        "vs_torch": base["torch"] / best[1] if "torch" in base else None,
                        "vs_cublaslt": base["cublaslt"] / best[1] if "cublaslt" in base else None,
                        "vs_bf16": base["bf16 F.linear"] / best[1],
                        "err_x": best[2] / ref_err if ref_err else None,
                        "torch_err": base_err.get("torch"), "cublaslt_err": base_err.get("cublaslt")})
        print(json.dumps(summary[-1]), flush=True)
    json.dump({"rows": rows, "summary": summary}, open(out_path, "w"), indent=1)

    def fmt(x, spec="6.3f"):
        return format(x, spec) if x is not None else "  -   "

    print(f"{'shape':>16} {'TFLOP/s':>7} {'x torch':>7} {'x Lt':>6} {'x bf16':>6} {'err x':>6}  best kernel")
    for r in summary:
        print(f"{r['shape']:>16} {r['best_tflops']:7.0f} {fmt(r['vs_torch'], '7.3f')} {fmt(r['vs_cublaslt'])} "
              f"{r['vs_bf16']:6.3f} {fmt(r['err_x'], '6.2f')}  {r['best'].replace('hopper_', '')}")
    for key in ("vs_torch", "vs_cublaslt", "vs_bf16"):
        got = [r[key] for r in summary if r[key] is not None]
        if got:
            print(f"geomean {key} over {len(got)} shapes: {float(np.exp(np.mean(np.log(got)))):.3f}")


if __name__ == "__main__":
    main()
