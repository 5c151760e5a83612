"""`gemmgen tune --workload FILE --devices 0,1,...`: a workload tuned on several GPUs of this
machine at once, each GPU kept busy across shapes (tune.schedule decides who tunes what, when).

- One worker process per GPU for the whole run (spawned: it makes its CUDA context once). It runs
  one tuner at a time (tune.loop.Tuner, in its main thread), on the study of a shape it leads or
  joins, then, where it finished a shape, that shape's re-timing.
- One compile pool for every GPU, in this process: --jobs worker processes (default: one per CPU
  core). Tuners send it their compiles and get the builds back; a point several GPUs ask for at
  once is compiled once. Each tuner keeps at most 2 x ceil(jobs / GPUs) points on their way.
- Each shape's count of trials still to take is one slot of shared memory: the tuners of a shape
  on several GPUs take from one count (tune.loop.Budget), and the results database's claims keep
  two of them from measuring one point.
- A shape is seeded (tune.workload.seeds) here when it is led, from what the studies hold then: a
  finished neighbour's winner, a running neighbour's best trial so far.
- The workers and the compile pool leave the terminal's process group, so that Ctrl-C reaches this
  process alone, which passes it on once: every tuner stops after its current trial, shapes whose
  trials are all done are still re-timed; a second Ctrl-C ends the workers at once. Everything
  measured is stored either way: a trial a dead worker held goes stale and is measured again by
  the next run (tune.storage), which finds its stored result if there is one.
- A worker that fails (its GPU cannot be opened, it raises, it dies) is reported; its shape goes to
  another GPU (tune.schedule). The run fails, with every GPU's message, only where all have failed.
"""

import itertools
import math
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace

from gemmgen.describe.arch import Arch
from gemmgen.describe.workload import Workload, WorkloadEntry
from gemmgen.errors import GemmgenError
from gemmgen.tune import loop
from gemmgen.tune.devices import TuneSpec, open_gpu
from gemmgen.tune.schedule import Backend, Event, Job, Schedule, Step, Usage, drive
from gemmgen.tune.space import load_space
from gemmgen.tune.workload import ShapeResult, _Studies, hand_out_order, seeds, shape_result, shape_title, tuning_order

POLL_S = 0.25  # how often the main process and the workers look whether the other is still there
STOP_WAIT_S = 60.0  # how long a released worker may take to finish before it is terminated


class Device:
    """A GPU as its worker holds it for the run: its context made once (devices.open_gpu, which
    checks --gpu), one results database connection, a Bench per tuner. The tests pass a stand-in
    with the same interface (``arch``, ``bench(spec)``, ``close()``)."""

    def __init__(self, spec: TuneSpec, index: int):
        from gemmgen.store.db import ResultsDB

        self.gpu = open_gpu(spec, index)
        self.arch = self.gpu.info.arch
        self.db = ResultsDB(spec.url)

    def bench(self, spec: TuneSpec):
        from gemmgen.measure.bench import Bench

        return Bench(self.gpu, self.db, tag=None, seed=spec.seed, batch_count=spec.batch_count)

    def close(self) -> None:
        self.db.close()
        self.gpu.close()


@dataclass
class _Shape:
    """A job's item: what to tune, and how many seeds its study got."""

    precision: str
    family: str
    entry: WorkloadEntry
    seeded: int = 0


def tune_on_devices(workload: Workload, pairs: list[tuple[str, str]], arch: Arch, base: TuneSpec,
                    devices: list[int], make_progress: Callable[[int], object],
                    log: Callable[[str], None]) -> tuple[list[ShapeResult], bool]:
    """tune.workload.tune_workload on several GPUs: its contract (one result per precision and shape,
    in its order; whether the run was interrupted; resumable the same way), each shape's result
    also saying what each GPU did there (ShapeResult.devices). ``make_progress(total)`` is called
    once, with the trials of the whole run. Raises GemmgenError where every GPU failed."""
    studies = _Studies(base.url)
    order = hand_out_order(workload, pairs)
    jobs = []
    spaces = {(p, f): load_space(f).narrowed(p, base.variant) for p, f, _ in order}
    for key, (precision, family, entry) in enumerate(order):
        name = loop.study_name(family, precision, arch.name, [entry.shape], base.variant, base.batch_count)
        done = studies.finished_in(name, spaces[precision, family])
        job = Job(key, name, base.trials - done, _Shape(precision, family, entry))
        if job.state == "skipped":
            log(f"[{key + 1}/{len(order)}] {shape_title(family, precision, base.variant, entry)}: skipped: study "
                f"{name} has {done} finished trials (--trials {base.trials})")
        jobs.append(job)
    names = [f"GPU{d}" for d in devices]
    schedule = Schedule(jobs, base.timeout_s)
    if any(job.state == "waiting" for job in jobs):
        progress = make_progress(sum(job.want for job in jobs if job.state == "waiting"))
        try:
            with _Node(workload, base, arch, dict(zip(names, devices)), jobs, studies, progress, log) as node:
                drive(schedule, node, names)
        finally:
            progress.close()
    if schedule.lost and len(schedule.lost) == len(names) and any(j.state == "waiting" for j in jobs):
        raise GemmgenError("every GPU failed: " + "; ".join(f"{d}: {schedule.lost[d]}" for d in names))
    by_key = {(j.item.precision, j.item.entry.shape): j for j in jobs}
    results = []
    for precision, family in pairs:
        for entry in tuning_order(workload):
            job = by_key[(precision, entry.shape)]
            results.append(shape_result(studies, precision, family, entry, job.study, _note(job), job.usage))
    return results, schedule.stopped


def _note(job: Job) -> str:
    """The report's "this run" for a job, by its state at the end."""
    if job.state == "done":  # by the GPUs that ended their part (a failed one's trials are in the study too)
        gpus = "+".join(d for d in dict.fromkeys(job.led_by + job.joined_by) if d in job.usage)
        return f"tuned on {gpus}" + (f", {job.item.seeded} seeded" if job.item.seeded else "")
    if job.state == "failed":
        return "failed: " + "; ".join(job.failures)
    return {"skipped": "skipped", "waiting": "not reached"}.get(job.state, "interrupted")


class _Slot:
    """One shape's count of trials still to take, in the run's shared array: what tune.loop.Budget
    needs of a multiprocessing.Value (``get_lock()``, ``value``)."""

    def __init__(self, array, index: int):
        self._array, self._index = array, index

    def get_lock(self):
        return self._array.get_lock()

    @property
    def value(self) -> int:
        return self._array[self._index]

    @value.setter
    def value(self, count: int) -> None:
        self._array[self._index] = count


def _frozen(value):
    """``value`` with every dict and list made a (sorted) tuple: a compile request's key."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _leave_terminal() -> None:
    """In a worker or compile process: a process group of its own, so that the terminal's Ctrl-C
    reaches the main process alone (and nvcc, started from here, is not killed by it)."""
    os.setpgrp()


def _compile_process() -> None:
    """A compile process's start: out of the terminal's process group, and ended when the main
    process is gone (killed: a pool's processes would otherwise wait for work for ever)."""
    _leave_terminal()
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (parent.join(), os._exit(1)), name="gemmgen-orphan", daemon=True).start()


class _Compiles:
    """The run's compile pool and the thread that serves the workers' requests (device, id, fn,
    args) from ``requests``: each is run in the pool, one run for all the requests of one (fn,
    args) on their way, and its BuildResult (or error text) is put on each asker's inbox as
    ("built", id, result, error)."""

    def __init__(self, jobs: int, context, inboxes: dict):
        self.requests = context.Queue()
        self.inboxes = inboxes
        self.compiles = self.shared = 0  # compiles run; requests answered by another's compile
        self._pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("forkserver"),
                                         initializer=_compile_process)
        self._waiting: dict = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="gemmgen-compiles", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (request := self.requests.get()) is not None:
            device, rid, fn, args = request
            key = (fn.__module__, fn.__qualname__, _frozen(args))
            with self._lock:
                if key in self._waiting:
                    self._waiting[key].append((device, rid))
                    self.shared += 1
                    continue
                self._waiting[key] = [(device, rid)]
            try:
                future = self._pool.submit(fn, *args)
            except Exception as err:  # noqa: BLE001 (a pool shut down or broken: the askers get the error)
                self._reply(key, None, f"{type(err).__name__}: {err}")
                continue
            self.compiles += 1
            future.add_done_callback(lambda f, key=key: self._done(key, f))

    def _done(self, key, future: Future) -> None:
        try:
            self._reply(key, future.result(), None)
        except BaseException as err:  # noqa: BLE001 (cancelled, or the compile process died)
            self._reply(key, None, f"{type(err).__name__}: {err}")

    def _reply(self, key, result, error: str | None) -> None:
        with self._lock:
            askers = self._waiting.pop(key, [])
        for device, rid in askers:
            self.inboxes[device].put(("built", rid, result, error))

    def close(self) -> None:
        self.requests.put(None)
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)


class _RemotePool:
    """A worker's side of the shared compile pool, an executor for tune.loop.Tuner.run: submit()
    sends the call to the main process and returns a Future that the worker's receiving thread
    completes (resolve)."""

    def __init__(self, device: str, requests):
        self._device, self._requests = device, requests
        self._futures: dict[int, Future] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        with self._lock:
            rid = next(self._ids)
            self._futures[rid] = future
        self._requests.put((self._device, rid, fn, args))
        return future

    def resolve(self, rid: int, result, error: str | None) -> None:
        with self._lock:
            future = self._futures.pop(rid, None)
        if future is None or not future.set_running_or_notify_cancel():  # cancelled by a stopping tuner
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(RuntimeError(f"compile pool: {error}"))

    def abandon(self, why: str) -> None:
        """Fail every future still waiting (the main process is gone)."""
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
        for future in futures:
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError(why))


def _why(err: BaseException) -> str:
    return str(err) if isinstance(err, GemmgenError) else f"{type(err).__name__}: {err}"


def _worker(index: int, name: str, base: TuneSpec, slots, inbox, events, requests, device_cls, compile_fn,
            jobs: int) -> None:
    """A GPU's worker process: takes orders from ``inbox`` -- ("tune", budget slot, spec, trials,
    timeout_s, sampler seed), ("retime",), ("stop",); compile results ("built", ...) go to its pool -- and
    puts on ``events``: ("progress", event), ("log", name, text), ("ended", name, Usage,
    interrupted), ("retimed", name, Usage), ("failed", name, why)."""
    _leave_terminal()
    state = {"tuner": None, "stopping": False}

    def on_interrupt(*_):  # between tuners (a running tuner has its own handler)
        state["stopping"] = True

    signal.signal(signal.SIGINT, on_interrupt)
    pool, orders = _RemotePool(name, requests), queue.Queue()

    def receive() -> None:
        parent = multiprocessing.parent_process()
        while True:
            try:
                message = inbox.get(timeout=POLL_S)
            except queue.Empty:
                if parent is not None and not parent.is_alive():  # the run's main process died
                    state["stopping"] = True
                    if state["tuner"] is not None:
                        state["tuner"].request_stop()
                    pool.abandon("the tune's main process is gone")
                    orders.put(("stop",))
                    return
                continue
            if message[0] == "built":
                pool.resolve(*message[1:])
            else:
                orders.put(message)
                if message[0] == "stop":
                    return

    try:
        device = device_cls(base, index)
    except Exception as err:  # noqa: BLE001 (a GPU that cannot be opened is a result: reported)
        events.put(("failed", name, _why(err)))
        return
    threading.Thread(target=receive, name="gemmgen-inbox", daemon=True).start()
    kept = None  # (tuner, bench) of the last tune: its shape's re-timing uses them
    try:
        while (order := orders.get())[0] != "stop":
            began = time.monotonic()
            if order[0] == "tune":
                _, slot, spec, trials, timeout_s, seed = order
                if kept is not None:
                    kept[1].close()
                    kept = None
                bench = device.bench(spec)
                tuner = loop.Tuner(bench, load_space(spec.family), spec.precision, device.arch, list(spec.shapes),
                                   storage=spec.url, sampler=spec.sampler, seed=seed, jobs=jobs,
                                   compile_timeout_s=spec.compile_timeout_s, log=lambda line: None,
                                   progress=lambda event: events.put(("progress", event)), device=name,
                                   first=list(spec.first), variant=spec.variant)
                tuner.compile_fn = compile_fn
                bench.tag = tuner.study_name
                kept = (tuner, bench)
                state["tuner"] = tuner
                if state["stopping"]:
                    tuner.request_stop()
                report = tuner.run(trials, timeout_s, budget=loop.Budget(0, shared=_Slot(slots, slot)), retime=False,
                                   pool=pool)
                state["tuner"] = None
                events.put(("ended", name, Usage(report.trials, tuner.measuring_s, tuner.compile_wait_s,
                                                 time.monotonic() - began), report.interrupted))
            elif order[0] == "retime":
                tuner = kept[0]
                before = tuner.measuring_s
                tuner.retime_best()
                events.put(("retimed", name, Usage(0, tuner.measuring_s - before, 0.0, time.monotonic() - began)))
    except Exception as err:  # noqa: BLE001 (reported: its shape goes to another GPU)
        events.put(("log", name, traceback.format_exc()))
        events.put(("failed", name, _why(err)))
    finally:
        if kept is not None:
            kept[1].close()
        device.close()


class _Node(Backend):
    """The device workers and the compile pool of one run (a context manager: they are stopped at
    its end): tune.schedule's Backend."""

    def __init__(self, workload: Workload, base: TuneSpec, arch: Arch, devices: dict[str, int], jobs: list[Job],
                 studies: _Studies, progress, log: Callable[[str], None]):
        self.workload, self.base, self.arch, self.devices, self.jobs = workload, base, arch, devices, jobs
        self.studies, self.progress, self.log = studies, progress, log
        self._interrupts = self._told = 0
        self._failed: set[str] = set()
        self._released: set[str] = set()
        self._exited: dict[str, int] = {}  # worker -> polls since it was seen exited without a word
        context = multiprocessing.get_context("spawn")  # each worker makes its own CUDA context
        self.slots = context.Array("i", max(1, len(jobs)))
        self.events = context.Queue()
        self.inboxes = {name: context.Queue() for name in devices}
        self.compiles = _Compiles(base.jobs, context, self.inboxes)
        share = max(1, math.ceil(base.jobs / len(devices)))
        # looked up now: tests substitute stand-ins (pickled by reference for the workers)
        device_cls, compile_fn = Device, loop._compile
        self.workers = {name: context.Process(target=_worker, name=f"gemmgen-{name}", args=(
            index, name, base, self.slots, self.inboxes[name], self.events, self.compiles.requests, device_cls,
            compile_fn, share)) for name, index in devices.items()}
        self._previous = signal.signal(signal.SIGINT, self._on_interrupt) if \
            threading.current_thread() is threading.main_thread() else None
        try:
            for worker in self.workers.values():
                worker.start()
        except BaseException:
            self.__exit__()
            raise
        self.log(f"{len(devices)} GPUs ({', '.join(devices)}), {base.jobs} compile workers shared among them")

    def __enter__(self) -> "_Node":
        return self

    def __exit__(self, *exc) -> None:
        for name in self.workers:
            self.release(name)
        deadline = time.monotonic() + STOP_WAIT_S
        for worker in self.workers.values():
            if worker.pid is None:  # never started
                continue
            worker.join(timeout=max(0.1, deadline - time.monotonic()))
            if worker.is_alive():
                worker.terminate()
                worker.join()
        self.compiles.close()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if self.compiles.shared:
            self.log(f"{self.compiles.compiles} compiles; {self.compiles.shared} more asks answered by a compile "
                     "another GPU had asked for")

    def _on_interrupt(self, *_) -> None:
        """Ctrl-C: the first is passed on to the workers (their tuners stop after the current
        trial), the second ends them; a third stops waiting for them."""
        self._interrupts += 1
        if self._interrupts > 2:
            raise KeyboardInterrupt
        for worker in self.workers.values():
            if worker.is_alive():
                os.kill(worker.pid, signal.SIGINT if self._interrupts == 1 else signal.SIGTERM)

    # ---- Backend ----

    def now(self) -> float:
        return time.monotonic()

    def left(self, job: Job) -> int:
        return self.slots[job.key]

    def start(self, device: str, step: Step) -> None:
        job, shape = step.job, step.job.item
        title = f"[{job.key + 1}/{len(self.jobs)}] " + shape_title(shape.family, shape.precision, self.base.variant,
                                                                  shape.entry)
        if step.kind == "retime":
            self.inboxes[device].put(("retime",))
            return
        spec = replace(self.base, family=shape.family, precision=shape.precision, shapes=(shape.entry.shape,),
                       study=None, trials=job.want, first=())
        if step.kind == "lead":
            done = self.studies.finished(job.study)
            self.slots[job.key] = max(0, self.base.trials - done)
            first = seeds(self.studies, load_space(shape.family), shape.precision, self.arch, shape.entry.shape,
                          self.workload.shapes, self.base.variant, self.base.batch_count)
            shape.seeded = len(first)
            spec = replace(spec, first=tuple(first))
            self.log(f"{title}: {self.slots[job.key]} trials on {device}"
                     + (f" (study {job.study} has {done})" if done else "")
                     + (f"; first {len(first)} winners at other shapes: "
                        + ", ".join(a["seeded_from"] for _, a in first) if first else ""))
        else:
            self.log(f"{title}: {device} joins ({self.slots[job.key]} trials left)")
        seed = None if self.base.seed is None else self.base.seed + self.devices[device]
        self.inboxes[device].put(("tune", job.key, spec, job.want, step.timeout_s, seed))

    def release(self, device: str) -> None:
        if device not in self._released:
            self._released.add(device)
            self.inboxes[device].put(("stop",))

    def wait(self) -> Event:
        while True:
            if self._interrupts > self._told:
                self._told = self._interrupts
                if self._told == 1:
                    self.log("stopping after the trials being measured (Ctrl-C again to stop at once)")
                    return Event("interrupt")
            try:
                message = self.events.get(timeout=POLL_S)
            except queue.Empty:
                gone = self._gone()
                if gone is not None:
                    return gone
                continue
            kind, name = message[0], message[1] if len(message) > 1 else None
            if kind == "progress":
                self.progress(message[1])
            elif kind == "log":
                self.log(f"{name}: {message[2].rstrip()}")
            elif name in self._failed:  # a word from a worker already reported failed
                continue
            elif kind == "ended":
                return Event("ended", name, message[2], message[3])
            elif kind == "retimed":
                return Event("retimed", name, message[2])
            elif kind == "failed":
                self._failed.add(name)
                self.log(f"{name} failed: {message[2]}")
                return Event("failed", name, message=message[2])

    def _gone(self) -> Event | None:
        """A worker that exited without a word (killed, crashed), once the queue had time to bring
        its last words: a failed Event."""
        for name, worker in self.workers.items():
            if name in self._failed or name in self._released or worker.exitcode is None:
                continue
            self._exited[name] = self._exited.get(name, 0) + 1
            if self._exited[name] > 1:
                self._failed.add(name)
                why = f"its worker process exited (code {worker.exitcode})"
                self.log(f"{name} failed: {why}")
                return Event("failed", name, message=why)
        return None
