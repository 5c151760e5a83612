"""`gemmgen tune`: an Optuna search over a family's search space.

The loop asks Optuna for points, rejects the ones that break a constraint before anything is
compiled (recorded as ``infeasible``), compiles the rest in a pool of worker processes ahead of
the GPU, and measures them one at a time through a :class:`~gemmgen.measure.Bench`-like object
(verify, then time, every shape). The study lives in the results database (Optuna's RDB
storage on the same URL); every measurement is committed when taken. A point already measured
on this device and shape is not compiled or timed again: its stored result is reused.
"""

import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

import optuna

from gemmgen.build import DEFAULT_TIMEOUT_S, BuildResult, build_kernel
from gemmgen.config import KernelConfig, make_config
from gemmgen.errors import GemmgenError, InvalidPoint
from gemmgen.measure import Measured, timed_problem_id
from gemmgen.points import NAMED_POINTS
from gemmgen.problem import Shape
from gemmgen.render import render_kernel, source_hash
from gemmgen.report import geometric_mean
from gemmgen.runtime import Timing
from gemmgen.space import SearchSpace

SAMPLERS = ("tpe", "random", "grid", "cmaes")
# --trials counts feasible points; infeasible ones are recorded too, but the search stops after
# this many asks per requested trial, in case the space holds few feasible points.
MAX_ASKS_PER_TRIAL = 50
_ANY_STATUS = ("ok", "wrong_result", "compile_error", "launch_error", "infeasible")


def study_name(family: str, precision: str, arch: str, shapes: list[Shape]) -> str:
    """The default study name, e.g. ``warp-fp32-sm_90-4096x4096x4096``."""
    return f"{family}-{precision}-{arch}-" + "_".join(str(s) for s in shapes)


def make_sampler(name: str, space: SearchSpace, seed: int | None) -> optuna.samplers.BaseSampler:
    """Raises GemmgenError for an unknown sampler or a missing optional package."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({k: list(v) for k, v in space.params.items()}, seed=seed)
    if name == "cmaes":
        try:
            import cmaes  # noqa: F401  (Optuna's CMA-ES sampler needs it)
        except ImportError:
            raise GemmgenError("--sampler cmaes needs the cmaes package: pip install cmaes") from None
        return optuna.samplers.CmaEsSampler(seed=seed)
    raise GemmgenError(f"unknown sampler {name!r}; choose one of: {', '.join(SAMPLERS)}")


def named_points_in(space: SearchSpace, precision: str) -> list[str]:
    """The family's named points of this precision whose values all lie in the space."""
    names = []
    for point in NAMED_POINTS.values():
        if point.family == space.family and point.precision == precision and all(
                point.params[k] in v for k, v in space.params.items()):
            if point.params not in [NAMED_POINTS[n].params for n in names]:
                names.append(point.name)
    return names


def _compile(family: str, params: dict, precision: str, arch: str, timeout_s: float) -> BuildResult:
    """Runs in a worker process: render and compile one point (into the shared cache)."""
    return build_kernel(make_config(family, params, precision, arch), timeout_s=timeout_s)


@dataclass
class TrialOutcome:
    config: KernelConfig | None
    name: str
    status: str  # ok when every shape is ok, else the first other status
    tflops: float | None  # geometric mean over the shapes (ok only)
    per_shape: list[Measured] = field(default_factory=list)
    reused: bool = False
    message: str = ""


@dataclass
class TuneReport:
    study: str
    trials: int  # feasible trials finished in this run (compiled and measured, or reused)
    infeasible: int  # points rejected by a constraint before compiling (recorded, not counted)
    seconds: float
    best: TrialOutcome | None
    baseline_tflops: float | None  # cuBLAS, geometric mean over the shapes
    named: dict[str, float]  # named point -> its TFLOP/s in this study
    interrupted: bool

    @property
    def trials_per_minute(self) -> float:
        return 60.0 * self.trials / self.seconds if self.seconds > 0 else 0.0


class Tuner:
    """One tuning run: a family, a precision, the GPU's architecture and one or more shapes.

    ``bench`` measures: it has ``db``, ``device_id``, ``measure_point(label, config, shape)``
    and ``measure_cublas(precision, shape)`` returning :class:`Measured` (the real one is
    :class:`gemmgen.measure.Bench`; tests pass a deterministic stand-in).
    """

    def __init__(self, bench, space: SearchSpace, precision: str, arch, shapes: list[Shape], *,
                 study: str | None = None, storage: str, sampler: str = "tpe", seed: int | None = None,
                 jobs: int = 1, compile_timeout_s: float = DEFAULT_TIMEOUT_S,
                 log: Callable[[str], None] = print):
        if precision not in space.precisions:
            raise GemmgenError(f"the {space.family} search space does not take precision {precision!r}; "
                               f"it takes: {', '.join(space.precisions)}")
        self.bench, self.space, self.precision, self.arch, self.shapes = bench, space, precision, arch, shapes
        self.jobs, self.compile_timeout_s, self.log = max(1, jobs), compile_timeout_s, log
        self.study_name = study or study_name(space.family, precision, arch.name, shapes)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(study_name=self.study_name, storage=storage, direction="maximize",
                                         sampler=make_sampler(sampler, space, seed), load_if_exists=True)
        for name in named_points_in(space, precision):
            self.study.enqueue_trial(NAMED_POINTS[name].params, user_attrs={"named_point": name},
                                     skip_if_exists=True)
        self._stop = False
        self.compile_fn = _compile  # what the worker processes run; tests substitute a stand-in

    # ---- one trial ----

    def _params(self, trial: optuna.Trial) -> dict:
        return {name: trial.suggest_categorical(name, list(values)) for name, values in self.space.params.items()}

    def _stored(self, config: KernelConfig) -> list[Measured] | None:
        """Every shape's stored measurement of this exact build on this device, or None."""
        db, src = self.bench.db, source_hash(render_kernel(config))
        found = []
        for shape in self.shapes:
            row = db.find(kernel_name=config.name, arch=config.arch.name, source_hash=src,
                          device_id=self.bench.device_id, problem_id=timed_problem_id(db, shape),
                          statuses=_ANY_STATUS)
            if row is None:
                return None
            timing = Timing(row.median_ms, row.min_ms, row.max_ms, 0) if row.median_ms else None
            found.append(Measured(config.name, config.name, config.precision, shape, row.status, timing,
                                  row.rel_error, row.message or ""))
        return found

    def _infeasible(self, params: dict, err: InvalidPoint) -> TrialOutcome:
        db = self.bench.db
        kernel_id = db.kernel(name=err.name, family=self.space.family, precision=self.precision,
                              arch=self.arch.name, params=params)
        for shape in self.shapes:
            db.record(kernel_id=kernel_id, device_id=self.bench.device_id,
                      problem_id=timed_problem_id(db, shape), status="infeasible",
                      message="; ".join(err.violations), tag=self.study_name)
        return TrialOutcome(None, err.name, "infeasible", None, message="; ".join(err.violations))

    def _measure(self, config: KernelConfig, build: BuildResult) -> TrialOutcome:
        per_shape = []
        for shape in self.shapes:
            m = self.bench.measure_point(config.name, config, shape, build=build)
            per_shape.append(m)
            if m.status != "ok":  # a wrong or failing kernel is not timed at the other shapes
                break
        return self._outcome(config, per_shape, reused=False)

    def _outcome(self, config: KernelConfig, per_shape: list[Measured], reused: bool) -> TrialOutcome:
        bad = next((m for m in per_shape if m.status != "ok"), None)
        if bad:
            return TrialOutcome(config, config.name, bad.status, None, per_shape, reused, bad.message)
        return TrialOutcome(config, config.name, "ok", geometric_mean([m.tflops for m in per_shape]), per_shape,
                            reused)

    def _finish(self, trial: optuna.Trial, outcome: TrialOutcome) -> None:
        trial.set_user_attr("kernel", outcome.name)
        trial.set_user_attr("status", outcome.status)
        if outcome.status == "ok":
            self.study.tell(trial, outcome.tflops)
        elif outcome.status == "infeasible":
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            trial.set_user_attr("message", outcome.message[:2000])
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    # ---- the run ----

    def request_stop(self, *_) -> None:
        """Stop after the trial being measured (installed as the SIGINT handler by run())."""
        if not self._stop:
            self.log("gemmgen: stopping after the current trial (Ctrl-C again to abort at once)")
            self._stop = True
        else:
            raise KeyboardInterrupt

    def run(self, n_trials: int, timeout_s: float | None = None) -> TuneReport:
        start = time.monotonic()
        baseline = {s: self.bench.measure_cublas(self.precision, s) for s in self.shapes}
        base = [m.tflops for m in baseline.values()]
        base_tflops = geometric_mean(base) if all(base) else None
        best: TrialOutcome | None = None
        named: dict[str, float] = {}
        done = infeasible = 0
        pending: deque[tuple[optuna.Trial, KernelConfig | None, Future | TrialOutcome]] = deque()
        previous = signal.signal(signal.SIGINT, self.request_stop)
        try:
            # forkserver: workers must not be forked from this process, which holds a CUDA context
            # and threads; they only render and run nvcc.
            with ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("forkserver")) as pool:
                asked = asks = 0
                while True:
                    out_of_time = timeout_s is not None and time.monotonic() - start > timeout_s
                    # Keep the compile pool busy ahead of the GPU.
                    while (not (self._stop or out_of_time) and asked < n_trials and asks < MAX_ASKS_PER_TRIAL * n_trials
                           and len(pending) < 2 * self.jobs):
                        trial = self.study.ask()
                        asks += 1
                        params = self._params(trial)
                        try:
                            config = make_config(self.space.family, params, self.precision, self.arch)
                        except InvalidPoint as err:
                            self._finish(trial, self._infeasible(params, err))
                            infeasible += 1
                            continue
                        asked += 1
                        stored = self._stored(config)
                        if stored is not None:
                            pending.append((trial, config, self._outcome(config, stored, reused=True)))
                            continue
                        pending.append((trial, config, pool.submit(self.compile_fn, config.family.name, config.params,
                                                                     config.precision, config.arch.name,
                                                                     self.compile_timeout_s)))
                    if not pending:
                        break
                    trial, config, work = pending.popleft()
                    if self._stop and isinstance(work, Future):
                        work.cancel()
                        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                        continue
                    if isinstance(work, Future):
                        outcome = self._measure(config, work.result())
                    else:
                        outcome = work
                    self._finish(trial, outcome)
                    done += 1
                    if outcome.status == "ok" and (best is None or outcome.tflops > best.tflops):
                        best = outcome
                    point = trial.user_attrs.get("named_point")
                    if point and outcome.status == "ok":
                        named[point] = outcome.tflops
                    self._progress(done, n_trials, outcome, best, base_tflops, start)
        finally:
            signal.signal(signal.SIGINT, previous)
        return TuneReport(self.study_name, done, infeasible, time.monotonic() - start, best, base_tflops, named,
                          self._stop)

    def _progress(self, done, total, outcome, best, base, start) -> None:
        minutes = (time.monotonic() - start) / 60.0
        this = f"{outcome.tflops:.2f} TFLOP/s" if outcome.tflops else outcome.status
        best_text = "-"
        if best:
            best_text = f"{best.tflops:.2f} TFLOP/s" + (f" ({100 * best.tflops / base:.0f}% of cuBLAS)" if base else "")
        self.log(f"[{done}/{total}] {outcome.name}: {this}{' (stored)' if outcome.reused else ''} | best {best_text} "
                 f"| {done / minutes if minutes > 0 else 0:.1f} trials/min")

