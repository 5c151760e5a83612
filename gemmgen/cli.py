"""The `gemmgen` command line: list, emit, build.

Errors the user can fix print one message on stderr and exit with status 2; `emit` writes only
CUDA source to stdout.
"""

import argparse
import sys

from gemmgen import __version__
from gemmgen.arch import Arch, detect_arch, parse_arch
from gemmgen.config import DEFAULT_ARCH, KernelConfig, make_config, parse_assignments
from gemmgen.errors import GemmgenError, InvalidParameter
from gemmgen.families import FAMILIES
from gemmgen.points import NAMED_POINTS, point_spec
from gemmgen.render import render_kernel


def _target(text: str | None) -> Arch:
    if text:
        return parse_arch(text)
    found = detect_arch()
    if found is None:
        print(f"gemmgen: no GPU detected; targeting {DEFAULT_ARCH} (choose with --gpu)", file=sys.stderr)
        return parse_arch(DEFAULT_ARCH)
    return found


def select_config(args: argparse.Namespace) -> KernelConfig:
    """The point named on the command line: POINT and/or --family, --precision, --set, --gpu."""
    overrides = parse_assignments(args.set) if args.set else {}
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


def cmd_emit(args: argparse.Namespace) -> int:
    source = render_kernel(select_config(args), harness=args.harness)
    if args.output:
        with open(args.output, "w") as f:
            f.write(source)
        print(f"gemmgen: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(source)
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from gemmgen.build import build_kernel, kernel_usage

    config = select_config(args)
    result = build_kernel(config, use_cache=not args.no_cache)
    if not result.ok:
        print(f"gemmgen: compile of {config.name} for {config.arch.name} failed:\n{result.log}", file=sys.stderr)
        return 1
    usage = kernel_usage(config, result)
    g = config.geometry
    print(f"{config.name} for {config.arch.name}: {'cached' if result.cached else f'{result.seconds:.2f} s'}, "
          f"cubin {result.cubin}")
    print(f"  threads {g.threads}, dynamic shared memory {g.smem_bytes} bytes")
    if usage:
        print(f"  registers {usage.registers}, stack {usage.stack_bytes} bytes, spill stores "
              f"{usage.spill_store_bytes} bytes, spill loads {usage.spill_load_bytes} bytes")
    return 0


def _add_point_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("point", nargs="?", help="a named point (v1..v6, blog_*) or a canonical kernel name")
    parser.add_argument("--family", choices=list(FAMILIES), help="start from this family's default point")
    parser.add_argument("--precision", help="fp32, tf32, fp16 or bf16 (the family's first by default)")
    parser.add_argument("--set", metavar="NAME=VALUE,...", help="parameter values, e.g. BM=128,BN=64,BK=16")
    parser.add_argument("--gpu", metavar="ARCH", help="target architecture, e.g. sm_89 (default: the GPU present, "
                        f"else {DEFAULT_ARCH})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemmgen", description="CUDA GEMM kernel generator and autotuner")
    parser.add_argument("--version", action="version", version=f"gemmgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="families, their parameters and allowed values, and the named points")
    p.add_argument("--family", choices=list(FAMILIES))
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("emit", help="write standalone CUDA source for a point to stdout")
    _add_point_arguments(p)
    p.add_argument("--harness", action="store_true", help="add a main() that checks and times the kernel")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=cmd_emit)

    p = sub.add_parser("build", help="compile a point to a cubin and print the compiler's resource report")
    _add_point_arguments(p)
    p.add_argument("--no-cache", action="store_true", help="compile even if a cached cubin exists")
    p.set_defaults(func=cmd_build)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except GemmgenError as err:
        print(f"gemmgen: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("gemmgen: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
