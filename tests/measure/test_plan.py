"""What `gemmgen bench` measures and in which order (gemmgen.measure.plan), and the ratio each row
gets, without a GPU: the plans of named points and of cuBLAS alone, a point the GPU cannot run,
and run_plan on a stand-in bench."""

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.points import point_spec
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import InvalidPoint
from gemmgen.measure.outcome import Measured
from gemmgen.measure.plan import Job, build_plan, point_plan, run_plan
from gemmgen.measure.timing import Timing

SM80, SM90 = parse_arch("sm_80"), parse_arch("sm_90")
BIG, SMALL = Shape(4096, 4096, 4096), Shape(128, 4096, 4096)
NT = Variant(trans="nt")


def steps(plan: list[Job]) -> list[tuple]:
    return [(str(j.shape), j.precision, j.label, j.config.name if j.config else None, j.variant.text) for j in plan]


def test_each_shape_and_precision_starts_with_cublas_then_its_points():
    plan, skipped = point_plan({"v4": point_spec("v4"), "hopper_fp16": point_spec("hopper_fp16")}, [BIG, SMALL], SM90)
    v4, hopper = point_spec("v4"), point_spec("hopper_fp16")
    assert skipped == {}
    names = {"v4": plan[1].config.name, "hopper_fp16": plan[3].config.name}
    assert names["v4"].startswith(v4[0]) and names["hopper_fp16"].startswith(hopper[0])
    default = Variant().text
    assert steps(plan) == [
        ("4096x4096x4096", "fp32", "cublas", None, default), ("4096x4096x4096", "fp32", "v4", names["v4"], default),
        ("4096x4096x4096", "fp16", "cublas", None, default),
        ("4096x4096x4096", "fp16", "hopper_fp16", names["hopper_fp16"], default),
        ("128x4096x4096", "fp32", "cublas", None, default), ("128x4096x4096", "fp32", "v4", names["v4"], default),
        ("128x4096x4096", "fp16", "cublas", None, default),
        ("128x4096x4096", "fp16", "hopper_fp16", names["hopper_fp16"], default),
    ]


def test_cublas_named_alone_is_measured_in_every_precision_in_the_variant_asked():
    plan, skipped = point_plan({}, [BIG], SM90, NT)
    assert skipped == {}
    assert steps(plan) == [("4096x4096x4096", p, "cublas", None, NT.text)
                           for p in ("fp32", "tf32", "fp16", "bf16", "e4m3", "e4m3e5m2", "e5m2e4m3")]
    # FP8's inputs K-major only: not in the default variant (B stored K x N)
    assert [step[1] for step in steps(point_plan({}, [BIG], SM90)[0])] == ["fp32", "tf32", "fp16", "bf16"]


def test_a_point_the_gpu_cannot_run_is_left_out_and_said_but_cublas_still_runs_in_its_precision():
    plan, skipped = point_plan({"hopper_fp16": point_spec("hopper_fp16")}, [BIG], SM80)
    assert list(skipped) == ["hopper_fp16"] and isinstance(skipped["hopper_fp16"], InvalidPoint)
    assert steps(plan) == [("4096x4096x4096", "fp16", "cublas", None, Variant().text)]


class StandIn:
    """Bench's two calls: cuBLAS at 2 ms; points at 4 ms, with cuBLAS timed next to them at 1 ms
    where ``interleaved``."""

    def __init__(self, interleaved: bool):
        self.interleaved = interleaved

    def measure_cublas(self, precision, shape, variant):
        return Measured("cublas", f"cublas_{precision}", precision, shape, "ok", Timing(2.0, 2.0, 2.0, 10))

    def measure_point(self, label, config, shape, build=None):
        self.builds = getattr(self, "builds", []) + [build]
        return Measured(label, config.name, config.precision, shape, "ok", Timing(4.0, 4.0, 4.0, 10),
                        baseline=Timing(1.0, 1.0, 1.0, 10) if self.interleaved else None)


def test_a_points_ratio_is_to_cublas_timed_with_it_else_to_its_cublas_row():
    plan, _ = point_plan({"v4": point_spec("v4")}, [BIG], SM90)
    started = []
    ratios = [r for _, _, r in run_plan(StandIn(True), plan, lambda i, job: started.append((i, job.label)))]
    assert started == [(1, "cublas"), (2, "v4")]
    assert ratios == [1.0, 0.25]  # cuBLAS's own row: to itself; the point: 1 ms / 4 ms
    assert [r for _, _, r in run_plan(StandIn(False), plan)] == [1.0, 0.5]  # 2 ms / 4 ms, by TFLOP/s


def test_the_suite_plan_leads_each_entry_with_cublas_in_the_default_variant(tmp_path):
    from gemmgen.selection.suite import SUITE_SHAPES, suite_jobs, suite_plan
    from gemmgen.store.db import ResultsDB

    db = ResultsDB(f"sqlite:///{tmp_path / 'suite.db'}")  # nothing stored: the named points
    plan = suite_plan(db, SM90, ["fp32", "bf16"])
    entries = suite_jobs(db, SM90, ["fp32", "bf16"])
    assert len(plan) == 2 * len(entries) == 2 * 2 * len(SUITE_SHAPES)
    assert [(j.shape, j.precision) for j in plan[0::2]] == [(s, p) for s, p, _, _ in entries]
    assert all(j.label == "cublas" and j.config is None for j in plan[0::2])
    assert [(j.shape, j.precision, j.label, j.config) for j in plan[1::2]] == entries
    assert {j.variant for j in plan} == {Variant()}


def test_the_plans_kernels_are_built_at_once_each_once_and_a_failure_is_left_to_the_measurement(monkeypatch):
    """build_plan compiles each distinct kernel once, several at a time; run_plan hands each point
    its build; a build that raises is left out, so measuring it records the failure as before."""
    from gemmgen.build import nvcc
    import threading
    import time

    from gemmgen.errors import GemmgenError
    plan, _ = point_plan({"v4": point_spec("v4"), "v5": point_spec("v5"), "hopper_fp16": point_spec("hopper_fp16")},
                         [BIG, Shape(100, 200, 300)], SM90)
    running, most, calls = [0], [0], []
    lock = threading.Lock()

    def build(config):
        with lock:
            calls.append(config.name)
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        if config.family.name == "hopper":
            raise GemmgenError("nvcc was not found")
        return nvcc.BuildResult(True, config.name, f"built {config.name}")

    monkeypatch.setattr(nvcc, "build_kernel", build)
    builds = build_plan(plan, jobs=3)
    names = {job.config.name for job in plan if job.config}
    assert sorted(calls) == sorted(names) and len(names) == 3  # once each, not once per shape
    assert most[0] > 1
    assert {n: b.log for n, b in builds.items()} == {n: f"built {n}" for n in names if not n.startswith("hopper")}
    bench = StandIn(True)
    list(run_plan(bench, plan, builds=builds))
    points = [job for job in plan if job.config]
    assert bench.builds == [builds.get(job.config.name) for job in points] and None in bench.builds
