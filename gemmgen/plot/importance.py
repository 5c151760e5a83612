"""A study's parameter importances, as Optuna computes them.

The evaluator is PED-ANOVA (optuna.importance.PedAnovaImportanceEvaluator): it needs only NumPy,
which gemmgen installs anyway, and it is deterministic. Optuna's default, fANOVA, and its
mean-decrease-impurity evaluator need scikit-learn, which gemmgen does not install. PED-ANOVA asks
how much each parameter's distribution among the best 10% of the trials differs from its
distribution among all of them.
"""

from dataclasses import dataclass

import optuna
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
from optuna.trial import TrialState

from gemmgen.errors import GemmgenError

EVALUATOR = "PED-ANOVA"


@dataclass(frozen=True)
class Importances:
    """``importances``: (parameter, importance) most important first, the importances summing
    to 1 (Optuna's normalisation); ``trials``: the complete trials they were computed from."""

    study: str
    evaluator: str
    trials: int
    importances: tuple[tuple[str, float], ...]


def importances(study: optuna.Study) -> Importances:
    """Optuna's parameter importances of ``study`` by PED-ANOVA.

    Raises GemmgenError where the study has too few complete trials, or no parameter that
    varies, for Optuna to compute them.
    """
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    try:
        found = get_param_importances(study, evaluator=PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError) as err:
        raise GemmgenError(f"Optuna cannot compute the parameter importances of study {study.study_name} "
                           f"({len(complete)} complete trials): {err}") from err
    if not found:
        raise GemmgenError(f"study {study.study_name} has no parameter that varies over its "
                           f"{len(complete)} complete trials: no importances to draw")
    return Importances(study.study_name, EVALUATOR, len(complete), tuple(found.items()))
