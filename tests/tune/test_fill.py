"""The fill's plan (gemmgen.tune.fill) without a GPU: which token counts, in what order."""
import math
from pathlib import Path

import pytest

from gemmgen.describe.problem import Shape
from gemmgen.tune.fill import FillPoint, check_points, fill_counts, interleave

LISTED = [16, 128, 512, 2048, 8192]


def test_token_counts_alternate_between_midpoints_and_drawn_ones_in_the_order_taken():
    """Without a stored kernel there are no boundaries: the geometric midpoints of the listed
    counts and random counts take turns, so a fill stopped after a few has some of each."""
    counts = fill_counts(None, [], 4096, 4096, LISTED, 12, seed=3)
    middle = [round(math.sqrt(a * b)) for a, b in zip(LISTED, LISTED[1:])]
    assert middle == [45, 256, 1024, 4096]
    assert counts[0:8:2] == middle  # every other count, in turn
    assert len(counts) == len(set(counts)) == 12
    assert all(1 <= m <= 8192 and m not in LISTED for m in counts)
    assert counts != sorted(counts)  # the order taken, not ascending M


def test_a_cap_keeps_the_first_taken():
    assert fill_counts(None, [], 4096, 4096, LISTED, 3, seed=3) == fill_counts(None, [], 4096, 4096, LISTED, 12,
                                                                                  seed=3)[:3]


def test_layers_take_turns_so_a_stopped_fill_has_measured_each():
    def points(n, ms):
        return [FillPoint(Shape(m, n, 4096), ()) for m in ms]
    qkv, o, down = points(6144, [45, 3000, 256]), points(4096, [45]), points(14336, [256, 45])
    plan = interleave([qkv, o, down])
    assert [(p.shape.n, p.shape.m) for p in plan] == [(6144, 45), (4096, 45), (14336, 256), (6144, 3000),
                                                      (14336, 45), (6144, 256)]
    assert {p.shape.n for p in plan[:3]} == {6144, 4096, 14336}
    assert interleave([]) == [] and interleave([[], o]) == o


def _plan(*layers):
    """A DispatchPlan of two kernels over ``layers``: (n, [(m_lo, m_hi, kernel index, measured), ...]) each."""
    from gemmgen.describe.arch import parse_arch
    from gemmgen.describe.config import make_config
    from gemmgen.describe.points import point_spec
    from gemmgen.selection.dispatch.select import DispatchPlan, Layer, Span

    arch = parse_arch("sm_90")
    specs = [point_spec(name) for name in ("hopper_bf16", "hopper_fp16")]
    kernels = tuple(make_config(family, params, precision, arch) for family, precision, params in specs)
    return DispatchPlan("bf16", arch, kernels, tuple(
        Layer(n, 4096, tuple(Span(lo, hi, i, 1.0, 1.0, tuple(measured)) for lo, hi, i, measured in spans), (16,), "")
        for n, spans in layers), ("NVIDIA H200",))


def test_checks_measure_each_choice_resting_on_no_measurement_at_its_ends_widest_span_first():
    """A span whose kernel was measured within it needs no check; the others are measured at their
    first and last token count (once where they are one), the widest span first, the layers in turn."""
    plan = _plan((4096, [(1, 16, 0, [16]), (17, 20, 1, []), (21, 256, 0, []), (257, 257, 1, [])]),
                 (6144, [(1, 8192, 1, [])]))
    checks = check_points(plan)
    got = [(p.shape.n, p.shape.m, p.configs[0].name) for p in checks]
    bf16, fp16 = plan.kernels[0].name, plan.kernels[1].name
    assert got == [(4096, 21, bf16), (6144, 1, fp16), (4096, 256, bf16), (6144, 8192, fp16), (4096, 17, fp16),
                   (4096, 20, fp16), (4096, 257, fp16)]
    assert all(p.shape.k == 4096 for p in checks)
    assert all(len(p.configs) == 1 for p in checks)  # the kernel alone


def test_checks_weigh_a_span_by_its_share_of_m_as_well_as_of_log_m():
    """Token counts 2048-4095 (a doubling: 0.08 of log M up to 8192, a quarter of M) are checked
    before 3-8 and 1-2 (0.12 of log M each, and a few counts: 3-8 the more), though in log M alone
    they would come last."""
    plan = _plan((4096, [(1, 2, 0, []), (3, 8, 1, []), (9, 2047, 0, [100]), (2048, 4095, 1, []),
                         (4096, 8192, 0, [8192])]))
    assert [p.shape.m for p in check_points(plan)] == [2048, 4095, 3, 8, 1, 2]


def test_no_checks_where_every_choice_was_measured():
    assert check_points(_plan((4096, [(1, 100, 0, [1, 100]), (101, 8192, 1, [4096])]))) == []


def test_run_fill_builds_each_kernel_once_logs_failures_and_hands_the_builds_to_the_measurements(monkeypatch):
    from types import SimpleNamespace

    from gemmgen.build import nvcc
    from gemmgen.errors import GemmgenError
    from gemmgen.tune.fill import run_fill

    plan = _plan((4096, [(1, 8192, 0, [])]))
    good, bad = plan.kernels
    built = []

    def build(config):
        built.append(config.name)
        if config is bad:
            raise GemmgenError("nvcc was not found\nlook in PATH")
        return nvcc.BuildResult(True, config.name, "")

    measured = []

    class Bench:
        def measure_point(self, label, config, shape, build=None):
            measured.append((config.name, shape.m, build.key if build else None))
            return SimpleNamespace(baseline_ratio=1.0, status="ok")

    monkeypatch.setattr(nvcc, "build_kernel", build)
    points = [FillPoint(Shape(m, 4096, 4096), (good, bad)) for m in (100, 200)]
    lines = []
    out = run_fill(points, Bench(), jobs=2, limit_s=None, log=lines.append)
    assert sorted(built) == sorted([good.name, bad.name])  # once each, not once per point
    assert lines[0] == f"fill: {bad.name} did not build: look in PATH"
    assert measured == [(good.name, 100, good.name), (bad.name, 100, None), (good.name, 200, good.name),
                        (bad.name, 200, None)]
    assert [(s.m, name, ratio) for s, name, ratio in out] == [(100, good.name, 1.0), (100, bad.name, 1.0),
                                                              (200, good.name, 1.0), (200, bad.name, 1.0)]


@pytest.mark.slow
def test_a_fill_does_not_plan_what_was_measured_with_the_same_build(tmp_path):
    """On a copy of the shipped file, the plan of F.linear's fill of 2026-12-07 (6 token counts a
    layer, seed 5), run again: most token counts it takes had kernels measured there that day, and
    it plans none of them again (their builds are today's), but other kernels instead."""
    import shutil
    from collections import defaultdict

    from gemmgen.codegen.render import render_kernel, source_hash
    from gemmgen.describe.arch import parse_arch
    from gemmgen.describe.workload import load_workload
    from gemmgen.selection.best import stored_rows
    from gemmgen.store.db import ResultsDB, resolve_url
    from gemmgen.tune.fill import plan_fill
    from gemmgen.tune.space import load_space

    root = Path(__file__).resolve().parents[2]
    shutil.copyfile(root / "results" / "h100.db", tmp_path / "h100.db")
    db = ResultsDB(resolve_url(str(tmp_path / "h100.db")), create=False)
    workload = load_workload(root / "workloads" / "llama3-8b-linear.toml")
    layers = defaultdict(list)
    for s in workload.shapes:
        layers[s.n, s.k].append(s.m)
    plan = plan_fill(db, load_space("hopper"), "bf16", parse_arch("sm_90"), workload.variant, dict(layers),
                     points=6, seed=5)
    stored = defaultdict(set)
    for r in stored_rows(db, precision="bf16", status="ok", variant=workload.variant, batch_count=1):
        if r.tflops:
            stored[r.M, r.N, r.K].add((r.kernel, r.build))
    assert len(plan) >= 12
    # most of its token counts (the midpoints and drawn ones; the model's boundaries have moved) had
    # kernels measured there: the skip had something to skip
    assert sum(bool(stored[p.shape.m, p.shape.n, p.shape.k]) for p in plan) >= len(plan) // 2
    for point in plan:
        s = point.shape
        assert point.configs
        for config in point.configs:
            assert (config.name, source_hash(render_kernel(config))) not in stored[s.m, s.n, s.k], (s, config.name)
