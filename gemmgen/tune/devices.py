"""`gemmgen tune --devices 0,1`: one tuner per GPU of this machine, each in a process of its own
pinned to its device, all on one study and one shared count of trials; the parent process shows
their progress and, once they are done, re-times the best points on the first device.

A single device runs its tuner in this process. Ctrl-C asks every tuner to stop after its current
trial (a second Ctrl-C stops them at once); everything measured is stored either way.
"""

import multiprocessing
import os
import queue
import signal
from dataclasses import dataclass

from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import GemmgenError, InvalidParameter
from gemmgen.tune.loop import Budget, TrialOutcome, Tuner, TuneReport


@dataclass(frozen=True)
class TuneSpec:
    """What to tune, as `gemmgen tune` was asked (picklable, for the device workers)."""

    family: str
    precision: str
    shapes: tuple[Shape, ...]
    url: str
    study: str | None
    sampler: str
    seed: int | None
    trials: int
    timeout_s: float | None
    jobs: int  # compile workers in all, shared out among the devices
    compile_timeout_s: float
    arch: str | None  # --gpu, which must be the GPU's own
    first: tuple[tuple[dict, dict], ...] = ()  # extra first trials, (params, user_attrs): Tuner's ``first``
    variant: Variant = Variant()  # what every trial's kernel computes (--trans, --out, --bias, --act)
    batch_count: int = 1  # products per launch of a batched variant (--batch N); 1 for any other


def parse_devices(text: str, count: int) -> list[int]:
    """``0``, ``0,1`` or ``all`` -> device indices, each below ``count`` (the GPUs present).
    Raises InvalidParameter naming what is allowed."""
    if text.strip().lower() == "all":
        if count < 1:
            raise InvalidParameter("--devices all: no CUDA device is present")
        return list(range(count))
    try:
        devices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidParameter(f"--devices {text!r}: write device numbers separated by commas (e.g. 0,1) or all") from None
    bad = [d for d in devices if not 0 <= d < count]
    if not devices or bad or len(set(devices)) != len(devices):
        raise InvalidParameter(f"--devices {text!r}: each device once, from 0 to {count - 1} ({count} present), "
                               "or all")
    return devices


def _tuner(spec: TuneSpec, bench, arch, *, device: str, seed: int | None, jobs: int, progress) -> Tuner:
    from gemmgen.tune.space import load_space

    return Tuner(bench, load_space(spec.family), spec.precision, arch, list(spec.shapes), study=spec.study,
                 storage=spec.url, sampler=spec.sampler, seed=seed, jobs=jobs,
                 compile_timeout_s=spec.compile_timeout_s, progress=progress, device=device,
                 first=list(spec.first), variant=spec.variant)


def open_gpu(spec: TuneSpec, index: int):
    """The Gpu of device ``index``; raises GemmgenError where --gpu is not that GPU."""
    from gemmgen.describe.arch import parse_arch
    from gemmgen.measure.device import Gpu

    gpu = Gpu(index)
    if spec.arch and parse_arch(spec.arch).cc != gpu.info.arch.cc:
        gpu.close()
        raise GemmgenError(f"--gpu {spec.arch} asks to tune for {spec.arch}, but GPU {index} is {gpu.info.name} "
                           f"({gpu.info.arch.name}); timings need that GPU, so tune on it")
    return gpu


def _open_bench(spec: TuneSpec, index: int):
    """(Gpu, Bench) on device ``index``; raises GemmgenError where --gpu is not that GPU."""
    from gemmgen.measure.bench import Bench
    from gemmgen.store.db import ResultsDB

    gpu = open_gpu(spec, index)
    return gpu, Bench(gpu, ResultsDB(spec.url), tag=None, seed=spec.seed, batch_count=spec.batch_count)


def _worker(spec: TuneSpec, index: int, jobs: int, budget, events) -> None:
    """A device worker's process: one tuner on GPU ``index``, its events on ``events``."""
    device = f"GPU{index}"
    try:
        gpu, bench = _open_bench(spec, index)
        try:
            seed = None if spec.seed is None else spec.seed + index  # the workers draw different points
            tuner = _tuner(spec, bench, gpu.info.arch, device=device, seed=seed, jobs=jobs, progress=events.put)
            bench.tag = tuner.study_name
            report = tuner.run(spec.trials, spec.timeout_s, budget=Budget(0, shared=budget), retime=False)
            events.put({"event": "report", "device": device, "trials": report.trials, "infeasible": report.infeasible,
                        "interrupted": report.interrupted, "seconds": report.seconds})
        finally:
            bench.close()
            gpu.close()
    except GemmgenError as err:
        events.put({"event": "error", "device": device, "text": str(err)})


def tune(spec: TuneSpec, devices: list[int], progress) -> TuneReport:
    """Tune on ``devices`` (indices); ``progress`` receives the tuners' events."""
    if len(devices) == 1:
        gpu, bench = _open_bench(spec, devices[0])
        try:
            tuner = _tuner(spec, bench, gpu.info.arch, device="", seed=spec.seed, jobs=spec.jobs, progress=progress)
            bench.tag = tuner.study_name
            return tuner.run(spec.trials, spec.timeout_s)
        finally:
            bench.close()
            gpu.close()
    return _tune_in_processes(spec, devices, progress)


def _tune_in_processes(spec: TuneSpec, devices: list[int], progress) -> TuneReport:
    context = multiprocessing.get_context("spawn")  # each worker makes its own CUDA context
    budget, events = context.Value("i", spec.trials), context.Queue()
    jobs = max(1, spec.jobs // len(devices))
    workers = [context.Process(target=_worker, args=(spec, index, jobs, budget, events), name=f"gemmgen-GPU{index}")
               for index in devices]
    interrupts = 0

    def on_interrupt(*_):  # the workers got the same Ctrl-C and stop after their trial
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1:
            for w in workers:
                if w.is_alive():
                    os.kill(w.pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    reports, errors = [], []
    try:
        for w in workers:
            w.start()
        while any(w.is_alive() for w in workers) or not events.empty():
            try:
                event = events.get(timeout=0.5)
            except queue.Empty:
                continue
            if event["event"] == "report":
                reports.append(event)
            elif event["event"] == "error":
                errors.append(f"{event['device']}: {event['text']}")
            else:
                progress(event)
        for w in workers:
            w.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    if errors and not reports:
        raise GemmgenError("; ".join(errors))
    crashed = [w.name for w in workers if w.exitcode not in (0, None)]
    interrupted = interrupts > 0 or any(r["interrupted"] for r in reports) or bool(crashed)
    gpu, bench = _open_bench(spec, devices[0])
    try:
        tuner = _tuner(spec, bench, gpu.info.arch, device=f"GPU{devices[0]}", seed=spec.seed, jobs=1, progress=progress)
        bench.tag = tuner.study_name
        best = _study_best(tuner)
        report = TuneReport(tuner.study_name, sum(r["trials"] for r in reports), sum(r["infeasible"] for r in reports),
                            max((r["seconds"] for r in reports), default=0.0), best, None, {}, interrupted)
        if not interrupted:
            report.retimed = tuner.retime_best()
        return report
    finally:
        bench.close()
        gpu.close()


def _study_best(tuner: Tuner) -> TrialOutcome | None:
    from optuna.trial import TrialState

    done = tuner.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not done:
        return None
    best = max(done, key=lambda t: t.value)
    config = tuner.config(best.params)
    return TrialOutcome(config, config.name, "ok", best.value)
