"""The samplers `gemmgen tune` offers, and :class:`FeasibleSampler`, which keeps points that break
a family's constraints out of the study: they are drawn and dropped (and counted) before Optuna
makes a trial of them, so they cost neither a compile nor a row in any table.
"""

import random
from collections.abc import Callable

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.samplers import BaseSampler

from gemmgen.errors import GemmgenError
from gemmgen.tune.space import SearchSpace

SAMPLERS = ("tpe", "random", "grid", "cmaes")
MAX_DRAWS = 1000  # draws per trial before giving the trial to the base sampler's own choice


def make_sampler(name: str, space: SearchSpace, seed: int | None,
                 feasible: Callable[[dict], bool] | None = None) -> BaseSampler:
    """The sampler called ``name``. With ``feasible`` (params -> bool), tpe, random and cmaes
    draw feasible points only (FeasibleSampler); grid walks its grid as it is (the tuner prunes
    infeasible grid points). TPE runs multivariate, with constant_liar so that several workers on
    one study do not all propose the point each of them is measuring.

    Raises GemmgenError for an unknown sampler or a missing optional package."""
    if name == "grid":
        return optuna.samplers.GridSampler({k: list(v) for k, v in space.params.items()}, seed=seed)
    if name == "tpe":
        base: BaseSampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    elif name == "random":
        base = optuna.samplers.RandomSampler(seed=seed)
    elif name == "cmaes":
        try:
            import cmaes  # noqa: F401  (Optuna's CMA-ES sampler needs it)
        except ImportError:
            raise GemmgenError("--sampler cmaes needs the cmaes package: pip install cmaes") from None
        base = optuna.samplers.CmaEsSampler(seed=seed)
    else:
        raise GemmgenError(f"unknown sampler {name!r}; choose one of: {', '.join(SAMPLERS)}")
    return FeasibleSampler(base, space, feasible, seed) if feasible else base


class FeasibleSampler(BaseSampler):
    """Wraps a sampler so that each new trial starts with a whole feasible point (its relative
    params). Where the base sampler gives a joint sample (multivariate TPE after its start-up
    trials) that breaks a constraint, it is repaired rather than drawn again: TPE, which does not
    know the constraints, recombines good points into infeasible ones most of the time, and each
    of its draws costs milliseconds. The repair takes a feasible point one parameter away, else
    two, in random order; else, like samplers with no joint sample (random, TPE's start-up), a
    uniform draw, up to MAX_DRAWS of them. ``infeasible_draws`` counts the points dropped.
    Enqueued trials (named points, retries) keep their params."""

    def __init__(self, base: BaseSampler, space: SearchSpace, feasible: Callable[[dict], bool], seed: int | None):
        self.base, self.space, self.feasible = base, space, feasible
        self._rng = random.Random(seed)
        self.infeasible_draws = 0
        self._distributions = {name: CategoricalDistribution(list(values)) for name, values in space.params.items()}

    def infer_relative_search_space(self, study, trial):
        return dict(self._distributions)

    def sample_relative(self, study, trial, search_space):
        if "fixed_params" in trial.system_attrs or trial.params:  # enqueued: a named point, a retry
            return {}
        base_space = self.base.infer_relative_search_space(study, trial)
        proposed = self.base.sample_relative(study, trial, base_space) if base_space else {}
        if len(proposed) == len(self.space.params):
            if self._ok(proposed):
                return dict(proposed)
            repaired = self._repair(proposed)
            if repaired is not None:
                return repaired
        for _ in range(MAX_DRAWS):
            params = {name: self._rng.choice(values) for name, values in self.space.params.items()}
            if self._ok(params):
                return params
        return {}

    def _ok(self, params: dict) -> bool:
        if self.feasible(params):
            return True
        self.infeasible_draws += 1
        return False

    def _repair(self, params: dict) -> dict | None:
        """A feasible point one parameter away from ``params``, else two (at most MAX_DRAWS tried),
        chosen at random among those; None where there is none."""
        names = list(self.space.params)
        singles = [(n, v) for n in names for v in self.space.params[n] if v != params[n]]
        self._rng.shuffle(singles)
        for name, value in singles:
            candidate = {**params, name: value}
            if self._ok(candidate):
                return candidate
        for _ in range(MAX_DRAWS):
            (n1, v1), (n2, v2) = self._rng.sample(singles, 2)
            if n1 != n2 and self._ok(candidate := {**params, n1: v1, n2: v2}):
                return candidate
        return None

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):
        self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._rng.seed()
