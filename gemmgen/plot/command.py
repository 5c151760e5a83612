"""The `plot` subcommand: its arguments, and turning them into one picture file.

Only argparse (and gemmgen's table of precisions) is imported here at start-up; the database, Optuna and matplotlib are imported
when a picture is made.
"""

import argparse
import sys
from collections.abc import Callable

from gemmgen.describe.dtypes import PRECISIONS

KINDS = ("history", "suite", "ladder", "importance")


def add_parser(sub, add_db_argument: Callable[[argparse.ArgumentParser], None],
               output_file: Callable[[str], str]) -> None:
    """Adds `plot` to the CLI's subparsers ``sub``; ``add_db_argument`` adds the shared --db,
    ``output_file`` is the shared type of -o (checked before any work)."""
    p = sub.add_parser("plot", help="draw a study's tuning history, the suite heatmap, the v1..v6 ladder or a "
                       "study's parameter importances to a PNG or SVG file (extra 'plot': matplotlib)")
    p.add_argument("kind", choices=KINDS, help="history and importance need --study; suite and ladder read the "
                   "stored measurements")
    p.add_argument("-o", "--output", required=True, type=output_file, metavar="FILE", help="the picture: FILE.png or FILE.svg")
    p.add_argument("--study", metavar="NAME", help="history, importance: the Optuna study (a wrong name lists "
                   "them)")
    p.add_argument("--precision", choices=tuple(PRECISIONS),
                   help="ladder: only the named points of this precision, and its cuBLAS (default: all)")
    p.add_argument("--gpu", metavar="ARCH", help="suite, ladder: kernels built for this architecture (default: "
                   "the one the database holds)")
    add_db_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Makes the picture ``args.kind`` asks for and writes it to ``args.output``.

    Raises GemmgenError (the CLI's exit 2) for an output that is not .png or .svg, a missing
    matplotlib, a database that cannot be read, an unknown study, or an option the kind does not
    take.
    """
    from gemmgen.plot.figure import check_output, load_pyplot, save, style

    fmt = check_output(args.output)
    _check_options(args)
    pyplot = load_pyplot()
    data = _extract(args)
    from gemmgen.plot import draw

    with style(pyplot):
        save(pyplot, getattr(draw, args.kind)(pyplot, data), args.output, fmt)
    print(f"gemmgen: wrote {args.output}", file=sys.stderr)
    return 0


def _check_options(args: argparse.Namespace) -> None:
    from gemmgen.errors import InvalidParameter

    takes = {"study": ("history", "importance"), "precision": ("ladder",), "gpu": ("suite", "ladder")}
    for option, kinds in takes.items():
        if getattr(args, option) is not None and args.kind not in kinds:
            raise InvalidParameter(f"--{option} goes with `gemmgen plot {' or '.join(kinds)}`, not {args.kind}")


def _extract(args: argparse.Namespace):
    """The plain data of the picture (the kind module's dataclass)."""
    from gemmgen.store.db import ResultsDB, resolve_url

    url = resolve_url(args.db)
    if args.kind in ("history", "importance"):
        from gemmgen.plot import history, importance
        from gemmgen.plot.studies import load_study

        study = load_study(url, args.study)
        if args.kind == "importance":
            return importance.importances(study)
        with ResultsDB(url, create=False) as db:
            return history.history(study, db)
    from gemmgen.plot import ladder, suite
    from gemmgen.plot.target import stored_arch

    with ResultsDB(url, create=False) as db:
        arch = stored_arch(db, args.gpu)
        if args.kind == "suite":
            return suite.suite_grid(db, arch)
        return ladder.ladder(db, arch, args.precision)
