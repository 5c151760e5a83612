"""Issue 32 on the GPU: FP8 e4m3 into bf16 C with per-tensor (scale=tensor) and row-wise
(scale=row) scales, hopper kernels against torch._scaled_mm (cuBLASLt per-tensor; a CUTLASS kernel
row-wise) in the same process, on the same tensors: alternating, median after warm-up, random
data, L2 flushed and C poisoned before every timed call. torch's default accumulates with
promotion (use_fast_accum=False); its fast-accumulation mode is timed too. Every result is checked
against the float64 product of the exact fp8 values and scales first (gemmgen.measure.verify's
rule, its sums taken on the GPU),
and each relative error is set beside torch's on the same inputs.

For each shape the table gives the named point hopper_e4m3's parameters and the best of a few
candidate tiles (CANDIDATES) with fast accumulation (promote=0) and with promotion (promote > 0),
so it is a tuned figure, not a dispatcher's.
usage: python benchmarks/fp8_scaled.py OUT.json [MxNxK ...] (needs an H100/H200, torch and nvcc)"""
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from alternate import Alternate, checked_plans, device_verdict

from gemmgen.build.nvcc import build_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.describe.problem import Shape, parse_shape
from gemmgen.measure.launcher import Launcher

VARIANT = {"trans": "nt", "out": "bf16"}
NAMED = {k: v for k, v in NAMED_POINTS["hopper_e4m3"].params.items() if v != FAMILIES["hopper"].defaults[k]}
CANDIDATES = [
    NAMED,
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "overlap": 1},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "streamk": 1},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "schedule": "pingpong"},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "streamk": 1},
    {"BM": 256, "BN": 128, "consumers": 2, "stages": 4, "swizzle": 8, "cluster": 2},
    {"BM": 64, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "swap": 1},
    {"BM": 48, "BN": 128, "consumers": 1, "stages": 6, "swizzle": 8, "cluster": 2, "streamk": 1, "swap": 1},
    # promoted: an interval's sums added in fp32 (accuracy as torch's default); 64 rows x 128 columns per consumer
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "promote": 4},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "promote": 2, "streamk": 1},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "promote": 4, "cluster": 2, "streamk": 1},
    {"BM": 64, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "promote": 4, "swap": 1},
    {"BM": 64, "BN": 128, "consumers": 1, "stages": 8, "swizzle": 8, "promote": 4, "streamk": 1},
]
LLAMA3_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # qkv, o, gate/up, down: N x K
SHAPES = [Shape(4096, 4096, 4096), Shape(8192, 8192, 8192),
          *(Shape(m, n, k) for m in (128, 777, 2048, 4096) for n, k in LLAMA3_8B)]


def build_all() -> dict:
    """(scale, label) -> Launcher of every candidate, built in parallel."""
    configs = {(scale, i): make_config("hopper", {**params, **VARIANT, "scale": scale}, "e4m3", "sm_90a")
               for scale in ("tensor", "row") for i, params in enumerate(CANDIDATES)}
    with ThreadPoolExecutor(16) as pool:
        built = dict(zip(configs, pool.map(build_kernel, configs.values())))
    for key, b in built.items():
        assert b.ok, b.log
    return {key: (configs[key].name, Launcher(built[key].library)) for key in configs}


def main():
    out_path = sys.argv[1]
    shapes = [parse_shape(s) for s in sys.argv[2:]] or SHAPES
    dev = torch.device("cuda:0")
    timed = Alternate(dev).timed_gpu  # host latency hidden: torch._scaled_mm spends more host time per call
    kernels = build_all()
    gen = torch.Generator(device=dev).manual_seed(32)
    rows, summary = [], []
    # The first shape is measured twice and its first figures dropped: torch's rate rises over
    # the first seconds of a process (1.13x of its later rate at 4096^3 on an H200).
    for index, s in enumerate([shapes[0], *shapes]):
        warming = index == 0
        a = (torch.rand(s.m, s.k, device=dev, generator=gen) * 2 - 1).to(torch.float8_e4m3fn)
        w = (torch.rand(s.n, s.k, device=dev, generator=gen) * 2 - 1).to(torch.float8_e4m3fn)
        c = torch.empty(s.m, s.n, device=dev, dtype=torch.bfloat16)
        stream = torch.cuda.current_stream().cuda_stream
        scales = {"tensor": (torch.rand(1, device=dev, generator=gen) * 3.75 + 0.25,
                             torch.rand(1, device=dev, generator=gen) * 3.75 + 0.25),
                  "row": (torch.rand(s.m, device=dev, generator=gen) * 3.75 + 0.25,
                          torch.rand(s.n, device=dev, generator=gen) * 3.75 + 0.25)}
        for scale, (sa, sb) in scales.items():
            a64, w64 = a.double() * sa.double().view(-1, 1), w.double() * sb.double().view(-1, 1)
            ref, bound = a64 @ w64.T, a64.abs() @ w64.abs().T
            del a64, w64

            def check(got):
                return device_verdict(got, ref, bound, "e4m3", s.k, "bf16")

            ts = (sa.view(-1, 1), sb.view(1, -1)) if scale == "row" else (sa.view(()), sb.view(()))
            def scaled_mm(fast=False):
                return torch._scaled_mm(a, w.t(), ts[0], ts[1], out_dtype=torch.bfloat16, use_fast_accum=fast)

            fns = [(lambda: None, scaled_mm), (lambda: None, lambda: scaled_mm(True))]
            names = [f"torch {scale}", f"torch {scale} fast"]
            errors = [check(scaled_mm()).rel_error, check(scaled_mm(True)).rel_error]
            ours = [(name, launcher) for (sc, _), (name, launcher) in kernels.items() if sc == scale]
            more = checked_plans(ours, s, a, w, c, stream, (sa.data_ptr(), sb.data_ptr()), check)
            names, fns, errors, plans = names + more[0], fns + more[1], errors + more[2], more[3]
            times = timed(fns, rounds=30)
            for plan in plans:
                plan.close()
            if warming:
                continue
            for name, ms, err in zip(names, times, errors):
                row = {"shape": str(s), "scale": scale, "kernel": name, "ms": ms,
                       "tflops": s.flops / (ms * 1e-3) / 1e12,
                       "vs_torch": times[0] / ms, "vs_torch_fast": times[1] / ms, "rel_err": err,
                       "err_vs_torch": err / errors[0]}
                rows.append(row)
            ours = list(zip(names[2:], times[2:], errors[2:]))
            fast = min((x for x in ours if "_pr" not in x[0]), key=lambda x: x[1])
            promoted = min((x for x in ours if "_pr" in x[0]), key=lambda x: x[1])
            summary.append({"shape": str(s), "scale": scale, "named": times[0] / ours[0][1],
                            "fast": times[0] / fast[1], "fast_vs_fast": times[1] / fast[1], "fast_kernel": fast[0],
                            "fast_err_x": fast[2] / errors[0], "promoted": times[0] / promoted[1],
                            "promoted_kernel": promoted[0], "promoted_err_x": promoted[2] / errors[0],
                            "torch_err": errors[0], "torch_fast_err": errors[1]})
            print(json.dumps(summary[-1]), flush=True)
    json.dump({"rows": rows, "summary": summary}, open(out_path, "w"), indent=1)
    print(f"{'shape':>16} {'scale':>6} {'named':>6} {'fast':>6} {'f/fast':>6} {'err x':>6} {'promo':>6} {'err x':>6} "
          f"{'torch err':>9}  best fast / promoted kernel")
    for r in summary:
        print(f"{r['shape']:>16} {r['scale']:>6} {r['named']:6.3f} {r['fast']:6.3f} {r['fast_vs_fast']:6.3f} "
              f"{r['fast_err_x']:6.2f} {r['promoted']:6.3f} {r['promoted_err_x']:6.2f} {r['torch_err']:9.2e}  "
              f"{r['fast_kernel'].replace('hopper_', '')} / {r['promoted_kernel'].replace('hopper_', '')}")
    for scale in ("tensor", "row"):
        picked = [r for r in summary if r["scale"] == scale]

        def geo(key):
            return float(np.exp(np.mean([np.log(r[key]) for r in picked])))

        print(f"geomean {scale} over {len(picked)} shapes, x torch._scaled_mm: named {geo('named'):.3f}; best fast "
              f"{geo('fast'):.3f} (x fast-accum torch {geo('fast_vs_fast'):.3f}, error x{geo('fast_err_x'):.2f}); "
              f"best promoted {geo('promoted'):.3f} (error x{geo('promoted_err_x'):.2f})")


if __name__ == "__main__":
    main()
