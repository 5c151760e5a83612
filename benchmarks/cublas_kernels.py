"""Which kernels cuBLAS runs for F.linear (bf16, W stored N x K, bf16 C) and for torch.mm with fp32
C at the given shapes, from torch.profiler's trace: each kernel's name, grid, block, registers per
thread, shared memory (bytes) and median duration (us) over 5 calls after 3 warm-up calls.
Prints one line per (shape, op, kernel), fields separated by " | ".
usage: python benchmarks/cublas_kernels.py MxNxK [MxNxK ...] (needs a GPU and torch)"""
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from gemmgen.describe.problem import parse_shape


def kernels(fn, trace: Path) -> dict[tuple, list[float]]:
    """(name, grid, block, registers, shared memory) -> durations (us) of the GPU kernels ``fn`` runs."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    out: dict[tuple, list[float]] = {}
    for event in json.loads(trace.read_text())["traceEvents"]:
        if event.get("cat") == "kernel":
            a = event.get("args", {})
            key = (event["name"], str(a.get("grid")), str(a.get("block")), a.get("registers per thread"),
                   a.get("shared memory"))
            out.setdefault(key, []).append(event["dur"])
    return out


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__.splitlines()[-1])
    with tempfile.TemporaryDirectory() as tmp:
        for text in sys.argv[1:]:
            s = parse_shape(text)
            x = torch.randn(s.m, s.k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(s.n, s.k, device="cuda", dtype=torch.bfloat16)
            wt = w.t().contiguous()
            ops = (("F.linear", lambda: F.linear(x, w)),
                   ("mm fp32 C", lambda: torch.mm(x, wt, out_dtype=torch.float32)))
            for what, fn in ops:
                for key, durations in kernels(fn, Path(tmp) / "trace.json").items():
                    durations.sort()
                    print(f"{s.m}x{s.n}x{s.k}", what, *key, f"{durations[len(durations) // 2]:.1f}", sep=" | ")


if __name__ == "__main__":
    main()
