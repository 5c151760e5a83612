"""The suite heatmap's numbers: per suite shape and precision, the ratio of the kernel the latest
`gemmgen bench --suite` measured to cuBLAS, by gemmgen.selection.best's policy."""

from dataclasses import dataclass
from datetime import datetime

from gemmgen.describe.arch import Arch
from gemmgen.describe.problem import Shape
from gemmgen.errors import GemmgenError
from gemmgen.selection.best import ranked
from gemmgen.selection.report import geometric_mean
from gemmgen.selection.suite import SUITE_PRECISIONS, SUITE_SHAPES, suite_variant
from gemmgen.store.db import ResultRow, ResultsDB

SUITE_TAG = "suite"  # the tag `gemmgen bench --suite` stores its rows with


@dataclass(frozen=True)
class SuiteCell:
    """One shape and precision: the kernel measured, its ratio to cuBLAS (1.0 = as fast; None
    where no cuBLAS row stands next to it) and its TFLOP/s."""

    kernel: str
    ratio: float | None
    tflops: float


@dataclass(frozen=True)
class SuiteGrid:
    """Rows ``shapes`` (the suite's order) x columns ``precisions``; ``cells`` holds the pairs that
    have a stored suite measurement; ``geomeans`` per precision the geometric mean of its ratios
    (None where it has none)."""

    arch: str
    shapes: tuple[Shape, ...]
    precisions: tuple[str, ...]
    cells: dict[tuple[Shape, str], SuiteCell]
    geomeans: dict[str, float | None]

    def ratio(self, shape: Shape, precision: str) -> float | None:
        cell = self.cells.get((shape, precision))
        return cell.ratio if cell else None


class _LatestSuiteRun:
    """ResultsDB.results as gemmgen.selection.best.ranked asks for it (one shape and precision), narrowed
    to the suite's rows from the latest measurement of a kernel built for ``arch`` there: the
    cuBLAS row timed just before it on its device, it, and what came after. Two suite runs used
    different kernels at some shapes; the picture shows the latest run, as `bench --suite`
    printed it."""

    def __init__(self, db: ResultsDB, arch: Arch):
        self._db, self._arch = db, arch

    def results(self, **filters) -> list[ResultRow]:
        rows = self._db.results(tag=SUITE_TAG, **filters)
        kernels = [r for r in rows if r.family != "cublas" and r.arch == self._arch.name]
        if not kernels:
            return []
        newest = max(kernels, key=_when)
        before = [_when(r) for r in rows
                  if r.family == "cublas" and r.device == newest.device and _when(r) <= _when(newest)]
        start = max(before) if before else _when(newest)
        return [r for r in rows if _when(r) >= start]


def _when(row: ResultRow) -> datetime:
    return datetime.fromisoformat(row.created_at)


def suite_grid(db: ResultsDB, arch: Arch, shapes=SUITE_SHAPES, precisions=SUITE_PRECISIONS) -> SuiteGrid:
    """The grid of the suite's stored rows for kernels built for ``arch``, a column per precision
    that has any (the shipped H100 file has no FP8 suite run). Raises GemmgenError
    where ``db`` holds no suite row for ``arch`` at any of ``shapes`` and ``precisions``."""
    view = _LatestSuiteRun(db, arch)
    cells = {}
    for shape in shapes:
        for precision in precisions:
            found = ranked(view, precision, shape, arch, variant=suite_variant(precision))
            if found:
                cells[(shape, precision)] = SuiteCell(found[0].kernel, found[0].score, found[0].tflops)
    if not cells:
        raise GemmgenError(f"no suite measurement of a kernel built for {arch.name} is stored in {db.url}: "
                           "`gemmgen bench --suite` makes them")
    precisions = [p for p in precisions if any(q == p for _, q in cells)]  # a precision never measured: no column
    geomeans = {}
    for precision in precisions:
        ratios = [c.ratio for (_, p), c in cells.items() if p == precision and c.ratio]
        geomeans[precision] = geometric_mean(ratios) if ratios else None
    return SuiteGrid(arch.name, tuple(shapes), tuple(precisions), cells, geomeans)
