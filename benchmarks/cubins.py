"""Fingerprints of the device code of a fixed set of kernels, to show that a change to the
templates leaves the cubins byte-identical (or to list the ones it changes).

    python benchmarks/cubins.py --save before.json          # on the old tree
    python benchmarks/cubins.py --against before.json       # on the new one: prints what differs

The set: every named point on sm_90 (hopper on sm_90a) in its plain variant, the tensor-core
points in five other variants (layouts, C's type, bias, activation, strided batch), and hopper
points covering each of its options (swap, thin tiles, stream-K, clusters, ping-pong, overlap,
tf32, FP8's promotion intervals and scales). Each entry is rendered and compiled to a cubin alone
(nvcc -cubin, the flags gemmgen.build.nvcc uses for the kernel); the fingerprint is the cubin's
sha256 and the emitted file's line count. Needs nvcc, no GPU. Exit 1 when --against finds a difference, or nvcc warns
(a variable the trimming left unused, say).
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gemmgen.build.nvcc import DEFAULT_FLAGS, find_tool
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.errors import InvalidPoint

VARIANTS = (
    {"trans": "nt", "out": "bf16"},
    {"trans": "tn", "out": "fp16", "bias": "row", "act": "relu"},
    {"trans": "tt", "bias": "col", "act": "gelu"},
    {"trans": "nt", "out": "bf16", "bias": "col", "batch": "strided"},
    {"act": "silu", "batch": "strided"},
)

HOPPER = (
    ("fp16", {"BM": 128, "BN": 128, "schedule": "pingpong"}),
    ("bf16", {"BM": 128, "BN": 256, "cluster": 2, "streamk": 1}),
    ("fp16", {"BM": 80, "BN": 128, "swap": 1}),
    ("bf16", {"BM": 8, "BN": 64, "swap": 1, "consumers": 1, "streamk": 1}),
    ("bf16", {"BM": 200, "BN": 192, "swap": 1, "overlap": 1}),
    ("fp16", {"BM": 64, "BN": 192, "consumers": 1, "stages": 6, "swizzle": 4}),
    ("tf32", {"BM": 56, "BN": 128, "streamk": 1}),
    ("bf16", {"BM": 256, "BN": 128, "overlap": 1, "cluster": 2}),
    # FP8: fast accumulation, promotion intervals (with stream-K, swap, clusters), scales in device memory
    ("e4m3", {"BM": 128, "BN": 128, "schedule": "pingpong", "trans": "nt"}),
    ("e4m3", {"BM": 64, "BN": 128, "swap": 1, "promote": 4, "trans": "nt", "scale": "row"}),
    ("e4m3", {"BM": 128, "BN": 128, "promote": 2, "cluster": 2, "streamk": 1, "trans": "nt", "scale": "tensor"}),
    ("e4m3", {"BM": 128, "BN": 256, "overlap": 1, "trans": "nt", "scale": "row", "bias": "col", "act": "gelu"}),
)


def corpus():
    """(label, KernelConfig) for every entry of the set."""
    out = []
    for name, point in NAMED_POINTS.items():
        arch = "sm_90a" if point.family == "hopper" else "sm_90"
        out.append((name, point.config(arch)))
        if point.family in ("mma", "hopper", "wmma", "warp"):
            for v in VARIANTS:
                label = name + "/" + ",".join(f"{k}={x}" for k, x in v.items())
                try:
                    out.append((label, make_config(point.family, {**point.params, **v}, point.precision, arch)))
                except InvalidPoint:  # a variant the family does not compute
                    pass
    for prec, params in HOPPER:
        for v in ({}, VARIANTS[0], VARIANTS[2]):
            try:
                cfg = make_config("hopper", {**params, **v}, prec, "sm_90a")
            except InvalidPoint:
                continue
            out.append((cfg.name, cfg))
    return out


def fingerprint(config) -> dict:
    source = render_kernel(config)
    with tempfile.TemporaryDirectory(prefix="gg-cubin-") as tmp:
        src, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        src.write_text(source)
        proc = subprocess.run([find_tool("nvcc"), *DEFAULT_FLAGS, *config.build_arch.nvcc_flags, "-cubin",
                               str(src), "-o", str(cubin)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return {"error": (proc.stdout + proc.stderr).strip()[-400:], "lines": source.count("\n")}
        warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "warning" in line]
        return {"sha256": hashlib.sha256(cubin.read_bytes()).hexdigest(), "lines": source.count("\n"),
                **({"warnings": warnings} if warnings else {})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", type=Path, help="write the fingerprints here")
    ap.add_argument("--against", type=Path, help="compare with fingerprints saved earlier")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--only", help="entries whose label contains this text")
    ap.add_argument("--emit", type=Path, help="also write each entry's emitted source into this folder "
                    "(for benchmarks/cubin_speed.py)")
    args = ap.parse_args(argv)
    entries = [(label, cfg) for label, cfg in corpus() if not args.only or args.only in label]
    if args.emit:
        args.emit.mkdir(parents=True, exist_ok=True)
        for label, cfg in entries:
            (args.emit / (re.sub(r"[^A-Za-z0-9_.-]", "_", label) + ".cu")).write_text(render_kernel(cfg))
    with ThreadPoolExecutor(args.jobs) as pool:
        prints = dict(zip((label for label, _ in entries), pool.map(fingerprint, (c for _, c in entries))))
    if args.save:
        args.save.write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n")
    differ = 0
    if args.against:
        before = json.loads(args.against.read_text())
        lines_before = lines_after = 0
        for label, now in prints.items():
            old = before.get(label)
            if old is None:
                print(f"new      {label}")
                continue
            lines_before += old["lines"]
            lines_after += now["lines"]
            if old.get("sha256") != now.get("sha256") or "error" in now:
                differ += 1
                print(f"DIFFERS  {label}" + (f": {now['error']}" if "error" in now else ""))
        print(f"{len(prints)} kernels, {differ} cubins differ; emitted lines {lines_before} -> {lines_after}")
    errors = [label for label, p in prints.items() if "error" in p]
    for label in errors:
        print(f"compile error: {label}: {prints[label]['error']}", file=sys.stderr)
    warned = [label for label, p in prints.items() if "warnings" in p]
    for label in warned:
        print(f"warnings: {label}: " + " | ".join(prints[label]["warnings"]), file=sys.stderr)
    return 1 if differ or errors or warned else 0


if __name__ == "__main__":
    sys.exit(main())
