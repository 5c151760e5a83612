"""Measure a menu of hopper tiles at the example workload's weak shapes: where the shipped results'
best is under --weak of cuBLAS (or, with --from-run, where benchmarks/torch_dispatch.py's gpu
ratio was), the tiles of 48, 96 and 192 rows (swap=1; cuBLAS's mid-size tile shapes) and the two
best stored kernels of each neighbouring shape (same N and K, M within 4x). Each point is built,
verified against float64 and timed in alternation with cuBLAS (gemmgen.measure.Bench, interleave),
and recorded in DB (a SQLite file of its own: results/h100.db is only read, from a copy, since
opening a file to record migrates it). Prints per shape the shipped score and the best measured.
This made the sweep19 and sweep19b rows of results/h100.db (results/README.md).
usage: python benchmarks/sweep_workload.py PRECISION DB [--build-only] [--dry-run] [--weak R]
       [--from-run TORCH_DISPATCH.out] [--limit-s S] [--min-ms MS]   (needs a GPU; run from the
       checkout root; TAG in the environment names the rows' tag, default sweep19)"""
import argparse, os, sys, time
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, os.getcwd())
from gemmgen.arch import parse_arch
from gemmgen.best import ranked
from gemmgen.build import build_kernel
from gemmgen.config import make_config
from gemmgen.db import ResultsDB, resolve_url
from gemmgen.errors import GemmgenError
from gemmgen.points import resolve_point
from gemmgen.problem import Shape
from gemmgen.workload import load_workload

ap = argparse.ArgumentParser()
ap.add_argument("precision"); ap.add_argument("db"); ap.add_argument("--build-only", action="store_true")
ap.add_argument("--dry-run", action="store_true", help="only say how many shapes, measurements and kernels")
ap.add_argument("--limit-s", type=float, default=520); ap.add_argument("--min-ms", type=float, default=80)
ap.add_argument("--weak", type=float, default=0.97)
ap.add_argument("--from-run", help="torch_dispatch output: the shapes whose gpu ratio there is under --weak")
args = ap.parse_args()
P = args.precision
arch = parse_arch("sm_90")
import shutil, tempfile
_copy = tempfile.mkdtemp() + "/h100.db"; shutil.copy("results/h100.db", _copy)  # opening migrates: never the shipped file
shipped = ResultsDB(resolve_url(_copy))
shapes = load_workload("workloads/llama3-8b.toml").shapes

def score(s):
    r = ranked(shipped, P, s, arch)
    return (r[0].score or 0.0, r[0].kernel) if r else (0.0, None)

MENU = []  # swap=1 tiles with the new BM values (48, 96, 192), cuBLAS's mid-size tile shapes
def add(m_lo, m_hi, **p):
    MENU.append((m_lo, m_hi, {"swap": 1, "swizzle": 8, **p}))
add(48, 192, BM=48, BN=128, consumers=2, stages=8)
add(48, 192, BM=48, BN=128, consumers=2, stages=8, schedule="pingpong")
add(48, 192, BM=48, BN=64, consumers=1, stages=8)
add(96, 768, BM=96, BN=64, consumers=1, stages=8)
add(96, 768, BM=96, BN=128, consumers=2, stages=6)
add(96, 768, BM=96, BN=128, consumers=2, stages=6, schedule="pingpong")
add(96, 1536, BM=96, BN=192, consumers=2, stages=5, schedule="pingpong")
add(96, 1536, BM=96, BN=192, consumers=1, stages=5)
add(192, 99999, BM=192, BN=64, consumers=2, stages=6, schedule="pingpong")
add(192, 99999, BM=192, BN=128, consumers=2, stages=5)
add(192, 99999, BM=192, BN=128, consumers=2, stages=5, cluster=2)
add(384, 99999, BM=192, BN=128, consumers=2, stages=5, swizzle=16)
SK = [dict(swap=1, streamk=1, swizzle=8, **p) for p in (
    dict(BM=96, BN=128, consumers=2, stages=6), dict(BM=96, BN=64, consumers=1, stages=8),
    dict(BM=48, BN=128, consumers=2, stages=8), dict(BM=192, BN=128, consumers=2, stages=5))]

plan = []  # (shape, [names])
import json
ran = {}
if args.from_run:
    for line in open(args.from_run):
        if line.startswith("{") and '"workload"' in line:
            r = json.loads(line)
            ran[r["shape"]] = r["gpu_vs_cublas"]
for s in shapes:
    sc, kbest = score(s)
    if (ran.get(str(s), 9.0) if ran else sc) >= args.weak:
        continue
    names = []
    for lo, hi, p in MENU:
        if lo <= s.m <= hi:
            names.append(make_config("hopper", p, P, arch).name)
    if s.k >= 8192 and s.m <= 1536:
        names += [make_config("hopper", p, P, arch).name for p in SK]
    for t in shapes:  # neighbours' winners: same N and K, M within 4x
        if t != s and t.n == s.n and t.k == s.k and 0.25 <= t.m / s.m <= 4:
            for r in ranked(shipped, P, t, arch)[:2]:
                names.append(r.kernel)
    names = [n for n in dict.fromkeys(names) if n != kbest or ran]
    plan.append((s, sc, names))
uniq = sorted({n for _, _, ns in plan for n in ns})
print(f"{P}: {len(plan)} weak shapes, {sum(len(n) for _, _, n in plan)} measurements, {len(uniq)} kernels", flush=True)

def _build(name):
    try:
        r = build_kernel(resolve_point(name, arch))
        return name, r.ok
    except GemmgenError as e:
        return name, f"{e}"
t0 = time.time()
if args.dry_run:
    sys.exit(0)
with ProcessPoolExecutor(max_workers=os.cpu_count()) as ex:
    bad = [(n, ok) for n, ok in ex.map(_build, uniq) if ok is not True]
print(f"built {len(uniq)} in {time.time()-t0:.0f}s; failed: {bad}", flush=True)
if args.build_only:
    sys.exit(0)

from gemmgen.measure import Bench
from gemmgen.runtime import Gpu
gpu = Gpu(0)
bench = Bench(gpu, ResultsDB(resolve_url(args.db)), tag=os.environ.get("TAG", "sweep19"), seed=19, min_total_ms=args.min_ms, interleave=True)
t0 = time.time(); table = []
for s, sc, names in plan:
    best_r, best_n = sc, "(shipped)"
    for n in names:
        if time.time() - t0 > args.limit_s:
            break
        res = bench.measure_point("sweep19", resolve_point(n, arch), s)
        r = res.baseline_ratio
        print(f"  {s} {n:<50} {res.status:<8} {r if r is None else round(r, 3)}", flush=True)
        if r and r > best_r:
            best_r, best_n = r, n
    table.append((s, sc, best_r, best_n))
print(f"\n{P} sweep: {time.time()-t0:.0f}s")
print(f"{'shape':<18}{'shipped':>8}{'now':>8}  kernel")
for s, sc, br, bn in table:
    print(f"{str(s):<18}{sc:8.3f}{br:8.3f}  {bn}")
bench.close()
gpu.close()
