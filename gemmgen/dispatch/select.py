"""Which kernels a dispatcher holds, and which tuned shape each one serves.

Each shape's candidates are the kernels stored with a verified measurement there, ranked by
gemmgen.best. Kernels are shared where it costs little: a shape accepts any kernel whose score
(median ratio to cuBLAS) is within ``share_within`` of its best, and kernels are taken greedily,
each time the one that the most shapes still unserved accept, so a workload of many shapes
compiles a few kernels. Each shape then gets the highest-scoring kernel taken that it accepts.
"""

from dataclasses import dataclass

from gemmgen.arch import Arch
from gemmgen.best import Ranked, ranked, wanted
from gemmgen.config import KernelConfig, make_config
from gemmgen.errors import GemmgenError, InvalidPoint
from gemmgen.points import point_spec
from gemmgen.problem import Shape, Variant

SHARE_WITHIN = 0.02  # a shape takes a kernel another shape uses if it is within 2% of its own best


@dataclass(frozen=True)
class Served:
    """A tuned shape: the kernel the dispatcher gives it (``kernel``, an index into
    DispatchPlan.kernels) and that kernel's score there, next to the best stored one; ``tflops``:
    that kernel's highest TFLOP/s there (what the dispatcher's choice for untuned shapes scales)."""

    shape: Shape
    kernel: int
    score: float | None
    best_kernel: str
    best_score: float | None
    tflops: float = 0.0


@dataclass(frozen=True)
class DispatchPlan:
    precision: str
    arch: Arch
    kernels: tuple[KernelConfig, ...]
    served: tuple[Served, ...]
    missing: tuple[Shape, ...]  # shapes asked for with nothing verified stored
    devices: tuple[str, ...]  # the devices the served kernels' scores were measured on
    variant: Variant = Variant()  # what every kernel computes (layouts, C's type, bias, activation)
    sm_count: int = 0  # SMs of the device the served kernels were measured on (the largest, if several)


def _candidates(db, precision: str, shape: Shape, arch: Arch, family: str | None,
                variant: Variant, batch_count: int | None) -> list[tuple[Ranked, KernelConfig]]:
    found = []
    for r in ranked(db, precision, shape, arch, family, variant, batch_count):
        family_name, prec, params = point_spec(r.kernel)
        try:
            found.append((r, make_config(family_name, params, prec, arch)))
        except InvalidPoint:  # stored by a gemmgen whose constraints differ: not buildable now
            continue
    return found


def _accepts(candidates: list[tuple[Ranked, KernelConfig]], share_within: float) -> dict[str, Ranked]:
    """kernel name -> its standing, for the kernels a shape accepts: its best, and any within
    share_within of the best's score."""
    top = candidates[0][0]
    accepted = {top.kernel: top}
    if top.score is not None:
        for r, _ in candidates[1:]:
            if r.score is not None and r.score >= top.score * (1.0 - share_within):
                accepted[r.kernel] = r
    return accepted


def plan_dispatch(db, precision: str, arch: Arch, shapes: list[Shape], *, family: str | None = None,
                  share_within: float = SHARE_WITHIN, variant: Variant = Variant(),
                  batch_count: int | None = None) -> DispatchPlan:
    """The kernels and the table of a dispatcher for ``shapes`` (duplicates ignored), all of
    them computing ``variant`` (gemmgen.best ranks kernels of one variant); ``batch_count``: by
    the measurements of that many products per launch only (None: of every count, as
    gemmgen.best.ranked). Raises GemmgenError where none of the shapes has a verified kernel of
    it stored for ``arch``."""
    shapes = list(dict.fromkeys(shapes))
    accepts, configs, tops, missing = {}, {}, {}, []
    for shape in shapes:
        candidates = _candidates(db, precision, shape, arch, family, variant, batch_count)
        if not candidates:
            missing.append(shape)
            continue
        accepts[shape] = _accepts(candidates, share_within)
        tops[shape] = candidates[0][0]
        configs.update((r.kernel, c) for r, c in candidates if r.kernel in accepts[shape])
    if not accepts:
        raise GemmgenError(f"no verified {wanted(precision, family, variant, batch_count)} stored for {arch.name} at "
                           f"any of the {len(shapes)} shape(s) "
                           f"({', '.join(map(str, shapes[:4]))}{', ...' if len(shapes) > 4 else ''}); "
                           "tune them first (gemmgen tune --workload FILE) or point --db at the results")
    chosen: list[str] = []
    unserved = set(accepts)
    while unserved:
        def gain(kernel: str) -> tuple:
            takers = [accepts[s][kernel] for s in unserved if kernel in accepts[s]]
            return len(takers), sum(r.score or 0.0 for r in takers), kernel
        kernel = max({k for s in unserved for k in accepts[s]}, key=gain)
        chosen.append(kernel)
        unserved = {s for s in unserved if kernel not in accepts[s]}
    index = {k: i for i, k in enumerate(chosen)}
    served, devices, sm_count = [], set(), 0
    for shape in shapes:
        if shape not in accepts:
            continue
        mine = max((r for k, r in accepts[shape].items() if k in index), key=Ranked.key)
        top = tops[shape]
        served.append(Served(shape, index[mine.kernel], mine.score, top.kernel, top.score, mine.tflops))
        devices.update(mine.devices)
        sm_count = max(sm_count, mine.sm_count)
    return DispatchPlan(precision, arch, tuple(configs[k] for k in chosen), tuple(served), tuple(missing),
                        tuple(sorted(devices)), variant, sm_count)
