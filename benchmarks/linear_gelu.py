"""Issue 18 on the GPU: gelu(x @ W^T + b) (tanh GELU, bias per column) with bf16 in and out, fused
into hopper kernels (trans=nt, out=bf16, bias=col, act=gelu), against cuBLASLt's fused GELU_BIAS
epilogue as torch calls it (torch._addmm_activation(b, x, W^T, use_gelu=True)), and the unfused
F.gelu(F.linear(x, W, b), approximate="tanh"), in the same process on the same tensors.
(gemmgen bench measures the same kernels against cuBLASLt through its own ctypes plan.)
Same method as bench: alternating, median after warm-up, random data, L2 flushed and C poisoned
before every timed call. Every result is checked against float64 first (gemmgen.measure.verify).
usage: python benchmarks/linear_gelu.py OUT.json [MxNxK ...] (needs a GPU, torch and nvcc)"""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from alternate import Alternate

from gemmgen.build.nvcc import build_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape, parse_shape
from gemmgen.measure import verify
from gemmgen.measure.launcher import Launcher

EPILOGUE = {"trans": "nt", "out": "bf16", "bias": "col", "act": "gelu"}
CANDIDATES = [  # linear_nt.py's best at these sizes, and neighbours
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "overlap": 1},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "overlap": 1},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "cluster": 2},
    {"BM": 256, "BN": 128, "consumers": 2, "stages": 4, "swizzle": 8},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "schedule": "pingpong"},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 16, "schedule": "pingpong"},
    {"BM": 64, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "schedule": "pingpong"},
    # cuBLASLt's GELU_BIAS kernel at 4096^3 (ncu): 256x128 tiles, clusters of 2, cooperative
    {"BM": 256, "BN": 128, "consumers": 2, "stages": 4, "swizzle": 8, "cluster": 2},
    {"BM": 256, "BN": 128, "consumers": 2, "stages": 4, "swizzle": 16},
    {"BM": 256, "BN": 128, "consumers": 2, "stages": 4, "swizzle": 8, "streamk": 1},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "cluster": 2, "overlap": 1},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "schedule": "pingpong", "cluster": 2},
]
out_path = sys.argv[1]
shapes = [parse_shape(s) for s in sys.argv[2:]] or [Shape(4096, 4096, 4096), Shape(4096, 14336, 4096)]
dev = torch.device("cuda:0")
timed = Alternate(dev).timed

kernels = {}
for params in CANDIDATES:
    config = make_config("hopper", {**params, **EPILOGUE}, "bf16", "sm_90")
    built = build_kernel(config)
    assert built.ok, built.log
    kernels[config.name] = Launcher(built.library)

rows = []
gen = torch.Generator(device=dev).manual_seed(18)
for s in shapes:
    x = (torch.rand(s.m, s.k, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    w = (torch.rand(s.n, s.k, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    b = (torch.rand(s.n, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    c = torch.empty(s.m, s.n, device=dev, dtype=torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream
    ref, scale = verify.epilogue((x.double() @ w.double().T).cpu().numpy(),
                                 (x.double().abs() @ w.double().abs().T).cpu().numpy(),
                                 b.double().cpu().numpy(), "col", "gelu")

    def check(got):
        return verify.compare(got.float().cpu().numpy().astype(np.float64), ref, scale, "bf16", s.k, "bf16", "gelu")

    fused = torch._addmm_activation(b, x, w.t(), use_gelu=True)
    unfused = F.gelu(F.linear(x, w, b), approximate="tanh")
    baselines = {"cublasLt GELU_BIAS (torch._addmm_activation)": (check(fused), lambda: torch._addmm_activation(
                     b, x, w.t(), use_gelu=True)),
                 "F.gelu(F.linear) unfused": (check(unfused), lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))}
    fns, names = [], []
    for name, (v, call) in baselines.items():
        rows.append({"shape": str(s), "kernel": name, "correct": v.ok, "rel_err": v.rel_error})
        fns.append((lambda: None, call))
        names.append(name)
    for name, launcher in kernels.items():
        c.fill_(float("nan"))
        launcher.launch(s.m, s.n, s.k, 1.0, x.data_ptr(), w.data_ptr(), 0.0, c.data_ptr(), stream, bias=b.data_ptr())
        torch.cuda.synchronize()
        v = check(c)
        rows.append({"shape": str(s), "kernel": name, "correct": v.ok, "rel_err": v.rel_error})
        assert v.ok, f"{name} at {s}: {v.message}"
        plan = launcher.plan(s.m, s.n, s.k, 1.0, x.data_ptr(), w.data_ptr(), 0.0, c.data_ptr(), stream,
                             bias=b.data_ptr())
        fns.append((lambda: c.fill_(float("nan")), plan.run))
        names.append(name)
    times = timed(fns, rounds=30)
    for name, ms in zip(names, times):
        row = {"shape": str(s), "kernel": name, "ms": ms, "tflops": s.flops / (ms * 1e-3) / 1e12,
               "vs_cublaslt": times[0] / ms}
        rows.append(row)
        print(json.dumps(row), flush=True)
    del x, w, b, c, fused, unfused
    torch.cuda.empty_cache()
json.dump(rows, open(out_path, "w"), indent=1)
print("checks: " + ", ".join(f"{r['kernel'][:24]}@{r['shape']}={'ok' if r['correct'] else 'WRONG'}"
                             for r in rows if "correct" in r and not r["kernel"].startswith("hopper")))
print(f"{'shape':>16} {'kernel':<58} {'ms':>8} {'TFLOP/s':>8} {'x cuBLASLt':>10}")
for r in rows:
    if "ms" in r:
        print(f"{r['shape']:>16} {r['kernel']:<58} {r['ms']:8.4f} {r['tflops']:8.1f} {r['vs_cublaslt']:10.3f}")
