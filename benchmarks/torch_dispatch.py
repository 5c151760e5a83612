"""Issue 17 on the GPU: the emitted dispatcher of a workload, called through gemmgen.torch, against
cuBLAS (torch.mm with out_dtype=float32) at every workload shape, and at unseen shapes against the
best stored kernel of the nearest tuned shape emitted alone; every result checked against float64.
Alternating, median after warm-up, random data, L2 flushed (a read of 2x L2), C poisoned; cuBLAS
writes into a C of its own (same type, same shape, poisoned too).
Three timings per shape: "gpu", each call's GPU time with the host's latency hidden behind a GPU
spin before the start event (Alternate.timed_gpu: what the call costs when the host runs ahead);
"eager", each call waited for (Alternate.timed: the host's latency is in it wherever the host is
slower than the GPU's flush); "queued", do_bench style (Alternate.timed_async). And the host time
of a call (microseconds; calls queued back to back), ours and torch.mm's, per shape.
usage: python benchmarks/torch_dispatch.py PRECISION DISPATCHER.cu DB OUT.json (needs a GPU and torch)"""
import json
import subprocess
import sys

import numpy as np
import torch
from alternate import Alternate

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.problem import Shape
from gemmgen.describe.workload import load_workload
from gemmgen.measure import verify
from gemmgen.selection.best import best, shape_distance
from gemmgen.store.db import ResultsDB
from gemmgen.torch import load

precision, cu, db_path, out_path = sys.argv[1:5]
wl = load_workload("workloads/llama3-8b.toml")
dev = torch.device("cuda:0")
op = load(cu)
dtype = op.dtype
from gemmgen.store.db import resolve_url
db = ResultsDB(resolve_url(db_path), create=False)
arch = parse_arch("sm_90")
clock = Alternate(dev)
timed, timed_async, timed_gpu, host_us = clock.timed, clock.timed_async, clock.timed_gpu, clock.host_us
# Between the workload's token counts (none on its grid), and one layer it does not have (Llama-2-7B's MLP)
UNSEEN = [Shape(40, 6144, 4096), Shape(48, 4096, 4096), Shape(100, 4096, 14336), Shape(200, 28672, 4096),
          Shape(320, 4096, 4096), Shape(777, 6144, 4096), Shape(1500, 4096, 14336), Shape(2500, 4096, 4096),
          Shape(5000, 6144, 4096), Shape(600, 11008, 4096)]


def check(c, a, b, k):
    a64, b64 = a.double(), b.double()
    ref = (a64 @ b64).cpu().numpy()
    scale = (a64.abs() @ b64.abs()).cpu().numpy()
    v = verify.compare(c.cpu().numpy(), ref, scale, precision, k)
    return v.ok, v.rel_error if hasattr(v, "rel_error") else None, v.message


single = {}


def single_op(name):
    if name not in single:
        path = f"/tmp/single_{name}.cu"
        subprocess.run([sys.executable, "-m", "gemmgen", "emit", name, "--gpu", "sm_90", "-o", path], check=True,
                       capture_output=True)
        single[name] = load(path)
    return single[name]


rows = []
gen = torch.Generator(device=dev).manual_seed(7)
for kind, shapes in (("workload", wl.shapes), ("unseen", UNSEEN)):
    for s in shapes:
        a = (torch.rand(s.m, s.k, device=dev, generator=gen) * 2 - 1).to(dtype)
        b = (torch.rand(s.k, s.n, device=dev, generator=gen) * 2 - 1).to(dtype)
        c = torch.empty(s.m, s.n, device=dev, dtype=torch.float32)
        c_ref = torch.empty_like(c)
        poison = lambda: c.fill_(float("nan"))
        ours, cublas = lambda: op(a, b, out=c), lambda: torch.mm(a, b, out_dtype=torch.float32, out=c_ref)
        fns = [(poison, ours), (lambda: c_ref.fill_(float("nan")), cublas)]
        row = {"kind": kind, "shape": str(s), "kernel": op.choice(s.m, s.n, s.k)}
        if kind == "unseen":
            tuned = [t for t in wl.shapes]
            near = min(tuned, key=lambda t: shape_distance(s, t))
            ref_kernel = best(db, precision, near, arch).kernel
            alone = single_op(ref_kernel)
            c2 = torch.empty_like(c)
            fns.append((lambda: c2.fill_(float("nan")), lambda: alone(a, b, out=c2)))
            row.update(nearest=str(near), nearest_best=ref_kernel)
        gpu = timed_gpu(fns, rounds=30)
        sync = timed(fns, rounds=15)
        t = timed_async(fns, rounds=30)
        row["gpu_ms"], row["gpu_cublas_ms"], row["gpu_vs_cublas"] = gpu[0], gpu[1], gpu[1] / gpu[0]
        row["sync_ms"], row["sync_cublas_ms"] = sync[0], sync[1]
        row["sync_vs_cublas"] = sync[1] / sync[0]
        row["ms"], row["cublas_ms"] = t[0], t[1]
        row["vs_cublas"] = t[1] / t[0]
        row["host_us"], row["host_cublas_us"] = host_us(ours, calls=200), host_us(cublas, calls=200)
        if kind == "unseen":
            row["alone_ms"] = gpu[2]
            row["vs_nearest_best"] = gpu[2] / gpu[0]
        op(a, b, out=c)
        torch.cuda.synchronize()
        ok, _, msg = check(c, a, b, s.k)
        row["correct"] = ok
        row["message"] = msg
        row["tflops"] = 2 * s.m * s.n * s.k / (gpu[0] * 1e-3) / 1e12
        rows.append(row)
        print(json.dumps(row), flush=True)
        del a, b, c
        torch.cuda.empty_cache()

ws = [r for r in rows if r["kind"] == "workload"]
wmean = wl.weighted_mean({Shape(*map(int, r["shape"].split("x"))): r["vs_cublas"] for r in ws})
wsync = wl.weighted_mean({Shape(*map(int, r["shape"].split("x"))): r["sync_vs_cublas"] for r in ws})
wgpu = wl.weighted_mean({Shape(*map(int, r["shape"].split("x"))): r["gpu_vs_cublas"] for r in ws})
summary = {"precision": precision, "gpu_weighted_geomean_vs_cublas": wgpu,
           "queued_weighted_geomean_vs_cublas": wmean, "eager_weighted_geomean_vs_cublas": wsync,
           "host_us_median": float(np.median([r["host_us"] for r in rows])),
           "host_cublas_us_median": float(np.median([r["host_cublas_us"] for r in rows])),
           "unseen_min_vs_nearest_best": min(r["vs_nearest_best"] for r in rows if r["kind"] == "unseen"),
           "all_correct": all(r["correct"] for r in rows)}
json.dump({"rows": rows, "summary": summary}, open(out_path, "w"), indent=1)
print(f"\n== {precision}: dispatcher through gemmgen.torch vs torch.mm(out_dtype=float32)")
print(f"{'kind':<8} {'shape':<16} {'kernel':<42} {'us':>7} {'cuBLAS':>7} {'x gpu':>6} {'eager':>6} {'queued':>6} "
      f"{'host us':>8} {'cuBLAS':>6} {'xnear':>6} ok")
for r in rows:
    near = f"{r['vs_nearest_best']:.3f}" if "vs_nearest_best" in r else ""
    print(f"{r['kind']:<8} {r['shape']:<16} {r['kernel'][:42]:<42} {r['gpu_ms']*1e3:7.1f} {r['gpu_cublas_ms']*1e3:7.1f} "
          f"{r['gpu_vs_cublas']:6.3f} {r['sync_vs_cublas']:6.3f} {r['vs_cublas']:6.3f} {r['host_us']:8.1f} "
          f"{r['host_cublas_us']:6.1f} {near:>6} {'ok' if r['correct'] else 'WRONG'}")
print(json.dumps(summary))
