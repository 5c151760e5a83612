"""Which stored kernel is best: the one policy that `best`, `emit best`, `bench --suite` and
`emit --dispatch` all use.

A GPU's TFLOP/s drift with its clock and temperature by more than the kernels near the top
differ, and two devices differ by more still, so a measurement is never compared by raw TFLOP/s
with one taken elsewhere or at another time. Each is judged against cuBLAS instead: divided by the
cuBLAS measurement of the same shape, precision, variant and batch count on the same device
taken nearest in time (bench, tune and the suite store one next to their timings), and a kernel
scores the median of its ratios: a batched kernel's rows of different batch counts are each
judged against cuBLAS's of their count, never against another's. The highest score wins. Kernels measured on a device that has no cuBLAS measurement
at the shape are ranked after all others, by their highest TFLOP/s.

FP8 adds accuracy. Its tensor cores keep about 14 bits of a sum unless a kernel promotes it, so
kernels that pass the check differ in error by up to 2x and more at long K. A kernel whose error
at a shape is more than ERROR_BOUND times cuBLAS's there (the same inputs, the cuBLAS row nearest
in time) ranks after every kernel within it, whatever their speeds; a dispatcher takes it only
where none within it was measured (gemmgen.selection.dispatch.select). The other precisions
accumulate in fp32 and are ranked by speed alone.

A kernel is judged by its newest build: where a kernel was measured at a shape (on a device, at a
batch count) by builds of different source, only the rows of the build measured last count there
(``stored_rows``). A template change can change a kernel's speed at some shapes and not others
(A's partial last tile row, 2026-12-07: 58 us to 35 us at 137 tokens, nothing at 256); the old
build's rows stand where the new one was not measured, and never blend with the new where it was.
"""

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from gemmgen.describe.arch import Arch
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Shape, Variant

ERROR_BOUND = 1.5  # FP8: the most a kernel's error may be, as a multiple of cuBLAS's on the same inputs


@dataclass(frozen=True)
class Ranked:
    """One kernel's standing at a shape: ``score`` is the median ratio of cuBLAS's time to its
    time (its TFLOP/s to cuBLAS's: 1.0 = as fast, above 1 faster; None where no cuBLAS
    measurement is stored next to it), ``tflops`` its highest
    TFLOP/s there, ``devices`` the device names its measurements came from, ``sm_count`` their
    largest count of SMs; ``error_ratio`` (FP8) its largest error there as a multiple of cuBLAS's
    (None where not known), ``within_error`` False where that is over ERROR_BOUND."""

    kernel: str
    family: str
    score: float | None
    tflops: float
    runs: int
    devices: tuple[str, ...]
    sm_count: int = 0
    error_ratio: float | None = None
    within_error: bool = True

    def key(self) -> tuple:
        return (self.within_error, self.score is not None, self.score if self.score is not None else self.tflops)


def shape_distance(a: Shape, b: Shape) -> float:
    """How far apart two shapes are: the sum of |log(a_i / b_i)| over M, N and K."""
    return sum(abs(math.log(x / y)) for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k)))


def _baseline_key(r) -> tuple:
    return r.device, r.batch_count, r.M, r.N, r.K


def _baselines(rows, field: str = "tflops") -> dict[tuple, list]:
    """cuBLAS's rows among ``rows`` with a ``field`` (its TFLOP/s, or its rel_error): (device, batch
    count, M, N, K) -> [(when, row)]."""
    found = defaultdict(list)
    for r in rows:
        if r.family == "cublas" and getattr(r, field):
            found[_baseline_key(r)].append((datetime.fromisoformat(r.created_at), r))
    return found


def _nearest(times: list, created_at: str):
    """The cuBLAS row of ``times`` taken nearest in time to ``created_at``."""
    when = datetime.fromisoformat(created_at)
    return min(times, key=lambda c: abs((c[0] - when).total_seconds()))[1]


def error_ratios(rows) -> dict[tuple[str, int, int, int], float]:
    """(kernel, M, N, K) -> the largest ratio of the kernel's measured error to cuBLAS's there
    (cuBLAS's row at that shape, device and batch count nearest in time), over ``rows`` (results
    of one precision and variant) where both errors are stored."""
    base = _baselines(rows, "rel_error")
    out: dict[tuple[str, int, int, int], float] = {}
    for r in rows:
        times = base.get(_baseline_key(r))
        if r.family != "cublas" and r.rel_error is not None and times:
            key = (r.kernel, r.M, r.N, r.K)
            out[key] = max(out.get(key, 0.0), r.rel_error / _nearest(times, r.created_at).rel_error)
    return out


def within_error(precision: str, ratio: float | None) -> bool:
    """Whether a kernel of ``precision`` whose error is ``ratio`` times cuBLAS's (None: not known)
    is as accurate as the policy asks: always, but for FP8 over ERROR_BOUND."""
    return not (PRECISIONS[precision].fp8 and ratio is not None and ratio > ERROR_BOUND)


def newest_builds(rows) -> list:
    """``rows`` (ResultRows) without those of a kernel's older builds at a shape where a newer one
    was measured: per kernel, arch, device, batch count and shape, the rows of the build whose
    latest measurement is the latest there (see the module). Order kept."""
    latest: dict[tuple, tuple[str, str]] = {}
    for r in rows:
        key = (r.kernel, r.arch, r.device, r.batch_count, r.M, r.N, r.K)
        if key not in latest or r.created_at > latest[key][0]:
            latest[key] = (r.created_at, r.build)
    return [r for r in rows if latest[r.kernel, r.arch, r.device, r.batch_count, r.M, r.N, r.K][1] == r.build]


def stored_rows(db, **filters) -> list:
    """``db.results(**filters)`` as the policy reads them: the newest build of each kernel at each
    shape (``newest_builds``)."""
    return newest_builds(db.results(**filters))


def paired_baselines(rows) -> list[tuple]:
    """(row, cuBLAS's TFLOP/s nearest in time, cuBLAS's median TFLOP/s there) for each timed
    kernel row of ``rows`` (results of one precision and variant) that has a cuBLAS row at its
    shape, device and batch count: the pairing ``ranked`` judges by, for the selection model's
    drift correction."""
    base = _baselines(rows)
    out = []
    for r in rows:
        times = base.get(_baseline_key(r))
        if r.family != "cublas" and r.tflops and times:
            out.append((r, _nearest(times, r.created_at).tflops, statistics.median(c.tflops for _, c in times)))
    return out


def ranked(db, precision: str, shape: Shape, arch: Arch, family: str | None = None,
           variant: Variant = Variant(), batch_count: int | None = None) -> list[Ranked]:
    """Every kernel built for ``arch`` (of ``family``, or any but cuBLAS) with a verified
    measurement of ``precision`` and ``variant`` (layouts, C's type, bias, activation) at
    ``shape``, best first (see the module's policy); judged against cuBLAS's rows of the same
    variant (the results database's variant columns select them). Kernels of another variant
    compute another product and are never among them. ``batch_count``: only measurements of
    that many products per launch (None: every count, each against cuBLAS's of its count). FP8
    kernels over ERROR_BOUND times cuBLAS's error rank after the others (see the module)."""
    rows = stored_rows(db, precision=precision, shape=(shape.m, shape.n, shape.k), status="ok", variant=variant,
                       batch_count=batch_count)
    cublas = _baselines(rows)
    errors = error_ratios(rows)
    ratios, fastest, families, runs, devices = defaultdict(list), {}, {}, defaultdict(int), defaultdict(set)
    sms = defaultdict(int)
    for r in rows:
        if r.family == "cublas" or r.arch != arch.name or not r.tflops or (family and r.family != family):
            continue
        fastest[r.kernel] = max(fastest.get(r.kernel, 0.0), r.tflops)
        families[r.kernel] = r.family
        runs[r.kernel] += 1
        devices[r.kernel].add(r.device)
        sms[r.kernel] = max(sms[r.kernel], r.sm_count)
        times = cublas.get(_baseline_key(r))
        if times:
            ratios[r.kernel].append(r.tflops / _nearest(times, r.created_at).tflops)
    found = []
    for k in fastest:
        error = errors.get((k, shape.m, shape.n, shape.k))
        found.append(Ranked(k, families[k], statistics.median(ratios[k]) if k in ratios else None, fastest[k],
                            runs[k], tuple(sorted(devices[k])), sms[k], error, within_error(precision, error)))
    return sorted(found, key=Ranked.key, reverse=True)


def wanted(precision: str, family: str | None = None, variant: Variant = Variant(),
           batch_count: int | None = None) -> str:
    """What a ranking looked for, in words, for the messages that say nothing was found:
    ``hopper fp16 (nt fp16 none none strided) kernel measured at a batch of 8``."""
    what = f"{family} {precision}" if family else precision
    if variant != Variant():
        what += f" ({variant.text})"
    return what + " kernel" + (f" measured at a batch of {batch_count}" if batch_count is not None else "")


def best(db, precision: str, shape: Shape, arch: Arch, family: str | None = None,
         variant: Variant = Variant(), batch_count: int | None = None) -> Ranked | None:
    """The best stored kernel at ``shape`` (see :func:`ranked`), or None where none is verified."""
    found = ranked(db, precision, shape, arch, family, variant, batch_count)
    return found[0] if found else None
