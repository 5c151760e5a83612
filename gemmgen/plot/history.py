"""A study's tuning history: each trial's TFLOP/s in the order the trials finished, the best so
far, and the cuBLAS TFLOP/s the tune measured next to them."""

import statistics
from dataclasses import dataclass
from datetime import datetime

import optuna
from optuna.trial import TrialState

from gemmgen.describe.problem import Shape
from gemmgen.selection.report import geometric_mean
from gemmgen.store.db import ResultsDB


@dataclass(frozen=True)
class TrialPoint:
    """One finished trial: ``minutes`` after the study's first trial started; ``tflops`` its
    value (the geometric mean of TFLOP/s over the study's shapes), None where it failed;
    ``status`` gemmgen's (ok, wrong_result, compile_error, launch_error) or Optuna's state."""

    number: int
    minutes: float
    tflops: float | None
    status: str
    kernel: str


@dataclass(frozen=True)
class History:
    """``trials``: the measured trials (complete or failed), in the order they finished;
    ``best_so_far[i]``: the highest TFLOP/s among trials[0..i] (None before the first success);
    ``cublas_tflops``: cuBLAS at the study's shapes as its tune measured it (the geometric mean
    over the shapes of each shape's median), None where no cuBLAS row carries the study's tag;
    ``infeasible``: trials that broke a constraint and were never measured."""

    study: str
    trials: tuple[TrialPoint, ...]
    best_so_far: tuple[float | None, ...]
    cublas_tflops: float | None
    infeasible: int

    @property
    def failures(self) -> int:
        return sum(1 for t in self.trials if t.tflops is None)

    @property
    def best(self) -> float | None:
        return self.best_so_far[-1] if self.best_so_far else None


def history(study: optuna.Study, db: ResultsDB) -> History:
    """The history of ``study``, whose measurements ``db`` holds (tagged with its name).

    Running and waiting trials are left out; a FAIL trial is a failure whatever its cause.
    """
    frozen = study.get_trials(deepcopy=False)
    done = [t for t in frozen if t.state in (TrialState.COMPLETE, TrialState.FAIL) and t.datetime_complete]
    starts = [t.datetime_start for t in frozen if t.datetime_start]
    origin = min(starts) if starts else None
    done.sort(key=lambda t: (t.datetime_complete, t.number))
    points, best_so_far, best = [], [], None
    for t in done:
        ok = t.state == TrialState.COMPLETE and t.value is not None
        status = "ok" if ok else str(t.user_attrs.get("status") or "fail")
        points.append(TrialPoint(t.number, _minutes(origin, t.datetime_complete), t.value if ok else None, status,
                                 str(t.user_attrs.get("kernel", ""))))
        if ok and (best is None or t.value > best):
            best = t.value
        best_so_far.append(best)
    infeasible = sum(1 for t in frozen if t.state == TrialState.PRUNED)
    return History(study.study_name, tuple(points), tuple(best_so_far), _cublas_tflops(db, study.study_name),
                   infeasible)


def _minutes(origin: datetime | None, when: datetime) -> float:
    return (when - origin).total_seconds() / 60.0 if origin else 0.0


def _cublas_tflops(db: ResultsDB, tag: str) -> float | None:
    per_shape: dict[Shape, list[float]] = {}
    for r in db.results(tag=tag, family="cublas", status="ok"):
        if r.tflops:
            per_shape.setdefault(Shape(r.M, r.N, r.K), []).append(r.tflops)
    return geometric_mean(statistics.median(v) for v in per_shape.values()) if per_shape else None
