"""What the L2 cache holds before a call, and what that costs: one emitted library (a kernel's, or
a dispatcher's) through gemmgen.torch against F.linear, in alternation, at given shapes, under four
states of L2 at the call's start (C NaN-poisoned in every one):

  clean        C poisoned, then L2 flushed (a read of 2x L2): what gemmgen bench and the other
               benchmarks here time
  C dirty      L2 flushed, then C poisoned: C's poison in L2, dirty
  other dirty  C poisoned, L2 flushed, then a 96 MB buffer written: L2 full of another op's dirty output
  A written    C poisoned, L2 flushed, then A rewritten in place: the input just written by the op
               before, as in a model

Each shape is timed twice, its tensors allocated at two offsets (a 1 MB or 38 MB pad first). Needs
a GPU and torch; run from the checkout root. Only F.linear's variant (nt, C in A's type, no bias).
usage: python benchmarks/l2_state.py LIB.cu --shape MxNxK [--shape ...] [--rounds 20]"""
import argparse
import json
import sys

import torch

from alternate import Alternate
from gemmgen.describe.problem import parse_shape
from gemmgen.errors import InvalidParameter
from gemmgen.torch import load

STATES = ("clean", "C dirty", "other dirty", "A written")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("library")
    ap.add_argument("--shape", action="append", required=True, metavar="MxNxK")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    try:
        shapes = [(s.m, s.n, s.k) for s in map(parse_shape, args.shape)]
    except InvalidParameter as e:
        ap.error(f"--shape: {e}")
    op = load(args.library)
    v = op.variant
    if not v.b_transposed or op.out_dtype != op.dtype or v.bias != "none" or v.act != "none":
        sys.exit(f"{args.library}: variant {v.text}: only F.linear's (nt, C in A's type, no bias) is compared here")
    dev = torch.device("cuda")
    clock = Alternate(dev)
    flush = clock.flush_buf
    clock.flush_buf = torch.zeros(1, device=dev)  # each state below flushes (or not) itself
    scratch = torch.empty(96 << 20, dtype=torch.uint8, device=dev)
    rows = []
    for m, n, k in shapes:
        for alloc in range(2):
            pad = torch.empty((alloc * 37 + 1) << 20, dtype=torch.uint8, device=dev)
            a = (torch.rand(m, k, device=dev) * 2 - 1).to(op.dtype)
            a2 = a.clone()
            b = (torch.rand(n, k, device=dev) * 2 - 1).to(op.dtype)
            c, c2 = torch.empty(m, n, device=dev, dtype=op.dtype), torch.empty(m, n, device=dev, dtype=op.dtype)
            ours = lambda: op(a, b, out=c)
            theirs = lambda: torch.nn.functional.linear(a, b, out=c2)
            before = {
                "clean": lambda t: (t.fill_(float("nan")), flush.sum()),
                "C dirty": lambda t: (flush.sum(), t.fill_(float("nan"))),
                "other dirty": lambda t: (t.fill_(float("nan")), flush.sum(), scratch.fill_(3)),
                "A written": lambda t: (t.fill_(float("nan")), flush.sum(), a.copy_(a2)),
            }
            for state in STATES:
                t1, t2 = clock.timed_gpu([(lambda: before[state](c), ours), (lambda: before[state](c2), theirs)],
                                         rounds=args.rounds)
                same = torch.allclose(c.float(), c2.float(), rtol=2e-2, atol=2e-1)
                row = dict(kernel=op.choice(m, n, k), m=m, n=n, k=k, alloc=alloc, state=state, us=t1 * 1e3,
                           torch_us=t2 * 1e3, ratio=t2 / t1, same=same)
                rows.append(row)
                print(json.dumps(row), flush=True)
            del a, a2, b, c, c2, pad
            torch.cuda.empty_cache()
    print("\n%-46s %-17s %s  %s" % ("kernel", "M x N x K", "alloc", "  ".join("%-19s" % s for s in STATES)))
    for i in range(0, len(rows), len(STATES)):
        r0 = rows[i]
        print("%-46s %-17s %d      %s" % (r0["kernel"][:46], f"{r0['m']}x{r0['n']}x{r0['k']}", r0["alloc"], "  ".join(
            "%5.0f/%5.0f %.3f%s" % (r["us"], r["torch_us"], r["ratio"], "" if r["same"] else "!")
            for r in rows[i:i + len(STATES)])))
    print("(each: gemmgen us / F.linear us, F.linear's time over gemmgen's; ! where the two results differ)")


if __name__ == "__main__":
    main()
