"""The commands that need no GPU: `list`, `emit` (a point, `emit best`, a dispatcher), `build`,
`results`, `best` and `model`. Each parses, calls the stage that does the work, and prints.
"""

import argparse
import sys
from dataclasses import replace

from gemmgen.cli.args import asked_variant, target, variant_options, variant_words
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.config import KernelConfig, make_config, parse_assignments
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.points import NAMED_POINTS, point_spec
from gemmgen.describe.problem import VARIANT_KEYS, Variant, split_variant
from gemmgen.errors import GemmgenError, InvalidParameter


def select_config(args: argparse.Namespace) -> KernelConfig:
    """The point named on the command line: POINT and/or --family, --precision, --set, the variant
    options, --gpu. The variant is the point's, with the keys the command line gives."""
    sets = parse_assignments(args.set) if args.set else {}
    overrides, _ = split_variant(sets)
    asked = asked_variant(args, sets)
    given = {str(k).strip().lower() for k in sets} | set(variant_options(args))
    if names_best(args):
        return _best_config(args, overrides, asked)
    if args.point and args.family:
        raise InvalidParameter("give either a point (e.g. v4) or --family, not both")
    if args.point:
        family, precision, named = point_spec(args.point)
    elif args.family:
        family, precision, named = args.family, None, {}
    else:
        raise InvalidParameter("name a point (e.g. `gemmgen emit v4`) or a family (`--family warp --set BM=64`); "
                               "`gemmgen list` shows both")
    params, variant = split_variant(named)
    variant = replace(variant, **{k: getattr(asked, k) for k in VARIANT_KEYS if k in given})
    return make_config(family, {**params, **overrides}, args.precision or precision, target(args.gpu), variant)


def _best_config(args: argparse.Namespace, overrides: dict, variant: Variant) -> KernelConfig:
    """`emit best --precision P --shape S [--family F] [--gpu]`: the best verified kernel stored."""
    missing = [flag for flag, value in (("--precision", args.precision), ("--shape", args.shape)) if not value]
    if missing:
        raise InvalidParameter(f"`emit best` needs {', '.join(missing)}, e.g. "
                               "gemmgen emit best --precision fp32 --shape 4096 [--family warp]")
    found, arch, shape = _stored_best(args, variant)
    count = f" (measured at a batch of {args.batch_count})" if args.batch_count is not None else ""
    print(f"gemmgen: best {args.precision}{variant.suffix} kernel at {shape}{count} for {arch.name}: "
          f"{_describe_ranked(found)}", file=sys.stderr)
    family, precision, named = point_spec(found.kernel)
    return make_config(family, {**split_variant(named)[0], **overrides}, precision, arch, variant)


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
    arch = target(args.gpu, quiet=True)
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


def names_best(args: argparse.Namespace) -> bool:
    """Whether the point named is ``best`` (`emit best`: the best stored kernel)."""
    return bool(args.point) and args.point.strip().lower() == "best"


def _emit_kind(args: argparse.Namespace) -> str:
    return "dispatch" if args.dispatch else "best" if names_best(args) else "point"


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
    arch = target(args.gpu)
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
    emit_args += variant_words(variant).split()
    if args.batch_count is not None:
        emit_args += ["--batch", str(args.batch_count)]
    if args.harness:
        emit_args.append("--harness")
    return render_dispatcher(plan, emit_args, harness=args.harness)


def cmd_build(args: argparse.Namespace) -> int:
    from gemmgen.build.nvcc import build_kernel, kernel_usage

    if names_best(args):
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


def cmd_model(args: argparse.Namespace) -> int:
    """`model --precision P [variant] [--family F] [--gpu ARCH] [--batch N]`: the selection model's
    held-out error on the stored measurements a dispatcher of that precision and variant is chosen from."""
    from gemmgen.selection.dispatch.model import evaluate, stored_samples
    from gemmgen.store.db import ResultsDB, resolve_url

    variant = asked_variant(args)
    arch = target(args.gpu, quiet=True)
    db = ResultsDB(resolve_url(args.db), create=False)
    samples, configs, sms, device = stored_samples(db, args.precision, arch, variant, args.family,
                                                   batch_count=args.batch_count)
    found = evaluate(samples, configs, sms)
    print(f"selection model of {args.precision} (variant {variant.text}) for {arch.name}: {len(samples)} measurements "
          f"of {len(configs)} kernels on {device} ({sms} SMs)")
    print(f"  {found.text()}")
    print(f"  each of {found.folds} folds of the (kernel, shape) pairs held out in turn, predicted by a fit on "
          "the rest")
    return 0
