"""One tuner: an Optuna search over a family's space, measured on one GPU.

The study lives in the results database's URL (tune.storage); any number of tuners -- the
device workers of one `gemmgen tune --devices ...`, or separate processes on other hosts -- may
work on it at once. Each tuner:

- asks Optuna for points; the sampler (tune.sampler) draws feasible points only, so points that
  break a constraint cost nothing and are only counted (a grid walks every point: the ones that
  break a constraint are pruned);
- reuses a point already measured on this device model at these shapes, waits for one that
  another tuner is measuring (a claim in the results database), and compiles the rest in a pool
  of worker processes, ahead of the GPU: its own, or one it shares with the tuners of other GPUs
  (tune.node);
- measures in a thread of its own (verify on the GPU, then time), so that asking, compiling and
  recording overlap the next measurement. A point whose median after a few runs is over
  GIVE_UP x the best so far is timed no further (its row says how many runs it had);
- holds a heartbeat for its running trials, so that a trial whose tuner dies is retried;
- counts the seconds its GPU spent measuring (trials, cuBLAS, the re-timing) and the seconds its
  measuring thread waited for a compile (Tuner.measuring_s, Tuner.compile_wait_s);
- at the end re-times the few best points in alternation with cuBLAS, as `gemmgen bench` does,
  so that the winner and its % of cuBLAS are what bench reports.
"""

import contextlib
import multiprocessing
import queue
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

import optuna
from optuna.storages import fail_stale_trials
from optuna.trial import TrialState

from gemmgen.build.nvcc import DEFAULT_TIMEOUT_S, BuildResult, build_kernel
from gemmgen.codegen.render import render_kernel, source_hash, template_hash
from gemmgen.describe.config import KernelConfig, make_config
from gemmgen.describe.families import get_family
from gemmgen.describe.points import NAMED_POINTS, resolve_point
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import InvalidParameter, InvalidPoint
from gemmgen.measure.outcome import CUT_PREFIX, Measured, timed_problem_id
from gemmgen.measure.timing import Timing
from gemmgen.selection.best import ERROR_BOUND, within_error
from gemmgen.selection.report import geometric_mean
from gemmgen.store.studies import GRACE_PERIOD_S, HEARTBEAT_INTERVAL_S, Heartbeat, open_storage, open_study
from gemmgen.tune.sampler import FeasibleSampler, make_sampler
from gemmgen.tune.space import SearchSpace

GIVE_UP = 1.25  # a candidate slower than this times the best median so far is timed no further
RETIME_TOP = 3  # points re-timed in alternation with cuBLAS at the end
FINAL_TAG = ":final"  # the re-timed rows' tag: the study's name and this
RETIMED_ATTR = "retimed"  # the study's user attribute that keeps the last re-timing's results
INACCURATE_WEIGHT = 1e-3  # a point over FP8's error bound counts as this fraction of its TFLOP/s (TrialOutcome.value)
MAX_ASKS_PER_TRIAL = 50  # grid: asks per requested trial before giving up on a space of few feasible points
_ANY_STATUS = ("ok", "wrong_result", "compile_error", "launch_error", "infeasible")
CHECK_DRAWS = 2000  # points of a space drawn, at most, to find one that computes the variant asked


def study_name(family: str, precision: str, arch: str, shapes: list[Shape], variant: Variant = Variant(),
               batch_count: int = 1) -> str:
    """The default study name, e.g. ``warp-fp32-sm_90-4096x4096x4096``; a variant other than the
    default adds its suffix to the precision, as kernel names do
    (``hopper-bf16_nt_obf16-sm_90-4096x4096x4096``), so that studies of different variants never
    mix (their trials would be different kernels with the same parameters); a batched one its
    batch count too (``mma-fp16_batched-sm_90-512x512x64-batch8``: a trial's TFLOP/s are of that
    many products per launch)."""
    return (f"{family}-{precision}{variant.suffix}-{arch}-" + "_".join(str(s) for s in shapes)
            + (f"-batch{batch_count}" if variant.batched else ""))


def check_variant(space: SearchSpace, precision: str, arch, variant: Variant) -> None:
    """Raises InvalidParameter, in one message, where tuning ``space`` for ``variant`` would find
    nothing: the family does not compute the variant at all (its declared ``computes``), or none
    of CHECK_DRAWS points drawn from the space computes it in ``precision`` on ``arch`` (the
    message gives the constraints every point drawn broke, else those of the first)."""
    family = get_family(space.family)
    refused = family.computes.refused(variant)
    if refused:
        raise InvalidParameter(f"family {family.name} computes {'; '.join(refused)}; see gemmgen list and "
                               "docs/problems.md for the variants each family computes")
    if variant == Variant():
        return
    space = space.narrowed(precision, variant)
    rng, first, every = random.Random(0), None, None
    for _ in range(CHECK_DRAWS):
        try:
            make_config(space.family, space.sample(rng), precision, arch, variant)
            return
        except InvalidPoint as err:
            first = first or err
            every = [v for v in (err.violations if every is None else every) if v in err.violations]
    why = "; ".join(every) if every else f"the first drawn: {first}"
    raise InvalidParameter(f"no point of the {space.family} search space computes {variant.text} in {precision} "
                           f"on {arch.name} ({CHECK_DRAWS} drawn): {why}")


def named_points_in(space: SearchSpace, precision: str) -> list[str]:
    """The family's named points of this precision whose values all lie in the space."""
    names = []
    for point in NAMED_POINTS.values():
        if point.family == space.family and point.precision == precision and all(
                point.params[k] in v for k, v in space.params.items()):
            if point.params not in [NAMED_POINTS[n].params for n in names]:
                names.append(point.name)
    return names


def _compile(name: str, arch: str, timeout_s: float) -> BuildResult:
    """Runs in a worker process: render and compile the point of canonical name ``name`` (into the
    shared cache)."""
    return build_kernel(resolve_point(name, arch), timeout_s=timeout_s)


@dataclass
class TrialOutcome:
    config: KernelConfig | None
    name: str
    status: str  # ok when every shape is ok, else the first other status
    tflops: float | None  # geometric mean over the shapes (ok only)
    per_shape: list[Measured] = field(default_factory=list)
    reused: bool = False
    message: str = ""
    error_ratio: float | None = None  # FP8: its largest error over the shapes, as a multiple of cuBLAS's there
    accurate: bool = True  # gemmgen.selection.best.within_error of that

    @property
    def value(self) -> float | None:
        """What the study maximizes: TFLOP/s, times INACCURATE_WEIGHT where the point is not
        accurate (FP8 over the best-kernel policy's error bound), so that every accurate point
        ranks first and the search learns where accuracy lies, while the slower of two inaccurate
        points still ranks lower."""
        if self.tflops is None:
            return None
        return self.tflops if self.accurate else self.tflops * INACCURATE_WEIGHT

    @property
    def timed_fully(self) -> bool:
        """False where a shape's timing stopped early (GIVE_UP)."""
        return not any(m.cut for m in self.per_shape)


@dataclass
class Retimed:
    """A point re-timed at the end in alternation with cuBLAS: TFLOP/s and its ratio to that
    cuBLAS timing, geometric means over the shapes."""

    name: str
    config: KernelConfig
    tflops: float
    ratio: float | None
    accurate: bool = True  # see TrialOutcome


@dataclass
class TuneReport:
    study: str
    trials: int  # feasible trials finished in this run (compiled and measured, or reused)
    infeasible: int  # points that break a constraint, drawn and dropped (never compiled, not counted)
    seconds: float
    best: TrialOutcome | None
    baseline_tflops: float | None  # cuBLAS, geometric mean over the shapes
    named: dict[str, float]  # named point -> its TFLOP/s in this study
    interrupted: bool
    retimed: list[Retimed] = field(default_factory=list)  # the best first

    @property
    def trials_per_minute(self) -> float:
        return 60.0 * self.trials / self.seconds if self.seconds > 0 else 0.0


class Budget:
    """How many more trials may start: this tuner's own count, or one shared by the device
    workers of one run (a multiprocessing.Value)."""

    def __init__(self, total: int, shared=None):
        self._shared = shared
        self._left = total

    def take(self) -> bool:
        if self._shared is None:
            if self._left <= 0:
                return False
            self._left -= 1
            return True
        with self._shared.get_lock():
            if self._shared.value <= 0:
                return False
            self._shared.value -= 1
            return True

    def give_back(self) -> None:
        if self._shared is None:
            self._left += 1
        else:
            with self._shared.get_lock():
                self._shared.value += 1


@dataclass(eq=False)
class _Work:
    """A trial on its way: compiling (``future``), waiting for another tuner's claim (``owner``),
    or ready (``outcome``)."""

    trial: optuna.Trial
    config: KernelConfig | None
    future: Future | None = None
    owner: int | None = None
    outcome: TrialOutcome | None = None
    source: str = ""  # the point's source hash (for the stored rows)
    claim: dict | None = None  # its claim's key (ResultsDB.claim), where it waits on one


def _lower_best(best_ms: dict, outcome: TrialOutcome) -> None:
    """best_ms[shape]: the lowest median of a fully timed, verified, accurate point so far (an
    inaccurate one would cut the accurate points slower than it)."""
    if outcome.status == "ok" and outcome.accurate:
        for m in outcome.per_shape:
            if m.timing and not m.cut:
                best_ms[m.shape] = min(best_ms.get(m.shape, m.timing.median_ms), m.timing.median_ms)


class Tuner:
    """One tuning run: a family, a precision, the GPU's architecture, one or more shapes and the
    problem variant (``variant``: every trial's kernel computes it, cuBLAS's baseline is of it,
    and the study's default name carries it).

    ``bench`` measures: it has ``db``, ``device_id``, ``gpu`` (or None), ``batch_count`` (the
    products one launch of a batched variant computes: its rows are stored, found and reused
    with that count only), ``measure_point(label, config, shape, build=..., give_up_ms=...)`` and
    ``measure_cublas(precision, shape, variant)`` returning :class:`Measured` (the real one is
    :class:`gemmgen.measure.Bench`; tests pass a deterministic stand-in). ``progress`` receives
    one event (a dict) per note and per finished trial (tune.progress renders them).

    The study's first trials, enqueued once however often it is opened: the family's named points,
    then ``first`` -- (params, user_attrs) pairs, e.g. the winners at a workload's other shapes with
    ``{"seeded_from": "<kernel> at <shape>"}``; params name the space's parameters only.
    """

    def __init__(self, bench, space: SearchSpace, precision: str, arch, shapes: list[Shape], *,
                 study: str | None = None, storage: str, sampler: str = "tpe", seed: int | None = None,
                 jobs: int = 1, compile_timeout_s: float = DEFAULT_TIMEOUT_S,
                 log: Callable[[str], None] = print, progress: Callable[[dict], None] | None = None,
                 device: str = "", heartbeat_interval_s: int = HEARTBEAT_INTERVAL_S,
                 grace_period_s: int = GRACE_PERIOD_S, first: list[tuple[dict, dict]] = (),
                 variant: Variant = Variant()):
        self.precision = space.precision(precision)
        self.bench, self.space, self.arch, self.shapes = bench, space.narrowed(self.precision, variant), arch, shapes
        self.jobs, self.compile_timeout_s, self.log = max(1, jobs), compile_timeout_s, log
        self.device, self.variant = device, variant
        self.batch_count = bench.batch_count if variant.batched else 1  # of every row stored and looked up
        check_variant(space, self.precision, arch, variant)
        self._progress = progress or self._log_progress
        self.study_name = study or study_name(space.family, precision, arch.name, shapes, variant, self.batch_count)
        self.sampler = make_sampler(sampler, self.space, seed, feasible=self._feasible)
        self.storage = open_storage(storage, heartbeat_interval_s=heartbeat_interval_s,
                                    grace_period_s=grace_period_s)
        # the family's named points that compute the variant (a constraint may keep one from it):
        # a point that cannot is no start
        named = [(NAMED_POINTS[name].params, {"named_point": name}) for name in named_points_in(self.space, precision)
                 if self._feasible(NAMED_POINTS[name].params)]
        self.study, moved = open_study(self.storage, storage, self.study_name, self.sampler, named + list(first),
                                       self.space.params)
        if moved:
            log(moved)
        self._stop = threading.Event()
        self.compile_fn = _compile  # what the worker processes run; tests substitute a stand-in
        # seconds the GPU spent in the bench's measurements, and the measuring thread spent waiting
        # for a compile, over every run() and retime_best() of this tuner
        self.measuring_s = 0.0
        self.compile_wait_s = 0.0
        self._stale_check_at = 0.0  # when _settle_waiting next fails this study's stale trials
        self._baseline_error: dict[Shape, float] = {}  # cuBLAS's rel_error per shape, once run() measured it

    # ---- points ----

    def config(self, params: dict) -> KernelConfig:
        """The KernelConfig of a trial's parameters, of this run's precision, target and variant;
        raises InvalidPoint."""
        return make_config(self.space.family, params, self.precision, self.arch, self.variant)

    def _feasible(self, params: dict) -> bool:
        try:
            self.config(params)
            return True
        except InvalidPoint:
            return False

    def _params(self, trial: optuna.Trial) -> dict:
        return {name: trial.suggest_categorical(name, list(values)) for name, values in self.space.params.items()}

    def _stored(self, config: KernelConfig, src: str) -> list[Measured] | None:
        """Every shape's stored measurement of this exact build (``src``: its source hash) on this
        device, or None."""
        db = self.bench.db
        found = []
        for shape in self.shapes:
            row = db.find(kernel_name=config.name, arch=config.arch.name, source_hash=src,
                          device_id=self.bench.device_id, problem_id=timed_problem_id(db, shape),
                          statuses=_ANY_STATUS, batch_count=self.batch_count)
            if row is None:
                return None
            timing = Timing(row.median_ms, row.min_ms, row.max_ms, row.runs or 0) if row.median_ms else None
            found.append(Measured(config.name, config.name, config.precision, shape, row.status, timing,
                                  row.rel_error, row.message or "", cut=(row.message or "").startswith(CUT_PREFIX),
                                  variant=config.variant, batch=self.batch_count))
        return found

    def _claim_key(self, config: KernelConfig, src: str) -> dict:
        db = self.bench.db
        kernel_id = db.kernel(name=config.name, family=config.family.name, precision=config.precision,
                              arch=config.arch.name, params=config.params, template_hash=template_hash(config),
                              source_hash=src)
        return dict(kernel_id=kernel_id, device_id=self.bench.device_id,
                    problem_id=timed_problem_id(db, self.shapes[0]))

    def _error_ratio(self, per_shape: list[Measured]) -> float | None:
        """The largest of a point's errors over cuBLAS's at the same shape (None where none is known)."""
        ratios = [m.rel_error / self._baseline_error[m.shape] for m in per_shape
                  if m.rel_error is not None and self._baseline_error.get(m.shape)]
        return max(ratios) if ratios else None

    def _outcome(self, config: KernelConfig, per_shape: list[Measured], reused: bool) -> TrialOutcome:
        bad = next((m for m in per_shape if m.status != "ok"), None)
        if bad:
            return TrialOutcome(config, config.name, bad.status, None, per_shape, reused, bad.message)
        ratio = self._error_ratio(per_shape)
        return TrialOutcome(config, config.name, "ok", geometric_mean([m.tflops for m in per_shape]), per_shape,
                            reused, error_ratio=ratio, accurate=within_error(self.precision, ratio))

    # ---- the GPU thread ----

    def _timed(self, measure, *args, **kwargs):
        """``measure(*args, **kwargs)`` (one of the bench's), its seconds added to measuring_s."""
        start = time.monotonic()
        try:
            return measure(*args, **kwargs)
        finally:
            self.measuring_s += time.monotonic() - start

    def _built(self, future: Future) -> BuildResult:
        """The compile's result, the time spent waiting for it added to compile_wait_s."""
        if future.done():
            return future.result()
        start = time.monotonic()
        try:
            return future.result()
        finally:
            self.compile_wait_s += time.monotonic() - start

    def _measure(self, config: KernelConfig, build: BuildResult, best_ms: dict) -> TrialOutcome:
        per_shape = []
        for shape in self.shapes:
            best = best_ms.get(shape)
            m = self._timed(self.bench.measure_point, config.name, config, shape, build=build,
                            give_up_ms=GIVE_UP * best if best else None)
            per_shape.append(m)
            if m.status != "ok":  # a wrong or failing kernel is not timed at the other shapes
                break
        return self._outcome(config, per_shape, reused=False)

    def _gpu_thread(self, work: queue.Queue, done: queue.Queue, best_ms: dict) -> None:
        """Measures what ``work`` brings, in order, and puts each on ``done``; None ends it."""
        gpu = getattr(self.bench, "gpu", None)
        if gpu is not None:
            gpu.context.push()
        try:
            while (item := work.get()) is not None:
                if self._stop.is_set():
                    item.future.cancel()
                    item.outcome = TrialOutcome(item.config, item.config.name, "interrupted", None)
                else:
                    try:
                        item.outcome = self._measure(item.config, self._built(item.future), best_ms)
                        _lower_best(best_ms, item.outcome)  # here, before the next point is measured
                    except Exception as err:  # noqa: BLE001 (a result like any other: the trial fails, the run goes on)
                        # while stopping, a compile cancelled or a shared pool gone is no result
                        status = "interrupted" if self._stop.is_set() else "launch_error"
                        item.outcome = TrialOutcome(item.config, item.config.name, status, None,
                                                    message=f"{type(err).__name__}: {err}")
                done.put(item)
        finally:
            if gpu is not None:
                gpu.context.pop()

    # ---- the run ----

    def request_stop(self, *_) -> None:
        """Stop after the trial being measured (installed as the SIGINT handler by run())."""
        if not self._stop.is_set():
            self.log("gemmgen: stopping after the current trial (Ctrl-C again to abort at once)")
            self._stop.set()
        else:
            raise KeyboardInterrupt

    def _note(self, text: str) -> None:
        self._progress({"event": "note", "device": self.device, "text": text})

    def run(self, n_trials: int, timeout_s: float | None = None, budget: Budget | None = None,
            retime: bool = True, pool=None) -> TuneReport:
        """Up to ``n_trials`` feasible trials (or what ``budget`` allows), or until ``timeout_s``
        (seconds, counted once cuBLAS's baseline is measured: no new trial is asked after it);
        then, with ``retime``, the best re-timed against cuBLAS. ``pool``: compile workers shared
        with other tuners (an executor: ``submit(fn, *args)`` returns a Future), left running;
        without one the run starts ``jobs`` workers of its own. Either way the tuner keeps at most
        2 x ``jobs`` points on their way (compiling, waiting for the GPU or for another tuner)."""
        budget = budget or Budget(n_trials)
        self._note(f"measuring cuBLAS at {', '.join(str(s) for s in self.shapes)}"
                   + (f" ({self.variant.text})" if self.variant != Variant() else ""))
        baseline = {s: self._timed(self.bench.measure_cublas, self.precision, s, self.variant)
                    for s in self.shapes}
        base = [m.tflops for m in baseline.values()]
        self._baseline_error = {s: m.rel_error for s, m in baseline.items() if m.status == "ok" and m.rel_error}
        # the time limit counts from here: making the operands of a large shape (FP8's are encoded
        # on the host) took longer than a workload's per-shape limit, which then measured nothing
        start = time.monotonic()
        base_tflops = geometric_mean(base) if all(base) else None
        best_ms = self._best_stored_ms()
        state = {"best": None, "named": {}, "done": 0, "pruned": 0, "asks": 0}
        heartbeat = Heartbeat(self.storage)
        work_q: queue.Queue = queue.Queue()
        done_q: queue.Queue = queue.Queue()
        gpu = threading.Thread(target=self._gpu_thread, args=(work_q, done_q, best_ms), name="gemmgen-gpu",
                               daemon=True)
        gpu.start()
        pending: deque[_Work] = deque()  # asked, not yet told: compiling, measuring or waiting
        previous = signal.signal(signal.SIGINT, self.request_stop) if threading.current_thread() is \
            threading.main_thread() else None
        self._note("compiling the first points " + ("(in the compile pool shared by the GPUs)" if pool is not None
                                                    else f"({self.jobs} compile workers)"))
        try:
            # forkserver: workers must not be forked from this process, which holds a CUDA context
            # and threads; they only render and run nvcc.
            with (contextlib.nullcontext(pool) if pool is not None else
                  ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("forkserver"))) \
                    as pool:
                while True:
                    out_of_time = timeout_s is not None and time.monotonic() - start > timeout_s
                    while (not (self._stop.is_set() or out_of_time) and len(pending) < 2 * self.jobs
                           and state["asks"] < MAX_ASKS_PER_TRIAL * max(n_trials, 1)):
                        if not budget.take():
                            break
                        item = self._ask(pool, heartbeat, state)
                        if item is None:
                            budget.give_back()
                            continue
                        pending.append(item)
                        if item.future is not None:
                            work_q.put(item)
                    if not pending:
                        break
                    self._settle_waiting(pending, pool, work_q)
                    finished = next((w for w in pending if w.outcome is not None and w.future is None), None)
                    if finished is None:
                        try:
                            finished = done_q.get(timeout=0.2)
                        except queue.Empty:
                            continue
                    pending.remove(finished)
                    self._finish(finished, heartbeat, state, best_ms, base_tflops, n_trials, start)
        finally:
            work_q.put(None)
            gpu.join()
            heartbeat.close()
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        infeasible = state["pruned"] + (self.sampler.infeasible_draws if isinstance(self.sampler, FeasibleSampler)
                                        else 0)
        seconds = time.monotonic() - start
        report = TuneReport(self.study_name, state["done"], infeasible, seconds, state["best"], base_tflops,
                            state["named"], self._stop.is_set())
        if retime and not self._stop.is_set():
            report.retimed = self.retime_best()
        return report

    def _ask(self, pool, heartbeat: Heartbeat, state: dict) -> _Work | None:
        """Asks for one trial and starts it: reused, waiting on a claim, or compiling. Returns None
        for a point that breaks a constraint (a grid's: pruned and counted)."""
        fail_stale_trials(self.study)  # a dead tuner's trials: failed, and enqueued again
        trial = self.study.ask()
        state["asks"] += 1
        heartbeat.hold(trial._trial_id)
        params = self._params(trial)
        try:
            config = self.config(params)
        except InvalidPoint as err:
            trial.set_user_attr("kernel", err.name)
            trial.set_user_attr("status", "infeasible")
            self.study.tell(trial, state=TrialState.PRUNED)
            heartbeat.drop(trial._trial_id)
            state["pruned"] += 1
            return None
        src = source_hash(render_kernel(config))
        stored = self._stored(config, src)
        if stored is not None:
            return _Work(trial, config, outcome=self._outcome(config, stored, reused=True))
        key = self._claim_key(config, src)
        owner = self.bench.db.claim(**key, owner=trial._trial_id)
        if owner != trial._trial_id:
            return _Work(trial, config, owner=owner, source=src, claim=key)
        return _Work(trial, config, future=self._submit(pool, config))

    def _submit(self, pool, config: KernelConfig) -> Future:
        return pool.submit(self.compile_fn, config.name, config.arch.name, self.compile_timeout_s)

    def _settle_waiting(self, pending: deque, pool, work_q: queue.Queue) -> None:
        """Trials whose point another tuner claimed: reuse its result once stored; take the claim
        over where its trial ended without one (its tuner died or failed). A claim of this study's
        whose tuner died is found here too, not only when this tuner asks: its stale trials are
        failed every heartbeat interval while one is waited on (tune.storage), so that a tuner
        with nothing left to ask never waits for a dead one."""
        if time.monotonic() >= self._stale_check_at and any(
                w.owner is not None and w.outcome is None and w.future is None for w in pending):
            self._stale_check_at = time.monotonic() + self.storage.get_heartbeat_interval()
            fail_stale_trials(self.study)
        for item in pending:
            if item.owner is None or item.outcome is not None or item.future is not None:
                continue
            if self._stop.is_set():
                item.outcome = TrialOutcome(item.config, item.config.name, "interrupted", None)
                continue
            stored = self._stored(item.config, item.source)
            if stored is not None:
                item.outcome = self._outcome(item.config, stored, reused=True)
                continue
            try:
                owner_state = self.storage.get_trial(item.owner).state
            except KeyError:
                owner_state = TrialState.FAIL
            if owner_state != TrialState.RUNNING and self.bench.db.take_over(
                    **item.claim, old_owner=item.owner, new_owner=item.trial._trial_id):
                item.owner = None
                item.future = self._submit(pool, item.config)
                work_q.put(item)

    def _finish(self, item: _Work, heartbeat: Heartbeat, state: dict, best_ms: dict, base_tflops, total: int,
                start: float) -> None:
        trial, outcome = item.trial, item.outcome
        trial.set_user_attr("kernel", outcome.name)
        trial.set_user_attr("status", outcome.status)
        if outcome.status == "ok":
            if not outcome.accurate:
                trial.set_user_attr("message", f"error {outcome.error_ratio:.2f}x cuBLAS's, over the bound of "
                                               f"{ERROR_BOUND}x: ranked after every accurate point")
            self.study.tell(trial, outcome.value)
        else:
            if outcome.message:
                trial.set_user_attr("message", outcome.message[:2000])
            self.study.tell(trial, state=TrialState.FAIL)
        heartbeat.drop(trial._trial_id)
        state["done"] += 1
        if outcome.status == "ok":
            _lower_best(best_ms, outcome)  # a reused or another tuner's point may be the best too
            if state["best"] is None or outcome.value > state["best"].value:
                state["best"] = outcome
            point = trial.user_attrs.get("named_point")
            if point:
                state["named"][point] = outcome.tflops
        best = state["best"]
        self._progress({"event": "trial", "device": self.device, "name": outcome.name, "status": outcome.status,
                        "tflops": outcome.tflops, "stored": outcome.reused, "full": outcome.timed_fully,
                        "best_tflops": best.tflops if best else None, "base_tflops": base_tflops,
                        "done": state["done"], "total": total, "seconds": time.monotonic() - start})

    def _best_stored_ms(self) -> dict:
        """Per shape, the best median stored on this device by this study's trials so far (a
        resumed study's cut starts where it was)."""
        best: dict = {}
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            try:
                config = self.config(trial.params)
            except InvalidPoint:
                continue
            for m in self._stored(config, source_hash(render_kernel(config))) or []:
                if m.status == "ok" and m.timing and not m.cut:
                    best[m.shape] = min(best.get(m.shape, m.timing.median_ms), m.timing.median_ms)
        return best

    def _log_progress(self, event: dict) -> None:
        if event["event"] == "note":
            self.log(f"gemmgen tune: {event['text']}")
            return
        this = f"{event['tflops']:.2f} TFLOP/s" if event["tflops"] else event["status"]
        best = f"{event['best_tflops']:.2f} TFLOP/s" if event["best_tflops"] else "-"
        minutes = event["seconds"] / 60.0
        self.log(f"[{event['done']}/{event['total']}] {event['name']}: {this}{' (stored)' if event['stored'] else ''}"
                 f" | best {best} | {event['done'] / minutes if minutes > 0 else 0:.1f} trials/min")

    # ---- the end ----

    def retime_best(self, top: int = RETIME_TOP) -> list[Retimed]:
        """The ``top`` best points of the study (by their stored TFLOP/s) re-timed at every shape in
        alternation with cuBLAS, as `gemmgen bench` times them, and recorded (tagged with the study's
        name and FINAL_TAG); best ratio first. They are also kept on the study (user attribute
        RETIMED_ATTR: [{"kernel", "tflops", "ratio"}], best first), so that a later run can report
        them without measuring again."""
        ranked = sorted(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                        key=lambda t: t.value, reverse=True)
        seen, configs = set(), []
        for trial in ranked:
            name = trial.user_attrs.get("kernel")
            if name in seen:
                continue
            seen.add(name)
            configs.append(self.config(trial.params))
            if len(configs) == top:
                break
        if not configs:
            return []
        self._note(f"re-timing the best {len(configs)} in alternation with cuBLAS")
        interleave, tag = getattr(self.bench, "interleave", False), getattr(self.bench, "tag", None)
        self.bench.interleave, self.bench.tag = True, f"{self.study_name}{FINAL_TAG}"
        out = []
        try:
            for config in configs:
                per_shape = [self._timed(self.bench.measure_point, config.name, config, shape)
                             for shape in self.shapes]
                if all(m.status == "ok" for m in per_shape):
                    ratios = [m.baseline_ratio for m in per_shape]
                    out.append(Retimed(config.name, config, geometric_mean([m.tflops for m in per_shape]),
                                       geometric_mean(ratios) if all(ratios) else None,
                                       within_error(self.precision, self._error_ratio(per_shape))))
        finally:
            self.bench.interleave, self.bench.tag = interleave, tag
        out.sort(key=lambda r: (r.accurate, r.ratio or 0.0, r.tflops), reverse=True)
        kept = [{"kernel": r.name, "tflops": r.tflops, "ratio": r.ratio, "accurate": r.accurate} for r in out]
        self.study.set_user_attr(RETIMED_ATTR, kept)
        return out
