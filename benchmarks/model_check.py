"""The selection model against what a dispatcher's kernels took at the token counts it served, from
the output of benchmarks/token_counts.py (no GPU): each row's kernel (the dispatcher's choice) at
its shape, predicted by the model fitted on a results database, against the time measured there.

`gemmgen model` holds out stored measurements, which sit on the workload's grid and at the fill's
token counts; a dispatcher serves token counts drawn at random, and serves each with the kernel
predicted fastest, so its errors lean one way (a kernel predicted too fast is the one taken). This
prints, per JSON file, the median and 90th percentile of |predicted / measured - 1|, how many
predictions were over 10% too fast and too slow, and the rows predicted most optimistically.
Times: the model's are drift-normalized to the stored cuBLAS times (gemmgen.selection.dispatch.model),
the benchmark's are GPU times with the host's latency hidden; read them within a few percent.
usage: python benchmarks/model_check.py DB RUN.json [RUN.json ...] [--worst 5]"""
import argparse
import json
import statistics

import numpy as np

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.problem import Shape, Variant
from gemmgen.selection.dispatch.model import TimeModel, stored_samples
from gemmgen.store.db import ResultsDB, resolve_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("runs", nargs="+", help="JSON files written by benchmarks/token_counts.py")
    parser.add_argument("--worst", type=int, default=5)
    args = parser.parse_args()
    db = ResultsDB(resolve_url(args.db), create=False)
    arch, models = parse_arch("sm_90"), {}
    for path in args.runs:
        run = json.load(open(path))
        key = (run["precision"], run["variant"])
        if key not in models:
            samples, configs, sms, _ = stored_samples(db, run["precision"], arch, Variant.parse(run["variant"]))
            models[key] = (TimeModel.fit(samples, configs, sms), configs)
        model, configs = models[key]
        rows = [(model.predict(configs[r["kernel"]], Shape(r["m"], r["n"], r["k"])) / r["us"], r)
                for r in run["rows"] if r["kernel"] in configs]
        errors = [abs(q - 1) for q, _ in rows]
        print(f"{path} ({run['precision']}, {run['variant']}): {len(rows)} of {len(run['rows'])} rows; "
              f"median error {statistics.median(errors):.1%}, 90th percentile {np.percentile(errors, 90):.1%}; "
              f"{sum(q < 0.9 for q, _ in rows)} predicted over 10% too fast, {sum(q > 1.1 for q, _ in rows)} too slow")
        for q, r in sorted(rows, key=lambda x: x[0])[:args.worst]:
            print(f"  {r['m']:>5}x{r['n']}x{r['k']} {r['kernel']:<52} predicted {q * r['us']:8.1f} us, "
                  f"measured {r['us']:8.1f} (x{q:.2f}); torch {r['torch_us']:.1f}")


if __name__ == "__main__":
    main()
