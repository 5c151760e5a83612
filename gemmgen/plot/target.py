"""Which architecture's kernels a picture of stored measurements shows."""

from gemmgen.describe.arch import Arch, parse_arch
from gemmgen.errors import GemmgenError
from gemmgen.store.db import ResultsDB


def stored_arch(db: ResultsDB, asked: str | None) -> Arch:
    """``asked`` (from --gpu) parsed, else the one architecture ``db`` holds measurements of.

    Raises GemmgenError where ``db`` holds none, or several and ``asked`` is None (naming them);
    InvalidParameter for an ``asked`` that is no architecture.
    """
    if asked:
        return parse_arch(asked)
    found = db.archs("ok")
    if len(found) == 1:
        return parse_arch(found[0])
    if not found:
        raise GemmgenError(f"no verified measurement is stored in {db.url}: nothing to draw")
    raise GemmgenError(f"{db.url} holds measurements of {', '.join(found)}: choose one with --gpu")
