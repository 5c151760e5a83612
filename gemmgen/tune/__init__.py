"""`gemmgen tune`: Optuna searches over a family's space, on one GPU or several, by one process
or many at once on one study.

- :mod:`gemmgen.tune.loop`: one tuner (one GPU): ask, compile ahead, measure, record.
- :mod:`gemmgen.tune.sampler`: the samplers, drawing feasible points only.
- :mod:`gemmgen.tune.space`: a family's search space (search_spaces/<family>.toml).
- :mod:`gemmgen.tune.devices`: one tuner per GPU of this machine, on one study.
- :mod:`gemmgen.tune.progress`: what a run shows while it goes.
- :mod:`gemmgen.tune.workload`: every shape and precision of a workload file, a study each.
- :mod:`gemmgen.tune.schedule`: on several GPUs, which GPU tunes which of a workload's shapes when.
- :mod:`gemmgen.tune.node`: the device workers and shared compile pool that carry that out.
- :mod:`gemmgen.tune.fill`: after a workload, measurements between its token counts.

The study itself lives in the results database (gemmgen.store.studies).
"""

from gemmgen.tune.loop import Budget, Retimed, TrialOutcome, Tuner, TuneReport, _compile, named_points_in, study_name
from gemmgen.tune.sampler import SAMPLERS, make_sampler

__all__ = ["SAMPLERS", "Budget", "Retimed", "TrialOutcome", "TuneReport", "Tuner", "_compile", "make_sampler",
           "named_points_in", "study_name"]
