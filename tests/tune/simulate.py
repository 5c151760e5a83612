"""A simulated machine for `gemmgen tune --workload FILE --devices ...`: GPUs, the compile pool they
share and each GPU's tuner, on a simulated clock, with timings drawn like those gemmgen measured.

What is real: the Schedule and the loop that drives it (tune.schedule), the hand-out order and the
seeding rule (tune.workload.hand_out_order, seeds, over the hopper search space). What is
modelled: tune.node's processes -- a worker per GPU, a tuner per step that asks ahead (2 x its
share of the compile workers), compiles in one shared pool (FIFO; a point already on its way is
not compiled again; one compiled before is a cache hit), measures in order on its GPU, stores each
result, claims each point before compiling it and reuses a result stored or claimed at the shape;
one count of trials per shape for all its tuners. A Llama-3-8B run takes about a second.

The timings (Timings) come from what was measured, each field saying where from.
"""

import heapq
import itertools
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.problem import Variant
from gemmgen.tune.loop import MAX_ASKS_PER_TRIAL, study_name
from gemmgen.tune.schedule import Backend, Event, Job, Schedule, Usage, device_usage, drive
from gemmgen.tune.space import load_space
from gemmgen.tune.workload import _Winner, hand_out_order, seeds

ARCH = parse_arch("sm_90")


@dataclass(frozen=True)
class Timings:
    """Seconds (and the shares that decide them) of the simulated machine: an H100 node with 16 CPU
    cores per GPU. Where from: results/h100.db's workload tunes (hopper fp16 and bf16, 2026-11-23,
    one H100), nvcc 13.0 and a Tuner with a fake GPU on the development machine (AMD EPYC)."""

    # a device worker's start: spawn, imports, its CUDA context (assumed; the real one is reported)
    worker_start_s: float = 4.0
    # the main process seeds a shape it hands out (tune.workload.seeds reads the neighbours' studies)
    lead_s: float = 0.2
    # a tuner's start at a shape: its study and sampler (CPU), then its operands, their float64
    # references and the cuBLAS baseline (GPU). Fitted to the gaps between one shape's last
    # measurement and the next one's first: 0.3 s + 9e-9 s per element of A, B and C (0.5 s at
    # 64x6144x4096, 1.4 s at 64x28672x4096, 3.8 s at 8192x28672x4096)
    tuner_start_s: float = 0.3
    operand_s_per_element: float = 9e-9
    # the tuner's main thread per trial (ask, render, claim; tell, record): 45 ms of CPU per trial
    # for a Tuner with a fake GPU (hopper fp16, TPE)
    ask_s: float = 0.03
    tell_s: float = 0.02
    # share of a shape's trials whose kernel no earlier shape had measured: 3900 of 5499 rows
    new_point: float = 0.71
    # nvcc, one hopper point: 2.8-4.0 s of CPU (user + sys); a cached one: found at once
    compile_s: float = 3.2
    compile_sigma: float = 0.3
    cached_compile_s: float = 0.05
    # a trial's measurement: ~70% are cut after 5 runs (GIVE_UP); the rows' spacing: cut 0.04-0.07 s,
    # full 0.24-0.27 s (medians), so 0.02 s + 8 kernels and 0.18 s + 20 kernels
    cut: float = 0.7
    cut_s: float = 0.02
    full_s: float = 0.18
    jitter: float = 0.3  # lognormal sigma on each measurement
    peak_flops: float = 600e12  # a kernel's time: max(flops / peak, bytes / bandwidth)
    bandwidth: float = 3e12
    # the final re-timing of a shape's best 3: the ':final' rows took 0.2 s (64x6144x4096) to 1.5 s
    # (8192x28672x4096)
    retime_s: float = 0.2
    retime_s_per_flop: float = 6.5e-13

    def kernel_s(self, shape) -> float:
        return max(shape.flops / self.peak_flops, 2 * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n)
                   / self.bandwidth)

    def setup_gpu_s(self, shape) -> float:
        return self.operand_s_per_element * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n)

    def measure_s(self, shape, rng: random.Random) -> float:
        base = self.cut_s + 8 * self.kernel_s(shape) if rng.random() < self.cut else self.full_s + 20 * self.kernel_s(shape)
        return base * rng.lognormvariate(0.0, self.jitter)

    def compile_time(self, rng: random.Random) -> float:
        return self.compile_s * rng.lognormvariate(0.0, self.compile_sigma)


def _frozen(params: dict) -> tuple:
    return tuple(sorted(params.items()))


class _Study:
    """A shape's study as the simulation keeps it."""

    def __init__(self, name: str):
        self.name = name
        self.enqueued: deque = deque()  # seeds not asked yet
        self.asked: list = []  # every trial's point, in order
        self.measured: dict = {}  # point -> its quality at this shape
        self.claims: dict = {}  # point -> the tuners waiting for its result (its claimer measures it)
        self.finished = 0


class _Studies:
    """What tune.workload.seeds reads of the studies (its _Studies), from the simulation's."""

    def __init__(self, sim: "Sim"):
        self.sim = sim

    def trials(self, name: str) -> list:
        study = self.sim.by_name.get(name)
        return [SimpleNamespace(params=dict(p), system_attrs={}) for p in (study.asked if study else [])]

    def winner(self, name: str):
        study = self.sim.by_name.get(name)
        if study is None or not study.measured:
            return None
        point = max(study.measured, key=study.measured.get)  # a finished shape's winner, a running one's best
        return _Winner(f"k{self.sim.ids[point]}", study.measured[point], None, dict(point))


class _Pool:
    """The shared compile pool: ``workers`` at once, first come first served; a point on its way is
    not compiled again, one compiled before takes cached_compile_s."""

    def __init__(self, sim: "Sim", workers: int):
        self.sim, self.free = sim, workers
        self.queue: deque = deque()
        self.compiled: set = set()
        self.on_way: dict = {}
        self.compiles = self.shared = 0

    def submit(self, point, done) -> None:
        if point in self.on_way:
            self.on_way[point].append(done)
            self.shared += 1
            return
        self.on_way[point] = [done]
        t = self.sim.timings
        self.queue.append((point, t.cached_compile_s if point in self.compiled else t.compile_time(self.sim.rng)))
        self._run()

    def _run(self) -> None:
        while self.free and self.queue:
            point, seconds = self.queue.popleft()
            self.free -= 1
            self.compiles += 1
            self.sim.after(seconds, partial(self._done, point))

    def _done(self, point) -> None:
        self.free += 1
        self.compiled.add(point)
        for done in self.on_way.pop(point):
            done()
        self._run()


class _Tuner:
    """A GPU's tuner on one shape (tune.loop.Tuner, modelled): start, cuBLAS baseline, then asks
    ahead while it has fewer than 2 x ``share`` points on their way and the shape's count allows;
    the GPU measures its compiled points in order; each trial told when its result is there."""

    def __init__(self, sim: "Sim", device: str, job: Job, share: int):
        self.sim, self.device, self.job, self.share = sim, device, job, share
        self.study, self.shape = sim.studies[job.key], job.item[2].shape
        self.pending, self.asks = 0, 0
        self.gpu_queue: deque = deque()  # [point, compiled?] in the order asked
        self.ready: deque = deque()  # points with a result, not told yet
        self.claimed: set = set()
        self.main_busy = self.gpu_busy = self.dead = self.ended = False
        self.waiting_since = None  # when the GPU began waiting for its next point's compile
        self.usage = Usage()

    def begin(self) -> None:
        self.sim.after(self.sim.timings.tuner_start_s, self._baseline)

    def _baseline(self) -> None:
        if self.dead:
            return
        seconds = self.sim.timings.setup_gpu_s(self.shape)
        self.usage.measuring_s += seconds
        self.sim.after(seconds, self._main)

    def _main(self) -> None:
        if self.dead or self.ended or self.main_busy:
            return
        t = self.sim.timings
        if (self.pending < 2 * self.share and self.asks < MAX_ASKS_PER_TRIAL * self.job.want
                and self.sim.take(self.job)):
            self.main_busy = True
            self.sim.after(t.ask_s, self._asked)
        elif self.ready:
            self.main_busy = True
            self.sim.after(t.tell_s, partial(self._told, self.ready.popleft()))
        elif self.pending == 0:
            self.ended = True
            self.sim.emit(Event("ended", self.device, self.usage, False))

    def _asked(self) -> None:
        if self.dead:
            return
        self.main_busy = False
        self.pending += 1
        self.asks += 1
        study = self.study
        point = study.enqueued.popleft() if study.enqueued else self.sim.draw()
        study.asked.append(point)
        if point in study.measured:  # stored at this shape: reused
            self.ready.append(point)
        elif point in study.claims:  # another tuner is measuring it: wait for its result
            study.claims[point].append(self)
        else:
            study.claims[point] = []
            self.claimed.add(point)
            item = [point, False]
            self.gpu_queue.append(item)
            self.sim.pool.submit(point, partial(self._compiled, item))
        self._gpu()
        self._main()

    def _compiled(self, item) -> None:
        item[1] = True
        self._gpu()

    def _gpu(self) -> None:
        if self.dead or self.gpu_busy or not self.gpu_queue:
            return
        point, compiled = self.gpu_queue[0]
        if not compiled:
            if self.waiting_since is None:
                self.waiting_since = self.sim.t
            return
        if self.waiting_since is not None:
            self.usage.compile_wait_s += self.sim.t - self.waiting_since
            self.waiting_since = None
        self.gpu_queue.popleft()
        self.gpu_busy = True
        seconds = self.sim.timings.measure_s(self.shape, self.sim.rng)
        self.sim.after(seconds, partial(self._measured, point, seconds))

    def _measured(self, point, seconds: float) -> None:
        if self.dead:
            return
        self.gpu_busy = False
        self.usage.measuring_s += seconds
        self.claimed.discard(point)
        self.sim.store(self.study, point)
        self.ready.append(point)
        self._gpu()
        self._main()

    def result_stored(self, point) -> None:
        """The point it waited for was measured by another tuner."""
        if not self.dead:
            self.ready.append(point)
            self._main()

    def _told(self, point) -> None:
        if self.dead:
            return
        self.main_busy = False
        self.pending -= 1
        self.usage.trials += 1
        self.study.finished += 1
        self._main()

    def die(self) -> None:
        """Its worker is gone: what it asked is lost; the points it claimed go to their waiters (the
        first takes the claim over and measures it: tune.loop's take-over, without the grace period)."""
        self.dead = True
        for point in self.claimed:
            waiters = [w for w in self.study.claims.pop(point, []) if not w.dead]
            if waiters:
                heir = waiters[0]
                self.study.claims[point] = waiters[1:]
                heir.claimed.add(point)
                item = [point, False]
                heir.gpu_queue.append(item)
                self.sim.pool.submit(point, partial(heir._compiled, item))


class Sim(Backend):
    """A machine of ``gpus`` (names) and ``cores`` compile workers running ``jobs`` (in hand-out
    order, each Job's item a (precision, family, entry)) for ``trials`` per shape: tune.schedule's
    Backend. ``fail``: {GPU: simulated second} at which its worker dies."""

    def __init__(self, workload, jobs: list[Job], gpus: list[str], cores: int, trials: int, seed: int = 0,
                 timings: Timings = Timings(), fail: dict | None = None):
        self.workload, self.jobs, self.gpus, self.trials, self.timings = workload, jobs, gpus, trials, timings
        self.rng = random.Random(seed)
        self.t = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self.outbox: deque = deque()
        self.pool = _Pool(self, cores)
        self.share = max(1, math.ceil(cores / len(gpus)))
        self.space = load_space("hopper").narrowed("bf16", Variant())  # as a tuner of the workload's draws
        self.studies = {job.key: _Study(job.study) for job in jobs}
        self.by_name = {s.name: s for s in self.studies.values()}
        self.budget = {job.key: 0 for job in jobs}
        self.points: list = []  # every point drawn, in order
        self.ids: dict = {}
        self.quality: dict = {}
        self.measurements: Counter = Counter()  # (point, shape) -> times measured
        self.tuners: dict = {}  # GPU -> its running _Tuner
        self.lost: set = set()
        self.parent_free = 0.0
        self._step_since: dict = {}
        self.released_at: dict = {}
        for gpu, at in (fail or {}).items():
            self.at(at, partial(self._fail, gpu))

    # ---- the clock ----

    def at(self, when: float, fn) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), fn))

    def after(self, seconds: float, fn) -> None:
        self.at(self.t + seconds, fn)

    def emit(self, event: Event) -> None:
        """A step ended: its Usage gets the seconds it had the GPU (as a device worker counts them)."""
        event.usage.busy_s = self.t - self._step_since.pop(event.device)
        self.tuners.pop(event.device, None)
        self.outbox.append(event)

    # ---- Backend ----

    def now(self) -> float:
        return self.t

    def left(self, job: Job) -> int:
        return self.budget[job.key]

    def take(self, job: Job) -> bool:
        if self.budget[job.key] <= 0:
            return False
        self.budget[job.key] -= 1
        return True

    def start(self, device: str, step) -> None:
        begin = max(self.t, self.timings.worker_start_s)
        if step.kind == "lead":  # the main process seeds shapes one at a time
            self.parent_free = begin = max(begin, self.parent_free) + self.timings.lead_s
        self._step_since[device] = begin
        self.at(begin, partial(self._begin, device, step))

    def _begin(self, device: str, step) -> None:
        if device in self.lost:
            return
        job, (precision, family, entry) = step.job, step.job.item
        study = self.studies[job.key]
        if step.kind == "retime":
            seconds = self.timings.retime_s + self.timings.retime_s_per_flop * entry.shape.flops
            self.after(seconds, lambda: device in self.lost or self.emit(Event("retimed", device, Usage(0, seconds))))
            return
        if step.kind == "lead":
            self.budget[job.key] = max(0, self.trials - study.finished)
            first = seeds(_Studies(self), self.space, precision, ARCH, entry.shape, self.workload.shapes)
            study.enqueued.extend(_frozen(params) for params, _ in first)
        tuner = self.tuners[device] = _Tuner(self, device, job, self.share)
        tuner.begin()

    def release(self, device: str) -> None:
        self.released_at[device] = self.t

    def wait(self) -> Event:
        while not self.outbox:
            if not self._heap:
                raise RuntimeError("the simulation stalled: no event is due and no step has ended")
            self.t, _, fn = heapq.heappop(self._heap)
            fn()
        return self.outbox.popleft()

    # ---- points and results ----

    def draw(self):
        """A point the sampler proposes: one drawn before (at any shape) with 1 - new_point, else new."""
        if self.points and self.rng.random() >= self.timings.new_point:
            return self.rng.choice(self.points)
        point = _frozen(self.space.sample(self.rng))
        if point not in self.ids:
            self.ids[point] = len(self.ids)
            self.quality[point] = self.rng.random()
            self.points.append(point)
        return point

    def store(self, study: _Study, point) -> None:
        """A measurement's result, recorded: the point's waiters at the shape get it."""
        self.measurements[(point, study.name)] += 1
        study.measured[point] = self.quality[point] * self.rng.lognormvariate(0.0, 0.1)
        for waiter in study.claims.pop(point, []):
            waiter.result_stored(point)

    def _fail(self, device: str) -> None:
        if device in self.lost or device in self.released_at:
            return
        self.lost.add(device)
        tuner = self.tuners.pop(device, None)
        if tuner is not None:
            tuner.die()
        self._step_since.pop(device, None)
        self.outbox.append(Event("failed", device, message="simulated failure"))


@dataclass
class Outcome:
    """A simulated run: its wall time, per GPU its Usage (tune.schedule), and its jobs."""

    wall_s: float
    usage: dict
    jobs: list
    sim: Sim = field(repr=False)

    def measuring_share(self, gpu: str) -> float:
        return self.usage.get(gpu, Usage()).measuring_s / self.wall_s

    def busy_share(self, gpu: str) -> float:
        """The share of the run the GPU had a shape to work on."""
        return self.usage.get(gpu, Usage()).busy_s / self.wall_s


def simulate(workload, precision: str, gpus: int, cores: int, trials: int, seed: int = 0,
             timings: Timings = Timings(), fail: dict | None = None) -> Outcome:
    """``workload`` at ``precision`` (hopper), ``trials`` per shape, on ``gpus`` GPUs with ``cores``
    compile workers, from fresh studies and an empty compile cache."""
    order = hand_out_order(workload, [(precision, "hopper")])
    jobs = [Job(key, study_name("hopper", precision, ARCH.name, [entry.shape]), trials, (p, f, entry))
            for key, (p, f, entry) in enumerate(order)]
    names = [f"GPU{i}" for i in range(gpus)]
    sim = Sim(workload, jobs, names, cores, trials, seed, timings, fail)
    schedule = Schedule(jobs)
    drive(schedule, sim, names)
    return Outcome(sim.t, device_usage(job.usage for job in jobs), jobs, sim)
