"""The commands that measure on the GPU: `bench` (named points, cuBLAS, the suite) and `tune` (a
family at shapes, or a workload file, and its fill). Each parses, calls the stage that does the
work (gemmgen.measure.plan, gemmgen.tune), and prints.
"""

import argparse
import sys

from gemmgen.cli.args import asked_variant, measured_batch_count, variant_options, variant_words
from gemmgen.describe.arch import detect_arch, parse_arch
from gemmgen.describe.config import DEFAULT_ARCH
from gemmgen.describe.points import point_spec
from gemmgen.describe.problem import Variant, split_variant
from gemmgen.errors import GemmgenError, InvalidParameter


def cmd_bench(args: argparse.Namespace) -> int:
    from gemmgen.describe.problem import parse_shape
    from gemmgen.measure.bench import Bench
    from gemmgen.measure.device import Gpu
    from gemmgen.measure.plan import build_plan, point_plan, run_plan
    from gemmgen.selection.report import format_rows
    from gemmgen.selection.suite import SUITE_PRECISIONS, geometric_mean_ratios, suite_plan
    from gemmgen.store.db import ResultsDB, resolve_url

    if bool(args.points) == bool(args.suite):
        raise InvalidParameter("name points to measure (e.g. `gemmgen bench v4 cublas`) or give --suite, not both")
    if args.precision and not args.suite:
        raise InvalidParameter("--precision goes with --suite: a named point has its own precision, and cuBLAS is "
                               "measured in the named points' (in all four where it is named alone)")
    if args.shape and args.suite:
        raise InvalidParameter("--shape goes with named points: the suite measures its own shapes "
                               "(gemmgen.selection.suite)")
    shapes = [parse_shape(s) for s in (args.shape or ["4096"])]
    labels = [p.strip() for p in args.points]
    specs = {label: point_spec(label) for label in labels if label.lower() != "cublas"}  # unknown names fail here
    given = variant_options(args)
    if given and args.suite:
        raise InvalidParameter("--trans, --out, --bias and --act apply to named points; the suite measures each "
                               "precision in its own variant (trans=nn into fp32 C, no bias, no activation; e4m3: "
                               "trans=nt into bf16 C with per-tensor scales)")
    specs = {label: (family, precision, {**params, **given}) for label, (family, precision, params) in specs.items()}
    batch_count = measured_batch_count(args, split_variant(given)[1].batched or any(
        split_variant(params)[1].batched for _, _, params in specs.values()))
    url = resolve_url(args.db)
    with Gpu(args.device) as gpu:
        db = ResultsDB(url)
        arch = gpu.info.arch
        if args.suite:
            plan = suite_plan(db, arch, args.precision or SUITE_PRECISIONS)
        else:  # cuBLAS's variant where no point is named: `gemmgen bench cublas --trans nt`
            plan, skipped = point_plan(specs, shapes, arch, split_variant(given)[1])
            for label, err in skipped.items():
                print(f"gemmgen: {label} cannot run on {arch.name}, skipped: {err}", file=sys.stderr)
        bench = Bench(gpu, db, tag="suite" if args.suite else "bench", seed=args.seed, interleave=True,
                      batch_count=batch_count)
        rows = []
        peak = gpu.info.peak_bandwidth  # bytes/s, for "% HBM"
        print(f"gemmgen bench on {gpu.info.name} ({arch.name}); results in {url}", file=sys.stderr)

        def starting(i, job):
            print(f"[{i}/{len(plan)}] {job.shape} {job.precision}{job.variant.suffix} {job.label} ...",
                  file=sys.stderr, flush=True)

        try:
            kernels = len({job.config.name for job in plan if job.config})
            if kernels:
                print(f"gemmgen bench: building {kernels} kernel(s) at once", file=sys.stderr, flush=True)
            builds = build_plan(plan)
            for job, m, ratio in run_plan(bench, plan, starting, builds):
                rows.append({
                    "point": job.label, "kernel": m.kernel, "precision": job.precision, "shape": str(job.shape),
                    **({"batch": m.batch} if batch_count > 1 else {}),  # TFLOP/s and GB/s: of every product
                    "ms": m.timing.median_ms if m.timing else None, "TFLOP/s": m.tflops,
                    "GB/s": m.bandwidth / 1e9 if m.bandwidth else None,
                    "% HBM": 100.0 * m.bandwidth / peak if m.bandwidth and peak else None,
                    "% cuBLAS": 100.0 * ratio if ratio else None,
                    "rel_err": m.rel_error, "status": m.status,
                })
                if m.status != "ok":
                    print(f"    {m.status}: {m.message.splitlines()[0] if m.message else ''}", file=sys.stderr)
        finally:
            bench.close()
    print(format_rows(rows, list(rows[0]) if rows else [], args.format))
    if args.suite and args.format == "table":
        for prec, ratio in geometric_mean_ratios(rows).items():
            print(f"geometric mean of ratios to cuBLAS, {prec}: " + (f"{ratio:.3f}" if ratio else "-"))
    return 0 if measured_ok(rows) else 1


def measured_ok(rows: list[dict]) -> bool:
    """Whether a bench run's rows are what exit status 0 says: every kernel verified and timed. A
    cuBLAS row is infeasible where cuBLAS has no algorithm (cuBLASLt's FP8 matmul at odd leading
    dimensions): the kernel was measured alone, which is a result, not a failure."""
    return all(r["status"] == "ok" or (r["point"] == "cublas" and r["status"] == "infeasible") for r in rows)


def cmd_tune(args: argparse.Namespace) -> int:
    import os
    import time

    from gemmgen.describe.problem import parse_shape
    from gemmgen.measure.device import device_count
    from gemmgen.store.db import resolve_url
    from gemmgen.tune.devices import TuneSpec, parse_devices, tune
    from gemmgen.tune.progress import Progress
    from gemmgen.tune.space import load_space

    if args.trials < (0 if args.fill else 1):
        raise InvalidParameter("--trials must be at least 1 (0 only with --fill: measure between the tuned token "
                               "counts, tune nothing new)")
    if args.fill and not args.workload:
        raise InvalidParameter("--fill measures between a workload's token counts: it goes with --workload FILE")
    if args.fill_points < 0:
        raise InvalidParameter(f"--fill-points must be at least 0 (0: explore no new token counts, only check the "
                               f"dispatcher's choices that rest on no measurement); got {args.fill_points}")
    if args.jobs is not None and args.jobs < 1:
        raise InvalidParameter("--jobs must be at least 1 (compile workers; leave it out for one per CPU core)")
    if args.workload:
        from gemmgen.describe.workload import load_workload
        from gemmgen.tune.workload import format_report, plan, tune_workload

        if args.shape:
            raise InvalidParameter("give --shape or --workload, not both: the workload file lists its shapes")
        if args.study:
            raise InvalidParameter("--study names one study; with --workload each shape has its own, named as "
                                   "`gemmgen tune --shape` names it")
        workload = load_workload(args.workload)
        variant = workload.variant_with(variant_options(args))
        batch_count = measured_batch_count(args, variant.batched)
        arch = parse_arch(args.gpu) if args.gpu else detect_arch()
        if arch is None:
            raise GemmgenError("no GPU detected; tuning measures on the GPU it tunes for")
        pairs = plan(workload, args.precision, args.family, arch, variant)
        devices = parse_devices(args.devices, device_count())
        url = resolve_url(args.db)
        base = TuneSpec("", "", (), url, None, args.sampler, args.seed, args.trials, args.timeout,
                        args.jobs or os.cpu_count() or 1, args.compile_timeout, args.gpu or arch.name, variant=variant,
                        batch_count=batch_count)
        print(f"gemmgen tune: workload {workload.name}, {len(workload.entries)} shapes in "
              f"{', '.join(f'{p}{variant.suffix} ({f})' for p, f in pairs)}, {args.trials} trials per shape, on "
              f"{', '.join(f'GPU{d}' for d in devices)}; results and studies in {url}", file=sys.stderr)
        names = [f"GPU{d}" for d in devices] if len(devices) > 1 else [""]
        start = time.monotonic()
        results, interrupted = tune_workload(workload, pairs, arch, base, devices,
                                             lambda total: Progress(total, names),
                                             lambda line: print(f"gemmgen tune: {line}", file=sys.stderr))
        print(format_report(workload, results, variant))
        usage = [r.devices for r in results if r.devices]  # on several GPUs, the shapes some GPU worked on
        if usage:
            from gemmgen.tune.schedule import device_usage, format_usage

            print(format_usage(device_usage(usage), names, time.monotonic() - start))
        if interrupted:
            print("interrupted: every trial so far is stored; run the same command again to go on")
            return 130
        if args.fill:
            _fill_workload(args, workload, pairs, arch, variant, url, devices[0])
        return 0
    if not args.family:
        raise InvalidParameter("--family is required with --shape (e.g. gemmgen tune --family warp --shape 4096); "
                               "only --workload picks one per precision")
    variant = asked_variant(args)
    batch_count = measured_batch_count(args, variant.batched)
    from gemmgen.tune.loop import check_variant

    space = load_space(args.family)
    precision = space.precision(args.precision)
    shapes = tuple(parse_shape(s) for s in (args.shape or ["4096"]))
    # before any GPU is opened: on --gpu's target, else the GPU present's (the tuner checks on it again)
    check_variant(space, precision, parse_arch(args.gpu) if args.gpu else (detect_arch() or parse_arch(DEFAULT_ARCH)),
                  variant)
    devices = parse_devices(args.devices, device_count())
    url = resolve_url(args.db)
    spec = TuneSpec(space.family, precision, shapes, url, args.study, args.sampler, args.seed, args.trials,
                    args.timeout, args.jobs or os.cpu_count() or 1, args.compile_timeout, args.gpu, variant=variant,
                    batch_count=batch_count)
    print(f"gemmgen tune: {space.family} {precision}{variant.suffix} at {', '.join(str(s) for s in shapes)} on "
          f"{', '.join(f'GPU{d}' for d in devices)}; results and study in {url}", file=sys.stderr)
    progress = Progress(args.trials, [f"GPU{d}" for d in devices] if len(devices) > 1 else [""])
    try:
        report = tune(spec, devices, progress)
    finally:
        progress.close()
    print_tune_report(report, space.family, precision, list(shapes), spec.jobs, args.gpu, variant)
    return 130 if report.interrupted else 0


def _fill_workload(args, workload, pairs, arch, variant, url: str, device: int) -> None:
    """`tune --workload FILE --fill`: gemmgen.tune.fill for each (precision, family) of ``pairs``."""
    import os

    from gemmgen.tune.fill import fill_workload

    log = lambda line: print(f"gemmgen tune: {line}", file=sys.stderr)  # noqa: E731
    for precision, found in fill_workload(workload, pairs, arch, variant, url, device, seed=args.seed,
                                          points=args.fill_points, jobs=args.jobs or os.cpu_count() or 1,
                                          limit_s=args.timeout, log=log):
        ratios = [r for _, _, r in found if r]
        print(f"fill {precision}: {len(found)} measured, {len(ratios)} verified and timed"
              + (f", best ratio to cuBLAS {max(ratios):.3f}" if ratios else ""))


def print_tune_report(report, family: str, precision: str, shapes: list, jobs: int, arch: str | None,
                      variant: Variant = Variant()) -> None:
    shape_args = " ".join(f"--shape {s}" for s in shapes) + variant_words(variant)
    print(f"study {report.study}: {report.trials} trials in {report.seconds / 60:.1f} min "
          f"({report.trials_per_minute:.1f} trials/min, {jobs} compile workers); "
          f"{report.infeasible} points that break a constraint drawn and dropped")
    if report.retimed:
        print("the best, re-timed in alternation with cuBLAS (as gemmgen bench times them):")
        for r in report.retimed:
            ratio = f"{100 * r.ratio:.1f}% of cuBLAS" if r.ratio else "-"
            over = "" if r.accurate else "  (error over the FP8 bound: ranked last)"
            print(f"  {r.name}  {r.tflops:.2f} TFLOP/s  {ratio}{over}")
        winner = report.retimed[0]
        print("  " + ", ".join(f"{k}={v}" for k, v in winner.config.params.items()))
    elif report.best:
        best = report.best
        line = f"best: {best.name}  {best.tflops:.2f} TFLOP/s"
        if report.baseline_tflops:
            line += f"  ({100 * best.tflops / report.baseline_tflops:.1f}% of cuBLAS {report.baseline_tflops:.2f})"
        print(line)
    else:
        print("no verified point yet")
    if report.best or report.retimed:
        for name, tflops in report.named.items():
            print(f"  named point {name}: {tflops:.2f} TFLOP/s in this study")
        print(f"emit: gemmgen emit best --family {family} --precision {precision} {shape_args}"
              + (f" --gpu {arch}" if arch else ""))
    if report.interrupted:
        print(f"interrupted: every trial so far is stored; resume with: gemmgen tune --family {family} "
              f"--precision {precision} {shape_args} --study {report.study}")
