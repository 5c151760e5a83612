"""The tuning loop without a GPU: the GPU step is replaced by a deterministic stand-in that
records into a real (temporary) results database; compiles are real where marked nvcc."""

import random
from concurrent.futures import ProcessPoolExecutor

import optuna
import pytest

from gemmgen import tune
from gemmgen.arch import parse_arch
from gemmgen.build import BuildResult, build_kernel
from gemmgen.config import make_config
from gemmgen.db import ResultsDB
from gemmgen.errors import GemmgenError
from gemmgen.measure import Measured, timed_problem_id
from gemmgen.problem import Shape
from gemmgen.render import render_kernel, source_hash
from gemmgen.runtime import Timing
from gemmgen.space import load_space

SM90 = parse_arch("sm_90")
SHAPES = [Shape(256, 256, 256)]


def fake_tflops(config) -> float:
    """Deterministic 'speed': bigger tiles and double buffering are faster."""
    p, g = config.params, config.geometry
    return g.tile_m * g.tile_n / 1000.0 + p.get("buffers", 1) + p.get("BK", 0) / 100.0


def fake_compile(family, params, precision, arch, timeout_s):
    return BuildResult(True, "fake", "")


class FakeBench:
    """Stands in for gemmgen.measure.Bench: same interface, no GPU; records like the real one."""

    def __init__(self, db: ResultsDB, wrong: set[str] = frozenset()):
        self.db, self.wrong, self.measured, self.stop_after, self.tuner = db, wrong, [], None, None
        self.device_id = db.device(name="Fake GPU", arch="sm_90", sm_count=1, clock_mhz=1, memory_clock_mhz=1,
                                   driver_version="0", cuda_version="0")

    def measure_cublas(self, precision, shape):
        return Measured("cublas", f"cublas_{precision}", precision, shape, "ok", Timing(1.0, 1.0, 1.0, 1))

    def measure_point(self, label, config, shape, build=None):
        self.measured.append(config.name)
        status = "wrong_result" if config.name in self.wrong else "ok"
        ms = shape.flops / (fake_tflops(config) * 1e12) * 1e3
        m = Measured(label, config.name, config.precision, shape, status,
                     Timing(ms, ms, ms, 10) if status == "ok" else None, 1e-7)
        kernel_id = self.db.kernel(name=config.name, family=config.family.name, precision=config.precision,
                                   arch=config.arch.name, params=config.params,
                                   source_hash=source_hash(render_kernel(config)))
        self.db.record(kernel_id=kernel_id, device_id=self.device_id,
                       problem_id=timed_problem_id(self.db, shape), status=status,
                       median_ms=m.timing.median_ms if m.timing else None, tflops=m.tflops, tag="test")
        if self.stop_after and len(self.measured) == self.stop_after:
            self.tuner.request_stop()
        return m


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'tune.db'}"


def make_tuner(url, bench, study="s", sampler="random", seed=0, family="warp", precision="fp32"):
    t = tune.Tuner(bench, load_space(family), precision, SM90, SHAPES, study=study, storage=url, sampler=sampler,
                   seed=seed, jobs=2, log=lambda line: None)
    t.compile_fn = fake_compile
    bench.tuner = t
    return t


def test_study_name_and_named_points():
    assert tune.study_name("warp", "fp32", "sm_90", [Shape(4096, 4096, 4096), Shape(16, 4096, 4096)]) == \
        "warp-fp32-sm_90-4096x4096x4096_16x4096x4096"
    assert tune.named_points_in(load_space("warp"), "fp32") == ["v4", "splitk"]
    assert tune.named_points_in(load_space("wmma"), "tf32") == ["v5"]
    assert tune.named_points_in(load_space("wmma"), "fp16") == ["v6"]
    assert tune.named_points_in(load_space("wmma"), "bf16") == []


def test_unknown_sampler_and_precision(url):
    with pytest.raises(GemmgenError, match="unknown sampler"):
        tune.make_sampler("anneal", load_space("warp"), 0)
    with pytest.raises(GemmgenError, match="does not take precision"):
        make_tuner(url, FakeBench(ResultsDB(url)), precision="tf32")


def test_first_trial_is_the_named_point_and_best_is_tracked(url):
    bench = FakeBench(ResultsDB(url))
    report = make_tuner(url, bench).run(12)
    assert bench.measured[0] == "warp_128x128x8_w64x32_t8x8_b2_fp32"  # v4, enqueued first
    assert report.trials == 12 and "v4" in report.named
    ok = [t for t in optuna.load_study(study_name="s", storage=url).trials if t.state.name == "COMPLETE"]
    assert report.best.tflops == max(t.value for t in ok)
    assert report.baseline_tflops == pytest.approx(SHAPES[0].flops / 1e-3 / 1e12)


def test_infeasible_points_never_reach_the_compiler(url):
    db = ResultsDB(url)
    bench = FakeBench(db)
    report = make_tuner(url, bench, seed=3).run(30)
    trials = optuna.load_study(study_name="s", storage=url).trials
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert pruned, "the warp space holds points whose warp tile is not 32 threads"
    for t in pruned:
        assert t.user_attrs["status"] == "infeasible" and t.user_attrs["kernel"] not in bench.measured
    rows = db.results(status="infeasible")
    assert len(rows) == len(pruned) == report.infeasible
    assert all(r.message and r.status == "infeasible" for r in rows)
    assert report.trials == 30  # feasible trials; the infeasible ones are not counted


def test_wrong_results_fail_the_trial(url):
    v4 = "warp_128x128x8_w64x32_t8x8_b2_fp32"
    bench = FakeBench(ResultsDB(url), wrong={v4})
    report = make_tuner(url, bench).run(3)
    first = optuna.load_study(study_name="s", storage=url).trials[0]
    assert first.state.name == "FAIL" and first.user_attrs["status"] == "wrong_result"
    assert "v4" not in report.named and (report.best is None or report.best.name != v4)


def test_resume_continues_the_study_and_reuses_stored_results(url):
    bench = FakeBench(ResultsDB(url))
    make_tuner(url, bench, seed=1).run(6)
    measured_before = list(bench.measured)
    again = FakeBench(ResultsDB(url))
    report = make_tuner(url, again, seed=1).run(6)  # same study name: resumed
    trials = [t for t in optuna.load_study(study_name="s", storage=url).trials if t.state.name != "PRUNED"]
    assert len(trials) == 12
    assert sum(1 for t in trials if t.user_attrs.get("named_point") == "v4") == 1  # enqueued once
    # the seeded random sampler proposes the same points again: all stored, nothing re-measured
    assert report.trials == 6
    assert not set(again.measured) & set(measured_before)


def test_stop_request_ends_after_the_current_trial(url):
    bench = FakeBench(ResultsDB(url))
    bench.stop_after = 2
    report = make_tuner(url, bench, seed=5).run(50)
    assert report.interrupted and len(bench.measured) == 2
    states = [t.state.name for t in optuna.load_study(study_name="s", storage=url).trials]
    assert "RUNNING" not in states and states.count("COMPLETE") == 2


def test_grid_sampler(url):
    bench = FakeBench(ResultsDB(url))
    report = make_tuner(url, bench, sampler="grid", family="shared").run(9)
    assert report.trials == 9 and report.best.config.params["TILE"] == 32


@pytest.mark.nvcc
def test_parallel_compile_pool_builds_real_cubins(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "cache"))
    space, rng, points = load_space("register"), random.Random(7), []
    while len(points) < 4:
        params = space.sample(rng)
        try:
            make_config("register", params, "fp32", SM90)
            points.append(params)
        except GemmgenError:
            continue
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(tune._compile, ["register"] * 4, points, ["fp32"] * 4, ["sm_90"] * 4, [120] * 4))
    assert all(r.ok and r.cubin.is_file() for r in results)
    again = build_kernel(make_config("register", points[0], "fp32", SM90))
    assert again.cached and again.cubin.read_bytes() == results[0].cubin.read_bytes()
