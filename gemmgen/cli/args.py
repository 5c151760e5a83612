"""What the `gemmgen` command line accepts, for every command: the parser's rules (one-line
errors, no blank values, ASCII digits, -o checked before any work), the options several commands
share (--family, --precision, --db, the variant's, --batch, a point's), and reading them back:
the variant asked for, the batch count measured, the target architecture.
"""

import argparse
import os
import re
import sys
from pathlib import Path

from gemmgen.describe.arch import Arch, detect_arch, parse_arch
from gemmgen.describe.config import DEFAULT_ARCH
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.problem import (
    FIELDS,
    VARIANT_KEYS,
    Variant,
    option_of,
    split_variant,
)
from gemmgen.errors import InvalidParameter


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


def device_list(value: str) -> str:
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


def target(text: str | None, quiet: bool = False) -> Arch:
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


def variant_words(variant: Variant) -> str:
    """The options that ask for ``variant`` (" --trans nt --out bf16"), empty for the default."""
    return "".join(f" {option_of(key)} {value}" for key, value in variant.items)


def add_family_argument(parser: argparse.ArgumentParser, help: str | None = None, *,
                         names: tuple[str, ...] = tuple(FAMILIES)) -> None:
    """--family for every command that takes one: a name of ``names`` (another is refused with
    the list)."""
    parser.add_argument("--family", choices=names, help=help)


def add_precision_argument(parser: argparse.ArgumentParser, help: str | None = None, **kwargs) -> None:
    """--precision for every command that takes one: fp32, tf32, fp16 or bf16 (gemmgen.describe.dtypes;
    another name, ``BF16`` or ``fp64``, is refused with the list)."""
    parser.add_argument("--precision", choices=tuple(PRECISIONS), help=help, **kwargs)


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="URL", help="results database: a SQLAlchemy URL or a SQLite file "
                        "(default: $GEMMGEN_DB, else results/gemmgen.db)")


def add_variant_arguments(parser: argparse.ArgumentParser, *, filters: bool = False) -> None:
    """--trans, --out, --bias, --act and --batch-mode, the problem variant (gemmgen.describe.problem.Variant), for every
    command that takes one; an option not given is the default variant's value. With ``filters``
    (results) each only narrows the rows shown, and one not given is any value."""
    for f in FIELDS:
        parser.add_argument(f.flag, dest=f.key, choices=f.choices,
                            help=f"{f.help} (default {'any' if filters else f.default})")


def add_batch_count(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", dest="batch_count", type=int, metavar="N", help="measure a strided batch of N "
                        "products per launch (packed strides M*K, K*N, M*N); implies --batch-mode strided")


def add_batch_filter(parser: argparse.ArgumentParser, use: str) -> None:
    """--batch N where it picks stored rows (results, best, emit best, emit --dispatch): only
    measurements of N products per launch (variant_options makes it batch=strided). ``use``: what
    the command does with them, for the help."""
    parser.add_argument("--batch", dest="batch_count", type=int, metavar="N", help=f"{use} only measurements of a "
                        "strided batch of N products per launch (implies --batch-mode strided; default: every count)")


def add_stored_kernel_arguments(parser: argparse.ArgumentParser, batch_use: str) -> None:
    """The options that choose stored kernels (best, model): --family (default any), --precision
    (required), --gpu (the architecture they were built for), the variant's options, --batch N
    (``batch_use``: what the command does with its rows) and --db."""
    add_family_argument(parser, "only this family's kernels (default: any)")
    add_precision_argument(parser, required=True)
    parser.add_argument("--gpu", metavar="ARCH", help="kernels built for this architecture (default: the GPU present, "
                        "else sm_90)")
    add_variant_arguments(parser)
    add_batch_filter(parser, batch_use)
    add_db_argument(parser)


def add_point_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("point", nargs="?", help="a named point (v1..v6, blog_*) or a canonical kernel name")
    add_family_argument(parser, "start from this family's default point")
    add_precision_argument(parser, "the family's first by default")
    parser.add_argument("--set", metavar="NAME=VALUE,...", help="parameter values, e.g. BM=128,BN=64,BK=16")
    parser.add_argument("--gpu", metavar="ARCH", help="target architecture, e.g. sm_89 (default: the GPU present, "
                        f"else {DEFAULT_ARCH})")
    add_variant_arguments(parser)
