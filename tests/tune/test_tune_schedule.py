"""Who tunes which shape when, on several GPUs (tune.schedule), without GPUs: the rules one by one,
then the Llama-3-8B workload on 2, 4 and 8 simulated GPUs (tests/tune/simulate.py: the real Schedule,
drive() and seeding rule; modelled workers, compile pool and tuners on a simulated clock, with
timings drawn like those measured on the H100). Run with -s to see the simulated runs' figures."""

from functools import lru_cache
from pathlib import Path

import pytest
from simulate import simulate

from gemmgen.describe.workload import load_workload
from gemmgen.tune.schedule import Job, Schedule, Step, Usage, format_usage
from gemmgen.tune.workload import hand_out_order, tuning_order

LLAMA = Path(__file__).resolve().parents[2] / "workloads" / "llama3-8b.toml"
TRIALS = 60  # per shape: what the shipped workload tunes ran (54-106 per shape)
CORES_PER_GPU = 16  # the lent H100 and H200 machines: 16 CPU cores per GPU


def make_jobs(*wants: int) -> list[Job]:
    return [Job(key, f"study{key}", want) for key, want in enumerate(wants)]


def counts(**left):
    """A ``left`` function from job keys (j0=..., j1=...)."""
    return lambda job: left[f"j{job.key}"]


def test_free_gpus_lead_the_shapes_in_order_then_join_the_one_with_most_trials_left_each():
    jobs = make_jobs(20, 0, 20)  # the second's study has its trials: skipped
    s = Schedule(jobs, join_min=4)
    assert jobs[1].state == "skipped"
    assert s.next("A", 0.0, counts()) == Step("lead", jobs[0])
    assert s.next("B", 0.0, counts()) == Step("lead", jobs[2])
    # C: j2 has 12 left for one tuner (4 each for 3 > join_min * 2 = 8); j0's 5 would leave under 4 each
    left = counts(j0=5, j2=12)
    assert s.next("C", 1.0, left) == Step("join", jobs[2])
    assert s.next("D", 1.0, left) == Step("join", jobs[2])  # 12 left, 3 tuners: 4 each, join_min
    assert s.next("E", 1.0, left) is None  # 4 tuners would have 3 each; j0 with 2 would have 2.5
    assert jobs[2].tuners == {"B", "C", "D"} and jobs[2].led_by == ["B"] and jobs[2].joined_by == ["C", "D"]
    assert s.next("E", 1.0, counts(j0=8, j2=0)) == Step("join", jobs[0])


def test_the_last_tuner_of_a_shape_to_end_re_times_it_and_an_interrupted_shape_is_not():
    jobs = make_jobs(20, 20)
    s = Schedule(jobs, join_min=1)
    s.next("A", 0.0, counts())
    s.next("B", 0.0, counts())
    assert s.next("C", 0.0, counts(j0=20, j1=10)) == Step("join", jobs[0])
    s.ended("A", jobs[0], Usage(12, 3.0, 1.0), interrupted=False)
    assert jobs[0].state == "running"  # C still on it
    assert s.next("A", 5.0, counts(j0=0, j1=0)) is None
    s.ended("C", jobs[0], Usage(8, 2.0, 0.5), interrupted=False)
    assert jobs[0].state == "retiming"
    assert s.next("A", 6.0, counts(j0=0, j1=0)) is None  # the re-timing is C's
    assert s.next("C", 6.0, counts(j0=0, j1=0)) == Step("retime", jobs[0])
    s.retimed("C", jobs[0], Usage(0, 1.5, 0.0))
    assert jobs[0].state == "done" and jobs[0].retimed_by == "C"
    assert jobs[0].usage == {"A": Usage(12, 3.0, 1.0), "C": Usage(8, 3.5, 0.5)}
    s.ended("B", jobs[1], Usage(5, 1.0, 0.0), interrupted=True)
    assert jobs[1].state == "interrupted" and s.next("B", 7.0, counts(j0=0, j1=15)) is None


def test_after_ctrl_c_nothing_starts_but_a_finished_shape_is_still_re_timed():
    jobs = make_jobs(20, 20, 20)
    s = Schedule(jobs)
    s.next("A", 0.0, counts())
    s.stop()
    s.ended("A", jobs[0], Usage(20, 4.0, 0.0), interrupted=False)  # its trials were all done
    assert s.next("A", 1.0, counts()) == Step("retime", jobs[0])
    assert s.next("B", 1.0, counts()) is None and jobs[1].state == jobs[2].state == "waiting"  # not reached


def test_a_failed_gpus_shape_is_led_again_once_then_given_up_and_the_gpu_gets_no_more_work():
    jobs = make_jobs(20, 20)
    s = Schedule(jobs)
    s.next("A", 0.0, counts())
    s.failed("A", jobs[0], "its worker process exited (code 9)")
    assert jobs[0].state == "waiting" and s.next("A", 1.0, counts()) is None
    assert s.next("B", 1.0, counts()) == Step("lead", jobs[0])  # again, before the next shape
    assert jobs[0].led_by == ["A", "B"]
    s.failed("B", jobs[0], "CUDA error")
    assert jobs[0].state == "failed"
    assert jobs[0].failures == ["A: its worker process exited (code 9)", "B: CUDA error"]
    assert s.next("C", 2.0, counts()) == Step("lead", jobs[1])
    assert s.lost == {"A": "its worker process exited (code 9)", "B": "CUDA error"}


def test_a_shape_whose_gpu_failed_while_others_tuned_it_is_led_again_when_they_end_not_re_timed():
    jobs = make_jobs(40)
    s = Schedule(jobs, join_min=1)
    s.next("A", 0.0, counts())
    assert s.next("B", 0.0, counts(j0=30)) == Step("join", jobs[0])
    s.failed("A", jobs[0], "lost")
    assert jobs[0].state == "running"  # B goes on
    s.ended("B", jobs[0], Usage(25, 5.0, 0.0), interrupted=False)
    assert jobs[0].state == "waiting"  # the trials A took and never finished: a lead runs them
    assert s.next("B", 9.0, counts()) == Step("lead", jobs[0])
    s.ended("B", jobs[0], Usage(3, 1.0, 0.0), interrupted=False)
    assert s.next("B", 11.0, counts()) == Step("retime", jobs[0])


def test_a_shape_is_joined_only_while_its_timeout_has_not_run_out_and_for_the_time_left():
    jobs = make_jobs(50)
    s = Schedule(jobs, timeout_s=10.0, join_min=1)
    assert s.next("A", 100.0, counts()) == Step("lead", jobs[0], 10.0)
    assert s.next("B", 104.0, counts(j0=40)) == Step("join", jobs[0], 6.0)
    assert s.next("C", 110.5, counts(j0=30)) is None


def test_the_hand_out_order_takes_the_layers_in_turn_each_from_its_largest_m():
    workload = load_workload(LLAMA)
    order = hand_out_order(workload, [("bf16", "hopper")])
    assert len(order) == len(workload.entries) == 68
    assert [str(e.shape) for _, _, e in order[:5]] == ["8192x6144x4096", "8192x4096x4096", "8192x28672x4096",
                                                        "8192x4096x14336", "6144x6144x4096"]
    assert [str(e.shape) for _, _, e in order[-4:]] == ["16x6144x4096", "16x4096x4096", "16x28672x4096",
                                                         "16x4096x14336"]
    layer = [e.shape.m for _, _, e in order if e.shape.n == 6144]
    assert layer == sorted((e.shape.m for e in tuning_order(workload) if e.shape.n == 6144), reverse=True)
    # two precisions: eight groups in turn, a layer's consecutive shapes eight apart
    both = hand_out_order(workload, [("fp16", "hopper"), ("bf16", "hopper")])
    assert [(p, str(e.shape)) for p, _, e in both[:8:4]] == [("fp16", "8192x6144x4096"), ("bf16", "8192x6144x4096")]
    assert [str(e.shape) for p, _, e in both if p == "fp16"] == [str(e.shape) for _, _, e in order]


# ---- the Llama-3-8B workload on simulated GPUs ----

@lru_cache(maxsize=None)
def run(gpus: int, cores: int, fail: tuple = ()):
    return simulate(load_workload(LLAMA), "bf16", gpus, cores, TRIALS, seed=1, fail=dict(fail) or None)


def check_every_shape_tuned_once(outcome) -> None:
    """Every shape has its TRIALS trials, was re-timed once, and no point was measured twice at a
    shape, however many GPUs tuned it."""
    sim = outcome.sim
    assert {job.state for job in outcome.jobs} == {"done"}
    assert all(sim.studies[job.key].finished == TRIALS for job in outcome.jobs)
    assert all(job.retimed_by is not None for job in outcome.jobs)
    assert max(sim.measurements.values()) == 1, [k for k, n in sim.measurements.items() if n > 1][:3]


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_the_schedule_keeps_every_simulated_gpu_busy_on_llama3_8b(gpus):
    """The GPUs have a shape to work on (a tuner, or a re-timing) at least 90% of the run's wall
    time in all, start-up and the end included, and each at least 85%; N GPUs with 16 cores each
    finish at least 0.9 N times as fast as one GPU with 16 cores, so the schedule takes little
    from the GPUs' own work; every shape gets its trials once.

    What a GPU measures of its time is bounded by the compiles (about 55% of it is spent waiting
    for one, at 16 cores a GPU) and by the tuner's pipeline at each shape, not by the schedule: one
    GPU alone measures no larger share (asserted)."""
    many = run(gpus, CORES_PER_GPU * gpus)
    alone = run(1, CORES_PER_GPU)
    same_machine = run(1, CORES_PER_GPU * gpus)
    names = [f"GPU{i}" for i in range(gpus)]
    busy = [many.busy_share(g) for g in names]
    measuring = sum(many.measuring_share(g) for g in names) / gpus
    print(f"\n{gpus} GPUs, {CORES_PER_GPU * gpus} compile workers, {TRIALS} trials x {len(many.jobs)} shapes: "
          f"{many.wall_s:.0f} s, a shape to work on {sum(busy) / gpus:.1%} of the time (least {min(busy):.1%}), "
          f"measuring {measuring:.1%}; 1 GPU with {CORES_PER_GPU} cores {alone.wall_s:.0f} s (measuring "
          f"{alone.measuring_share('GPU0'):.1%}): {alone.wall_s / many.wall_s:.2f}x; 1 GPU with "
          f"{CORES_PER_GPU * gpus} cores {same_machine.wall_s:.0f} s: {same_machine.wall_s / many.wall_s:.2f}x; "
          f"{many.sim.pool.shared} compiles shared\n" + format_usage(many.usage, names, many.wall_s))
    assert sum(busy) / gpus >= 0.90 and min(busy) >= 0.85, busy
    assert alone.wall_s / (gpus * many.wall_s) >= 0.90
    assert measuring >= 0.9 * alone.measuring_share("GPU0")
    assert sum(u.trials for u in many.usage.values()) == TRIALS * len(many.jobs)
    check_every_shape_tuned_once(many)


def test_a_simulated_gpu_that_dies_leaves_its_shape_to_the_others_and_nothing_is_measured_twice():
    whole = run(4, 64)
    broken = run(4, 64, (("GPU2", 0.4 * whole.wall_s),))
    assert broken.sim.lost == {"GPU2"}
    check_every_shape_tuned_once(broken)
    # the three left take up its part: at most about 4/3 of the time, and GPU2 did a good part of its
    # share before (dying at 0.4 of the time: 0.29-0.4 of a quarter of the trials, by the space's draws)
    assert broken.wall_s <= 1.4 * whole.wall_s
    assert broken.usage["GPU2"].trials > 0.25 * TRIALS * len(broken.jobs) / 4
