"""The `gemmgen` command line: list, emit, build, bench, tune, results, best, plot.

Errors the user can fix print one message on stderr and exit with status 2; `emit` writes only
CUDA source to stdout.
"""

import argparse
import os
import re
import sys
from pathlib import Path

from gemmgen import __version__
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import Arch, detect_arch, parse_arch
from gemmgen.describe.config import DEFAULT_ARCH, KernelConfig, make_config, parse_assignments
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.points import NAMED_POINTS, point_spec
from gemmgen.describe.problem import (ACTIVATIONS, BATCHES, BIASES, LAYOUTS, OUTPUTS, VARIANT_KEYS, Variant, option_of,
                                      split_variant)
from gemmgen.errors import GemmgenError, InvalidParameter
from gemmgen.plot.command import add_parser as add_plot_parser


class Parser(argparse.ArgumentParser):
    """argparse's parser with gemmgen's rules for what is typed, for every command: an error is
    one line (what was wrong; `--help` says what is allowed) with exit status 2; no value may be
    blank (``--set ''``, ``-o ''``); numbers are written in ASCII digits (``４０９６`` is refused,
    as gemmgen.describe.problem.parse_shape and the parameters refuse it)."""

    def error(self, message: str):
        # where argparse's message does not say what is allowed, --help does
        lists = not message.startswith(("unrecognized arguments", "the following arguments are required"))
        self.exit(2, f"gemmgen: error: {message}{'' if lists else f' (`{self.prog} --help` lists the options)'}\n")

    def add_argument(self, *names, **kwargs):
        if kwargs.get("action", "store") in ("store", "append") and "choices" not in kwargs:
            kind = kwargs.get("type", str)
            kwargs["type"] = _TYPES.get(kind, kind)
        return super().add_argument(*names, **kwargs)


def _text(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is empty: give a value")
    return value


def _whole(value: str) -> int:
    if not re.fullmatch(r"-?[0-9]+", value.strip()):
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number in ASCII digits (e.g. 8)")
    return int(value)


def _number(value: str) -> float:
    if not re.fullmatch(r"[0-9]+(\.[0-9]*)?|\.[0-9]+", value.strip()):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number in ASCII digits (e.g. 2.5)")
    return float(value)


_TYPES = {str: _text, int: _whole, float: _number}


def _device_list(value: str) -> str:
    """--devices: ``all`` or GPU numbers in ASCII digits separated by commas (gemmgen.tune.devices
    checks them against the GPUs present)."""
    if not re.fullmatch(r"\s*(all|[0-9]+(\s*,\s*[0-9]+)*)\s*", value, re.IGNORECASE):
        raise argparse.ArgumentTypeError(f"{value!r}: write GPU numbers in ASCII digits separated by commas (e.g. "
                                         "0,1), or all")
    return value


def output_file(value: str) -> str:
    """The type of every -o FILE: checked when the command line is read, before any work, so that
    nothing is built or measured for a file that cannot be written: not blank, not a folder, in
    a folder that exists and can be written (or a file that can)."""
    path = Path(_text(value))
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a folder: give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {value}: folder {folder} does not exist")
    if not os.access(path if path.exists() else folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {value}: {'it' if path.exists() else f'folder {folder}'} "
                                         "is not writable")
    return value


def _target(text: str | None, quiet: bool = False) -> Arch:
    """--gpu's architecture, else the GPU present's, else DEFAULT_ARCH (saying so on stderr
    unless ``quiet``: a caller whose messages name the architecture anyway)."""
    if text:
        from gemmgen.build.nvcc import check_target

        arch = parse_arch(text)
        check_target(arch)
        return arch
    found = detect_arch()
    if found is None:
        if not quiet:
            print(f"gemmgen: no GPU detected; targeting {DEFAULT_ARCH} (choose with --gpu)", file=sys.stderr)
        return parse_arch(DEFAULT_ARCH)
    return found


def variant_options(args: argparse.Namespace) -> dict[str, str]:
    """The variant options given (--trans, --out, --bias, --act, --batch-mode; see add_variant_arguments), by
    key. --batch N (a count, commands that measure) asks for batch=strided where --batch-mode is not given."""
    given = {key: getattr(args, key) for key in VARIANT_KEYS if getattr(args, key, None)}
    count = getattr(args, "batch_count", None)
    if count is not None:
        if count < 1:
            raise InvalidParameter(f"--batch {count}: the batch count must be at least 1")
        if given.get("batch") == "none":
            raise InvalidParameter("--batch N measures a strided batch; it cannot go with --batch-mode none")
        given["batch"] = "strided"
    return given


def measured_batch_count(args: argparse.Namespace, batched: bool) -> int:
    """The products per launch that bench and tune measure a batched variant at (--batch N), 1
    where nothing measured is batched. Raises InvalidParameter where a batched variant (named, or
    --batch-mode strided) comes without --batch N: the count is part of what is measured."""
    if not batched:
        return 1
    if args.batch_count is None:
        raise InvalidParameter("a batched variant (batch=strided) is measured at a batch count: give --batch N, the "
                               "products per launch (e.g. --batch 8)")
    return args.batch_count


def asked_variant(args: argparse.Namespace, sets: dict | None = None) -> Variant:
    """The variant the command line asks for: the variant options, and the variant keys of
    ``sets`` (--set's assignments, where the command has --set), the rest the default. Raises
    InvalidParameter where --set and an option give one key different values."""
    sets = dict(sets or {})
    given = variant_options(args)
    from_set = split_variant(sets)[1]
    for key, value in given.items():
        named = next((k for k in sets if str(k).strip().lower() == key), None)
        if named is not None and getattr(from_set, key) != value:
            raise InvalidParameter(f"--set gives {named}={sets[named]} and {option_of(key)} gives {value}; "
                                   f"give {key} once")
    return Variant(**{**{k: getattr(from_set, k) for k in VARIANT_KEYS}, **given})


def _variant_words(variant: Variant) -> str:
    """The options that ask for ``variant`` (" --trans nt --out bf16"), empty for the default."""
    return "".join(f" {option_of(key)} {value}" for key, value in variant.items)


def select_config(args: argparse.Namespace) -> KernelConfig:
    """The point named on the command line: POINT and/or --family, --precision, --set, the variant
    options, --gpu."""
    sets = parse_assignments(args.set) if args.set else {}
    variant = asked_variant(args, sets)
    given = {str(k).strip().lower() for k in sets} | set(variant_options(args))
    overrides = {**split_variant(sets)[0], **{k: getattr(variant, k) for k in VARIANT_KEYS if k in given}}
    if _names_best(args):
        return _best_config(args, overrides)
    if args.point and args.family:
        raise InvalidParameter("give either a point (e.g. v4) or --family, not both")
    if args.point:
        family, precision, params = point_spec(args.point)
    elif args.family:
        family, precision, params = args.family, None, {}
    else:
        raise InvalidParameter("name a point (e.g. `gemmgen emit v4`) or a family (`--family warp --set BM=64`); "
                               "`gemmgen list` shows both")
    return make_config(family, {**params, **overrides}, args.precision or precision, _target(args.gpu))


def _best_config(args: argparse.Namespace, overrides: dict) -> KernelConfig:
    """`emit best --precision P --shape S [--family F] [--gpu]`: the best verified kernel stored."""
    missing = [flag for flag, value in (("--precision", args.precision), ("--shape", args.shape)) if not value]
    if missing:
        raise InvalidParameter(f"`emit best` needs {', '.join(missing)}, e.g. "
                               "gemmgen emit best --precision fp32 --shape 4096 [--family warp]")
    variant = asked_variant(args, overrides)
    found, arch, shape = _stored_best(args, variant)
    count = f" (measured at a batch of {args.batch_count})" if args.batch_count is not None else ""
    print(f"gemmgen: best {args.precision}{variant.suffix} kernel at {shape}{count} for {arch.name}: "
          f"{_describe_ranked(found)}", file=sys.stderr)
    family, precision, params = point_spec(found.kernel)
    return make_config(family, {**params, **overrides}, precision, arch)


def _describe_ranked(found) -> str:
    score = f"{100 * found.score:.1f}% of cuBLAS (median)" if found.score is not None else "no cuBLAS stored next to it"
    return f"{found.kernel}, {score}, {found.tflops:.2f} TFLOP/s at best, on {', '.join(found.devices)}"


def _stored_best(args: argparse.Namespace, variant: Variant):
    """(the best verified stored kernel of ``variant`` for --precision, --shape [, --family] on
    the --gpu architecture (default: the GPU present, else sm_90) by gemmgen.selection.best's policy, ranked
    by the rows of --batch N products per launch where given (else of every count), the Arch, the
    Shape). Raises GemmgenError naming what was looked for where nothing is stored."""
    from gemmgen.describe.problem import parse_shape
    from gemmgen.selection.best import best, wanted
    from gemmgen.store.db import ResultsDB, resolve_url

    shape = parse_shape(args.shape)
    arch = _target(args.gpu, quiet=True)
    url = resolve_url(args.db)
    db = ResultsDB(url, create=False)
    count = args.batch_count
    found = best(db, args.precision, shape, arch, family=args.family, variant=variant, batch_count=count)
    if found is None:
        what = wanted(args.precision, args.family, variant, count)
        if count is not None and best(db, args.precision, shape, arch, family=args.family, variant=variant):
            raise GemmgenError(f"no verified {what} at {shape} for {arch.name} in {url}, only at other batch counts "
                               f"(`gemmgen results --shape {shape}` shows each row's batch_count); drop --batch, or "
                               f"measure at this one (gemmgen bench ... --batch {count})")
        raise GemmgenError(f"no verified {what} at {shape} for {arch.name} in {url}; "
                           "run `gemmgen tune` or `gemmgen bench` first")
    return found, arch, shape


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
    shape_args = " ".join(f"--shape {s}" for s in shapes) + _variant_words(variant)
    print(f"study {report.study}: {report.trials} trials in {report.seconds / 60:.1f} min "
          f"({report.trials_per_minute:.1f} trials/min, {jobs} compile workers); "
          f"{report.infeasible} points that break a constraint drawn and dropped")
    if report.retimed:
        print("the best, re-timed in alternation with cuBLAS (as gemmgen bench times them):")
        for r in report.retimed:
            ratio = f"{100 * r.ratio:.1f}% of cuBLAS" if r.ratio else "-"
            print(f"  {r.name}  {r.tflops:.2f} TFLOP/s  {ratio}")
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


def cmd_list(args: argparse.Namespace) -> int:
    families = [FAMILIES[args.family]] if args.family else list(FAMILIES.values())
    for fam in families:
        print(f"family {fam.name}: {fam.doc}")
        print(f"  precisions: {', '.join(fam.precisions)}")
        print(f"  requires:   {fam.requires}")
        for p in fam.params:
            choices = ", ".join(str(c) for c in p.choices)
            print(f"  {p.name:<8} default {str(fam.defaults[p.name]):<8} one of {{{choices}}}  {p.doc}")
        print()
    print("named points:")
    for point in NAMED_POINTS.values():
        if args.family and point.family != args.family:
            continue
        name = point.config().name
        print(f"  {point.name:<15} {name:<45} {point.source}")
        if point.note:
            print(f"  {'':<15} note: {point.note}")
    return 0


#: The options of `emit` that only some kinds of emit take, with why, in the order they are checked:
#: an option given to another kind would do nothing, and is refused. The kinds: "point" (a named
#: point, a canonical name or --family), "best" (`emit best`), "dispatch" (--dispatch).
EMIT_OPTIONS = {
    "workload": ("--workload", ("dispatch",), "one kernel per shape, chosen at run time"),
    "batch_count": ("--batch N", ("best", "dispatch"), "it picks stored measurements of N products per launch (a "
                    "batched kernel takes the count at launch: --batch-mode strided emits one)"),
    "shape": ("--shape", ("best", "dispatch"), "it picks stored kernels (every emitted kernel serves every shape)"),
    "db": ("--db", ("best", "dispatch"), "it is where stored kernels are picked from"),
}


def _names_best(args: argparse.Namespace) -> bool:
    """Whether the point named is ``best`` (`emit best`: the best stored kernel)."""
    return bool(args.point) and args.point.strip().lower() == "best"


def _emit_kind(args: argparse.Namespace) -> str:
    return "dispatch" if args.dispatch else "best" if _names_best(args) else "point"


def _check_emit_options(args: argparse.Namespace) -> None:
    """Refuses an option that the kind of emit asked for does not take (EMIT_OPTIONS)."""
    kind = _emit_kind(args)
    words = {"point": "a named point or --family", "best": "`emit best`", "dispatch": "--dispatch"}
    for dest, (option, kinds, why) in EMIT_OPTIONS.items():
        if getattr(args, dest) is not None and kind not in kinds:
            raise InvalidParameter(f"{option} goes with {' or '.join(words[k] for k in kinds)}, not with "
                                   f"{words[kind]}: {why}")


def cmd_emit(args: argparse.Namespace) -> int:
    _check_emit_options(args)
    if args.dispatch:
        source = _dispatcher_source(args)
    else:
        if args.shape and len(args.shape) > 1:
            raise InvalidParameter("`emit best` takes one --shape; for several, emit a dispatcher: "
                                   "gemmgen emit --dispatch --shape S1 --shape S2 ...")
        args.shape = args.shape[0] if args.shape else None
        config = select_config(args)
        source = render_kernel(config, harness=args.harness)
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(source)
        except OSError as err:
            raise GemmgenError(f"cannot write {args.output}: {err.strerror}") from None
        print(f"gemmgen: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(source)
    return 0


def _dispatcher_source(args: argparse.Namespace) -> str:
    """`emit --dispatch (--workload FILE | --shape S ...) --precision P [--family F] --gpu ARCH`."""
    from gemmgen.describe.problem import parse_shape
    from gemmgen.describe.workload import load_workload
    from gemmgen.selection.dispatch.emit import render_dispatcher
    from gemmgen.selection.dispatch.select import plan_dispatch
    from gemmgen.store.db import ResultsDB, resolve_url

    if args.point or args.set:
        raise InvalidParameter("--dispatch takes its kernels from the results database: give no point and no --set "
                               "(--trans, --out, --bias, --act and --batch-mode choose the variant)")
    if bool(args.workload) == bool(args.shape):
        raise InvalidParameter("--dispatch needs the shapes to serve: --workload FILE or --shape MxNxK (repeatable), "
                               "not both")
    if args.workload:
        workload = load_workload(args.workload)
        variant = workload.variant_with(variant_options(args))
        shapes = workload.shapes
        precision = args.precision or (workload.precisions[0] if len(workload.precisions) == 1 else None)
        if precision is None or precision not in workload.precisions:
            raise InvalidParameter(f"--dispatch --workload {args.workload}: give --precision, one of the workload's "
                                   f"{', '.join(workload.precisions)} (a dispatcher serves one precision)")
    else:
        variant = asked_variant(args)
        shapes = [parse_shape(s) for s in args.shape]
        precision = args.precision
        if not precision:
            raise InvalidParameter("--dispatch needs --precision (fp32, tf32, fp16 or bf16)")
    arch = _target(args.gpu)
    url = resolve_url(args.db)
    plan = plan_dispatch(ResultsDB(url, create=False), precision, arch, shapes, family=args.family, variant=variant,
                         batch_count=args.batch_count)
    # one line, however many layers: the file's header has each layer's table
    predicted = sum(1 for layer in plan.layers if not any(s.measured for s in layer.spans))
    print(f"gemmgen: dispatcher of {len(plan.kernels)} kernel(s) for {len(plan.layers)} layer(s) (N x K), every M "
          f"from 1 to {plan.max_m}: {sum(len(layer.spans) for layer in plan.layers)} spans"
          + (f"; {predicted} layer(s) with nothing measured on them: their choices are predicted" if predicted else "")
          + "; its header has each layer's table", file=sys.stderr)
    if args.workload:
        emit_args = ["--dispatch", "--workload", args.workload, "--precision", precision, "--gpu", arch.name]
    else:
        emit_args = ["--dispatch", *[w for s in args.shape for w in ("--shape", s)], "--precision", precision,
                     "--gpu", arch.name]
    if args.family:
        emit_args += ["--family", args.family]
    emit_args += _variant_words(variant).split()
    if args.batch_count is not None:
        emit_args += ["--batch", str(args.batch_count)]
    if args.harness:
        emit_args.append("--harness")
    return render_dispatcher(plan, emit_args, harness=args.harness)


def cmd_build(args: argparse.Namespace) -> int:
    from gemmgen.build.nvcc import build_kernel, kernel_usage

    if _names_best(args):
        raise InvalidParameter("build takes a named point, a canonical name or --family; `gemmgen best --precision P "
                               "--shape S` names the best stored kernel, to build by its name")
    config = select_config(args)
    result = build_kernel(config, use_cache=not args.no_cache)
    if not result.ok:
        print(f"gemmgen: compile of {config.name} for {config.arch.name} failed:\n{result.log}", file=sys.stderr)
        return 1
    usage = kernel_usage(config, result)
    g = config.geometry
    print(f"{config.name} for {config.arch.name}: {'cached' if result.cached else f'{result.seconds:.2f} s'}, "
          f"library {result.library}, cubin {result.cubin}")
    print(f"  threads {g.threads}, dynamic shared memory {g.smem_bytes} bytes")
    if usage:
        print(f"  registers {usage.registers}, stack {usage.stack_bytes} bytes, spill stores "
              f"{usage.spill_store_bytes} bytes, spill loads {usage.spill_load_bytes} bytes")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from gemmgen.describe.problem import parse_shape
    from gemmgen.measure.bench import Bench
    from gemmgen.measure.device import Gpu
    from gemmgen.measure.plan import point_plan, run_plan
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
        raise InvalidParameter("--trans, --out, --bias and --act apply to named points; the suite measures the "
                               "default variant (trans=nn into fp32 C, no bias, no activation)")
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
            for job, m, ratio in run_plan(bench, plan, starting):
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
    return 0 if all(r["status"] == "ok" for r in rows) else 1


RESULT_COLUMNS = ["kernel", "precision", "arch", "device", "M", "N", "K", "batch_count", "status", "median_ms", "runs",
                  "tflops", "rel_error", "created_at"]


def cmd_results(args: argparse.Namespace) -> int:
    from gemmgen.describe.problem import parse_shape
    from gemmgen.selection.report import format_rows
    from gemmgen.store.db import ResultsDB, resolve_url

    shape = parse_shape(args.shape) if args.shape else None
    arch = parse_arch(args.gpu).name if args.gpu else None
    db = ResultsDB(resolve_url(args.db), create=False)
    rows = db.results(family=args.family, precision=args.precision, arch=arch, device=args.device,
                      shape=(shape.m, shape.n, shape.k) if shape else None, status=args.status,
                      variant=variant_options(args) or None, batch_count=args.batch_count, sort=args.sort,
                      descending=not args.ascending,
                      limit=args.limit)
    print(format_rows([r.as_dict() for r in rows], RESULT_COLUMNS, args.format))
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    found, arch, _ = _stored_best(args, asked_variant(args))
    print(_describe_ranked(found))
    _, _, params = point_spec(found.kernel)
    print("  " + ", ".join(f"{k}={v}" for k, v in params.items()))
    print(f"  emit: gemmgen emit {found.kernel} --gpu {arch.name}")
    return 0


#: The names --family takes where it picks stored rows (results): gemmgen's families and the
#: cuBLAS baseline's rows.
STORED_FAMILIES = (*FAMILIES, "cublas")


def _add_family_argument(parser: argparse.ArgumentParser, help: str | None = None, *,
                         names: tuple[str, ...] = tuple(FAMILIES)) -> None:
    """--family for every command that takes one: a name of ``names`` (another is refused with
    the list)."""
    parser.add_argument("--family", choices=names, help=help)


def _add_precision_argument(parser: argparse.ArgumentParser, help: str | None = None, **kwargs) -> None:
    """--precision for every command that takes one: fp32, tf32, fp16 or bf16 (gemmgen.describe.dtypes;
    another name, ``BF16`` or ``fp64``, is refused with the list)."""
    parser.add_argument("--precision", choices=tuple(PRECISIONS), help=help, **kwargs)


def _add_db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="URL", help="results database: a SQLAlchemy URL or a SQLite file "
                        "(default: $GEMMGEN_DB, else results/gemmgen.db)")


def add_variant_arguments(parser: argparse.ArgumentParser, *, filters: bool = False) -> None:
    """--trans, --out, --bias, --act and --batch-mode, the problem variant (gemmgen.describe.problem.Variant), for every
    command that takes one; an option not given is the default variant's value. With ``filters``
    (results) each only narrows the rows shown, and one not given is any value."""
    default = (lambda value: "any") if filters else (lambda value: value)
    parser.add_argument("--batch-mode", dest="batch", choices=BATCHES, help="strided: a batch of products in one "
                        "launch, the launcher taking the batch count and a stride per matrix (docs/problems.md) "
                        f"(default {default('none')})")
    parser.add_argument("--trans", choices=LAYOUTS, help="layouts of A and B: nn (A M x K, B K x N, row-major), nt "
                        "(B stored N x K, as torch's linear weight), tn, tt (A stored K x M) "
                        f"(default {default('nn')})")
    parser.add_argument("--out", choices=OUTPUTS, help="the type C is stored in; accumulation is fp32 "
                        f"(default {default('fp32')})")
    parser.add_argument("--bias", choices=BIASES, help="a vector of C's type added before the activation: row (M "
                        "values, one per row of C), col (N values, one per column: nn.Linear's bias) "
                        f"(default {default('none')})")
    parser.add_argument("--act", choices=ACTIVATIONS, help="applied last: relu, gelu (tanh approximation), silu "
                        f"(default {default('none')})")


def _add_batch_count(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", dest="batch_count", type=int, metavar="N", help="measure a strided batch of N "
                        "products per launch (packed strides M*K, K*N, M*N); implies --batch-mode strided")


def _add_batch_filter(parser: argparse.ArgumentParser, use: str) -> None:
    """--batch N where it picks stored rows (results, best, emit best, emit --dispatch): only
    measurements of N products per launch (variant_options makes it batch=strided). ``use``: what
    the command does with them, for the help."""
    parser.add_argument("--batch", dest="batch_count", type=int, metavar="N", help=f"{use} only measurements of a "
                        "strided batch of N products per launch (implies --batch-mode strided; default: every count)")


def _add_point_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("point", nargs="?", help="a named point (v1..v6, blog_*) or a canonical kernel name")
    _add_family_argument(parser, "start from this family's default point")
    _add_precision_argument(parser, "the family's first by default")
    parser.add_argument("--set", metavar="NAME=VALUE,...", help="parameter values, e.g. BM=128,BN=64,BK=16")
    parser.add_argument("--gpu", metavar="ARCH", help="target architecture, e.g. sm_89 (default: the GPU present, "
                        f"else {DEFAULT_ARCH})")
    add_variant_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gemmgen", description="CUDA GEMM kernel generator and autotuner")
    parser.add_argument("--version", action="version", version=f"gemmgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="families, their parameters and allowed values, and the named points")
    _add_family_argument(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("emit", help="write standalone CUDA source for a point to stdout")
    _add_point_arguments(p)
    p.add_argument("--harness", action="store_true", help="add a main() that checks and times the kernel")
    p.add_argument("-o", "--output", type=output_file, metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--shape", action="append", metavar="MxNxK", help="with `emit best`: the problem shape; with "
                   "--dispatch: a shape to serve (repeatable)")
    p.add_argument("--dispatch", action="store_true", help="one file with the best stored kernels of several shapes "
                   "(--workload or --shape) and a launcher that picks one by (M, N, K); see gemmgen.selection.best")
    p.add_argument("--workload", metavar="FILE", help="with --dispatch: the shapes and variant of a workload file "
                   "(--trans, --out, --bias and --act may add variant keys it leaves out)")
    _add_batch_filter(p, "with `emit best` and --dispatch: rank by")
    _add_db_argument(p)
    p.set_defaults(func=cmd_emit)

    p = sub.add_parser("build", help="compile a point (shared library and cubin) and print the compiler's resource "
                       "report")
    _add_point_arguments(p)
    p.add_argument("--no-cache", action="store_true", help="compile even if a cached cubin exists")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("bench", help="verify and time points and cuBLAS on the GPU; store every result")
    p.add_argument("points", nargs="*", metavar="POINT", help="named points, canonical names, or cublas")
    p.add_argument("--suite", action="store_true", help="the fixed suite of shapes; per shape and precision the "
                   "best verified kernel stored (else the named point) next to cuBLAS")
    _add_precision_argument(p, "with --suite: only these precisions (repeatable)", action="append")
    p.add_argument("--shape", action="append", metavar="MxNxK", help="problem shape, repeatable; one number is a "
                   "cube (default 4096)")
    add_variant_arguments(p)  # for every point named, and cuBLAS
    _add_batch_count(p)
    p.add_argument("--seed", type=int, help="seed of the random inputs")
    p.add_argument("--device", type=int, default=0, metavar="N", help="the GPU to measure on (default 0)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    _add_db_argument(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="Optuna search over a family's space on the GPUs present; stores every trial")
    _add_family_argument(p, "required with --shape; with --workload, by default hopper on sm_90 (else mma) for "
                         "tf32, fp16 and bf16, warp for fp32")
    p.add_argument("--gpu", metavar="ARCH", help="architecture to tune for; must be the GPU present (default)")
    p.add_argument("--devices", default="0", type=_device_list, metavar="0,1|all", help="GPUs to measure on, one tuner "
                   "each, all on one study (default 0); with --workload, the shapes are spread over them, each GPU taking "
                   "the next shape (or joining a running one) as soon as it is free")
    _add_precision_argument(p, "default: the first in the family's search space; with --workload: only this one "
                            "of the workload's precisions")
    p.add_argument("--shape", action="append", metavar="MxNxK", help="repeatable; the objective is the geometric "
                   "mean of TFLOP/s over the shapes (default 4096)")
    p.add_argument("--workload", metavar="FILE", help="tune every shape and precision of a workload file (TOML, "
                   "e.g. workloads/llama3-8b.toml), in its variant, one study per shape: the one `--shape` uses; not "
                   "with --shape. --trans, --out, --bias and --act may add variant keys the file leaves out")
    p.add_argument("--trials", type=int, default=100, help="feasible points to measure now (default 100); points "
                   "that break a constraint are recorded but not counted. With --workload: per shape, the trials "
                   "its study should have in all (a shape that has them is skipped, so a re-run goes on)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="stop asking for new trials after this long "
                   "(with --workload: per shape; with --fill also the fill's measuring time per precision)")
    p.add_argument("--fill", action="store_true", help="with --workload, after its shapes: measure candidate kernels "
                   "at token counts between and around the listed ones, where the selection model's choice changes "
                   "(gemmgen/tune/fill.py), so that a dispatcher's choice at any M rests on measurements near it")
    p.add_argument("--fill-points", type=int, default=28, metavar="N", help="token counts the fill measures per "
                   "layer (default 28)")
    add_variant_arguments(p)
    _add_batch_count(p)
    p.add_argument("--study", help="study name (default: family-precision<variant>-arch-shapes, the variant's "
                   "suffix as in kernel names: hopper-bf16_nt_obf16-sm_90-4096x4096x4096)")
    p.add_argument("--sampler", choices=["tpe", "random", "grid", "cmaes"], default="tpe")
    p.add_argument("--seed", type=int)
    p.add_argument("--jobs", type=int, help="compile worker processes in all, shared among the devices (default: "
                   "one per CPU core)")
    p.add_argument("--compile-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="time limit of one compile (default 120)")
    _add_db_argument(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("results", help="query stored measurements")
    _add_family_argument(p, "a family, or cublas (the baseline's rows)", names=STORED_FAMILIES)
    _add_precision_argument(p)
    p.add_argument("--gpu", metavar="ARCH", help="target architecture, e.g. sm_90")
    p.add_argument("--device", help="part of the device name, e.g. H100")
    p.add_argument("--shape", metavar="MxNxK")
    p.add_argument("--status", choices=["ok", "wrong_result", "compile_error", "launch_error", "infeasible"])
    add_variant_arguments(p, filters=True)
    _add_batch_filter(p, "show")
    p.add_argument("--sort", default="tflops", help="column to sort by (default tflops)")
    p.add_argument("--ascending", action="store_true")
    p.add_argument("--limit", type=int)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    _add_db_argument(p)
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("best", help="the best verified stored kernel for a precision and shape: the highest median "
                       "ratio to the cuBLAS time stored next to its times (gemmgen.selection.best)")
    _add_family_argument(p, "only this family's kernels (default: any)")
    _add_precision_argument(p, required=True)
    p.add_argument("--shape", required=True, metavar="MxNxK")
    p.add_argument("--gpu", metavar="ARCH", help="kernels built for this architecture (default: the GPU present, "
                   "else sm_90)")
    add_variant_arguments(p)
    _add_batch_filter(p, "rank by")
    _add_db_argument(p)
    p.set_defaults(func=cmd_best)
    add_plot_parser(sub, _add_db_argument, output_file)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command ``argv`` asks for; returns the exit status (2: something given was wrong,
    said in one line on stderr)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, --version, or argparse's one-line error (Parser.error)
        return done.code
    try:
        return args.func(args)
    except GemmgenError as err:
        print(f"gemmgen: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("gemmgen: interrupted; every measurement taken so far is stored", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
