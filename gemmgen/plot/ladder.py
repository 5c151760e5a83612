"""The ladder's numbers: the named points v1..v6 (each at its own precision) and cuBLAS, TFLOP/s
per shape, from every stored measurement."""

from dataclasses import dataclass

from gemmgen.describe.arch import Arch
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.describe.problem import Shape
from gemmgen.errors import GemmgenError, InvalidParameter, InvalidPoint
from gemmgen.selection.best import ranked
from gemmgen.selection.suite import SUITE_SHAPES
from gemmgen.store.db import ResultsDB

LADDER = ("v1", "v2", "v3", "v4", "v5", "v6")


@dataclass(frozen=True)
class Rung:
    """One named point (or cuBLAS, ``point`` "cublas") of one precision at one shape: its
    highest stored TFLOP/s, and for a named point its score by gemmgen.selection.best (the median ratio to
    the cuBLAS time stored next to its times; None where none is)."""

    point: str
    precision: str
    kernel: str
    tflops: float
    ratio: float | None


@dataclass(frozen=True)
class Ladder:
    """``series``: labels in drawing order (``v1 (fp32)``, ..., ``cuBLAS fp32``), each with the
    shapes where it is stored; ``shapes``: the suite's shapes where any named point is stored;
    ``missing``: the named points asked for that are stored at none of them."""

    arch: str
    shapes: tuple[Shape, ...]
    series: dict[str, dict[Shape, Rung]]
    missing: tuple[str, ...]


def ladder(db: ResultsDB, arch: Arch, precision: str | None = None, shapes=SUITE_SHAPES) -> Ladder:
    """The ladder at the suite's ``shapes`` for kernels built for ``arch``: v1..v6 (only those of
    ``precision`` where given) and cuBLAS of each precision among the points stored.

    Raises InvalidParameter where no point is of ``precision``; GemmgenError where none of the
    points is stored at any of ``shapes``. A point that cannot be built for ``arch`` is missing.
    """
    points = [NAMED_POINTS[name] for name in LADDER if precision in (None, NAMED_POINTS[name].precision)]
    if not points:
        have = ", ".join(f"{NAMED_POINTS[n].precision} ({n})" for n in LADDER)
        raise InvalidParameter(f"no named point of the ladder is {precision}: {have}")
    series: dict[str, dict[Shape, Rung]] = {}
    rankings: dict[tuple[str, Shape], dict] = {}  # one query per precision and shape: v1..v4 share fp32's
    for point in points:
        found = {}
        try:
            kernel = point.config(arch).name
        except InvalidPoint:
            series[f"{point.name} ({point.precision})"] = found
            continue
        for shape in shapes:
            if (point.precision, shape) not in rankings:
                rankings[point.precision, shape] = {r.kernel: r for r in ranked(db, point.precision, shape, arch)}
            if mine := rankings[point.precision, shape].get(kernel):
                found[shape] = Rung(point.name, point.precision, kernel, mine.tflops, mine.score)
        series[f"{point.name} ({point.precision})"] = found
    missing = tuple(p.name for p, found in zip(points, series.values()) if not found)
    stored = [s for s in shapes if any(s in found for found in series.values())]
    if not stored:
        asked = ", ".join(p.name for p in points)
        raise GemmgenError(f"none of {asked} is stored for {arch.name} at the suite's shapes in {db.url}: "
                           f"`gemmgen bench {' '.join(p.name for p in points)} --shape ...` measures them")
    series = {label: found for label, found in series.items() if found}
    for prec in dict.fromkeys(rung.precision for found in series.values() for rung in found.values()):
        series[f"cuBLAS {prec}"] = {s: rung for s in stored if (rung := _cublas(db, prec, s, arch)) is not None}
    return Ladder(arch.name, tuple(stored), series, missing)


def _cublas(db: ResultsDB, precision: str, shape: Shape, arch: Arch) -> Rung | None:
    """cuBLAS's highest stored TFLOP/s at ``shape`` on devices of ``arch``, as the points' are."""
    rows = [r for r in db.results(family="cublas", precision=precision, arch=arch.name,
                                  shape=(shape.m, shape.n, shape.k), status="ok") if r.tflops]
    if not rows:
        return None
    top = max(rows, key=lambda r: r.tflops)
    return Rung("cublas", precision, top.kernel, top.tflops, 1.0)
