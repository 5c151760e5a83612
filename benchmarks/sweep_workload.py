"""Measure a menu of hopper tiles at the example workload's weak shapes: where the shipped results'
best is under --weak of cuBLAS (or, with --from-run, where benchmarks/torch_dispatch.py's gpu
ratio was), the tiles of 48, 96 and 192 rows (swap=1; cuBLAS's mid-size tile shapes) and the two
best stored kernels of each neighbouring shape (same N and K, M within 4x). Each point is built,
verified against float64 and timed in alternation with cuBLAS (gemmgen.measure.bench.Bench, interleave),
and recorded in DB (a SQLite file of its own: results/h100.db is only read, from a copy, since
opening a file to record migrates it). Prints per shape the shipped score and the best measured.
This made the sweep19 and sweep19b rows of results/h100.db (results/README.md).
usage: python benchmarks/sweep_workload.py PRECISION DB [--build-only] [--dry-run] [--weak R]
       [--from-run TORCH_DISPATCH.out] [--limit-s S] [--min-ms MS]   (needs a GPU; run from the
       checkout root; TAG in the environment names the rows' tag, default sweep19)"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from gemmgen.build.nvcc import build_kernel
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.config import make_config
from gemmgen.describe.points import resolve_point
from gemmgen.describe.workload import load_workload
from gemmgen.errors import GemmgenError
from gemmgen.selection.best import ranked
from gemmgen.store.db import ResultsDB, resolve_url

ARCH = parse_arch("sm_90")
# (smallest M, largest M, smallest K, the point): swap=1 tiles of the new BM values (48, 96, 192),
# cuBLAS's mid-size tile shapes; stream-K ones for the long K of the MLP's down projection
_TILE = {"swap": 1, "swizzle": 8}
MENU = [(lo, hi, min_k, {**_TILE, **p}) for lo, hi, min_k, p in (
    (48, 192, 0, dict(BM=48, BN=128, consumers=2, stages=8)),
    (48, 192, 0, dict(BM=48, BN=128, consumers=2, stages=8, schedule="pingpong")),
    (48, 192, 0, dict(BM=48, BN=64, consumers=1, stages=8)),
    (96, 768, 0, dict(BM=96, BN=64, consumers=1, stages=8)),
    (96, 768, 0, dict(BM=96, BN=128, consumers=2, stages=6)),
    (96, 768, 0, dict(BM=96, BN=128, consumers=2, stages=6, schedule="pingpong")),
    (96, 1536, 0, dict(BM=96, BN=192, consumers=2, stages=5, schedule="pingpong")),
    (96, 1536, 0, dict(BM=96, BN=192, consumers=1, stages=5)),
    (192, sys.maxsize, 0, dict(BM=192, BN=64, consumers=2, stages=6, schedule="pingpong")),
    (192, sys.maxsize, 0, dict(BM=192, BN=128, consumers=2, stages=5)),
    (192, sys.maxsize, 0, dict(BM=192, BN=128, consumers=2, stages=5, cluster=2)),
    (384, sys.maxsize, 0, dict(BM=192, BN=128, consumers=2, stages=5, swizzle=16)),
    (0, 1536, 8192, dict(BM=96, BN=128, consumers=2, stages=6, streamk=1)),
    (0, 1536, 8192, dict(BM=96, BN=64, consumers=1, stages=8, streamk=1)),
    (0, 1536, 8192, dict(BM=48, BN=128, consumers=2, stages=8, streamk=1)),
    (0, 1536, 8192, dict(BM=192, BN=128, consumers=2, stages=5, streamk=1)),
)]


def measured_ratios(path: str) -> dict[str, float]:
    """shape -> gpu ratio to cuBLAS, of a torch_dispatch.py output's workload rows."""
    ratios = {}
    for line in open(path):
        if line.startswith("{") and '"workload"' in line:
            row = json.loads(line)
            ratios[row["shape"]] = row["gpu_vs_cublas"]
    return ratios


def plan(precision: str, shipped: ResultsDB, weak: float, ran: dict[str, float]) -> list[tuple]:
    """(shape, its shipped score, the kernels to measure there) for each weak shape: under ``weak``
    in ``ran`` where given (its served kernel measured again too), else by the shipped score."""
    shapes = load_workload("workloads/llama3-8b.toml").shapes
    found = []
    for s in shapes:
        top = ranked(shipped, precision, s, ARCH)
        score, kbest = (top[0].score or 0.0, top[0].kernel) if top else (0.0, None)
        if (ran.get(str(s), 9.0) if ran else score) >= weak:
            continue
        names = [make_config("hopper", p, precision, ARCH).name
                 for lo, hi, min_k, p in MENU if lo <= s.m <= hi and s.k >= min_k]
        for t in shapes:  # neighbours' winners: same N and K, M within 4x
            if t != s and t.n == s.n and t.k == s.k and 0.25 <= t.m / s.m <= 4:
                names += [r.kernel for r in ranked(shipped, precision, t, ARCH)[:2]]
        found.append((s, score, [n for n in dict.fromkeys(names) if n != kbest or ran]))
    return found


def _build(name):
    try:
        return name, build_kernel(resolve_point(name, ARCH)).ok
    except GemmgenError as e:
        return name, f"{e}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("precision")
    ap.add_argument("db")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="only say how many shapes, measurements and kernels")
    ap.add_argument("--limit-s", type=float, default=520)
    ap.add_argument("--min-ms", type=float, default=80)
    ap.add_argument("--weak", type=float, default=0.97)
    ap.add_argument("--from-run", help="torch_dispatch output: the shapes whose gpu ratio there is under --weak")
    args = ap.parse_args()
    copy = os.path.join(tempfile.mkdtemp(), "h100.db")
    shutil.copy("results/h100.db", copy)  # opening a file may migrate it: never the shipped one
    todo = plan(args.precision, ResultsDB(resolve_url(copy)), args.weak,
                measured_ratios(args.from_run) if args.from_run else {})
    uniq = sorted({n for _, _, names in todo for n in names})
    print(f"{args.precision}: {len(todo)} weak shapes, {sum(len(n) for _, _, n in todo)} measurements, "
          f"{len(uniq)} kernels", flush=True)
    if args.dry_run:
        return
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as ex:
        bad = [(n, ok) for n, ok in ex.map(_build, uniq) if ok is not True]
    print(f"built {len(uniq)} in {time.time() - t0:.0f}s; failed: {bad}", flush=True)
    if args.build_only:
        return

    from gemmgen.measure.bench import Bench  # needs PyCUDA and a GPU
    from gemmgen.measure.device import Gpu

    tag = os.environ.get("TAG", "sweep19")
    with Gpu(0) as gpu:
        bench = Bench(gpu, ResultsDB(resolve_url(args.db)), tag=tag, seed=19, min_total_ms=args.min_ms,
                      interleave=True)
        t0, table = time.time(), []
        for s, score, names in todo:
            best_r, best_n = score, "(shipped)"
            for n in names:
                if time.time() - t0 > args.limit_s:
                    break
                res = bench.measure_point(tag, resolve_point(n, ARCH), s)
                r = res.baseline_ratio
                print(f"  {s} {n:<50} {res.status:<8} {r if r is None else round(r, 3)}", flush=True)
                if r and r > best_r:
                    best_r, best_n = r, n
            table.append((s, score, best_r, best_n))
        bench.close()
    print(f"\n{args.precision} sweep: {time.time() - t0:.0f}s")
    print(f"{'shape':<18}{'shipped':>8}{'now':>8}  kernel")
    for s, score, best_r, best_n in table:
        print(f"{str(s):<18}{score:8.3f}{best_r:8.3f}  {best_n}")


if __name__ == "__main__":
    main()
