"""`gemmgen plot` on the shipped results (a copy of results/h100.db, never the file itself), without
a GPU: each kind's numbers against the database and gemmgen.selection.best, each picture as PNG and SVG
(the SVG keeps its text, so the numbers drawn are read back), the user errors, and
optuna-dashboard on the shipped studies (tests/cli/test_docs.py runs the commands of docs/plots.md)."""

import io
import json
import os
import re
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from contextlib import closing
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
from optuna.trial import TrialState

from gemmgen.cli.main import main
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.describe.problem import Shape
from gemmgen.plot.history import history
from gemmgen.plot.importance import importances
from gemmgen.plot.ladder import LADDER, ladder
from gemmgen.plot.studies import load_study
from gemmgen.plot.suite import suite_grid
from gemmgen.selection.best import ranked
from gemmgen.selection.suite import SUITE_PRECISIONS, SUITE_SHAPES
from gemmgen.store.db import ResultsDB

ROOT = Path(__file__).resolve().parents[2]
DB = ROOT / "results" / "h100.db"
DOC = ROOT / "docs" / "plots.md"
STUDY = "hopper-fp16-sm_90-1000x1000x1000"  # 500 trials, the README's history
SM90 = parse_arch("sm_90")

pytestmark = pytest.mark.skipif(not DB.is_file(), reason="results/h100.db is not in this checkout")


def _matplotlib():
    return pytest.importorskip("matplotlib", reason="gemmgen plot's pictures need the 'plot' extra")


@pytest.fixture
def db_file(tmp_path) -> Path:
    copy = tmp_path / "h100.db"
    shutil.copyfile(DB, copy)
    return copy


@pytest.fixture
def db(db_file):
    """The copy of the shipped file, opened to record into (the shipped file is in rollback-journal
    mode, which create=False would open read-only)."""
    with ResultsDB(f"sqlite:///{db_file}") as results:
        yield results


def draw(db_file: Path, kind: str, out: Path, *extra: str) -> None:
    assert main(["plot", kind, "--db", str(db_file), "-o", str(out), *extra]) == 0
    assert out.is_file()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def svg_texts(path: Path) -> list[str]:
    """The text of every <text> element of an SVG (matplotlib's, with svg.fonttype none)."""
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg", f"{path} is not an SVG"
    return ["".join(t.itertext()).strip() for t in root.iter("{http://www.w3.org/2000/svg}text")]


def draw_svg(db_file: Path, tmp_path: Path, kind: str, *extra: str) -> list[str]:
    """Draws ``kind`` as SVG; its texts."""
    _matplotlib()
    svg = tmp_path / f"{kind}.svg"
    draw(db_file, kind, svg, *extra)
    return svg_texts(svg)


def draw_both(db_file: Path, tmp_path: Path, kind: str, *extra: str) -> list[str]:
    """Draws ``kind`` as PNG (of a readable size) and SVG; the SVG's texts. Once per kind: the other
    tests of a kind read draw_svg's."""
    _matplotlib()
    png = tmp_path / f"{kind}.png"
    draw(db_file, kind, png, *extra)
    width, height = png_size(png)
    assert width > 400 and height > 300
    return draw_svg(db_file, tmp_path, kind, *extra)


# ---- suite ------------------------------------------------------------------------------------

def _latest_suite_ratio(db, precision: str, shape: Shape) -> tuple[str, float]:
    """The test's own reading of a suite cell: the newest suite row of a kernel there, over the
    cuBLAS row of its device nearest to it in time."""
    rows = db.results(tag="suite", precision=precision, shape=(shape.m, shape.n, shape.k), status="ok")
    when = {r.measurement_id: datetime.fromisoformat(r.created_at) for r in rows}
    kernel = max((r for r in rows if r.family != "cublas"), key=lambda r: when[r.measurement_id])
    base = min((r for r in rows if r.family == "cublas" and r.device == kernel.device),
               key=lambda r: abs((when[r.measurement_id] - when[kernel.measurement_id]).total_seconds()))
    return kernel.kernel, kernel.tflops / base.tflops


def test_suite_grid_is_the_latest_suite_run_by_the_best_policy(db):
    grid = suite_grid(db, SM90)
    assert grid.shapes == SUITE_SHAPES and grid.precisions == SUITE_PRECISIONS[:4]  # no FP8 suite run in the file
    assert len(grid.cells) == len(SUITE_SHAPES) * 4
    for (shape, precision), cell in grid.cells.items():
        kernel, ratio = _latest_suite_ratio(db, precision, shape)
        assert cell.kernel == kernel
        assert cell.ratio == pytest.approx(ratio, rel=1e-12)
    # the geometric means of the latest suite run (2026-11-23 06:16 UTC), as docs/results.md quotes them
    assert {p: round(g, 3) for p, g in grid.geomeans.items()} == {"fp32": 1.010, "tf32": 1.142, "fp16": 1.096,
                                                                  "bf16": 1.079}


def test_suite_picture_writes_every_ratio_in_its_cell(db, db_file, tmp_path):
    grid = suite_grid(db, SM90)
    texts = draw_both(db_file, tmp_path, "suite")
    expected = Counter(f"{grid.ratio(s, p):.2f}" for s in grid.shapes for p in grid.precisions)
    assert not expected - Counter(texts)  # each cell's value, as often as it occurs (the colour bar's ticks add more)
    assert {str(s) for s in SUITE_SHAPES} <= set(texts)
    for precision, mean in grid.geomeans.items():  # a label's two lines are two texts in SVG
        assert precision in texts and f"(geomean {mean:.3f})" in texts
    # a cell is cuBLAS's time over the kernel's (the kernel's TFLOP/s over cuBLAS's): above 1 is faster
    assert "suite on sm_90: cuBLAS's time / the kernel's (> 1: faster; bold: >= 1)" in texts


# ---- history ----------------------------------------------------------------------------------

def test_history_of_a_shipped_study(db, db_file):
    study = load_study(f"sqlite:///{db_file}", STUDY)
    found = history(study, db)
    finished = [t for t in study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
    assert len(found.trials) == len(finished) == 500
    assert sorted(t.number for t in found.trials) == sorted(t.number for t in finished)
    assert found.failures == 0 and found.infeasible == 0  # the shipped studies kept no failed trial
    assert all(a <= b for a, b in zip(found.best_so_far, found.best_so_far[1:]))
    assert all(a.minutes <= b.minutes for a, b in zip(found.trials, found.trials[1:]))
    assert found.best == study.best_value
    per_shape: dict = {}
    for r in db.results(tag=STUDY, family="cublas", status="ok"):
        per_shape.setdefault((r.M, r.N, r.K), []).append(r.tflops)
    assert list(per_shape) == [(1000, 1000, 1000)]
    assert found.cublas_tflops == pytest.approx(statistics.median(per_shape[(1000, 1000, 1000)]))


def test_history_picture_shows_the_best_and_cublas(db, db_file, tmp_path):
    found = history(load_study(f"sqlite:///{db_file}", STUDY), db)
    texts = draw_both(db_file, tmp_path, "history", "--study", STUDY)
    assert f"best so far ({found.best:.1f})" in texts
    assert f"cuBLAS ({found.cublas_tflops:.1f})" in texts
    assert "trial (500)" in texts and not any(t.startswith("failed (") for t in texts)
    assert STUDY in texts and "500 trials, 0 failed" in texts


def test_history_counts_and_marks_failed_trials(db, db_file, tmp_path):
    """A study with failures (the shipped ones have none): 2 failed, 1 infeasible, 3 measured."""
    url = f"sqlite:///{db_file}"
    study = optuna.create_study(study_name="with-failures", storage=url, direction="maximize")
    for number, (state, value, status) in enumerate([
            (TrialState.FAIL, None, "compile_error"), (TrialState.COMPLETE, 10.0, "ok"),
            (TrialState.PRUNED, None, "infeasible"), (TrialState.COMPLETE, 5.0, "ok"),
            (TrialState.FAIL, None, "wrong_result"), (TrialState.COMPLETE, 12.0, "ok")]):
        trial = study.ask()
        trial.suggest_int("BM", 16, 256)
        trial.set_user_attr("status", status)
        trial.set_user_attr("kernel", f"k{number}")
        study.tell(trial, value, state=state) if value is not None else study.tell(trial, state=state)
    found = history(load_study(url, "with-failures"), db)
    assert [t.status for t in found.trials] == ["compile_error", "ok", "ok", "wrong_result", "ok"]
    assert found.failures == 2 and found.infeasible == 1
    assert found.best_so_far == (None, 10.0, 10.0, 10.0, 12.0)
    assert found.cublas_tflops is None  # no cuBLAS row carries its tag
    texts = draw_svg(db_file, tmp_path, "history", "--study", "with-failures")
    assert "failed (2)" in texts and "trial (3)" in texts and "best so far (12.0)" in texts
    assert not any(t.startswith("cuBLAS") for t in texts)


# ---- ladder -----------------------------------------------------------------------------------

def _expected_ladder(db) -> dict[str, dict[Shape, tuple[str, float, float | None]]]:
    """The test's own reading of the ladder: for each of v1..v6 stored at a suite shape, per shape
    its kernel, highest TFLOP/s and gemmgen.selection.best score there."""
    expected = {}
    for name in LADDER:
        point = NAMED_POINTS[name]
        kernel = point.config(SM90).name
        at = {}
        for shape in SUITE_SHAPES:
            mine = [r for r in ranked(db, point.precision, shape, SM90) if r.kernel == kernel]
            if mine:
                at[shape] = (kernel, mine[0].tflops, mine[0].score)
        if at:
            expected[f"{name} ({point.precision})"] = at
    return expected


def _store(db, point: str, shape: Shape, tflops: float) -> None:
    """A verified bench row of the named point at ``shape``, on the shipped file's H100."""
    config = NAMED_POINTS[point].config(SM90)
    device = db.results(family="cublas", precision="fp32", shape=(4096, 4096, 4096))[0]
    device_id = db.device(name=device.device, arch="sm_90", sm_count=132, clock_mhz=1980, memory_clock_mhz=2619,
                          driver_version="580.159.04", cuda_version="13.0")
    kernel_id = db.kernel(name=config.name, family=config.family.name, precision=config.precision, arch="sm_90",
                          params=config.params)
    db.record(kernel_id=kernel_id, device_id=device_id, problem_id=db.problem(shape.m, shape.n, shape.k, 1.0, 0.0),
              status="ok", median_ms=shape.flops / (tflops * 1e12) * 1e3, tflops=tflops, tag="bench")


def test_ladder_of_the_shipped_results(db):
    found = ladder(db, SM90)
    expected = _expected_ladder(db)
    # v4 is at every suite shape (the suite's fp32 fallback, a tuning seed); the ladder run of
    # docs/results.md adds v1..v6 at 4096^3 and 8192^3 (results/README.md)
    assert set(expected["v4 (fp32)"]) == set(SUITE_SHAPES)
    if "v1 (fp32)" in expected:
        big = {Shape(4096, 4096, 4096), Shape(8192, 8192, 8192)}
        assert [label for label in expected if big <= set(expected[label])] == \
            [f"{n} ({NAMED_POINTS[n].precision})" for n in LADDER]
    precisions = list(dict.fromkeys(NAMED_POINTS[label.split()[0]].precision for label in expected))
    assert list(found.series) == [*expected, *(f"cuBLAS {p}" for p in precisions)]
    assert found.missing == tuple(n for n in LADDER if f"{n} ({NAMED_POINTS[n].precision})" not in expected)
    assert found.shapes == SUITE_SHAPES
    for label, at in expected.items():
        assert {s: (r.kernel, r.tflops, r.ratio) for s, r in found.series[label].items()} == at
    for precision in precisions:
        for shape, rung in found.series[f"cuBLAS {precision}"].items():
            rows = db.results(family="cublas", precision=precision, shape=(shape.m, shape.n, shape.k), status="ok")
            assert rung.tflops == max(r.tflops for r in rows)
    for shape, rung in found.series["cuBLAS fp32"].items():
        assert rung.tflops > found.series["v4 (fp32)"][shape].tflops


def test_ladder_takes_a_point_once_it_is_stored(db):
    before = ladder(db, SM90, precision="fp32")
    had = {s: r.tflops for s, r in before.series.get("v1 (fp32)", {}).items()}
    shape = next(s for s in SUITE_SHAPES if s not in had)  # the shipped ladder run is at 4096^3 and 8192^3 only
    _store(db, "v1", shape, 3.05)
    found = ladder(db, SM90, precision="fp32")
    assert list(found.series)[0] == "v1 (fp32)" and list(found.series)[-1] == "cuBLAS fp32"
    assert found.missing == tuple(n for n in before.missing if n != "v1")
    assert {s: r.tflops for s, r in found.series["v1 (fp32)"].items()} == {**had, shape: 3.05}


def test_ladder_of_all_six(db):
    """The ladder run stored (v1..v6 and cuBLAS at 4096^3 and 8192^3, as docs/results.md's command
    stores it): every point drawn, none missing, each at its own precision."""
    big = (Shape(4096, 4096, 4096), Shape(8192, 8192, 8192))
    for i, name in enumerate(LADDER):
        for shape in big:
            _store(db, name, shape, 5.0 + i)
    found = ladder(db, SM90)
    assert list(found.series) == ["v1 (fp32)", "v2 (fp32)", "v3 (fp32)", "v4 (fp32)", "v5 (tf32)", "v6 (fp16)",
                                  "cuBLAS fp32", "cuBLAS tf32", "cuBLAS fp16"]
    assert found.missing == ()
    for label in found.series:
        assert set(big) <= set(found.series[label])
    for i, name in enumerate(LADDER):  # the highest stored: these rows, or the shipped run's where faster
        rung = found.series[f"{name} ({NAMED_POINTS[name].precision})"][big[0]]
        assert rung.kernel == NAMED_POINTS[name].config(SM90).name and rung.tflops >= 5.0 + i
    assert found.series["cuBLAS fp16"][big[0]].tflops > found.series["v6 (fp16)"][big[0]].tflops


def test_ladder_picture(db_file, tmp_path):
    with ResultsDB(f"sqlite:///{db_file}", create=False) as results:
        found = ladder(results, SM90)
    texts = draw_both(db_file, tmp_path, "ladder")
    assert set(found.series) <= set(texts) and "v4 (fp32)" in texts and "cuBLAS fp32" in texts
    if found.missing:
        assert any(f"not stored, so not drawn: {', '.join(found.missing)}" in t for t in texts)
    else:
        assert not any("not stored" in t for t in texts)
    assert {str(s) for s in SUITE_SHAPES} <= set(texts)


def test_ladder_picture_of_all_six(db_file, tmp_path):
    with ResultsDB(f"sqlite:///{db_file}") as results:  # a copy, recorded into
        for name in LADDER:
            _store(results, name, Shape(4096, 4096, 4096), 20.0)
    texts = draw_svg(db_file, tmp_path, "ladder")
    assert {"v1 (fp32)", "v5 (tf32)", "v6 (fp16)", "cuBLAS tf32", "cuBLAS fp16"} <= set(texts)
    assert not any("not stored" in t for t in texts)


# ---- importance -------------------------------------------------------------------------------

def test_importances_are_optunas_ped_anova(db_file, tmp_path):
    study = load_study(f"sqlite:///{db_file}", STUDY)
    found = importances(study)
    expected = get_param_importances(study, evaluator=PedAnovaImportanceEvaluator())
    assert found.evaluator == "PED-ANOVA" and found.trials == 500
    assert dict(found.importances) == expected
    assert [name for name, _ in found.importances] == list(expected)
    assert set(expected) == set(study.best_trial.params)
    assert sum(expected.values()) == pytest.approx(1.0)
    texts = draw_both(db_file, tmp_path, "importance", "--study", STUDY)
    for name, value in found.importances:
        assert name in texts and f"{value:.3f}" in texts


# ---- errors -----------------------------------------------------------------------------------

def _fails(capsys, argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gemmgen: error: ") and "Traceback" not in err
    for word in words:
        assert word in err, err
    return err


def test_a_wrong_or_missing_study_lists_the_studies(capsys, db_file, tmp_path):
    out = tmp_path / "h.png"
    err = _fails(capsys, ["plot", "history", "--db", str(db_file), "--study", "nope", "-o", str(out)],
                 "no study named 'nope'", "the 46 studies in", f"  {STUDY}  (500 trials)")
    assert err.count("trials)") == 46
    _fails(capsys, ["plot", "importance", "--db", str(db_file), "-o", str(out)], "give the study with --study NAME",
           f"  {STUDY}  (500 trials)")
    assert not out.exists()


@pytest.mark.parametrize("name", ["out.jpg", "out.pdf", "out"])
def test_only_png_and_svg_are_written(capsys, db_file, tmp_path, name):
    _fails(capsys, ["plot", "suite", "--db", str(db_file), "-o", str(tmp_path / name)], "PNG or SVG", ".png or .svg")
    assert not (tmp_path / name).exists()


def test_a_missing_database_or_one_without_studies(capsys, tmp_path):
    missing = tmp_path / "none.db"
    _fails(capsys, ["plot", "suite", "--db", str(missing), "-o", str(tmp_path / "s.png")], "no results database at")
    _fails(capsys, ["plot", "history", "--db", str(missing), "--study", STUDY, "-o", str(tmp_path / "h.png")],
           "no results database at")
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    ResultsDB(f"sqlite:///{empty}").close()  # gemmgen's tables, no measurement, no study
    _fails(capsys, ["plot", "history", "--db", str(empty), "--study", STUDY, "-o", str(tmp_path / "h.png")],
           "holds no Optuna studies")
    with ResultsDB(f"sqlite:///{empty}", create=False) as results:
        with results._engine.connect() as connection:
            assert not results._engine.dialect.has_table(connection, "studies")  # nothing was created
    _fails(capsys, ["plot", "suite", "--db", str(empty), "-o", str(tmp_path / "s.png")],
           "no verified measurement is stored")


def test_options_a_kind_does_not_take_and_a_ladder_of_no_point(capsys, db_file, tmp_path):
    out = str(tmp_path / "x.png")
    _fails(capsys, ["plot", "suite", "--db", str(db_file), "--precision", "fp16", "-o", out],
           "--precision goes with `gemmgen plot ladder`")
    _fails(capsys, ["plot", "ladder", "--db", str(db_file), "--study", STUDY, "-o", out], "--study goes with")
    _fails(capsys, ["plot", "ladder", "--db", str(db_file), "--precision", "bf16", "-o", out],
           "no named point of the ladder is bf16")
    v5 = NAMED_POINTS["v5"].config(SM90).name  # taken out of the copy: the shipped ladder run stores it
    with closing(sqlite3.connect(db_file)) as con, con:
        con.execute("DELETE FROM measurements WHERE kernel_id IN (SELECT id FROM kernels WHERE name = ?)", (v5,))
    _fails(capsys, ["plot", "ladder", "--db", str(db_file), "--precision", "tf32", "-o", out],
           "none of v5 is stored for sm_90", "gemmgen bench v5")


def test_without_matplotlib_one_message_names_the_extra(capsys, monkeypatch, db_file, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    _fails(capsys, ["plot", "suite", "--db", str(db_file), "-o", str(tmp_path / "s.png")],
           "needs matplotlib", "pip install 'gemmgen[plot]'")


# ---- docs/plots.md, the README's pictures, optuna-dashboard -------------------------------------

def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def _in_a_checkout_copy(tmp_path: Path) -> tuple[Path, dict]:
    """A folder laid out as the repository root for the docs' commands (results/h100.db a copy),
    and an environment whose PATH finds this Python's gemmgen and optuna-dashboard."""
    root = tmp_path / "root"
    (root / "results").mkdir(parents=True)
    shutil.copyfile(DB, root / "results" / "h100.db")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return root, env


def test_the_readme_pictures_are_committed_pngs():
    for name in ("suite.png", "history.png"):
        width, height = png_size(ROOT / "docs" / "images" / name)
        assert width > 400 and height > 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_optuna_dashboard_opens_the_shipped_results(tmp_path):
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (it is in the test extra)")
    (command,) = [line for block in _blocks("text") for line in block.splitlines()
                  if line.startswith("optuna-dashboard ")]
    assert command == "optuna-dashboard sqlite:///results/h100.db"
    root, env = _in_a_checkout_copy(tmp_path)
    port = _free_port()
    server = subprocess.Popen(["bash", "-c", f"exec {command} --port {port} --quiet"], cwd=root, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, listed = time.monotonic() + 60, None
        while listed is None:
            assert server.poll() is None, f"optuna-dashboard exited: {server.stderr.read()}"
            assert time.monotonic() < deadline, "optuna-dashboard did not answer within 60 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as reply:
                    listed = json.load(io.TextIOWrapper(reply, encoding="utf-8"))
            except OSError:
                time.sleep(0.3)
    finally:
        server.terminate()
        server.wait(timeout=30)
    # the names only: optuna.get_all_study_summaries would also find each study's best trial (7 s)
    shipped = optuna.get_all_study_names(f"sqlite:///{root / 'results' / 'h100.db'}")
    assert len(shipped) == 46
    assert sorted(s["study_name"] for s in listed["study_summaries"]) == sorted(shipped)
