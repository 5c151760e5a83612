"""What a dispatcher's choice costs at a token count it has no measurement of (issue 29), from a
results database alone (no GPU): for each stored shape where at least 6 kernels were measured,
every measurement at that shape is held out, the selection model is fitted on the rest, and
among the kernels measured there the one a dispatcher would take (gemmgen.selection.dispatch.select:
the model's prediction times its caution factors) is set against the fastest of them, by their
measured times. The geometric mean of those ratios (1.0: always the fastest) is the choice's
regret where the model has to predict; with the candidates' own measurements it would be 1.0.

Also printed: the same with the model's predictions alone (no caution factors), and with the
nearest measured token count's winner instead of the model.
usage: python benchmarks/choice_regret.py DB PRECISION [--trans nt --out bf16 ...] [--shapes 80]"""
import argparse
import math
import statistics
from collections import defaultdict

import numpy as np

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.problem import Shape, Variant
from gemmgen.selection.dispatch import select
from gemmgen.selection.dispatch.model import TimeModel, stored_samples
from gemmgen.selection.report import geometric_mean
from gemmgen.store.db import ResultsDB


def held_out(db_url: str, precision: str, variant: Variant, count: int):
    """Per held-out shape: (shape, [(kernel, predicted us, caution factor, measured us)])."""
    db = ResultsDB(db_url, create=False)
    samples, configs, sms, _ = stored_samples(db, precision, parse_arch("sm_90"), variant)
    times = defaultdict(list)
    for s in samples:
        times[s.shape, s.kernel].append(s.us)
    by_shape = defaultdict(dict)
    for (shape, kernel), us in times.items():
        by_shape[shape][kernel] = statistics.median(us)
    shapes = sorted(s for s, kernels in by_shape.items() if len(kernels) >= 6 and s.m > 8)
    shapes = shapes[::max(1, len(shapes) // count)]
    out = []
    for shape in shapes:
        rest = [s for s in samples if s.shape != shape]
        model = TimeModel.fit(rest, configs, sms)
        measured = defaultdict(set)
        for s in rest:
            measured[s.kernel, s.shape.n, s.shape.k].add(s.shape.m)
        ms = np.array([shape.m])
        rows = []
        for kernel, us in by_shape[shape].items():
            at = measured.get((kernel, shape.n, shape.k), set())
            factor = select.caution(model, configs[kernel], shape.n, shape.k, at, ms)[0]
            rows.append((kernel, model.predict(configs[kernel], shape), factor, us))
        out.append((shape, rows))
    return out, by_shape


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("precision")
    ap.add_argument("--trans", default="nn")
    ap.add_argument("--out", default="fp32")
    ap.add_argument("--bias", default="none")
    ap.add_argument("--scale", default="none")
    ap.add_argument("--shapes", type=int, default=80)
    args = ap.parse_args()
    variant = Variant(args.trans, args.out, args.bias, scale=args.scale)
    url = args.db if "://" in args.db else f"sqlite:///{args.db}"
    data, by_shape = held_out(url, args.precision, variant, args.shapes)
    cautious, raw, nearest = [], [], []
    for shape, rows in data:
        best = min(r[3] for r in rows)
        cautious.append(min(rows, key=lambda r: r[1] * r[2])[3] / best)
        raw.append(min(rows, key=lambda r: r[1])[3] / best)
        others = sorted((s for s in by_shape if (s.n, s.k) == (shape.n, shape.k) and s.m != shape.m),
                        key=lambda s: abs(math.log(s.m / shape.m)))
        for near in others[:3]:
            there = by_shape[near]
            rated = [(there[k] / min(there.values()), k) for k, *_ in rows if k in there]
            if rated:
                pick = min(rated)[1]
                nearest.append(next(r[3] for r in rows if r[0] == pick) / best)
                break
    print(f"{args.precision} ({variant.text}), {len(data)} held-out shapes of {url}")
    for name, xs in (("the dispatcher's choice", cautious), ("the model alone", raw),
                     ("the nearest token count's winner", nearest)):
        print(f"  {name:<34} regret {geometric_mean(xs):.3f} (worst {max(xs):.2f}, {sum(x > 1.05 for x in xs)} of "
              f"{len(xs)} over 1.05)")


if __name__ == "__main__":
    main()
