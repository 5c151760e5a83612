"""Workloads: the file format (gemmgen.describe.workload) and `gemmgen tune --workload` without a GPU -- the
GPU step is the deterministic stand-in of fakes.py, recording into a real results database, with
the Optuna studies on SQLite in tmp_path."""

import math
import os
import random
import shutil
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from fakes import SM90, FakeBench, fake_compile

import gemmgen.measure.device
import gemmgen.tune.devices
import gemmgen.tune.loop
import gemmgen.tune.space as space_module
from gemmgen.cli.main import main
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape, Variant
from gemmgen.describe.workload import InvalidWorkload, load_workload
from gemmgen.errors import InvalidParameter, InvalidPoint
from gemmgen.paths import search_spaces_dir
from gemmgen.store.db import ResultsDB
from gemmgen.tune.space import load_space
from gemmgen.tune.workload import default_family, plan, tuning_order

REPO = Path(__file__).resolve().parents[2]

GOOD = """
name = "tiny"
description = "two layers"
precisions = ["fp16", "bf16"]

[[shape]]
label = "up"
m = [16, 128]
n = 512
k = 256
weight = 2

[[shape]]
m = 64
n = [256, 512]
k = [128, 256]
"""


def write(tmp_path, text: str, name: str = "w.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_expands_its_lists_in_order_with_weights_and_labels(tmp_path):
    w = load_workload(write(tmp_path, GOOD))
    assert (w.name, w.description, w.precisions) == ("tiny", "two layers", ("fp16", "bf16"))
    assert [(str(e.shape), e.weight, e.label) for e in w.entries] == [
        ("16x512x256", 2.0, "up"), ("128x512x256", 2.0, "up"),
        ("64x256x128", 1.0, ""), ("64x256x256", 1.0, ""), ("64x512x128", 1.0, ""), ("64x512x256", 1.0, "")]
    assert w.shapes == [e.shape for e in w.entries] and w.entry(Shape(64, 256, 128)).weight == 1.0


def test_name_defaults_to_the_file_stem_and_description_to_nothing(tmp_path):
    w = load_workload(write(tmp_path, 'precisions = ["fp32"]\n[[shape]]\nm = 1\nn = 2\nk = 3\n', "my-model.toml"))
    assert (w.name, w.description, w.shapes) == ("my-model", "", [Shape(1, 2, 3)])


def test_a_shape_given_twice_is_one_entry_with_the_weights_summed(tmp_path):
    w = load_workload(write(tmp_path, 'precisions = ["fp16"]\n'
                                      '[[shape]]\nlabel = "q_proj"\nm = [16, 32]\nn = 4096\nk = 4096\n'
                                      '[[shape]]\nlabel = "o_proj"\nm = 16\nn = 4096\nk = 4096\nweight = 0.5\n'))
    assert [(str(e.shape), e.weight, e.label) for e in w.entries] == [
        ("16x4096x4096", 1.5, "q_proj+o_proj"), ("32x4096x4096", 1.0, "q_proj")]


def test_weighted_mean_is_the_weighted_geometric_mean_over_the_shapes_that_have_a_value(tmp_path):
    w = load_workload(write(tmp_path, GOOD))
    a, b, c = w.shapes[0], w.shapes[1], w.shapes[2]
    # weights 2, 2 and 1; the other shapes have no value
    assert w.weighted_mean({a: 0.5, b: 2.0, c: 0.8, w.shapes[3]: None}) == pytest.approx(
        math.exp((2 * math.log(0.5) + 2 * math.log(2.0) + math.log(0.8)) / 5))
    assert w.weighted_mean({}) is None


@pytest.mark.parametrize("text, message", [
    ('precisions = ["fp16"]\n[[shape]\n', "not valid TOML: "),
    ('precisons = ["fp16"]\n', "unknown key 'precisons'; allowed: name, description, precisions, trans, out, "
                               "bias, act, batch, scale, shape (shapes go in [[shape]] tables)"),
    ('[[shape]]\nm = 1\nn = 1\nk = 1\n', 'precisions is missing; list the ones to tune, e.g. precisions = '
                                         '["fp16", "bf16"] (allowed: fp32, tf32, fp16, bf16, e4m3, e4m3e5m2, '
                                         'e5m2e4m3)'),
    ('precisions = "fp16"\n', "precisions must be a non-empty list of names, e.g. [\"fp16\", \"bf16\"]; "
                              "got 'fp16'"),
    ('precisions = ["fp8"]\n', "unknown precision 'fp8'; allowed: fp32, tf32, fp16, bf16, e4m3, e4m3e5m2, e5m2e4m3"),
    ('precisions = ["fp16", "fp16"]\n', "precisions lists fp16 twice"),
    ('name = 3\nprecisions = ["fp16"]\n', "name must be a string, not 3"),
    ('precisions = ["fp16"]\n', "no shapes; add [[shape]] tables, each with m, n and k"),
    ('precisions = ["fp16"]\nshape = []\n', "no shapes; add [[shape]] tables, each with m, n and k"),
    ('precisions = ["fp16"]\nshape = 4096\n', "shape must be [[shape]] tables, each with m, n and k"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1\nn = 1\nk = 1\n[[shape]]\nlabel = "o"\nm = 1\nn = 1\nk = 1\nM = 2\n',
     "[[shape]] #2 (o): unknown key 'M'; allowed: m, n, k, label, weight"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1\n', "[[shape]] #1: n and k missing; give m, n and k, each a number "
                                                  "or a list of numbers"),
    ('precisions = ["fp16"]\n[[shape]]\nlabel = "qkv"\nm = [16, 0]\nn = 1\nk = 1\n',
     "[[shape]] #1 (qkv): m = 0: M, N and K must be whole numbers from 1 to 2147483647 (2^31 - 1)"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1\nn = -4\nk = 1\n', "n = -4: M, N and K must be whole numbers"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1\nn = 1\nk = 2147483648\n', "k = 2147483648: M, N and K must be"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1.5\nn = 1\nk = 1\n', "m = 1.5: M, N and K must be whole numbers"),
    ('precisions = ["fp16"]\n[[shape]]\nm = "16"\nn = 1\nk = 1\n', "m = '16': M, N and K must be whole numbers"),
    ('precisions = ["fp16"]\n[[shape]]\nm = []\nn = 1\nk = 1\n', "[[shape]] #1: m = []: give at least one value"),
    ('precisions = ["fp16"]\n[[shape]]\nm = [16, 16]\nn = 1\nk = 1\n', "[[shape]] #1: m lists 16 twice"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1\nn = 1\nk = 1\nweight = 0\n',
     "[[shape]] #1: weight = 0: a weight must be a number > 0"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1\nn = 1\nk = 1\nweight = inf\n', "weight = inf: a weight must be"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1\nn = 1\nk = 1\nweight = "1"\n', "weight = '1': a weight must be"),
    ('precisions = ["fp16"]\n[[shape]]\nm = 1\nn = 1\nk = 1\nlabel = 7\n', "[[shape]] #1: label must be a string"),
    ('precisions = ["bf16"]\ntrans = "tx"\n', "trans='tx' is not allowed; trans must be one of: nn, nt, tn, tt"),
    ('precisions = ["bf16"]\nout = "fp8"\n', "out='fp8' is not allowed; out (the type of C) must be one of: "
                                            "fp32, fp16, bf16"),
    ('precisions = ["bf16"]\nbias = "both"\n', "bias='both' is not allowed; bias must be one of: none, row, col"),
    ('precisions = ["bf16"]\nact = "GELU"\n', "act='GELU' is not allowed; act (the activation) must be one of: "
                                            "none, relu, gelu, silu"),
    ('precisions = ["bf16"]\nout = 16\n', 'out must be a string, e.g. out = "bf16", not 16'),
    ('precisions = ["bf16"]\nbatch = 5\n', 'batch must be a string, e.g. batch = "strided", not 5'),
    ('precisions = ["bf16"]\n[[shape]]\nm = 1\nn = 1\nk = 1\ntrans = "nt"\n',
     "[[shape]] #1: unknown key 'trans'; allowed: m, n, k, label, weight"),
])
def test_each_problem_is_one_message_naming_the_file_and_the_entry(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(InvalidWorkload) as caught:
        load_workload(path)
    assert str(caught.value).startswith(f"workload {path}: ") and message in str(caught.value)
    assert "\n" not in str(caught.value) and isinstance(caught.value, InvalidParameter)


def test_a_file_names_its_variant_and_the_command_line_adds_to_it_or_agrees(tmp_path):
    w = load_workload(write(tmp_path, 'act = "gelu"\ntrans = "nt"\nout = "bf16"\n' + GOOD))
    assert w.variant == Variant("nt", "bf16", "none", "gelu")
    assert w.variant_given == (("trans", "nt"), ("out", "bf16"), ("act", "gelu"))
    assert w.variant_with({}) == w.variant == w.variant_with({"trans": "nt", "act": "gelu"})
    assert w.variant_with({"bias": "col"}) == Variant("nt", "bf16", "col", "gelu")  # a key the file leaves out
    with pytest.raises(InvalidParameter) as caught:
        w.variant_with({"bias": "col", "out": "fp16"})
    assert str(caught.value) == f'--out fp16 disagrees with workload {w.path}, which says out = "bf16"; leave --out ' \
        "out, or change the file"
    plain = load_workload(write(tmp_path, GOOD, "plain.toml"))
    assert plain.variant == Variant() and plain.variant_given == ()
    assert plain.variant_with({"trans": "tn"}) == Variant("tn")
    # a key given at its default value is given: an option must agree with it
    explicit = load_workload(write(tmp_path, 'trans = "nn"\n' + GOOD, "nn.toml"))
    with pytest.raises(InvalidParameter, match='--trans nt disagrees with workload .*nn.toml, which says trans = "nn"'):
        explicit.variant_with({"trans": "nt"})
    # the batch mode's option is --batch-mode (--batch is a count)
    one = load_workload(write(tmp_path, 'batch = "none"\n' + GOOD, "one.toml"))
    with pytest.raises(InvalidParameter, match='^--batch-mode strided disagrees with workload .*one.toml, which says '
                                               'batch = "none"; leave --batch-mode out'):
        one.variant_with({"batch": "strided"})


def test_a_missing_file_is_one_message(tmp_path):
    with pytest.raises(InvalidWorkload, match=r"workload .*nope.toml: cannot read it: No such file or directory"):
        load_workload(tmp_path / "nope.toml")


def test_the_llama3_8b_example_is_its_four_layers_at_token_counts_16_to_8192():
    w = load_workload(REPO / "workloads" / "llama3-8b.toml")
    assert w.precisions == ("fp16", "bf16") and len(w.entries) == 68
    layers = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
              "down_proj": (4096, 14336)}
    for label, (n, k) in layers.items():
        mine = [e for e in w.entries if e.label == label]
        assert [(e.shape.m, e.shape.n, e.shape.k, e.weight) for e in mine] == \
            [(m, n, k, 1.0) for m in (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                                  6144, 8192)]


def test_the_llama3_8b_linear_example_is_the_same_layers_as_f_linear_in_bf16():
    plain, linear = (load_workload(REPO / "workloads" / name) for name in ("llama3-8b.toml", "llama3-8b-linear.toml"))
    assert linear.entries == plain.entries and linear.precisions == ("bf16",)
    assert linear.variant == Variant("nt", "bf16")


def test_tuning_order_is_per_layer_with_m_ascending(tmp_path):
    w = load_workload(write(tmp_path, 'precisions = ["fp16"]\n'
                                      '[[shape]]\nm = [4096, 16]\nn = 64\nk = 64\n'
                                      '[[shape]]\nm = [128, 1]\nn = [32, 64]\nk = 64\n'))
    assert [str(e.shape) for e in tuning_order(w)] == ["1x64x64", "16x64x64", "128x64x64", "4096x64x64",
                                                       "1x32x64", "128x32x64"]


def test_default_families_and_the_plan(tmp_path):
    sm80, sm90 = parse_arch("sm_80"), parse_arch("sm_90")
    assert [default_family(p, sm90) for p in ("fp32", "tf32", "fp16", "bf16")] == ["warp", "hopper", "hopper",
                                                                                  "hopper"]
    assert [default_family(p, sm80) for p in ("fp32", "tf32", "fp16", "bf16")] == ["warp", "mma", "mma", "mma"]
    with pytest.raises(InvalidParameter, match="no default family tunes fp16 on sm_75; choose one with --family"):
        default_family("fp16", parse_arch("sm_75"))
    w = load_workload(write(tmp_path, GOOD))
    assert plan(w, None, None, sm90) == [("fp16", "hopper"), ("bf16", "hopper")]
    assert plan(w, "bf16", "wmma", sm80) == [("bf16", "wmma")]
    with pytest.raises(InvalidParameter, match=r"--precision tf32: workload tiny \(.*w.toml\) tunes fp16, bf16"):
        plan(w, "tf32", None, sm90)
    with pytest.raises(InvalidParameter, match="--family warp does not take fp16, one of the workload's precisions "
                                               r"\(its search space takes fp32\)"):
        plan(w, None, "warp", sm90)
    with pytest.raises(InvalidParameter, match="--family hopper does not run on sm_80"):
        plan(w, None, "hopper", sm80)


def test_seeds_are_the_nearest_shapes_winners_new_to_the_study_and_in_the_space(tmp_path):
    """Others at m = 32 .. 8192 (n = k = 256), one factor 2 further from 64x256x256 each: the
    winners of the SEEDS nearest that lie in the space, less the one the study already has."""
    from optuna.distributions import CategoricalDistribution

    from gemmgen.tune.workload import SEEDS, _Studies, seeds

    space, rng, points = load_space("wmma"), random.Random(3), []
    while len(points) < 8:
        params = space.sample(rng)
        try:
            name = make_config("wmma", params, "bf16", SM90).name
        except InvalidPoint:
            continue
        if name not in [n for n, _ in points]:
            points.append((name, params))
    studies = _Studies(f"sqlite:///{tmp_path / 'studies.db'}")

    def study(m, trials, retimed=None):
        s = optuna.create_study(study_name=STUDY.format(f"{m}x256x256"), storage=studies.storage,
                                direction="maximize")
        for (name, params), value in trials:
            s.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: CategoricalDistribution(
                    list(space.params[k]) + ([v] if v not in space.params[k] else [])) for k, v in params.items()},
                value=value, user_attrs={"kernel": name, "status": "ok"}))
        if retimed:
            s.set_user_attr(gemmgen.tune.loop.RETIMED_ATTR, [{"kernel": retimed, "tflops": 1.0, "ratio": 0.9}])

    study(64, [(points[2], 5.0)])  # the shape to seed: it has points[2] already
    study(32, [(("outside", {**points[0][1], "BM": 48}), 9.0)])  # BM 48 is not in the space
    study(128, [(points[1], 10.0), (points[7], 20.0)], retimed=points[1][0])  # re-timing's first wins
    for i, m in enumerate((256, 512, 1024, 2048, 4096, 8192), 2):
        study(m, [(points[i if i < 7 else 0], 1.0)])
    others = [Shape(m, 256, 256) for m in (8192, 4096, 2048, 1024, 512, 256, 128, 64, 32)]
    got = seeds(studies, space, "bf16", SM90, Shape(64, 256, 256), others)
    assert SEEDS == 6  # 128 .. 4096: six kernels; points[2] (at 256) the study has
    assert got == [(points[i][1], {"seeded_from": f"{points[i][0]} at {m}x256x256"})
                   for i, m in ((1, 128), (3, 512), (4, 1024), (5, 2048), (6, 4096))]


# ---- `gemmgen tune --workload` with the fake GPU step ----

TINY = """
precisions = ["bf16"]
[[shape]]
label = "a"
m = [64, 128]
n = 256
k = 256
weight = 2
[[shape]]
label = "b"
m = 64
n = 512
k = 256
"""
STUDY = "wmma-bf16-sm_90-{}"  # wmma has no named point in bf16: a study's first trial is its first seed


class Bench(FakeBench):
    """FakeBench with what tune.devices asks of a bench besides; ``interrupt_at``: (shape, n): at
    the n-th trial measured at that shape, this process gets SIGINT, as from Ctrl-C, and that
    measurement ends once the tuner's handler has run (``stopped``): the fake's measurements take
    no time, and on a loaded machine the GPU thread measured the queued trials before the main
    thread ran the handler (a CI run, 2026-12-07), which a real measurement's milliseconds prevent."""

    made: list = []
    counts: dict = {}
    interrupt_at = None
    stopped = threading.Event()

    def close(self):
        pass

    def measure_point(self, label, config, shape, build=None, give_up_ms=None):
        if not self.interleave:  # a trial's measurement, not the re-timing at the end
            Bench.counts[shape] = Bench.counts.get(shape, 0) + 1
            if (shape, Bench.counts[shape]) == Bench.interrupt_at:
                os.kill(os.getpid(), signal.SIGINT)
                Bench.stopped.wait(10)
        return super().measure_point(label, config, shape, build=build, give_up_ms=give_up_ms)


@pytest.fixture
def fake_gpu(monkeypatch):
    """tune.devices opens Bench instead of the GPU; compiles are fake_compile; one device."""
    Bench.made, Bench.counts, Bench.interrupt_at, Bench.stopped = [], {}, None, threading.Event()
    request_stop = gemmgen.tune.loop.Tuner.request_stop

    def stop_and_tell(tuner, *args):
        try:
            return request_stop(tuner, *args)
        finally:
            Bench.stopped.set()

    def open_bench(spec, index):
        bench = Bench(ResultsDB(spec.url))
        bench.batch_count = spec.batch_count  # as the real Bench is made (tune.devices._open_bench)
        Bench.made.append(bench)
        return SimpleNamespace(info=SimpleNamespace(arch=SM90), close=lambda: None), bench

    monkeypatch.setattr(gemmgen.tune.devices, "_open_bench", open_bench)
    monkeypatch.setattr(gemmgen.measure.device, "device_count", lambda: 1)
    monkeypatch.setattr(gemmgen.tune.loop, "_compile", fake_compile)
    monkeypatch.setattr(gemmgen.tune.loop.Tuner, "request_stop", stop_and_tell)
    return Bench


def tune_argv(path, url, trials=4):
    return ["tune", "--workload", str(path), "--family", "wmma", "--gpu", "sm_90", "--trials", str(trials),
            "--sampler", "random", "--seed", "1", "--jobs", "2", "--db", url]


def trials_of(url, shape):
    return optuna.load_study(study_name=STUDY.format(shape), storage=url).trials


def finished(url, shape):
    return [t for t in trials_of(url, shape) if t.state.name in ("COMPLETE", "FAIL")
            and t.user_attrs.get("status") != "interrupted"]


def winner(url, shape):
    """(kernel, its params, TFLOP/s, ratio) of a shape's study, from its final re-timing."""
    study = optuna.load_study(study_name=STUDY.format(shape), storage=url)
    best = study.user_attrs[gemmgen.tune.loop.RETIMED_ATTR][0]
    trial = next(t for t in study.trials if t.user_attrs.get("kernel") == best["kernel"])
    return best["kernel"], trial.params, best["tflops"], best["ratio"]


def test_tune_workload_tunes_every_shape_seeding_each_with_its_neighbours_winners(tmp_path, capsys, fake_gpu):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    assert main(tune_argv(path, url)) == 0
    out, err = capsys.readouterr()
    shapes = ["64x256x256", "128x256x256", "64x512x256"]
    db = ResultsDB(url)
    for shape in shapes:  # every shape: its own study, the one `tune --shape` names, and rows
        assert len(finished(url, shape)) == 4
        assert db.results(family="wmma", shape=tuple(map(int, shape.split("x"))), status="ok")
    w1, p1, _, _ = winner(url, shapes[0])
    w2, p2, _, _ = winner(url, shapes[1])
    # the second shape starts from the first one's winner, which is then measured there too
    first = trials_of(url, shapes[1])[0]
    assert first.user_attrs["seeded_from"] == f"{w1} at 64x256x256" and first.params == p1
    assert first.user_attrs["kernel"] == w1 and first.state.name == "COMPLETE"
    assert any(r.kernel == w1 for r in db.results(shape=(128, 256, 256), status="ok"))
    # the third: the nearest shape's winner first (64x256x256 is one factor 2 away, 128x256x256 two)
    seeded = [(t.user_attrs["seeded_from"], t.params) for t in trials_of(url, shapes[2])
              if "seeded_from" in t.user_attrs]
    expected = [(f"{w1} at 64x256x256", p1)] + ([(f"{w2} at 128x256x256", p2)] if w2 != w1 else [])
    assert seeded == expected
    assert [t.number for t in trials_of(url, shapes[2])[:len(expected)]] == list(range(len(expected)))
    assert f"[2/3] wmma bf16 128x256x256 (a): 4 trials; first 1 winners at other shapes: {w1} at 64x256x256" in err
    # the report: one row per shape with its winner, then the weighted geometric mean (weights 2, 2, 1)
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] and
            line.split()[0] in shapes}
    ratios = []
    for shape, label, weight in zip(shapes, "aab", (2, 2, 1)):
        kernel, _, tflops, ratio = winner(url, shape)
        assert rows[shape][:5] == [shape, label, str(weight), kernel, f"{tflops:.4g}"]
        assert rows[shape][5] == f"{100 * ratio:.4g}" and rows[shape][6] == "4"
        ratios.append((weight, ratio))
    mean = math.exp(sum(w * math.log(r) for w, r in ratios) / 5)
    assert f"weighted geometric mean of % cuBLAS, bf16: {100 * mean:.1f} (3 of 3 shapes)" in out

    # the same command again: every shape has its trials; nothing is measured, no GPU opened
    made = len(fake_gpu.made)
    assert main(tune_argv(path, url)) == 0
    out, err = capsys.readouterr()
    assert len(fake_gpu.made) == made
    assert "[1/3] wmma bf16 64x256x256 (a): skipped: study wmma-bf16-sm_90-64x256x256 has 4 finished trials " \
        "(--trials 4)" in err
    assert sum(1 for line in out.splitlines() if line.endswith(" skipped")) == 3
    assert f"weighted geometric mean of % cuBLAS, bf16: {100 * mean:.1f} (3 of 3 shapes)" in out

    # more trials per shape: each study gets the ones it lacks
    assert main(tune_argv(path, url, trials=6)) == 0
    assert [len(finished(url, s)) for s in shapes] == [6, 6, 6]


@pytest.mark.slow
def test_an_interrupted_workload_resumes_where_it_stopped(tmp_path, capsys, fake_gpu):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    fake_gpu.interrupt_at = (Shape(128, 256, 256), 2)  # Ctrl-C during the second shape's second trial
    assert main(tune_argv(path, url)) == 130
    out, _ = capsys.readouterr()
    assert "interrupted: every trial so far is stored; run the same command again to go on" in out
    assert len(finished(url, "64x256x256")) == 4
    stopped = len(finished(url, "128x256x256"))
    assert 1 <= stopped < 4
    with pytest.raises(KeyError):  # never reached: no study
        trials_of(url, "64x512x256")
    assert any(line.startswith("64x512x256") and line.endswith("not reached") for line in out.splitlines())

    fake_gpu.interrupt_at = None
    assert main(tune_argv(path, url)) == 0
    _, err = capsys.readouterr()
    assert "[1/3] wmma bf16 64x256x256 (a): skipped" in err
    assert f"[2/3] wmma bf16 128x256x256 (a): {4 - stopped} trials (study wmma-bf16-sm_90-128x256x256 has " \
        f"{stopped})" in err
    assert [len(finished(url, s)) for s in ("64x256x256", "128x256x256", "64x512x256")] == [4, 4, 4]


def test_a_workload_run_after_its_search_space_changed_tunes_each_study_again_in_full(tmp_path, capsys, fake_gpu,
                                                                                         monkeypatch):
    """A study of the old values is set aside (NAME@1) and NAME wants all of --trials again, where
    counting the old study's trials would have skipped the shape (or given it the difference)."""
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    assert main(tune_argv(path, url)) == 0
    capsys.readouterr()
    spaces = tmp_path / "spaces"
    shutil.copytree(search_spaces_dir(), spaces)
    toml = spaces / "wmma.toml"
    toml.write_text(toml.read_text().replace("PAD = [0, 8, 16]", "PAD = [0, 8]"))
    monkeypatch.setattr(space_module, "search_spaces_dir", lambda: spaces)
    assert main(tune_argv(path, url)) == 0
    out, err = capsys.readouterr()
    assert "skipped" not in err and "[1/3] wmma bf16 64x256x256 (a): 4 trials\n" in err
    assert ("study wmma-bf16-sm_90-64x256x256 was begun with another search space (PAD: [0, 8, 16] -> [0, 8])"
            in out + err)
    for shape in ("64x256x256", "128x256x256", "64x512x256"):
        assert len(finished(url, shape)) == 4
        assert len([t for t in trials_of(url, f"{shape}@1") if t.state.name == "COMPLETE"]) == 4


@pytest.mark.parametrize("extra, message", [
    (["--shape", "4096"], "give --shape or --workload, not both: the workload file lists its shapes"),
    (["--study", "mine"], "--study names one study; with --workload each shape has its own, named as "
                          "`gemmgen tune --shape` names it"),
    (["--precision", "fp16"], "--precision fp16: workload w ({path}) tunes bf16"),
])
def test_options_that_do_not_go_with_a_workload_exit_2_with_one_message(tmp_path, capsys, extra, message):
    path = write(tmp_path, TINY)
    assert main(tune_argv(path, f"sqlite:///{tmp_path / 'tune.db'}") + extra) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"gemmgen: error: {message.format(path=path)}\n"
    assert not (tmp_path / "tune.db").exists()


def test_a_bad_workload_file_exits_2_with_one_message(tmp_path, capsys):
    path = write(tmp_path, 'precisions = ["fp16"]\n[[shape]]\nm = 0\nn = 1\nk = 1\n')
    assert main(["tune", "--workload", str(path), "--gpu", "sm_90"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"gemmgen: error: workload {path}: [[shape]] #1: m = 0: M, N and K must be whole " \
        "numbers from 1 to 2147483647 (2^31 - 1)\n"


# ---- a workload that names its variant: tune and emit --dispatch take it ----

TINY_NT = 'trans = "nt"\nout = "bf16"\n' + TINY


def test_tune_workload_tunes_the_files_variant(tmp_path, capsys, fake_gpu):
    """The file's nt/bf16 with --bias and --act added: every study and kernel is of nt bf16 col gelu."""
    path, url = write(tmp_path, TINY_NT), f"sqlite:///{tmp_path / 'tune.db'}"
    argv = ["tune", "--workload", str(path), "--gpu", "sm_90", "--trials", "2", "--sampler", "random", "--seed", "1",
            "--jobs", "2", "--db", url, "--bias", "col", "--act", "gelu", "--trans", "nt"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "in bf16_nt_obf16_bcol_gelu (hopper)" in err
    assert {s.study_name for s in optuna.get_all_study_summaries(url)} == \
        {f"hopper-bf16_nt_obf16_bcol_gelu-sm_90-{s}" for s in ("64x256x256", "128x256x256", "64x512x256")}
    assert all(name.endswith("_bf16_nt_obf16_bcol_gelu") for bench in fake_gpu.made for name in bench.measured)
    assert out.startswith("workload w (variant nt bf16 col gelu)\n")


@pytest.mark.parametrize("extra, message", [
    (["--out", "fp16"], '--out fp16 disagrees with workload {path}, which says out = "bf16"; leave --out out, or '
                        "change the file"),
    ([], "family wmma computes trans=nn only, not trans=nt; out=fp32 only, not out=bf16"),  # tune_argv's --family wmma
])
def test_tune_workload_refuses_options_that_disagree_with_its_variant(tmp_path, capsys, extra, message):
    path = write(tmp_path, TINY_NT)
    assert main(tune_argv(path, f"sqlite:///{tmp_path / 'tune.db'}") + extra) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"gemmgen: error: {message.format(path=path)}") and err.count("\n") == 1
    assert not (tmp_path / "tune.db").exists()


def test_emit_dispatch_serves_the_workloads_variant(tmp_path, capsys):
    from stored import NT_GELU, V_THIN, stored_variant

    _, url = stored_variant(tmp_path)
    path = write(tmp_path, 'precisions = ["bf16"]\ntrans = "nt"\nout = "bf16"\nbias = "col"\nact = "gelu"\n'
                           '[[shape]]\nm = [16, 4096]\nn = 4096\nk = 4096\n')
    argv = ["emit", "--dispatch", "--workload", str(path), "--gpu", "sm_90", "--db", url]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "dispatcher of 2 kernel(s) for 1 layer(s) (N x K)" in captured.err
    assert f"//   0  {V_THIN}" in captured.out or f"//   1  {V_THIN}" in captured.out
    assert f'return "{NT_GELU.text}";' in captured.out
    line = next(ln for ln in captured.out.splitlines() if ln.startswith("//   gemmgen emit "))
    assert line == f"//   gemmgen emit --dispatch --workload {path} --precision bf16 --gpu sm_90 --trans nt --out bf16 " \
                   "--bias col --act gelu"
    assert main([*argv, "--act", "gelu"]) == 0 and capsys.readouterr().out == captured.out  # agreeing
    assert main([*argv, "--act", "relu"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"gemmgen: error: --act relu disagrees with workload {path}, which " \
        'says act = "gelu"; leave --act out, or change the file\n'
