"""One tuner with the fake GPU step (fakes.FakeBench) as a process of its own, for
test_tune_concurrency.py: python tune_worker.py URL STUDY TRIALS SEED [options]. Prints one JSON
line: its trial count and the points it measured."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakes import SHAPES, SM90, FakeBench, fake_compile  # noqa: E402

from gemmgen.store.db import ResultsDB  # noqa: E402
from gemmgen.tune import Tuner  # noqa: E402
from gemmgen.tune.space import load_space  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("study")
    parser.add_argument("trials", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds a measurement takes")
    parser.add_argument("--marker", help="a file to which each measurement's kernel is appended when it starts")
    parser.add_argument("--heartbeat", type=int, default=10)
    parser.add_argument("--grace", type=int, default=60)
    args = parser.parse_args()
    bench = FakeBench(ResultsDB(args.url), sleep_s=args.sleep, marker=args.marker)
    tuner = Tuner(bench, load_space("warp"), "fp32", SM90, SHAPES, study=args.study, storage=args.url,
                  sampler="tpe", seed=args.seed, jobs=1, log=lambda line: None,
                  heartbeat_interval_s=args.heartbeat, grace_period_s=args.grace)
    tuner.compile_fn = fake_compile
    report = tuner.run(args.trials, retime=False)
    print(json.dumps({"trials": report.trials, "measured": bench.measured}))


if __name__ == "__main__":
    main()
