"""A dispatcher against torch at token counts drawn at random (issue 29's measure): for each layer
N x K given, COUNT token counts drawn uniformly from [LO, HI] (without the counts a workload file
lists for it, with --not-in), each shape's result checked against float64, and its time against
torch's in the same process (cuBLAS, fp32 out: ``torch.mm(a, b, out_dtype=torch.float32)``; for a
variant with B stored N x K, ``F.linear``, with the column bias where the variant adds one):
alternating, median after warm-up, random data, C poisoned and L2 flushed (a read of 2x L2) before
each call (with --l2, another of alternate.L2_STATES), the host's latency hidden (Alternate.timed_gpu). Prints per layer and in all the
geometric mean, the worst, and the counts under 0.90 and 0.80; writes every row to OUT.json and,
with --plot, the ratio against M per layer.
usage: python benchmarks/token_counts.py PRECISION DISPATCHER.cu OUT.json --layer NxK [--layer ...]
       [--count 100] [--range 1 8192] [--seed 29] [--not-in WORKLOAD.toml] [--plot OUT.png]
       [--rounds 15] [--label NAME] [--l2 STATE]     (needs a GPU and torch; run from the checkout root)
       python benchmarks/token_counts.py PRECISION DISPATCHER.cu OUT.json --shape MxNxK [--shape ...]
       (those shapes instead of drawn ones, in that order: to time again the rows of an earlier run)"""
import argparse
import json
import random
import sys

import torch
from alternate import L2_STATES, Alternate, device_verdict

from gemmgen.describe.problem import parse_shape
from gemmgen.describe.workload import load_workload
from gemmgen.errors import InvalidParameter
from gemmgen.selection.report import geometric_mean
from gemmgen.torch import load


def draw(layers, count, lo, hi, seed, listed):
    """(M, N, K) per layer: ``count`` distinct token counts uniform in [lo, hi], none of ``listed``."""
    rng = random.Random(seed)
    out = []
    for n, k in layers:
        taken = set(listed.get((n, k), ()))
        ms = []
        while len(ms) < min(count, hi - lo + 1 - len(taken)):
            m = rng.randint(lo, hi)
            if m not in taken:
                taken.add(m)
                ms.append(m)
        out += [(m, n, k) for m in sorted(ms)]
    return out


def summary(rows):
    r = [x["ratio"] for x in rows]
    return {"shapes": len(r), "geomean": geometric_mean(r), "worst": min(r), "under_0.90": sum(x < 0.9 for x in r),
            "under_0.80": sum(x < 0.8 for x in r), "share_at_least_0.90": sum(x >= 0.9 for x in r) / len(r),
            "all_correct": all(x["correct"] for x in rows)}


def plot(rows, layers, path, title, ylabel):
    """The ratio against M, a line per layer, with 1.0 and 0.9 marked, to ``path`` (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for n, k in layers:
        mine = [r for r in rows if (r["n"], r["k"]) == (n, k)]
        ax.plot([r["m"] for r in mine], [r["ratio"] for r in mine], "o-", ms=3, lw=0.8, label=f"N={n}, K={k}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.9, color="r", lw=0.6, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token count M")
    ax.set_ylabel(f"{ylabel} (above 1: faster)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_table(result, heading):
    """Per layer and in all: shapes, geometric mean, worst, counts under 0.90 and 0.80, correct."""
    print(f"\n== {heading}")
    print(f"{'layer':<14}{'shapes':>7}{'geomean':>9}{'worst':>8}{'<0.90':>7}{'<0.80':>7}  correct")
    for name, s in list(result["layers"].items()) + [("all", result["all"])]:
        print(f"{name:<14}{s['shapes']:>7}{s['geomean']:>9.3f}{s['worst']:>8.3f}{s['under_0.90']:>7}"
              f"{s['under_0.80']:>7}  {s['all_correct']}")


def drawing_options(ap: argparse.ArgumentParser, count: int, layer_required: bool = True) -> None:
    """The options both token-count benchmarks take: the dispatcher, OUT.json, the layers and how
    their token counts are drawn, the plot, the rounds and the label."""
    ap.add_argument("dispatcher")
    ap.add_argument("out")
    ap.add_argument("--layer", action="append", required=layer_required, default=[], metavar="NxK")
    ap.add_argument("--count", type=int, default=count)
    ap.add_argument("--range", type=int, nargs=2, default=(1, 8192), metavar=("LO", "HI"))
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--plot", metavar="PNG")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--label", default="")


def layers_of(args) -> list[tuple[int, int]]:
    """(N, K) of each --layer NxK."""
    return [tuple(int(x) for x in text.lower().split("x")) for text in args.layer]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("precision")
    drawing_options(ap, 100, layer_required=False)
    ap.add_argument("--not-in", metavar="WORKLOAD", help="leave out the token counts this workload lists")
    ap.add_argument("--shape", action="append", default=[], metavar="MxNxK",
                    help="time these shapes, in this order, instead of drawing token counts (no --layer needed)")
    ap.add_argument("--l2", default="clean", choices=L2_STATES,
                    help="what L2 holds when each call starts (benchmarks/alternate.py); default: clean, as gemmgen bench")
    args = ap.parse_args()
    if not args.shape and not args.layer:
        ap.error("give the layers to draw token counts for (--layer NxK), or the shapes to time (--shape MxNxK)")
    if args.shape:
        try:
            shapes = [(s.m, s.n, s.k) for s in map(parse_shape, args.shape)]
        except InvalidParameter as e:
            ap.error(f"--shape: {e}")
        layers = list(dict.fromkeys((n, k) for _, n, k in shapes))
    else:
        layers = layers_of(args)
        listed = {}
        if args.not_in:
            for s in load_workload(args.not_in).shapes:
                listed.setdefault((s.n, s.k), []).append(s.m)
        shapes = draw(layers, args.count, *args.range, args.seed, listed)
    dev = torch.device("cuda:0")
    op = load(args.dispatcher)
    variant = op.variant
    dtype = op.dtype
    out_dtype = op.out_dtype
    if variant.bias not in ("none", "col") or variant.act != "none" or (variant.bias == "col" and out_dtype != dtype):
        sys.exit(f"{args.dispatcher}: variant {variant.text}: only no bias or a column bias into A's type "
                 f"(F.linear's), and no activation, have a torch call to compare with here")
    clock = Alternate(dev, args.l2)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rows = []
    for m, n, k in shapes:
        a = (torch.rand(m, k, device=dev, generator=gen) * 2 - 1).to(dtype)
        b_shape = (n, k) if variant.b_transposed else (k, n)
        b = (torch.rand(*b_shape, device=dev, generator=gen) * 2 - 1).to(dtype)
        c, c_ref = torch.empty(m, n, device=dev, dtype=out_dtype), torch.empty(m, n, device=dev, dtype=out_dtype)
        bias = (torch.rand(n, device=dev, generator=gen) * 2 - 1).to(out_dtype) if variant.bias == "col" else None
        if variant.b_transposed:
            theirs = lambda: torch.nn.functional.linear(a, b, bias, out=c_ref) if out_dtype == dtype else \
                torch.mm(a, b.t(), out_dtype=out_dtype, out=c_ref)
        else:
            theirs = lambda: torch.mm(a, b, out_dtype=out_dtype, out=c_ref) if out_dtype != dtype else \
                torch.mm(a, b, out=c_ref)
        ours = lambda: op(a, b, out=c, bias=bias)
        a_written = a.clone() if args.l2 == "A written" else None
        rewrite_a = lambda: a.copy_(a_written)
        fns = [(lambda: c.fill_(float("nan")), ours, rewrite_a), (lambda: c_ref.fill_(float("nan")), theirs, rewrite_a)]
        t_ours, t_torch = clock.timed_gpu(fns, rounds=args.rounds)
        c.fill_(float("nan"))
        ours()
        torch.cuda.synchronize()
        a64, b64 = a.double(), (b.double().t() if variant.b_transposed else b.double())
        bias64 = torch.zeros(n, dtype=torch.float64, device=dev) if bias is None else bias.double()
        verdict = device_verdict(c, a64 @ b64 + bias64, a64.abs() @ b64.abs() + bias64.abs(), args.precision, k,
                                 variant.out)
        row = {"m": m, "n": n, "k": k, "kernel": op.choice(m, n, k), "us": t_ours * 1e3, "torch_us": t_torch * 1e3,
               "ratio": t_torch / t_ours, "correct": bool(verdict.ok), "message": verdict.message}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del a, b, c, c_ref, a64, b64, bias, a_written
        torch.cuda.empty_cache()
    result = {"label": args.label, "precision": args.precision, "dispatcher": args.dispatcher, "l2": args.l2,
              "variant": variant.text, "range": list(args.range), "seed": args.seed, "rows": rows,
              "layers": {f"{n}x{k}": summary([r for r in rows if (r["n"], r["k"]) == (n, k)]) for n, k in layers},
              "all": summary(rows), "device": torch.cuda.get_device_name(dev)}
    json.dump(result, open(args.out, "w"), indent=1)
    if args.plot:
        plot(rows, layers, args.plot, f"{args.label or args.dispatcher} {args.precision} ({variant.text}) on "
             f"{result['device']}: geomean {result['all']['geomean']:.3f}", "torch time / gemmgen time")
    print_table(result, f"{args.label} {args.precision} ({variant.text}) vs torch, {len(rows)} shapes, M in "
                        f"{args.range}, L2 {args.l2}")
    sys.exit(0 if result["all"]["all_correct"] else 1)


if __name__ == "__main__":
    main()
