"""Which GPU tunes which shape, and when, in `gemmgen tune --workload FILE --devices 0,1,...`.

Pure policy and bookkeeping: no processes, no GPU, no clock of its own. tune.node drives a
Schedule with the device workers of one machine; the tests drive the same Schedule, through the
same loop (drive), with simulated devices on a simulated clock. The rules:

- A job is one (precision, shape) of the workload: one study, one count of trials still to take
  (its budget: what the study lacks of --trials; the backend holds it, Schedule reads it).
- A GPU that is free takes, in this order:
  1. the re-timing of the shape whose last tuner it has just ended (a shape is re-timed once, by
     the GPU that finished it, right away, so that its winner is known to the shapes after it);
  2. the next shape nobody has started, in the order the jobs are given (tune.workload's
     hand_out_order); it leads it: the backend seeds its study and sets its budget;
  3. else it joins the running shape with the most trials left per tuner, provided each of its
     tuners, the new one included, would still have JOIN_MIN trials to take, and its --timeout
     has not run out. A joining tuner works on the same study and takes from the same budget;
     the results database's claims keep two tuners from measuring one point.
  4. else nothing: it waits, in case a failed GPU's shape comes back; at the end it is let go.
  So no GPU waits for another GPU's shape while any shape has work left.
- Ctrl-C (stop): no shape is started or joined any more; shapes whose tuners all ended with
  their trials done are still re-timed (seconds); the others are interrupted.
- A GPU that fails (its worker died or raised) is not given work again. Its shape goes back to be
  led anew -- at once where no other GPU is on it, else once the others have ended -- so that the
  trials it took and never finished are run (a lead sets the budget from the study again). A
  shape on which GPUs failed more than RETRIES times is given up.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

JOIN_MIN = 4  # trials left for each tuner of a shape, the joining one included, for a GPU to join it
RETRIES = 1  # times a shape whose GPU failed is handed out again


@dataclass
class Usage:
    """What GPUs did, added up per shape and per GPU: trials finished; seconds with a step (from
    its start on the GPU to its end: a shape to work on); of those, seconds measuring on the GPU
    (trials, cuBLAS baselines, re-timings) and seconds its measuring thread waited for a compile.
    The rest of a step is its tuner's own work (its start, asking, recording)."""

    trials: int = 0
    measuring_s: float = 0.0
    compile_wait_s: float = 0.0
    busy_s: float = 0.0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.trials + other.trials, self.measuring_s + other.measuring_s,
                     self.compile_wait_s + other.compile_wait_s, self.busy_s + other.busy_s)


@dataclass(eq=False)
class Job:
    """One (precision, shape) of the run. ``want``: the trials its study lacked when the run began
    (0: nothing to do, state "skipped"). ``item``: what the backend needs to tune it (tune.node: the
    workload entry, the precision and family), opaque here."""

    key: int  # its place in the hand-out order; the backend's index for its budget
    study: str
    want: int
    item: object = None
    state: str = "waiting"  # waiting, running, retiming, done, interrupted, failed, skipped
    tuners: set = field(default_factory=set)  # the GPUs tuning it now
    led_by: list = field(default_factory=list)  # the GPUs that led it (a second after a failure)
    joined_by: list = field(default_factory=list)
    retimed_by: str | None = None
    started_at: float | None = None  # when it was first led (its --timeout runs from there)
    usage: dict = field(default_factory=dict)  # GPU -> Usage at this shape
    failures: list = field(default_factory=list)  # messages of the GPUs that failed on it
    interrupted: bool = False
    rerun: bool = False  # a GPU failed on it since it was last led: lead it again once its tuners end

    def __post_init__(self):
        if self.want <= 0:
            self.state = "skipped"


@dataclass(frozen=True)
class Step:
    """What a GPU does next: "lead" (start a shape), "join" (tune a running shape too), "retime"."""

    kind: str
    job: Job
    timeout_s: float | None = None  # for a tuner: how long it may go on asking (the shape's --timeout)


@dataclass(frozen=True)
class Event:
    """What a backend reports: a step ended ("ended": a tuner, "retimed"), a GPU "failed" (its
    step with it; ``message`` says why), or "interrupt" (Ctrl-C, no device)."""

    kind: str
    device: str | None = None
    usage: Usage = field(default_factory=Usage)
    interrupted: bool = False  # a tuner stopped before its budget was used up
    message: str = ""


class Schedule:
    """The state of a run's jobs and the rules above. ``timeout_s``: each shape's --timeout (None:
    none); ``join_min``: JOIN_MIN."""

    def __init__(self, jobs: list[Job], timeout_s: float | None = None, join_min: int = JOIN_MIN):
        self.jobs, self.timeout_s, self.join_min = jobs, timeout_s, join_min
        self.stopped = False
        self.lost: dict[str, str] = {}  # failed GPU -> why
        self._owed: dict[str, Job] = {}  # GPU -> the shape it must re-time next

    def next(self, device: str, now: float, left: Callable[[Job], int]) -> Step | None:
        """The step ``device`` takes now (the rules above), marked started; None: nothing for it
        now. ``left(job)``: the trials of a running job's budget not taken yet."""
        if device in self.lost:
            return None
        job = self._owed.pop(device, None)
        if job is not None:
            job.retimed_by = device
            return Step("retime", job)
        if self.stopped:
            return None
        job = next((j for j in self.jobs if j.state == "waiting"), None)
        if job is not None:
            job.state = "running"
            job.tuners.add(device)
            job.led_by.append(device)
            if job.started_at is None:
                job.started_at = now
            return Step("lead", job, self._time_left(job, now))
        best, most = None, 0.0
        for j in self.jobs:
            if j.state != "running" or device in j.tuners:
                continue
            remaining = self._time_left(j, now)
            if remaining is not None and remaining <= 0:
                continue
            n = left(j)
            if n >= self.join_min * (len(j.tuners) + 1) and n / len(j.tuners) > most:
                best, most = j, n / len(j.tuners)
        if best is None:
            return None
        best.tuners.add(device)
        best.joined_by.append(device)
        return Step("join", best, self._time_left(best, now))

    def _time_left(self, job: Job, now: float) -> float | None:
        return None if self.timeout_s is None else job.started_at + self.timeout_s - now

    def ended(self, device: str, job: Job, usage: Usage, interrupted: bool) -> None:
        """``device``'s tuner on ``job`` ended (``interrupted``: it stopped before its budget was
        used). The last tuner of a shape ended with every trial done: that GPU owes its re-timing."""
        self._add(device, job, usage)
        job.tuners.discard(device)
        job.interrupted |= interrupted
        if job.tuners or job.state != "running":
            return
        if job.interrupted:
            job.state = "interrupted"
        elif job.rerun:
            self._lead_again(job)
        else:
            job.state = "retiming"
            self._owed[device] = job

    def retimed(self, device: str, job: Job, usage: Usage) -> None:
        self._add(device, job, usage)
        job.state = "done"

    def failed(self, device: str, job: Job | None, message: str) -> None:
        """``device`` failed (``job``: the shape it was on, if any): it gets no more work; the shape
        is led anew, at once or once its other tuners end (the rule above)."""
        self.lost[device] = message
        self._owed.pop(device, None)
        if job is None:
            return
        job.tuners.discard(device)
        job.failures.append(f"{device}: {message}")
        if job.state == "retiming":
            job.state = "interrupted"  # its trials are stored; a re-run with more --trials re-times it
        elif job.state == "running":
            job.rerun = True
            if not job.tuners:
                self._lead_again(job)

    def _lead_again(self, job: Job) -> None:
        """A shape a GPU failed on, its tuners all ended: led anew, unless it failed too often or
        the run is stopping."""
        job.rerun = False
        if len(job.failures) > RETRIES:
            job.state = "failed"
        elif self.stopped or job.interrupted:
            job.state = "interrupted"
        else:
            job.state = "waiting"

    def stop(self) -> None:
        """Ctrl-C: nothing is started or joined any more; shapes not started stay "waiting" (not
        reached)."""
        self.stopped = True

    def _add(self, device: str, job: Job, usage: Usage) -> None:
        job.usage[device] = job.usage.get(device, Usage()) + usage


class Backend:
    """What drive() needs of the GPUs (tune.node's device workers; the tests' simulation)."""

    def now(self) -> float:
        """Seconds on the backend's clock."""
        raise NotImplementedError

    def left(self, job: Job) -> int:
        """Trials of ``job``'s budget not taken yet."""
        raise NotImplementedError

    def start(self, device: str, step: Step) -> None:
        """Begin ``step`` on ``device`` (for "lead": seed the study, set the budget first)."""
        raise NotImplementedError

    def wait(self) -> Event:
        """Block until the next Event."""
        raise NotImplementedError

    def release(self, device: str) -> None:
        """``device`` gets no more work in this run."""
        raise NotImplementedError


def drive(schedule: Schedule, backend: Backend, devices: list[str]) -> None:
    """Runs ``schedule`` on ``devices`` until no step is left: each free GPU is given
    schedule.next() at once, each Event is booked, and every GPU is released at the end (a
    failed one when it fails). Returns when no GPU has a step, after Ctrl-C too."""
    running: dict[str, Step] = {}
    idle = list(devices)

    def hand_out(first: str | None = None) -> None:
        for device in sorted(idle, key=lambda d: d != first):  # the GPU that just ended asks first
            step = schedule.next(device, backend.now(), backend.left)
            if step is not None:
                idle.remove(device)
                running[device] = step
                backend.start(device, step)

    hand_out()
    while running:
        event = backend.wait()
        if event.kind == "interrupt":
            schedule.stop()
            continue
        step = running.pop(event.device, None)
        if event.kind == "failed":  # with its step, or while it waited for one
            schedule.failed(event.device, step.job if step else None, event.message)
            if event.device in idle:
                idle.remove(event.device)
            backend.release(event.device)
        else:
            if event.kind == "retimed":
                schedule.retimed(event.device, step.job, event.usage)
            else:
                schedule.ended(event.device, step.job, event.usage, event.interrupted)
            idle.append(event.device)
        hand_out(event.device)
    for device in idle:
        backend.release(device)


def device_usage(per_shape: Iterable[dict[str, Usage]]) -> dict[str, Usage]:
    """Per GPU, its Usage summed over the shapes' (Job.usage, ShapeResult.devices)."""
    out: dict[str, Usage] = {}
    for usages in per_shape:
        for device, usage in usages.items():
            out[device] = out.get(device, Usage()) + usage
    return out


def format_usage(usage: dict[str, Usage], devices: list[str], wall_s: float) -> str:
    """The report's lines per GPU: its trials, the seconds it measured and waited of ``wall_s``
    (the run's), and what it waited for: a compile, its tuner (start, asking, recording), or a
    shape to work on (start-up, its shapes' seeding, the end of the run: what the schedule costs)."""
    lines = [f"per GPU, of the run's {wall_s:.1f} s:"]
    for device in devices:
        u = usage.get(device, Usage())
        waited = max(0.0, wall_s - u.measuring_s)
        idle = max(0.0, wall_s - u.busy_s)
        tuner = max(0.0, waited - idle - u.compile_wait_s)
        share = 100.0 * u.measuring_s / wall_s if wall_s > 0 else 0.0
        lines.append(f"  {device}: {u.trials} trials; measured {u.measuring_s:.1f} s ({share:.1f}%), waited "
                     f"{waited:.1f} s: {u.compile_wait_s:.1f} s for a compile, {tuner:.1f} s for its tuner, "
                     f"{idle:.1f} s with no shape to work on")
    return "\n".join(lines)
