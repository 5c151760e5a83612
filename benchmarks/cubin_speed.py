"""Two emitted versions of the same kernels timed against each other on the GPU: where a template
change altered device code (benchmarks/cubins.py lists which), this shows whether it altered speed.

    python benchmarks/cubin_speed.py OLD_DIR NEW_DIR [--json OUT.json]

OLD_DIR and NEW_DIR hold emitted .cu files (one kernel each, the same file names: e.g. written
from the two trees by benchmarks/cubins.py --emit). Each pair is built (in parallel), loaded with
gemmgen.torch.load, and called on the same operands at three shapes (thin, mid and square; a batch
of 4 for a batched variant) in alternation (benchmarks/alternate.py: L2 flushed, C poisoned,
median of --rounds after warm-up, launch gaps hidden); the two results must agree (bitwise, or within
2% where the compiler contracted a multiply-add differently). Prints new/old time per kernel and shape
and the geometric mean; exit 1 where a pair disagrees. Needs torch and a GPU.
"""

import argparse
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from alternate import Alternate

import gemmgen.torch as gt
from gemmgen.build.nvcc import DEFAULT_FLAGS, build_library
from gemmgen.torch.checks import build_target, source_target

SHAPES = ((256, 6144, 4096), (1536, 4096, 4096), (4096, 4096, 4096))
BATCH = 4


def _build(path: Path) -> str:
    """Build ``path`` as gemmgen.torch.load will (its own target, the default flags), into the cache."""
    source = path.read_text()
    result = build_library(source, build_target(source_target(source), None, None), DEFAULT_FLAGS)
    return "" if result.ok else f"{path}: {result.log[-300:]}"


def operands(op, m: int, n: int, k: int, batched: bool, gen: torch.Generator):
    """a, b, out and bias (or None) for ``op``'s variant, uniform(-1, 1)."""
    v, lead = op.variant, ((BATCH,) if batched else ())

    def uniform(*shape, dtype):
        return (torch.rand(*lead, *shape, device="cuda", generator=gen) * 2 - 1).to(dtype)
    a = uniform(*((k, m) if v.a_transposed else (m, k)), dtype=op.dtype)
    b = uniform(*((n, k) if v.b_transposed else (k, n)), dtype=op.dtype)
    bias = None if v.bias == "none" else uniform(n if v.bias == "col" else m, dtype=op.out_dtype)
    return a, b, torch.empty(*lead, m, n, device="cuda", dtype=op.out_dtype), bias


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rounds", type=int, default=30, help="timed calls of each version per shape (median)")
    args = ap.parse_args(argv)
    names = sorted(p.name for p in args.old.glob("*.cu") if (args.new / p.name).is_file())
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        failed = [f for f in pool.map(_build, [d / n for n in names for d in (args.old, args.new)]) if f]
    for f in failed:
        print("build failed:", f, file=sys.stderr)
    timer, gen, rows, wrong = Alternate(torch.device("cuda")), torch.Generator(device="cuda").manual_seed(7), [], 0
    for name in names:
        old, new = gt.load(args.old / name), gt.load(args.new / name)
        for m, n, k in SHAPES:
            a, b, out, bias = operands(old, m, n, k, old.variant.batched, gen)
            out_new = out.clone()
            fns = [(lambda: out.fill_(float("nan")), lambda: old(a, b, out, bias=bias)),
                   (lambda: out_new.fill_(float("nan")), lambda: new(a, b, out_new, bias=bias))]
            t_old, t_new = timer.timed(fns, rounds=args.rounds, hide_us=40.0)
            same = torch.equal(out, out_new)  # bitwise; close: within rounding where FMA contraction moved
            close = same or torch.allclose(out.float(), out_new.float(), rtol=2e-2, atol=2e-2)
            wrong += not close
            rows.append({"kernel": name.removesuffix(".cu"), "shape": f"{m}x{n}x{k}", "old_us": 1e3 * t_old,
                         "new_us": 1e3 * t_new, "ratio": t_new / t_old, "same_result": same})
            print(f"{name[:-3]:60s} {m:5d}x{n}x{k}  old {1e3 * t_old:8.1f} us  new {1e3 * t_new:8.1f} us  "
                  f"new/old {t_new / t_old:.3f}{'' if same else '  (not bitwise equal)' if close else '  RESULTS DIFFER'}", flush=True)
    ratios = [r["ratio"] for r in rows]
    print(f"{len(rows)} timings of {len(names)} kernels: new/old geomean "
          f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f}, min {min(ratios):.3f}, max {max(ratios):.3f}; "
          f"{sum(abs(r - 1) > 0.01 for r in ratios)} beyond 1%; {wrong} results differ")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if wrong or failed else 0


if __name__ == "__main__":
    sys.exit(main())
