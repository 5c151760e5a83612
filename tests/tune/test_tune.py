"""The tuning loop without a GPU: the GPU step is replaced by a deterministic stand-in that
records into a real (temporary) results database; compiles are real where marked nvcc."""

import dataclasses
import random
import re
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import optuna
import pytest
from fakes import SHAPES, SM90, FakeBench, fake_compile, fake_tflops
from test_workload import TINY, fake_gpu  # noqa: F401 (fake_gpu is a fixture)

from gemmgen import tune
from gemmgen.build.nvcc import build_kernel
from gemmgen.cli.main import main
from gemmgen.codegen.render import render_kernel, source_hash
from gemmgen.describe.config import make_config
from gemmgen.describe.points import point_spec
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import GemmgenError
from gemmgen.store.db import ResultsDB
from gemmgen.tune.space import load_space


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


def test_infeasible_points_are_drawn_and_dropped_never_stored(url):
    """The warp space is mostly points whose warp tile is not 32 threads: the sampler drops them
    before Optuna makes trials of them; they are counted, not stored, never compiled."""
    db = ResultsDB(url)
    bench = FakeBench(db)
    report = make_tuner(url, bench, seed=3).run(10)
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert report.infeasible > 10, report.infeasible  # counted
    assert not [t for t in trials if t.state.name == "PRUNED"] and not db.results(status="infeasible")
    assert len(trials) == report.trials == 10
    for name in bench.measured:  # every point measured is feasible
        assert make_config("warp", point_spec(name)[2], "fp32", SM90).name == name


def test_a_grid_prunes_and_counts_its_infeasible_points(url):
    bench = FakeBench(ResultsDB(url))
    report = make_tuner(url, bench, sampler="grid", family="register").run(4)
    trials = optuna.load_study(study_name="s", storage=url).trials
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert report.infeasible == len(pruned) and report.trials == 4
    assert all(t.user_attrs["status"] == "infeasible" and t.user_attrs["kernel"] not in bench.measured
               for t in pruned)


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


def test_a_study_begun_with_another_search_space_is_kept_apart_and_the_tune_goes_on(url):
    lines = []
    bench = FakeBench(ResultsDB(url))
    make_tuner(url, bench, seed=1).run(4)
    space = load_space("warp")
    wider = dataclasses.replace(space, params={**space.params, "BK": (4, *space.params["BK"])})
    assert wider.params["BK"] != space.params["BK"]
    t = tune.Tuner(FakeBench(ResultsDB(url)), wider, "fp32", SM90, SHAPES, study="s", storage=url, sampler="random",
                   seed=1, jobs=2, log=lines.append)
    t.compile_fn = fake_compile
    t.bench.tuner = t
    assert t.run(3).trials == 3  # Optuna alone raised "CategoricalDistribution does not support dynamic value space"
    assert any(line.startswith("study s was begun with another search space (BK: ") and "kept as study s@1" in line
               for line in lines), lines
    kept = optuna.load_study(study_name="s@1", storage=url)
    assert sum(1 for tr in kept.trials if tr.state.name == "COMPLETE") >= 4
    again = optuna.load_study(study_name="s", storage=url)
    assert all(tr.distributions["BK"].choices == wider.params["BK"] for tr in again.trials if "BK" in tr.params)
    # the same space again: the study goes on, nothing set aside
    lines.clear()
    tune.Tuner(FakeBench(ResultsDB(url)), wider, "fp32", SM90, SHAPES, study="s", storage=url, sampler="random",
               seed=2, jobs=2, log=lines.append)
    assert not any("search space" in line for line in lines)
    assert "s@2" not in optuna.get_all_study_names(url)


@pytest.mark.slow
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
    while len(points) < 2:
        try:
            points.append(make_config("register", space.sample(rng), "fp32", SM90))
        except GemmgenError:
            continue
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(tune._compile, [p.name for p in points], ["sm_90"] * 2, [120] * 2))
    assert all(r.ok and r.cubin.is_file() for r in results)
    again = build_kernel(points[0])
    assert again.cached and again.cubin.read_bytes() == results[0].cubin.read_bytes()


def slow_compile(name, arch, timeout_s):
    """fake_compile that takes 0.2 s (a thread pool's worker runs it)."""
    time.sleep(0.2)
    return fake_compile(name, arch, timeout_s)


def test_a_tuner_compiles_in_a_pool_it_is_given_and_counts_its_gpu_seconds(url):
    """A pool passed to run() (shared with other tuners: tune.node) is used and left running; the
    tuner counts the seconds its bench measured (each trial, the cuBLAS baseline, the re-timing)
    and those its measuring thread waited for a compile."""
    bench = FakeBench(ResultsDB(url), sleep_s=0.05)
    tuner = make_tuner(url, bench, seed=3)
    tuner.compile_fn = slow_compile
    with ThreadPoolExecutor(1) as pool:
        report = tuner.run(4, pool=pool)
        assert pool.submit(len, "still open").result() == 10
    assert report.trials == 4 and len(bench.measured) == 4 and report.retimed
    # 4 trials and the re-timed (each 0.05 s asleep in measure_point); cuBLAS returns at once
    slept = 0.05 * (len(bench.measured) + len(bench.retimed))
    assert slept <= tuner.measuring_s < slept + 0.5
    # one worker compiling 0.2 s a point, the GPU 0.05 s: the measuring thread waits for some of
    # each compile -- how much depends on how long asking for the next trial (rendering it) takes on
    # this machine: 0.36 s of the 0.8 on one loaded enough, where 0.4 had been the bound
    assert 0.05 <= tuner.compile_wait_s < 0.2 * 4 + 0.5


def test_devices_are_parsed_and_checked():
    from gemmgen.tune.devices import parse_devices

    assert parse_devices("0", 1) == [0] and parse_devices("0,1", 2) == [0, 1] and parse_devices(" all ", 4) == [0, 1, 2, 3]
    for text, count in (("2", 2), ("0,0", 2), ("", 2), ("x", 2), ("all", 0), ("-1", 2)):
        with pytest.raises(GemmgenError, match="--devices"):
            parse_devices(text, count)


def test_a_candidate_slower_than_the_cut_is_timed_no_further(url):
    """After a first point is measured, every later one is measured with a cut of GIVE_UP times
    the best median so far; one slower than it is stored as cut and does not move the best."""
    bench = FakeBench(ResultsDB(url))
    make_tuner(url, bench, seed=2).run(12, retime=False)
    ms = [SHAPES[0].flops / (fake_tflops(make_config("warp", point_spec(n)[2], "fp32", SM90)) * 1e9) for n in bench.measured]
    assert bench.give_ups[0] is None and all(g is not None for g in bench.give_ups[1:])
    for i, cut in enumerate(bench.give_ups[1:], 1):  # GIVE_UP x the best fully timed point measured before
        earlier = [m for m, g in zip(ms[:i], bench.give_ups[:i]) if g is None or m <= g]
        assert cut == pytest.approx(tune.loop.GIVE_UP * min(earlier))
    assert bench.give_ups[1:] == sorted(bench.give_ups[1:], reverse=True)
    assert any(m > g for m, g in zip(ms[1:], bench.give_ups[1:])), "no candidate was slower than its cut: nothing tested"


def test_the_best_are_retimed_against_cublas_at_the_end(url):
    bench = FakeBench(ResultsDB(url))
    report = make_tuner(url, bench, seed=4).run(6)
    assert 1 <= len(report.retimed) <= tune.loop.RETIME_TOP
    assert sorted(bench.retimed) == sorted(r.name for r in report.retimed)
    assert report.retimed[0].ratio is not None
    assert [r.ratio for r in report.retimed] == sorted((r.ratio for r in report.retimed), reverse=True)


def test_progress_lines_and_live_bars():
    """Off a terminal, one line per trial on the stream; on one (tqdm), a bar per device. Notes
    (the cuBLAS baseline, the first compiles) show either way."""
    import io

    from gemmgen.tune.progress import Progress

    event = {"event": "trial", "device": "GPU1", "name": "warp_x", "status": "ok", "tflops": 40.0, "stored": False,
             "full": True, "best_tflops": 41.0, "base_tflops": 50.0}
    out = io.StringIO()
    lines = Progress(10, ["GPU0", "GPU1"], stream=out, live=False)
    lines({"event": "note", "device": "GPU0", "text": "measuring cuBLAS at 64x64x64"})
    lines(event)
    lines({**event, "full": False, "tflops": 10.0})
    text = out.getvalue().splitlines()
    assert text[0] == "gemmgen tune [GPU0]: measuring cuBLAS at 64x64x64"
    assert text[1].startswith("[1/10] GPU1 warp_x: 40.00 TFLOP/s | best 41.00 TFLOP/s (82% of cuBLAS) | ")
    assert "trials/min | about" in text[1] and "(timed a few runs: slower than the best)" in text[2]
    out = io.StringIO()
    bars = Progress(10, ["GPU0", "GPU1"], stream=out, live=True)
    bars(event)
    bars.close()
    assert "GPU1" in out.getvalue() and "1/10" in out.getvalue() and "best 41.00 TFLOP/s (82% of cuBLAS)" in out.getvalue()


def test_the_retimed_are_kept_on_the_study(url):
    report = make_tuner(url, FakeBench(ResultsDB(url)), seed=4).run(6)
    kept = optuna.load_study(study_name="s", storage=url).user_attrs[tune.loop.RETIMED_ATTR]
    assert kept == [{"kernel": r.name, "tflops": r.tflops, "ratio": r.ratio, "accurate": True} for r in report.retimed]
    assert len(kept) >= 1 and kept[0]["ratio"] > 0


class Fp8Bench(FakeBench):
    """FP8 errors: cuBLAS's 1e-3 (it promotes), a kernel's 1e-3 where it promotes and 2e-3 (over
    the 1.5x bound) where its tensor cores accumulate all of K."""

    def measure_cublas(self, precision, shape, variant=Variant()):
        return dataclasses.replace(super().measure_cublas(precision, shape, variant), rel_error=1e-3)

    def measure_point(self, label, config, shape, build=None, give_up_ms=None):
        m = super().measure_point(label, config, shape, build=build, give_up_ms=give_up_ms)
        return dataclasses.replace(m, rel_error=1e-3 if config.params["promote"] else 2e-3)


def test_an_fp8_point_over_the_error_bound_ranks_after_every_accurate_one(url):
    """The study maximizes speed among the points within FP8's error bound (gemmgen.selection.best):
    a faster point over it is told at INACCURATE_WEIGHT of its TFLOP/s, says why, does not set the
    cut, and is re-timed last."""
    bench = Fp8Bench(ResultsDB(url))
    t = tune.Tuner(bench, load_space("hopper"), "e4m3", SM90, SHAPES, study="f8", storage=url, sampler="random",
                   seed=3, jobs=2, log=lambda line: None, variant=Variant("nt", "bf16", scale="tensor"))
    t.compile_fn = fake_compile
    bench.tuner = t
    report = t.run(10)
    trials = [x for x in optuna.load_study(study_name="f8", storage=url).trials if x.state.name == "COMPLETE"]
    fast = [x for x in trials if x.params["promote"] == 0]
    promoted = [x for x in trials if x.params["promote"] > 0]
    assert fast and promoted
    fastest = max(fake_tflops(t.config(x.params)) for x in trials)
    assert fastest in [fake_tflops(t.config(x.params)) for x in fast], "no inaccurate point was fastest: nothing tested"
    assert max(x.value for x in fast) < min(x.value for x in promoted)
    assert all(x.value == pytest.approx(tune.loop.INACCURATE_WEIGHT * fake_tflops(t.config(x.params))) for x in fast)
    assert all("over the bound of 1.5x" in x.user_attrs["message"] for x in fast)
    assert report.best.accurate and report.best.config.params["promote"] > 0 and report.best.error_ratio == 1.0
    assert report.retimed[0].accurate
    assert [r.accurate for r in report.retimed] == sorted((r.accurate for r in report.retimed), reverse=True)
    cut = SHAPES[0].flops / (max(fake_tflops(t.config(x.params)) for x in promoted) * 1e9)
    assert min(g for g in bench.give_ups if g is not None) >= tune.loop.GIVE_UP * cut * (1 - 1e-9)


class SlowBaselineBench(FakeBench):
    def measure_cublas(self, precision, shape, variant=Variant()):
        time.sleep(1.0)  # a large FP8 shape's operands, encoded on the host, took longer than a workload's limit
        return super().measure_cublas(precision, shape, variant)


def test_the_time_limit_counts_from_the_baseline_so_a_slow_one_leaves_trials(url):
    bench = SlowBaselineBench(ResultsDB(url))
    report = make_tuner(url, bench).run(4, timeout_s=0.8, retime=False)
    assert report.trials >= 1 and bench.measured
    assert report.seconds < 1.0 + 0.8 + 5.0


def test_extra_first_points_come_after_the_named_points_once(url):
    extra = {**point_spec("v4")[2], "BN": 64}  # v4 with a 64-column tile: another feasible point
    name = make_config("warp", extra, "fp32", SM90).name
    for _ in range(2):  # opened twice: enqueued once
        t = tune.Tuner(FakeBench(ResultsDB(url)), load_space("warp"), "fp32", SM90, SHAPES, study="s", storage=url,
                       sampler="random", seed=0, jobs=1, log=lambda line: None,
                       first=[(extra, {"seeded_from": "a kernel at 1x2x3"})])
    t.compile_fn = fake_compile
    t.run(3, retime=False)
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.user_attrs.get("named_point") or t.user_attrs.get("seeded_from") for t in trials] == \
        ["v4", "splitk", "a kernel at 1x2x3"]
    assert trials[2].user_attrs["kernel"] == name and trials[2].state.name == "COMPLETE"


@pytest.mark.slow
def test_a_tuner_with_nothing_left_to_ask_takes_over_a_dead_tuners_claim_after_the_grace_period(url):
    """A point claimed by a trial whose tuner died (its heartbeat stopped) is measured by the tuner
    waiting for it once the claim is stale, though that tuner asks nothing more: stale trials are
    failed while a claim is waited on, not only on asking (before, it waited for ever)."""
    point = {**point_spec("v4")[2], "BN": 64}
    name = make_config("warp", point, "fp32", SM90).name
    dead = tune.Tuner(FakeBench(ResultsDB(url)), load_space("warp"), "fp32", SM90, SHAPES, study="s", storage=url,
                      sampler="random", seed=0, log=lambda line: None, heartbeat_interval_s=1, grace_period_s=2)
    dead.study.enqueue_trial(point)
    trial = dead.study.ask()
    while dead._params(trial) != {k: point[k] for k in dead.space.params}:  # the named points come first
        trial = dead.study.ask()
    dead.storage.record_heartbeat(trial._trial_id)  # then it dies: no more heartbeats, never told
    config = dead.config(point)
    assert dead.bench.db.claim(**dead._claim_key(config, source_hash(render_kernel(config))),
                               owner=trial._trial_id) == trial._trial_id
    bench = FakeBench(ResultsDB(url))
    waiter = tune.Tuner(bench, load_space("warp"), "fp32", SM90, SHAPES, study="s", storage=url, sampler="random",
                        seed=1, log=lambda line: None, heartbeat_interval_s=1, grace_period_s=2)
    waiter.compile_fn = fake_compile
    waiter.study.enqueue_trial(point)  # its one trial draws the dead tuner's point
    reports = []
    runner = threading.Thread(target=lambda: reports.append(waiter.run(1, retime=False)), daemon=True)
    start = time.monotonic()
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive(), "the tuner waits for a dead tuner's claim"
    assert 2 <= time.monotonic() - start < 30  # after the grace period
    assert reports[0].trials == 1 and bench.measured == [name]
    states = {t.number: t.state.name for t in optuna.load_study(study_name="s", storage=url).trials}
    assert states[trial.number] == "FAIL"


# ---- problem variants ----

NT_GELU = Variant("nt", "bf16", "col", "gelu")


def test_a_variants_study_is_named_after_it():
    shapes = [Shape(4096, 4096, 4096)]
    assert tune.study_name("hopper", "bf16", "sm_90", shapes, NT_GELU) == \
        "hopper-bf16_nt_obf16_bcol_gelu-sm_90-4096x4096x4096"
    assert tune.study_name("hopper", "bf16", "sm_90", shapes, Variant()) == \
        tune.study_name("hopper", "bf16", "sm_90", shapes) == "hopper-bf16-sm_90-4096x4096x4096"  # as before


def test_every_trial_of_a_variant_computes_it_and_is_judged_against_its_cublas(url):
    """Every kernel compiled, measured and re-timed computes the variant (the compile worker is
    asked for it too: FakeBench checks the build's name), cuBLAS is measured in it, and the study
    is the variant's own: the default variant's tune at the same shape is another study."""
    db = ResultsDB(url)
    bench = FakeBench(db)
    t = tune.Tuner(bench, load_space("hopper"), "bf16", SM90, SHAPES, storage=url, sampler="random", seed=0, jobs=2,
                   log=lambda line: None, variant=NT_GELU)
    t.compile_fn = fake_compile
    report = t.run(6)
    assert t.study_name == "hopper-bf16_nt_obf16_bcol_gelu-sm_90-256x256x256" == report.study
    assert bench.baselines == [("bf16", SHAPES[0], NT_GELU)]
    assert len(bench.measured) == 6 and bench.retimed
    assert all(point_spec(name)[2]["bias"] == "col" and name.endswith("_bf16_nt_obf16_bcol_gelu")
               for name in bench.measured + bench.retimed)
    trials = optuna.load_study(study_name=t.study_name, storage=url).trials
    assert [t_.state.name for t_ in trials] == ["COMPLETE"] * 6
    assert trials[0].user_attrs.get("named_point") == "hopper_bf16"  # the named point computes the variant too
    assert {r.kernel for r in db.results()} == set(bench.measured) | set(bench.retimed)
    assert all(r.variant == NT_GELU for r in db.results())
    assert report.retimed[0].config.variant == NT_GELU
    plain = tune.Tuner(FakeBench(db), load_space("hopper"), "bf16", SM90, SHAPES, storage=url, sampler="random",
                       seed=0, jobs=1, log=lambda line: None)
    plain.compile_fn = fake_compile
    plain.run(2, retime=False)
    assert plain.study_name == "hopper-bf16-sm_90-256x256x256"
    assert len(optuna.load_study(study_name=t.study_name, storage=url).trials) == 6
    assert [r.variant for r in db.results(variant=Variant())] == [Variant()] * 2


@pytest.mark.parametrize("family, precision, variant, message", [
    ("register", "fp32", Variant(bias="col"), "family register computes bias=none only, not bias=col; see gemmgen list"),
    ("hopper", "tf32", Variant("nt"), "no point of the hopper search space computes nt fp32 none none in tf32 on "
                                      "sm_90 (2000 drawn): tf32 computes trans=nn into fp32 C only so far"),
])
def test_a_variant_the_space_cannot_compute_is_refused_before_any_trial(url, family, precision, variant, message):
    with pytest.raises(GemmgenError, match=re.escape(message)):
        tune.Tuner(FakeBench(ResultsDB(url)), load_space(family), precision, SM90, SHAPES, storage=url,
                   variant=variant, log=lambda line: None)
    assert optuna.get_all_study_summaries(url) == []


def test_gemmgen_tune_with_variant_options(tmp_path, capsys, fake_gpu):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    argv = ["tune", "--family", "hopper", "--precision", "bf16", "--shape", "256", "--trans", "nt", "--out", "bf16",
            "--bias", "col", "--act", "gelu", "--gpu", "sm_90", "--trials", "3", "--sampler", "random", "--seed", "1",
            "--jobs", "2", "--db", url]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    study = "hopper-bf16_nt_obf16_bcol_gelu-sm_90-256x256x256"
    assert "gemmgen tune: hopper bf16_nt_obf16_bcol_gelu at 256x256x256 on GPU0" in err
    assert out.startswith(f"study {study}: 3 trials")
    assert "emit: gemmgen emit best --family hopper --precision bf16 --shape 256x256x256 --trans nt --out bf16 " \
           "--bias col --act gelu --gpu sm_90" in out
    [bench] = fake_gpu.made
    assert bench.baselines == [("bf16", Shape(256, 256, 256), NT_GELU)]
    assert all(name.endswith("_nt_obf16_bcol_gelu") for name in bench.measured)
    # emit best finds the variant's winner (FakeBench stores no cuBLAS rows: ranked by TFLOP/s)
    winner = max(ResultsDB(url).results(variant=NT_GELU, status="ok"), key=lambda r: r.tflops).kernel
    assert main(["best", "--precision", "bf16", "--shape", "256", "--gpu", "sm_90", "--trans", "nt", "--out", "bf16",
                 "--bias", "col", "--act", "gelu", "--db", url]) == 0
    assert capsys.readouterr().out.startswith(f"{winner}, no cuBLAS stored next to it")
    assert main(["best", "--precision", "bf16", "--shape", "256", "--gpu", "sm_90", "--db", url]) == 2
    assert "no verified bf16 kernel at 256x256x256" in capsys.readouterr().err  # the default variant: none stored
    assert main(["emit", "best", "--precision", "bf16", "--shape", "256", "--gpu", "sm_90", "--trans", "nt", "--out",
                 "bf16", "--bias", "col", "--act", "gelu", "--db", url]) == 0
    captured = capsys.readouterr()
    assert f"{winner}(" in captured.out
    assert captured.err.startswith(f"gemmgen: best bf16_nt_obf16_bcol_gelu kernel at 256x256x256 for sm_90: {winner}")


def test_gemmgen_tune_workload_with_variant_options(tmp_path, capsys, fake_gpu):
    path, url = tmp_path / "w.toml", f"sqlite:///{tmp_path / 'tune.db'}"
    path.write_text(TINY)
    argv = ["tune", "--workload", str(path), "--gpu", "sm_90", "--trials", "2", "--sampler", "random", "--seed", "1",
            "--jobs", "2", "--db", url, "--trans", "nt", "--out", "bf16"]
    assert main(argv) == 0
    _, err = capsys.readouterr()
    assert "in bf16_nt_obf16 (hopper)" in err  # the default family of bf16 on sm_90 computes nt into bf16
    names = {s.study_name for s in optuna.get_all_study_summaries(url)}
    assert names == {f"hopper-bf16_nt_obf16-sm_90-{s}" for s in ("64x256x256", "128x256x256", "64x512x256")}
    assert all(name.endswith("_bf16_nt_obf16") for bench in fake_gpu.made for name in bench.measured)
    assert "[2/3] hopper bf16_nt_obf16 128x256x256 (a): 2 trials; first 1 winners at other shapes: " in err


@pytest.mark.parametrize("extra, message", [
    (["--family", "register", "--bias", "col"], "family register computes bias=none only, not bias=col"),
    (["--family", "hopper", "--precision", "tf32", "--trans", "nt"], "no point of the hopper search space computes "
                                                                     "nt fp32 none none in tf32 on sm_90"),
])
def test_gemmgen_tune_refuses_a_variant_it_cannot_tune_in_one_message(tmp_path, capsys, extra, message):
    assert main(["tune", "--shape", "64", "--gpu", "sm_90", "--db", str(tmp_path / "t.db"), *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"gemmgen: error: {message}") and err.count("gemmgen: error:") == 1
    assert not (tmp_path / "t.db").exists()


def test_a_batched_tune_measures_stores_and_reuses_at_its_batch_count_only(tmp_path, capsys, fake_gpu):
    """--batch N: every trial's kernel is batched, cuBLAS's baseline too, the study is named for
    the count, every row says the count, and a tune at another count neither reuses those rows
    nor shares the study; `results --batch N` shows one count."""
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    argv = ["tune", "--family", "mma", "--precision", "fp16", "--shape", "256", "--gpu", "sm_90", "--trials", "3",
            "--sampler", "random", "--seed", "1", "--jobs", "2", "--db", url]
    assert main([*argv, "--batch", "8"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("study mma-fp16_batched-sm_90-256x256x256-batch8: 3 trials")
    [bench] = fake_gpu.made
    batched = Variant(batch="strided")
    assert bench.baselines == [("fp16", Shape(256, 256, 256), batched)]
    assert bench.measured and all(name.endswith("_fp16_batched") for name in bench.measured)
    rows = ResultsDB(url).results()
    assert rows and {r.batch_count for r in rows} == {8} and {r.variant for r in rows} == {batched}
    assert main([*argv, "--batch", "4"]) == 0
    capsys.readouterr()
    again = fake_gpu.made[1]
    assert set(again.measured) >= set(bench.measured)  # the same points drawn: measured again at 4, none reused
    names = {s.study_name for s in optuna.get_all_study_summaries(url)}
    assert names == {"mma-fp16_batched-sm_90-256x256x256-batch8", "mma-fp16_batched-sm_90-256x256x256-batch4"}
    db = ResultsDB(url)
    assert {r.batch_count for r in db.results(batch_count=4)} == {4}
    assert len(db.results(batch_count=8)) == len(rows) and db.results(batch_count=1) == []
    assert main(["results", "--batch", "8", "--db", url, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "batch_count" in lines[0].split(",") and len(lines) == 1 + len(rows)
