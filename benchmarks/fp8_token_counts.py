"""An FP8 dispatcher against torch._scaled_mm at token counts drawn at random (issue 29's measure,
for issue 32's dispatchers): for each layer N x K given, COUNT token counts drawn uniformly from
[LO, HI] (token_counts.draw), e4m3 A (M x K) and B stored N x K, bf16 C, with the dispatcher's
scales (scale=tensor: one fp32 value each; scale=block: torch's 1x128 and 128x128 block scales,
in the layout gemmgen.describe.scaling gives both). Each result -- the dispatcher's through
gemmgen.torch and torch._scaled_mm's (its default accumulation, which promotes) -- is checked
against the float64 product of the exact fp8 values and scales, and its relative error set beside
torch's; then the two are timed alternating, median after warm-up with the host's latency hidden,
L2 flushed, gemmgen's C poisoned (torch's is new at each call). torch has no block-scaled
algorithm where M is not a multiple of 4: such counts are reported as refused and kept out of the
ratios. Prints per layer and in all the
geometric mean, the worst, the counts under 0.90 and 0.80, and the largest error ratio; writes
every row to OUT.json and, with --plot, the ratio against M per layer.
usage: python benchmarks/fp8_token_counts.py DISPATCHER.cu OUT.json --layer NxK [--layer ...]
       [--count 25] [--range 1 8192] [--seed 29] [--plot OUT.png] [--rounds 15] [--label NAME]
       (needs an H100/H200 and torch; run from the checkout root)"""
import argparse
import json
import sys

import torch
from alternate import Alternate, device_verdict
from fp8_block import fp8_operands
from token_counts import draw, drawing_options, layers_of, plot, print_table, summary

from gemmgen.describe.problem import Shape
from gemmgen.torch import load


def main() -> None:
    ap = argparse.ArgumentParser()
    drawing_options(ap, 25)
    args = ap.parse_args()
    layers = layers_of(args)
    shapes = draw(layers, args.count, *args.range, args.seed, {})
    dev = torch.device("cuda:0")
    op = load(args.dispatcher)
    variant = op.variant
    if op.dtype != torch.float8_e4m3fn or variant.trans != "nt" or variant.bias != "none" or variant.act != "none" \
            or variant.scale not in ("tensor", "block"):
        sys.exit(f"{args.dispatcher}: variant {variant.text}: this benchmark takes e4m3 nt dispatchers without an "
                 "epilogue, scaled per tensor or by blocks (torch._scaled_mm's product)")
    clock = Alternate(dev)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rows, refused = [], []
    for index, (m, n, k) in enumerate([shapes[0], *shapes]):  # the first twice: torch warms up over seconds
        s = Shape(m, n, k)
        a, w, (sa, sb), a64, w64 = fp8_operands(variant.scale, s, dev, gen)  # sa, sb: torch's layout, and ours
        ref, bound = a64 @ w64.T, a64.abs() @ w64.abs().T
        del a64, w64
        c = torch.empty(m, n, device=dev, dtype=op.out_dtype)
        ours = lambda: op(a, w, out=c, scale_a=sa, scale_b=sb)
        theirs = lambda: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=op.out_dtype)  # C of its own, new
        c.fill_(float("nan"))
        ours()
        mine = device_verdict(c, ref, bound, "e4m3", k, variant.out)
        try:
            torch_v = device_verdict(theirs(), ref, bound, "e4m3", k, variant.out)
        except RuntimeError as e:  # no block-scaled algorithm at this M
            torch_v = None
            if index:
                refused.append({"m": m, "n": n, "k": k, "correct": bool(mine.ok), "why": str(e).splitlines()[0]})
                print(json.dumps(refused[-1]), flush=True)
        if torch_v is not None:
            assert torch_v.ok, f"torch._scaled_mm at {s}: {torch_v.message}"
            fns = [(lambda: c.fill_(float("nan")), ours), (lambda: None, theirs)]
            t_ours, t_torch = clock.timed_gpu(fns, rounds=args.rounds)
            if index:
                rows.append({"m": m, "n": n, "k": k, "kernel": op.choice(m, n, k), "us": t_ours * 1e3,
                             "torch_us": t_torch * 1e3, "ratio": t_torch / t_ours, "correct": bool(mine.ok),
                             "message": mine.message, "error_x": mine.rel_error / torch_v.rel_error})
                print(json.dumps(rows[-1]), flush=True)
        del a, w, c, ref, bound
        torch.cuda.empty_cache()
    result = {"label": args.label, "precision": "e4m3", "dispatcher": args.dispatcher, "variant": variant.text,
              "range": list(args.range), "seed": args.seed, "rows": rows, "refused_by_torch": refused,
              "layers": {f"{n}x{k}": summary([r for r in rows if (r["n"], r["k"]) == (n, k)]) for n, k in layers},
              "all": summary(rows), "device": torch.cuda.get_device_name(dev),
              "largest_error_x": max(r["error_x"] for r in rows)}
    json.dump(result, open(args.out, "w"), indent=1)
    if args.plot:
        plot(rows, layers, args.plot, f"{args.label or args.dispatcher} e4m3 ({variant.text}) on "
             f"{result['device']}: geomean {result['all']['geomean']:.3f}", "torch._scaled_mm time / gemmgen time")
    print_table(result, f"{args.label} e4m3 ({variant.text}) vs torch._scaled_mm, {len(rows)} shapes, M in "
                        f"{args.range}; largest error {result['largest_error_x']:.2f}x torch's; refused by torch: "
                        f"{len(refused)} (all correct here: {all(r['correct'] for r in refused)})")
    sys.exit(0 if result["all"]["all_correct"] and all(r["correct"] for r in refused) else 1)


if __name__ == "__main__":
    main()
