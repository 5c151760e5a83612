"""What the L2 cache holds before a call, and what that costs: one emitted library (a kernel's, or
a dispatcher's) through gemmgen.torch against F.linear, in alternation, at given shapes, under
each state of alternate.L2_STATES (clean, C dirty, other dirty, A written: alternate.py says what
each holds). Each shape is timed twice, its tensors allocated at two offsets (a 1 MB or 38 MB pad
first). Needs a GPU and torch; run from the checkout root. Only F.linear's variant (nt, C in A's
type, no bias).
usage: python benchmarks/l2_state.py LIB.cu --shape MxNxK [--shape ...] [--rounds 20]"""
import argparse
import json
import os
import sys

import torch

from alternate import L2_STATES, Alternate
from gemmgen.describe.problem import parse_shape
from gemmgen.errors import InvalidParameter
from gemmgen.torch import load


def time_shape(op, clock: Alternate, m: int, n: int, k: int, alloc: int, rounds: int) -> list[dict]:
    """One row per L2 state: op's and F.linear's median times (us) at m x n x k, the tensors
    allocated after a pad of (37 * alloc + 1) MB; ``kernel`` the dispatcher's choice, or for a
    single kernel's library its file's name."""
    dev = torch.device("cuda")
    pad = torch.empty((alloc * 37 + 1) << 20, dtype=torch.uint8, device=dev)  # held until the end: moves the tensors
    a = (torch.rand(m, k, device=dev) * 2 - 1).to(op.dtype)
    a2 = a.clone()
    b = (torch.rand(n, k, device=dev) * 2 - 1).to(op.dtype)
    c, c2 = torch.empty(m, n, device=dev, dtype=op.dtype), torch.empty(m, n, device=dev, dtype=op.dtype)
    ours = lambda: op(a, b, out=c)
    theirs = lambda: torch.nn.functional.linear(a, b, out=c2)
    rewrite_a = lambda: a.copy_(a2)
    rows = []
    for state in L2_STATES:
        clock.l2 = state
        t1, t2 = clock.timed_gpu([(lambda: c.fill_(float("nan")), ours, rewrite_a),
                                  (lambda: c2.fill_(float("nan")), theirs, rewrite_a)], rounds=rounds)
        same = torch.allclose(c.float(), c2.float(), rtol=2e-2, atol=2e-1)
        row = dict(kernel=op.choice(m, n, k) or os.path.basename(str(op.path)), m=m, n=n, k=k, alloc=alloc,
                   state=state, us=t1 * 1e3, torch_us=t2 * 1e3, ratio=t2 / t1, same=same)
        rows.append(row)
        print(json.dumps(row), flush=True)
    del pad
    return rows


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
    rows = []
    for m, n, k in shapes:
        for alloc in range(2):
            rows += time_shape(op, clock, m, n, k, alloc, args.rounds)
            torch.cuda.empty_cache()
    print("\n%-46s %-17s %s  %s" % ("kernel", "M x N x K", "alloc", "  ".join("%-19s" % s for s in L2_STATES)))
    for i in range(0, len(rows), len(L2_STATES)):
        r0 = rows[i]
        print("%-46s %-17s %d      %s" % (r0["kernel"][:46], f"{r0['m']}x{r0['n']}x{r0['k']}", r0["alloc"], "  ".join(
            "%5.0f/%5.0f %.3f%s" % (r["us"], r["torch_us"], r["ratio"], "" if r["same"] else "!")
            for r in rows[i:i + len(L2_STATES)])))
    print("(each: gemmgen us / F.linear us, F.linear's time over gemmgen's; ! where the two results differ)")


if __name__ == "__main__":
    main()
