"""`gemmgen tune --workload FILE --fill`: token counts as a continuum.

A workload lists a few token counts per layer (N x K); a model is called at any. After the listed
shapes are tuned, the fill measures, for each layer, candidate kernels at token counts between
and around the listed ones, so that the dispatcher's choice at every M rests on measurements
near it (gemmgen.selection.dispatch.model interpolates a kernel's measurements along M):

- Where: the token counts at which the selection model's choice changes (the boundaries of its
  table for the layer, and the count just before each), the geometric midpoints of the listed
  counts, and a few drawn at random (log-uniform, seeded), at most ``points`` per layer.
- What: at each, the ``per_m`` kernels the model predicts fastest among those measured on the
  layer and their stream-K twins (the hybrid, for whole-tile coop kernels), the ``per_m``
  fastest of the space's fitted tiles (``[[fit]]`` in search_spaces/<family>.toml: BM any
  multiple of 8, so that a tile count fits the SMs at that M), and the stream-K twin of the
  first whole-tile kernel picked -- each of them only where that build of it (its source) was
  not measured at that shape on the device already, so that a fill run again, with the same
  seed, measures what the first did not (a kernel whose source changed is measured again).
- In what order: one token count of each layer in turn, each layer's in the order they were
  taken (a boundary, a midpoint, a drawn count, ...), so that a fill the time limit stops has
  measured every layer alike rather than the first layers' low token counts only.
- How: each is built (in parallel), checked against float64 and timed in alternation with cuBLAS
  (gemmgen.measure.bench.Bench), and every outcome is recorded, as a tune's trials are.
- Then the checks: the dispatcher those measurements give (gemmgen.selection.dispatch.select,
  its accuracy rule and caution included) can still serve a span of token counts with a kernel
  never measured within it, on the model's word. Each such kernel is measured at the first and
  last count of its span (:func:`check_points`), the dispatcher planned again, and so on, for at
  most CHECK_ROUNDS rounds or until every span rests on a measurement. On an H200 a kernel
  measured at 128 tokens only (26 us) served 129-256 and took 62-68 us at 137-156: its second tile
  row was nearly empty (since fixed in the kernel, docs/problems.md), which the model's base did
  not price.
- Time: with a limit, the first EXPLORE_SHARE of it for the points above, the rest for checks.
"""

import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from gemmgen.build.nvcc import BuildResult, build_kernels
from gemmgen.codegen.render import render_kernel, source_hash
from gemmgen.describe.arch import Arch
from gemmgen.describe.config import KernelConfig, make_config
from gemmgen.describe.families import get_family
from gemmgen.describe.families.base import cdiv
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import InvalidPoint
from gemmgen.selection.best import stored_rows
from gemmgen.selection.dispatch.model import TimeModel, stored_samples
from gemmgen.tune.space import SearchSpace, load_space

MIN_BM = 8
EXPLORE_SHARE = 0.5  # of a time-limited fill, for the exploration; the rest checks the dispatcher's choices
CHECK_ROUNDS = 4  # measure the unmeasured choices, plan again: at most this many times


@dataclass(frozen=True)
class FillPoint:
    shape: Shape
    configs: tuple[KernelConfig, ...]


def fitted_tiles(space: SearchSpace, precision: str, arch: Arch, variant: Variant, m: int) -> list[KernelConfig]:
    """For each of ``space.fits``, a tile for each count of tile rows that M can take: BM the
    least multiple of 8 that covers M in that many rows (at most 256), as valid configs (stages
    lowered until the tile fits; a BM the family refuses is skipped)."""
    out = []
    for base in space.fits:
        for bm in sorted({max(MIN_BM, cdiv(cdiv(m, rows), 8) * 8) for rows in range(1, cdiv(m, MIN_BM) + 1)}):
            if bm <= 256:
                config = _valid({**base, "BM": bm}, precision, arch, space.family, variant)
                if config is not None:
                    out.append(config)
    return out


def _valid(params: dict, precision: str, arch: Arch, family: str, variant: Variant) -> KernelConfig | None:
    """The config of ``params``, with fewer stages where its tile does not fit; None where nothing fits."""
    allowed = get_family(family).param("stages").choices
    for stages in sorted((s for s in allowed if s <= params.get("stages", max(allowed))), reverse=True):
        try:
            return make_config(family, {**params, "stages": stages}, precision, arch, variant)
        except InvalidPoint as err:
            if not any("shared memory" in v for v in err.violations):
                return None
    return None


def stream_k_twin(config: KernelConfig) -> KernelConfig | None:
    """``config`` with streamk=1 where it computes whole tiles in the coop schedule (the hybrid)."""
    p = config.params
    if p.get("streamk", 1) != 0 or p.get("schedule") != "coop":
        return None
    try:
        return make_config(config.family, {**p, "streamk": 1}, config.precision, config.arch, config.variant)
    except InvalidPoint:
        return None


def fill_counts(model: TimeModel, layer_kernels: list[KernelConfig], n: int, k: int, listed: list[int],
                points: int, seed: int) -> list[int]:
    """The token counts to measure on layer N x K (see the module), at most ``points``, in the order
    taken: in turn from the model's boundaries, the midpoints of the listed counts and random ones
    (half uniform, half log-uniform in [1, the largest listed]), so that a cap, or a fill stopped
    part way, keeps a mix of all three."""
    top = max(listed)
    boundaries: list[int] = []
    if layer_kernels:
        ms = np.arange(1, top + 1)
        choice = np.stack([model.predict_m(c, n, k, ms) for c in layer_kernels]).argmin(axis=0)
        for i in np.nonzero(choice[1:] != choice[:-1])[0]:
            boundaries += [int(ms[i]), int(ms[i + 1])]  # the last count of one kernel's range, the first of the next
    ordered = sorted(set(listed))
    middle = [round(math.sqrt(a * b)) for a, b in zip(ordered, ordered[1:]) if b > a + 1]
    rng = random.Random(seed)
    drawn = [rng.randint(1, top) if i % 2 else round(math.exp(rng.uniform(0.0, math.log(top)))) for i in range(points)]
    sources = [boundaries[::max(1, len(boundaries) // max(1, points // 3))], middle, drawn]
    out: list[int] = []
    while len(out) < points and any(sources):
        for source in sources:
            while source:
                m = source.pop(0)
                if m not in listed and m not in out and 1 <= m <= top:
                    out.append(m)
                    break
    return out[:points]


def interleave(per_layer: list[list[FillPoint]]) -> list[FillPoint]:
    """The layers' points one of each layer in turn (the first of every layer, then the second,
    ...), each layer's in its own order."""
    out = []
    for i in range(max((len(points) for points in per_layer), default=0)):
        out += [points[i] for points in per_layer if i < len(points)]
    return out


def plan_fill(db, space: SearchSpace, precision: str, arch: Arch, variant: Variant, layers: dict[tuple[int, int], list[int]],
              *, points: int = 24, per_m: int = 2, seed: int = 0, device: str | None = None) -> list[FillPoint]:
    """What to measure for each layer (N, K) -> its listed token counts (see the module), on the
    GPU named ``device`` (None: the one the model's measurements are of). Raises GemmgenError
    where nothing of the precision and variant is stored yet (tune the listed shapes first)."""
    samples, configs, sms, fitted_on = stored_samples(db, precision, arch, variant, space.family)
    model = TimeModel.fit(samples, configs, sms)
    done = _measured_builds(db, precision, arch, variant, device or fitted_on)
    builds: dict[str, str] = {}

    def new(config: KernelConfig, shape: Shape) -> bool:  # not yet measured at shape with its current source
        stored = done.get((config.name, shape.m, shape.n, shape.k))
        if not stored:
            return True
        if config.name not in builds:
            builds[config.name] = source_hash(render_kernel(config))
        return builds[config.name] not in stored

    per_layer = []
    for (n, k), listed in layers.items():
        plan = []
        per_layer.append(plan)
        measured = sorted({s.kernel for s in samples if (s.shape.n, s.shape.k) == (n, k)})
        layer_kernels = [configs[name] for name in measured]
        twins = [t for t in (stream_k_twin(c) for c in layer_kernels) if t is not None]
        known = {c.name: c for c in layer_kernels + twins}
        for m in fill_counts(model, layer_kernels, n, k, listed, points, seed):
            picked: list[KernelConfig] = []
            shape = Shape(m, n, k)
            for group in (list(known.values()), fitted_tiles(space, precision, arch, variant, m)):
                ranked = sorted(group, key=lambda c: model.predict(c, shape))
                picked += [c for c in ranked if c.name not in {p.name for p in picked} and new(c, shape)][:per_m]
            # the stream-K twin of the fastest whole-tile kernel picked, which the model knows least
            twin = next((t for t in map(stream_k_twin, picked) if t is not None), None)
            if twin is not None and twin.name not in {p.name for p in picked} and new(twin, shape):
                picked.append(twin)
            if picked:
                plan.append(FillPoint(Shape(m, n, k), tuple(picked)))
    return interleave(per_layer)


def _measured_builds(db, precision: str, arch: Arch, variant: Variant, device: str) -> dict[tuple, set[str]]:
    """(kernel, M, N, K) -> the builds (source hashes) of the kernel verified and timed at that
    shape on ``device`` (one product per launch): what a fill need not measure again."""
    out = defaultdict(set)
    for r in stored_rows(db, precision=precision, status="ok", variant=variant, batch_count=1):
        if r.arch == arch.name and r.device == device and r.tflops:
            out[r.kernel, r.M, r.N, r.K].add(r.build)
    return out


def check_points(plan) -> list[FillPoint]:
    """The dispatcher's choices that rest on no measurement: for every span of ``plan`` (a
    gemmgen.selection.dispatch.select.DispatchPlan) whose kernel was not measured within it on the
    layer, that kernel at the span's first and last token count. Each layer's spans widest first,
    the layers interleaved: a span's width is half its share of log M and half its share of M in
    [1, plan.max_m] (like the fill's drawn counts, half log-uniform and half uniform), so that
    neither the few counts of decode's narrow spans nor the wide mid- and large-M spans wait
    behind the other."""
    top = plan.max_m

    def width(s) -> float:
        return (math.log(s.m_hi + 1) - math.log(s.m_lo)) / math.log(top + 1) + (s.m_hi - s.m_lo + 1) / top

    per_layer = []
    for layer in plan.layers:
        spans = sorted((s for s in layer.spans if not s.measured), key=lambda s: (width(s), -s.m_lo), reverse=True)
        points = []
        for span in spans:
            config = plan.kernels[span.kernel]
            ends = dict.fromkeys((span.m_lo, span.m_hi))
            points += [FillPoint(Shape(m, layer.n, layer.k), (config,)) for m in ends]
        per_layer.append(points)
    return interleave(per_layer)


def run_fill(plan: list[FillPoint], bench, *, jobs: int, limit_s: float | None,
             log: Callable[[str], None]) -> list[tuple[Shape, str, float | None]]:
    """Builds every kernel of ``plan`` (``jobs`` at a time), then measures each point's kernels
    with ``bench`` (a gemmgen.measure.bench.Bench that times in alternation with cuBLAS and records),
    starting no point after ``limit_s`` seconds (building included). Returns (shape, kernel, ratio
    to cuBLAS or None)."""
    start = time.monotonic()
    built = build_kernels((c for p in plan for c in p.configs), max(1, jobs))
    for name, result in built.items():
        if isinstance(result, BuildResult) and result.ok:
            continue
        why = result.log[-300:] if isinstance(result, BuildResult) else str(result)
        log(f"fill: {name} did not build: {why.splitlines()[-1] if why else ''}")
    out = []
    for i, point in enumerate(plan):
        if limit_s is not None and time.monotonic() - start > limit_s:
            log(f"fill: stopped after {limit_s:.0f} s, {len(plan) - i} token counts not measured")
            break
        for config in point.configs:
            build = built[config.name]
            result = bench.measure_point("fill", config, point.shape,
                                         build=build if isinstance(build, BuildResult) else None)
            out.append((point.shape, config.name, result.baseline_ratio))
            ratio = f"{result.baseline_ratio:.3f} of cuBLAS" if result.baseline_ratio else result.status
            log(f"fill: {point.shape} {config.name}: {ratio}")
    return out


def fill_workload(workload, pairs: list[tuple[str, str]], arch: Arch, variant: Variant, url: str, device: int, *,
                  seed: int | None, points: int, jobs: int, limit_s: float | None,
                  log: Callable[[str], None]) -> Iterator[tuple[str, list[tuple[Shape, str, float | None]]]]:
    """The fill of a tuned workload (gemmgen.describe.workload.Workload) on GPU ``device``: for
    each (precision, family) of ``pairs`` in turn, :func:`plan_fill` over the workload's layers
    (N x K, each with its listed token counts) and :func:`run_fill`, then rounds of
    :func:`check_points` of the dispatcher of the workload's shapes; ``limit_s`` bounds each
    precision's (EXPLORE_SHARE of it the exploration's). Every outcome is recorded in the results
    database ``url`` (tag ``fill``). Yields each precision and what was measured."""
    from gemmgen.measure.bench import Bench
    from gemmgen.measure.device import Gpu
    from gemmgen.selection.dispatch.select import plan_dispatch
    from gemmgen.store.db import ResultsDB

    layers = defaultdict(list)
    for shape in workload.shapes:
        layers[shape.n, shape.k].append(shape.m)
    with Gpu(device) as gpu:
        db = ResultsDB(url)
        bench = Bench(gpu, db, tag="fill", seed=seed, min_total_ms=60.0, interleave=True)
        try:
            for precision, family in pairs:
                plan = plan_fill(db, load_space(family), precision, arch, variant, dict(layers), points=points,
                                 seed=seed or 0, device=gpu.info.name)
                log(f"fill {family} {precision}{variant.suffix}: {len(plan)} token counts, "
                    f"{sum(len(p.configs) for p in plan)} measurements")
                start = time.monotonic()
                explore_s = None if limit_s is None else limit_s * EXPLORE_SHARE
                found = run_fill(plan, bench, jobs=jobs, limit_s=explore_s, log=log)
                for round_ in range(1, CHECK_ROUNDS + 1):
                    left = None if limit_s is None else limit_s - (time.monotonic() - start)
                    if left is not None and left <= 0:
                        break
                    checks = check_points(plan_dispatch(db, precision, arch, workload.shapes, family=family,
                                                        variant=variant))
                    log(f"fill: check {round_}: {len(checks)} of the dispatcher's choices rest on no measurement")
                    if not checks:
                        break
                    found += run_fill(checks, bench, jobs=jobs, limit_s=left, log=log)
                yield precision, found
        finally:
            bench.close()
