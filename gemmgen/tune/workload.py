"""`gemmgen tune --workload FILE`: every (precision, shape) of a workload (gemmgen.describe.workload), one
study per shape -- the study `gemmgen tune --family F --precision P --shape S` works on, so that
the two share it -- each tuned by tune.devices.tune with the per-shape budget.

- Order: per layer (the shapes of one N x K, in the file's order), M ascending, so that each
  shape comes right after its neighbours.
- Seeds: before a shape's own points, the winners already found at the workload's other shapes
  (same family, precision and architecture), nearest first (best.shape_distance), at most SEEDS
  kernels: a kernel good at one shape is tried at its neighbours first. This also times one kernel
  at several shapes, which a dispatcher needs to let shapes share kernels.
- Resumable: ``trials`` is what each shape's study should have in all. A shape whose study has
  that many finished trials is skipped; one that has fewer gets the rest (everything measured is
  in the results database and the study either way).
- A shape's result -- the winner, its TFLOP/s and % of cuBLAS -- is what the tune's final
  re-timing kept on its study (tune.loop.RETIMED_ATTR), else the study's best trial (no ratio).
- On several GPUs (tune.node, tune.schedule) the shapes are handed out in hand_out_order, each
  GPU taking the next as soon as it is free, and a shape's seeds are what its neighbours' studies
  hold when it starts: a finished neighbour's winner, a running neighbour's best trial so far (a
  neighbour not started yet gives none).
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from optuna.trial import TrialState

from gemmgen.describe.arch import Arch, parse_arch
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.problem import Shape, Variant
from gemmgen.describe.workload import Workload, WorkloadEntry
from gemmgen.errors import InvalidParameter
from gemmgen.selection.best import shape_distance
from gemmgen.selection.report import format_rows
from gemmgen.store.studies import open_storage, space_changes
from gemmgen.tune.devices import TuneSpec, tune
from gemmgen.tune.loop import RETIMED_ATTR, check_variant, study_name
from gemmgen.tune.space import SearchSpace, load_space

SEEDS = 6  # winners of other shapes enqueued before a shape's own points
# The family tuned where --family is not given: the first that runs on the GPU.
DEFAULT_FAMILIES = {"fp32": ("warp",), "tf32": ("hopper", "mma"), "fp16": ("hopper", "mma"),
                    "bf16": ("hopper", "mma"), "e4m3": ("hopper",), "e4m3e5m2": ("hopper",),
                    "e5m2e4m3": ("hopper",)}


def default_family(precision: str, arch: Arch, variant: Variant = Variant()) -> str:
    """The family to tune ``precision`` with on ``arch`` (DEFAULT_FAMILIES): the first that runs
    there and computes ``variant`` (its declared ``computes``); raises InvalidParameter where none
    of them does."""
    for name in DEFAULT_FAMILIES[precision]:
        if FAMILIES[name].runs_on(arch.cc) and variant in FAMILIES[name].computes:
            return name
    what = precision if variant == Variant() else f"{precision} ({variant.text})"
    raise InvalidParameter(f"no default family tunes {what} on {arch.name}; choose one with --family")


def plan(workload: Workload, precision: str | None, family: str | None, arch: Arch,
         variant: Variant = Variant()) -> list[tuple[str, str]]:
    """(precision, family) pairs to tune: the workload's precisions (or ``precision`` alone, which
    must be one of them), each with ``family`` or its default family, which must compute
    ``variant`` (tune.loop.check_variant). Raises InvalidParameter naming the option and what is
    allowed."""
    precisions = workload.precisions
    if precision is not None:
        if precision not in precisions:
            raise InvalidParameter(f"--precision {precision}: workload {workload.name} ({workload.path}) tunes "
                                   f"{', '.join(precisions)}")
        precisions = (precision,)
    if family is None:
        pairs = [(p, default_family(p, arch, variant)) for p in precisions]
        for p, f in pairs:
            check_variant(load_space(f), p, arch, variant)
        return pairs
    if not FAMILIES[family].runs_on(arch.cc):
        raise InvalidParameter(f"--family {family} does not run on {arch.name}")
    taken = load_space(family).precisions
    for p in precisions:
        if p not in taken:
            raise InvalidParameter(f"--family {family} does not take {p}, one of the workload's precisions (its "
                                   f"search space takes {', '.join(taken)}); leave --family out to tune each "
                                   "precision with its default family, or pick one with --precision")
    for p in precisions:
        check_variant(load_space(family), p, arch, variant)
    return [(p, family) for p in precisions]


def tuning_order(workload: Workload) -> list[WorkloadEntry]:
    """The entries grouped by (N, K) in the order the file first gives each, M ascending within."""
    layers = list(dict.fromkeys((e.shape.n, e.shape.k) for e in workload.entries))
    return sorted(workload.entries, key=lambda e: (layers.index((e.shape.n, e.shape.k)), e.shape.m))


def hand_out_order(workload: Workload, pairs: list[tuple[str, str]]) -> list[tuple[str, str, WorkloadEntry]]:
    """(precision, family, entry) in the order several GPUs start them: the layers of every pair
    of ``pairs`` in turn, each layer from its largest M down -- each one's largest shape, then each
    one's second largest, and so on.

    A layer's consecutive shapes, each other's nearest, are thus as far apart as the layers allow:
    with no more GPUs than layers (and pairs) a shape starts after the previous shape of its layer
    has finished, and is seeded with its winner, as on one GPU. Largest first: the costliest shapes
    (the largest operands to set up, the longest timings) start early and the cheapest come last,
    where they even out the GPUs' ends."""
    groups: dict[tuple, list] = {}
    for precision, family in pairs:
        for entry in tuning_order(workload):
            groups.setdefault((precision, family, entry.shape.n, entry.shape.k), []).append(
                (precision, family, entry))
    columns = [column[::-1] for column in groups.values()]
    return [column[i] for i in range(max(map(len, columns), default=0)) for column in columns if i < len(column)]


def shape_title(family: str, precision: str, variant: Variant, entry: WorkloadEntry) -> str:
    """How the run's log names a shape: ``hopper bf16 16x6144x4096 (qkv_proj)``."""
    return f"{family} {precision}{variant.suffix} {entry.shape}" + (f" ({entry.label})" if entry.label else "")


@dataclass
class ShapeResult:
    """One (precision, shape) of the run: its study and what it holds now."""

    precision: str
    family: str
    entry: WorkloadEntry
    study: str
    trials: int  # finished trials of the study (after this run)
    kernel: str | None  # the winner (None: no verified point yet)
    tflops: float | None
    ratio: float | None  # to cuBLAS, timed in alternation with it (None: not re-timed)
    note: str  # tuned, skipped, interrupted or not reached; with the seeds enqueued
    devices: dict = field(default_factory=dict)  # on several GPUs: GPU name -> tune.schedule.Usage here


@dataclass
class _Winner:
    kernel: str
    tflops: float
    ratio: float | None
    params: dict | None  # the trial's params (the space's parameters), None where no trial has them


class _Studies:
    """Reads the studies in the results database's Optuna storage."""

    def __init__(self, url: str):
        self.storage = open_storage(url)

    def trials(self, name: str) -> list:
        try:
            study_id = self.storage.get_study_id_from_name(name)
        except KeyError:
            return []
        return self.storage.get_all_trials(study_id, deepcopy=False)

    def finished(self, name: str) -> int:
        """Trials measured to the end (ok or failed); not those that broke a constraint, were
        stopped by Ctrl-C before their measurement, or whose tuner died."""
        return self._finished(self.trials(name))

    @staticmethod
    def _finished(trials) -> int:
        return sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)
                   and t.user_attrs.get("status") not in (None, "infeasible", "interrupted"))

    def finished_in(self, name: str, space: SearchSpace) -> int:
        """finished(name), or 0 where the study was begun with other values of ``space``'s
        (narrowed) parameters: the tuner sets such a study aside and begins it again
        (store.studies.open_study), so it still wants all its trials."""
        trials = self.trials(name)
        return 0 if space_changes(trials, space.params) else self._finished(trials)

    def winner(self, name: str) -> _Winner | None:
        """The study's winner: the first of its final re-timing, else its best trial."""
        done = sorted((t for t in self.trials(name) if t.state == TrialState.COMPLETE), key=lambda t: t.value,
                      reverse=True)
        if not done:
            return None
        try:
            retimed = self.storage.get_study_user_attrs(self.storage.get_study_id_from_name(name)).get(RETIMED_ATTR)
        except KeyError:
            retimed = None
        if retimed:
            best = retimed[0]
            trial = next((t for t in done if t.user_attrs.get("kernel") == best["kernel"]), None)
            return _Winner(best["kernel"], best["tflops"], best["ratio"], trial.params if trial else None)
        return _Winner(done[0].user_attrs.get("kernel", "?"), done[0].value, None, done[0].params)


def shape_result(studies: _Studies, precision: str, family: str, entry: WorkloadEntry, name: str, note: str,
                 devices: dict | None = None) -> ShapeResult:
    """A shape's result as its study ``name`` holds it now (its winner: _Studies.winner)."""
    win = studies.winner(name)
    return ShapeResult(precision, family, entry, name, studies.finished(name), win.kernel if win else None,
                       win.tflops if win else None, win.ratio if win else None, note, devices or {})


def seeds(studies: _Studies, space: SearchSpace, precision: str, arch: Arch, shape: Shape,
          others: list[Shape], variant: Variant = Variant(), batch_count: int = 1) -> list[tuple[dict, dict]]:
    """(params, {"seeded_from": "<kernel> at <shape>"}) for the winners at the nearest of ``others``
    (nearest first; the first SEEDS distinct kernels in ``space``) that ``shape``'s study does not
    have yet; studies of ``variant`` (and ``batch_count``, where it is batched), whose winners compute it."""
    name = study_name(space.family, precision, arch.name, [shape], variant, batch_count)
    have = [t.system_attrs.get("fixed_params", t.params) for t in studies.trials(name)]
    kernels, out = set(), []
    for other in sorted((o for o in others if o != shape), key=lambda o: shape_distance(shape, o)):
        if len(kernels) == SEEDS:
            break
        win = studies.winner(study_name(space.family, precision, arch.name, [other], variant, batch_count))
        if win is None or win.params is None or win.kernel in kernels or not (
                win.params.keys() == space.params.keys() and all(v in space.params[k] for k, v in win.params.items())):
            continue  # none, already counted, or not in the space (the space's file changed since)
        kernels.add(win.kernel)
        if win.params not in have:
            out.append((dict(win.params), {"seeded_from": f"{win.kernel} at {other}"}))
    return out


def tune_workload(workload: Workload, pairs: list[tuple[str, str]], arch: Arch, base: TuneSpec, devices: list[int],
                  make_progress: Callable[[int], object], log: Callable[[str], None]) -> tuple[list[ShapeResult], bool]:
    """Tunes each (precision, family) of ``pairs`` at every shape of ``workload`` in tuning_order:
    ``base`` with the family, precision, shape, the trials the shape's study lacks (base.trials in
    all) and the seeds; every shape of base.variant. ``make_progress(total)`` makes a shape's progress display (closed after it);
    ``log`` takes notes. Returns (one result per precision and shape, whether it was interrupted:
    then the shapes after the interrupted one are "not reached"). Raises what tune raises.

    On several ``devices`` the shapes are spread over the GPUs instead (tune.node.tune_on_devices:
    ``make_progress`` is called once, for the whole run, and each result says what each GPU did
    there); one GPU tunes shape after shape here, in this process."""
    arch = parse_arch(arch.cc)  # study names carry the GPU's architecture, without a target suffix
    if len(devices) > 1:
        from gemmgen.tune.node import tune_on_devices

        return tune_on_devices(workload, pairs, arch, base, devices, make_progress, log)
    studies = _Studies(base.url)
    order = tuning_order(workload)
    results, interrupted = [], False
    total = len(pairs) * len(order)
    for precision, family in pairs:
        space = load_space(family)
        narrowed = space.narrowed(precision, base.variant)
        for entry in order:
            shape = entry.shape
            name = study_name(family, precision, arch.name, [shape], base.variant, base.batch_count)
            where = f"[{len(results) + 1}/{total}] {shape_title(family, precision, base.variant, entry)}"
            done = studies.finished_in(name, narrowed)
            if interrupted:
                note = "not reached"
            elif done >= base.trials:
                note = "skipped"
                log(f"{where}: skipped: study {name} has {done} finished trials (--trials {base.trials})")
            else:
                first = seeds(studies, space, precision, arch, shape, workload.shapes, base.variant,
                              base.batch_count)
                log(f"{where}: {base.trials - done} trials" + (f" (study {name} has {done})" if done else "") +
                    (f"; first {len(first)} winners at other shapes: " +
                     ", ".join(a["seeded_from"] for _, a in first) if first else ""))
                spec = replace(base, family=family, precision=precision, shapes=(shape,), study=None,
                               trials=base.trials - done, first=tuple(first))
                progress = make_progress(spec.trials)
                try:
                    report = tune(spec, devices, progress)
                finally:
                    progress.close()
                interrupted = report.interrupted
                note = ("interrupted" if interrupted else "tuned") + (f", {len(first)} seeded" if first else "")
            results.append(shape_result(studies, precision, family, entry, name, note))
    return results, interrupted


def format_report(workload: Workload, results: list[ShapeResult], variant: Variant = Variant()) -> str:
    """Per precision: a table of its shapes (shape, label, weight, winner, TFLOP/s, % of cuBLAS,
    the study's trials, what this run did) and the weighted geometric mean of % cuBLAS over the
    shapes that have one; ``variant``, the one tuned, is named where it is not the default."""
    lines = [f"workload {workload.name}" + (f" (variant {variant.text})" if variant != Variant() else "")
             + (f": {workload.description}" if workload.description else "")]
    columns = ["shape", "label", "weight", "kernel", "TFLOP/s", "% cuBLAS", "trials", "this run"]
    for precision in dict.fromkeys(r.precision for r in results):
        mine = [r for r in results if r.precision == precision]
        lines += ["", f"{precision} ({mine[0].family}):"]
        rows = [{"shape": str(r.entry.shape), "label": r.entry.label or None, "weight": r.entry.weight,
                 "kernel": r.kernel, "TFLOP/s": r.tflops, "% cuBLAS": 100 * r.ratio if r.ratio else None,
                 "trials": r.trials, "this run": r.note} for r in mine]
        lines.append(format_rows(rows, columns, "table"))
        mean = workload.weighted_mean({r.entry.shape: r.ratio for r in mine})
        counted = sum(1 for r in mine if r.ratio)
        lines.append(f"weighted geometric mean of % cuBLAS, {precision}: " +
                     (f"{100 * mean:.1f} ({counted} of {len(mine)} shapes)" if mean else "- (no shape re-timed)"))
    return "\n".join(lines)
