"""Issue 18 on the GPU: x @ W^T with bf16 in and bf16 out (trans=nt, out=bf16) through hopper
kernels, against cuBLAS through torch.nn.functional.linear(x, W) in the same process on the same
tensors. Same method as bench: alternating, median after warm-up, random data, L2 flushed (a read
of 2x L2) and C poisoned before every timed call, one call between two events. Each kernel's
result is checked against float64 first (gemmgen.measure.verify, with the bf16 store's rounding).
usage: python benchmarks/linear_nt.py OUT.json [MxNxK ...] (needs a GPU, torch and nvcc)"""
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

CANDIDATES = [  # the NN winners of the suite and the workload tunes at these sizes, and neighbours, as nt/bf16
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "overlap": 1},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "overlap": 1},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 4},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "cluster": 2},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 16, "cluster": 2},
    {"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "streamk": 1},
    {"BM": 256, "BN": 128, "consumers": 2, "stages": 4, "swizzle": 8},
    {"BM": 64, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 8, "schedule": "pingpong"},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "schedule": "pingpong"},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 16, "schedule": "pingpong"},
    {"BM": 128, "BN": 128, "consumers": 2, "stages": 6, "swizzle": 8, "schedule": "pingpong", "cluster": 2},
]
out_path = sys.argv[1]
shapes = [parse_shape(s) for s in sys.argv[2:]] or [Shape(4096, 4096, 4096), Shape(4096, 14336, 4096)]
dev = torch.device("cuda:0")
timed = Alternate(dev).timed

kernels = {}
for params in CANDIDATES:
    config = make_config("hopper", {**params, "trans": "nt", "out": "bf16"}, "bf16", "sm_90")
    built = build_kernel(config)
    assert built.ok, built.log
    kernels[config.name] = Launcher(built.library)


rows = []
gen = torch.Generator(device=dev).manual_seed(18)
for s in shapes:
    x = (torch.rand(s.m, s.k, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    w = (torch.rand(s.n, s.k, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    c = torch.empty(s.m, s.n, device=dev, dtype=torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream
    ref = (x.double() @ w.double().T).cpu().numpy()
    scale = (x.double().abs() @ w.double().abs().T).cpu().numpy()
    fns, names = [(lambda: None, lambda: F.linear(x, w))], ["cublas (F.linear)"]
    for name, launcher in kernels.items():
        c.fill_(float("nan"))
        launcher.launch(s.m, s.n, s.k, 1.0, x.data_ptr(), w.data_ptr(), 0.0, c.data_ptr(), stream)
        torch.cuda.synchronize()
        v = verify.compare(c.float().cpu().numpy().astype(np.float64), ref, scale, "bf16", s.k, "bf16")
        rows.append({"shape": str(s), "kernel": name, "correct": v.ok, "rel_err": v.rel_error})
        assert v.ok, f"{name} at {s}: {v.message}"
        plan = launcher.plan(s.m, s.n, s.k, 1.0, x.data_ptr(), w.data_ptr(), 0.0, c.data_ptr(), stream)
        fns.append((lambda: c.fill_(float("nan")), plan.run))
        names.append(name)
    lin = F.linear(x, w)
    v = verify.compare(lin.float().cpu().numpy().astype(np.float64), ref, scale, "bf16", s.k, "bf16")
    times = timed(fns, rounds=30)
    for name, ms in zip(names, times):
        row = {"shape": str(s), "kernel": name, "ms": ms, "tflops": s.flops / (ms * 1e-3) / 1e12,
               "vs_cublas": times[0] / ms}
        if name.startswith("cublas"):
            row.update(correct=v.ok, rel_err=v.rel_error)
        rows.append(row)
        print(json.dumps(row), flush=True)
    del x, w, c, lin
    torch.cuda.empty_cache()
json.dump(rows, open(out_path, "w"), indent=1)
print(f"{'shape':>16} {'kernel':<46} {'ms':>8} {'TFLOP/s':>8} {'x cuBLAS':>8}")
for r in rows:
    if "ms" in r:
        print(f"{r['shape']:>16} {r['kernel']:<46} {r['ms']:8.4f} {r['tflops']:8.1f} {r['vs_cublas']:8.3f}")
