"""Timing launches with CUDA events, in alternation (:func:`time_interleaved`), and what a
timing is (:class:`Timing`: median, min, max, runs)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gemmgen.measure.device import Gpu, LaunchFailed


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int


def time_interleaved(gpu: Gpu, launches: Sequence[Callable[[], None]], before: Callable[[], None], *,
                     warmup: int = 3, min_runs: int = 10, max_runs: int = 500,
                     min_total_ms: float = 300.0, give_up_ms: float | None = None,
                     probe_runs: int = 5) -> list[Timing]:
    """Time launches in alternation with a CUDA event pair around each run, after ``warmup``
    untimed rounds: one Timing per launch.

    ``before`` runs before every run, outside the events (gemmgen uses it to poison C, flush L2
    and hold the GPU until the call is queued: gemmgen.measure.l2flush). Each round runs every
    launch once (``before`` ahead of each), in turn forward and backward, so that the clock and
    temperature drift of a long measurement falls on all of them alike and none always follows the
    same neighbour: the way to compare two kernels (a point and cuBLAS).
    Rounds continue until each launch has ``min_runs`` runs and the first has ``min_total_ms`` of
    kernel time, or ``max_runs``. With ``give_up_ms``, they stop after ``probe_runs`` rounds where
    the first launch's median is above it (a tuner's candidate clearly slower than its best so
    far): its Timing then has those runs only. Raises LaunchFailed if any run faults.
    """
    drv = gpu.drv
    for _ in range(warmup):
        for launch in launches:
            before()
            launch()
    gpu.synchronize()
    start, stop = drv.Event(), drv.Event()
    times: list[list[float]] = [[] for _ in launches]
    order = list(range(len(launches)))
    while len(times[0]) < max_runs and (len(times[0]) < min_runs or sum(times[0]) < min_total_ms):
        if give_up_ms is not None and len(times[0]) == probe_runs and sorted(times[0])[probe_runs // 2] > give_up_ms:
            break
        for i in order:
            before()
            start.record()
            launches[i]()
            stop.record()
            try:
                stop.synchronize()
            except drv.Error as err:
                raise LaunchFailed(str(err)) from None
            times[i].append(stop.time_since(start))
        order.reverse()
    result = []
    for ts in times:
        ts.sort()
        result.append(Timing(ts[len(ts) // 2], ts[0], ts[-1], len(ts)))
    return result
