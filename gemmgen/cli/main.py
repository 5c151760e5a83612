"""The `gemmgen` command line: list, emit, build, bench, tune, results, best, model, plot.

Errors the user can fix print one message on stderr and exit with status 2; `emit` writes only
CUDA source to stdout. The parser is built here (:func:`build_parser`); the commands are in
gemmgen.cli.kernels (no GPU) and gemmgen.cli.measuring (bench, tune).
"""

import argparse
import sys

from gemmgen import __version__
from gemmgen.cli.args import (Parser, add_batch_count, add_batch_filter, add_db_argument, add_family_argument,
                              add_point_arguments, add_precision_argument, add_stored_kernel_arguments,
                              add_variant_arguments, device_list, output_file)
from gemmgen.cli.kernels import cmd_best, cmd_build, cmd_emit, cmd_list, cmd_model, cmd_results
from gemmgen.cli.measuring import cmd_bench, cmd_tune
from gemmgen.describe.families import FAMILIES
from gemmgen.errors import GemmgenError
from gemmgen.plot.command import add_parser as add_plot_parser

#: The names --family takes where it picks stored rows (results): gemmgen's families and the
#: cuBLAS baseline's rows.
STORED_FAMILIES = (*FAMILIES, "cublas")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gemmgen", description="CUDA GEMM kernel generator and autotuner")
    parser.add_argument("--version", action="version", version=f"gemmgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="families, their parameters and allowed values, and the named points")
    add_family_argument(p)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("emit", help="write standalone CUDA source for a point to stdout")
    add_point_arguments(p)
    p.add_argument("--harness", action="store_true", help="add a main() that checks and times the kernel")
    p.add_argument("-o", "--output", type=output_file, metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--shape", action="append", metavar="MxNxK", help="with `emit best`: the problem shape; with "
                   "--dispatch: a shape to serve (repeatable)")
    p.add_argument("--dispatch", action="store_true", help="one file with the best stored kernels of several shapes "
                   "(--workload or --shape) and a launcher that picks one by (M, N, K); see gemmgen.selection.best")
    p.add_argument("--workload", metavar="FILE", help="with --dispatch: the shapes and variant of a workload file "
                   "(--trans, --out, --bias and --act may add variant keys it leaves out)")
    add_batch_filter(p, "with `emit best` and --dispatch: rank by")
    add_db_argument(p)
    p.set_defaults(func=cmd_emit)

    p = sub.add_parser("build", help="compile a point (shared library and cubin) and print the compiler's resource "
                       "report")
    add_point_arguments(p)
    p.add_argument("--no-cache", action="store_true", help="compile even if a cached cubin exists")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("bench", help="verify and time points and cuBLAS on the GPU; store every result")
    p.add_argument("points", nargs="*", metavar="POINT", help="named points, canonical names, or cublas")
    p.add_argument("--suite", action="store_true", help="the fixed suite of shapes; per shape and precision the "
                   "best verified kernel stored (else the named point) next to cuBLAS")
    add_precision_argument(p, "with --suite: only these precisions (repeatable)", action="append")
    p.add_argument("--shape", action="append", metavar="MxNxK", help="problem shape, repeatable; one number is a "
                   "cube (default 4096)")
    add_variant_arguments(p)  # for every point named, and cuBLAS
    add_batch_count(p)
    p.add_argument("--seed", type=int, help="seed of the random inputs")
    p.add_argument("--device", type=int, default=0, metavar="N", help="the GPU to measure on (default 0)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    add_db_argument(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("tune", help="Optuna search over a family's space on the GPUs present; stores every trial")
    add_family_argument(p, "required with --shape; with --workload, by default hopper on sm_90 (else mma) for "
                         "tf32, fp16 and bf16, warp for fp32")
    p.add_argument("--gpu", metavar="ARCH", help="architecture to tune for; must be the GPU present (default)")
    p.add_argument("--devices", default="0", type=device_list, metavar="0,1|all", help="GPUs to measure on, one tuner "
                   "each, all on one study (default 0); with --workload, the shapes are spread over them, each GPU taking "
                   "the next shape (or joining a running one) as soon as it is free")
    add_precision_argument(p, "default: the first in the family's search space; with --workload: only this one "
                            "of the workload's precisions")
    p.add_argument("--shape", action="append", metavar="MxNxK", help="repeatable; the objective is the geometric "
                   "mean of TFLOP/s over the shapes (default 4096)")
    p.add_argument("--workload", metavar="FILE", help="tune every shape and precision of a workload file (TOML, "
                   "e.g. workloads/llama3-8b.toml), in its variant, one study per shape: the one `--shape` uses; not "
                   "with --shape. --trans, --out, --bias and --act may add variant keys the file leaves out")
    p.add_argument("--trials", type=int, default=100, help="feasible points to measure now (default 100); points "
                   "that break a constraint are recorded but not counted. With --workload: per shape, the trials "
                   "its study should have in all (a shape that has them is skipped, so a re-run goes on)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="stop asking for new trials this long after "
                   "cuBLAS's baseline is measured (with --workload: per shape; with --fill also the fill's "
                   "measuring time per precision)")
    p.add_argument("--fill", action="store_true", help="with --workload, after its shapes: measure candidate kernels "
                   "at token counts between and around the listed ones, where the selection model's choice changes "
                   "(gemmgen/tune/fill.py), then the kernels the dispatcher would choose where none was "
                   "measured, so that its choice at any M rests on measurements near it")
    p.add_argument("--fill-points", type=int, default=28, metavar="N", help="token counts the fill explores per "
                   "layer (default 28; 0: only the checks of the dispatcher's choices)")
    add_variant_arguments(p)
    add_batch_count(p)
    p.add_argument("--study", help="study name (default: family-precision<variant>-arch-shapes, the variant's "
                   "suffix as in kernel names: hopper-bf16_nt_obf16-sm_90-4096x4096x4096)")
    p.add_argument("--sampler", choices=["tpe", "random", "grid", "cmaes"], default="tpe")
    p.add_argument("--seed", type=int)
    p.add_argument("--jobs", type=int, help="compile worker processes in all, shared among the devices (default: "
                   "one per CPU core)")
    p.add_argument("--compile-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="time limit of one compile (default 120)")
    add_db_argument(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("results", help="query stored measurements")
    add_family_argument(p, "a family, or cublas (the baseline's rows)", names=STORED_FAMILIES)
    add_precision_argument(p)
    p.add_argument("--gpu", metavar="ARCH", help="target architecture, e.g. sm_90")
    p.add_argument("--device", help="part of the device name, e.g. H100")
    p.add_argument("--shape", metavar="MxNxK")
    p.add_argument("--status", choices=["ok", "wrong_result", "compile_error", "launch_error", "infeasible"])
    add_variant_arguments(p, filters=True)
    add_batch_filter(p, "show")
    p.add_argument("--sort", default="tflops", help="column to sort by (default tflops)")
    p.add_argument("--ascending", action="store_true")
    p.add_argument("--limit", type=int)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    add_db_argument(p)
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("best", help="the best verified stored kernel for a precision and shape: the highest median "
                       "ratio to the cuBLAS time stored next to its times (gemmgen.selection.best)")
    p.add_argument("--shape", required=True, metavar="MxNxK")
    add_stored_kernel_arguments(p, "rank by")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("model", help="the selection model's median prediction error on held-out stored measurements "
                       "of a precision and variant (the model `emit --dispatch` chooses by; "
                       "gemmgen.selection.dispatch.model)")
    add_stored_kernel_arguments(p, "fit and evaluate on")
    p.set_defaults(func=cmd_model)
    add_plot_parser(sub, add_db_argument, output_file)
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
