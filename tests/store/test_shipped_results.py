"""The shipped results (results/h100.db) as a fresh clone without a GPU uses them: query them,
ask for the best kernel, and emit a dispatcher for the example workload that nvcc compiles; all
of it from a read-only copy."""

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gemmgen.build.nvcc import build_library
from gemmgen.cli.main import main
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.points import resolve_point
from gemmgen.describe.workload import load_workload
from gemmgen.selection.dispatch.select import plan_dispatch
from gemmgen.store.db import ResultsDB

ROOT = Path(__file__).resolve().parents[2]
DB = ROOT / "results" / "h100.db"
FP8_DB = ROOT / "results" / "h200-fp8.db"
WORKLOAD = ROOT / "workloads" / "llama3-8b.toml"

pytestmark = pytest.mark.skipif(not DB.is_file(), reason="results/h100.db is not in this checkout")


def test_results_and_best_read_the_shipped_file(capsys):
    assert main(["results", "--db", str(DB), "--shape", "4096", "--precision", "fp16", "--limit", "3"]) == 0
    assert "hopper_" in capsys.readouterr().out
    assert main(["best", "--db", str(DB), "--precision", "bf16", "--shape", "128x4096x14336", "--gpu", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hopper_") and "% of cuBLAS (median)" in out and "NVIDIA H100 80GB HBM3" in out


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_dispatcher_for_the_example_workload_builds_from_the_shipped_file(capsys, tmp_path, precision):
    out = tmp_path / "gemm.cu"
    assert main(["emit", "--dispatch", "--workload", str(WORKLOAD), "--precision", precision, "--gpu", "sm_90",
                 "--db", str(DB), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "for 4 layer(s) (N x K), every M from 1 to 8192:" in err and "predicted" not in err  # all 4 measured
    source = out.read_text()
    first = source.split("//   0  ", 1)[1].split()[0]  # the first kernel of the header's list
    # nvcc takes about 2.5 minutes on this file alone on 2 cores: beside other slow tests it may pass
    # the default 300 s (a failure seen once, 2026-11-28); the test asks whether it builds, not how fast
    build = build_library(source, resolve_point(first, "sm_90").build_arch, timeout_s=1200)
    assert build.ok, build.log


@pytest.mark.parametrize("bias", ["none", "col"])
def test_the_shipped_file_serves_f_linears_layers(bias):
    """Issue 30: F.linear's Llama-3-8B layers in bf16 (nt, bf16 C), without and with a column
    bias, are measured in the shipped file: a dispatcher's plan for them is made without a GPU,
    every layer from measurements of its own (none predicted), in F.linear's variant. (The plan,
    not the file: rendering its ~50 kernels takes half a minute; the emit of a shipped dispatcher
    is READERS' below.)"""
    workload = load_workload(ROOT / "workloads" / "llama3-8b-linear.toml")
    variant = workload.variant_with({"bias": bias})
    plan = plan_dispatch(ResultsDB(f"sqlite:///{DB}", create=False), "bf16", parse_arch("sm_90"), workload.shapes,
                         variant=variant)
    assert len(plan.layers) == 4 and not any("predicted" in layer.basis for layer in plan.layers)
    suffix = "_bf16_nt_obf16" + ("_bcol" if bias == "col" else "")
    assert plan.kernels and all(c.name.startswith("hopper_") and c.name.endswith(suffix) for c in plan.kernels)


@pytest.mark.parametrize("scale", ["tensor", "block"])
def test_the_fp8_file_serves_the_fp8_workloads_layers_within_the_error_bound(scale):
    """Issue 32: the Llama-3-8B layers in FP8 (workloads/llama3-8b-fp8.toml, per-tensor and block
    scales), tuned on an H200: a dispatcher's plan is made without a GPU, every layer from its own
    measurements, of the scaled variant, and no kernel of a layer was measured over FP8's error
    bound there (gemmgen.selection.best.ERROR_BOUND)."""
    from gemmgen.selection.best import error_ratios, within_error

    workload = load_workload(ROOT / "workloads" / "llama3-8b-fp8.toml")
    variant = workload.variant_with({"scale": scale})
    db = ResultsDB(f"sqlite:///{FP8_DB}", create=False)
    plan = plan_dispatch(db, "e4m3", parse_arch("sm_90"), workload.shapes, variant=variant)
    assert plan.devices == ("NVIDIA H200",) and len(plan.layers) == 4
    assert not any("predicted" in layer.basis for layer in plan.layers)
    assert all(c.name.endswith(f"_e4m3_nt_obf16_s{scale}") for c in plan.kernels)
    errors = error_ratios(db.results(precision="e4m3", status="ok", variant=variant))
    for layer in plan.layers:
        for span in layer.spans:
            name = plan.kernels[span.kernel].name
            assert all(within_error("e4m3", ratio) for (k, _, n, kk), ratio in errors.items()
                       if k == name and (n, kk) == (layer.n, layer.k)), (name, layer.n, layer.k)


@pytest.mark.parametrize("db", [DB, FP8_DB], ids=["h100", "h200-fp8"])
def test_the_file_ships_in_rollback_journal_mode(db):
    """A WAL file's readers must write its -shm file beside it, so a read-only checkout or mount
    could not read it: the file ships in rollback-journal mode, which the tests below read from
    read-only media. SQLite's header says which (bytes 18 and 19, the file format's write and read
    versions: 1 rollback journal, 2 WAL), read here without opening the database."""
    with db.open("rb") as f:
        header = f.read(20)
    assert header[:16] == b"SQLite format 3\x00"
    assert (header[18], header[19]) == (1, 1)


# The commands that only read the results, each with a line its output must hold.
READERS = [
    (["results", "--precision", "fp16", "--shape", "4096", "--limit", "3"], "hopper_"),
    (["best", "--precision", "bf16", "--shape", "128x4096x14336", "--gpu", "sm_90"], "% of cuBLAS (median)"),
    (["emit", "best", "--precision", "fp16", "--shape", "4096", "--gpu", "sm_90"], "extern \"C\" __global__"),
    # a dispatcher of 64 kernels: half a minute of rendering, so with the slow tests
    pytest.param(["emit", "--dispatch", "--workload", str(WORKLOAD), "--precision", "bf16", "--gpu", "sm_90"],
                 "// kernels    :", marks=pytest.mark.slow),
]


def _held_to_permissions() -> list[str]:
    """The prefix that runs a command held to the files' permissions: none for a user; for root
    (CI, containers), setpriv without the capabilities that write read-only files anyway."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root, and without setpriv root writes read-only files anyway")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


def _read_only_copy(tmp_path, journal_mode: str) -> Path:
    """A copy of the shipped file in ``journal_mode``, the file and its folder made read-only."""
    folder = tmp_path / "media"
    folder.mkdir()
    copy = folder / DB.name
    shutil.copyfile(DB, copy)
    with sqlite3.connect(copy) as connection:
        assert connection.execute(f"PRAGMA journal_mode={journal_mode}").fetchone() == (journal_mode.lower(),)
    connection.close()
    copy.chmod(0o444)
    folder.chmod(0o555)
    return copy


def _gemmgen(prefix, argv, db) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([*prefix, sys.executable, "-m", "gemmgen", *argv, "--db", str(db)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("argv, shows", READERS, ids=["results", "best", "emit-best", "emit-dispatch"])
def test_the_shipped_file_reads_from_read_only_media(tmp_path, argv, shows):
    """A copy in rollback-journal mode, as the file ships (`sqlite3 results/h100.db 'PRAGMA
    journal_mode=DELETE'`), its folder and itself read-only: each command that only reads works,
    and nothing is written beside the file."""
    prefix = _held_to_permissions()
    copy = _read_only_copy(tmp_path, "DELETE")
    try:
        proc = _gemmgen(prefix, argv, copy)
        assert proc.returncode == 0, proc.stderr
        assert shows in proc.stdout
        assert [p.name for p in copy.parent.iterdir()] == [DB.name]
    finally:
        copy.parent.chmod(0o755)


def test_a_wal_file_on_read_only_media_says_how_to_convert_it(tmp_path):
    """A WAL file's readers must write its -shm file: where they cannot, one line names the
    command that converts it."""
    prefix = _held_to_permissions()
    copy = _read_only_copy(tmp_path, "WAL")
    try:
        proc = _gemmgen(prefix, READERS[0][0], copy)
    finally:
        copy.parent.chmod(0o755)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"gemmgen: error: cannot open results database sqlite:///{copy}: ")
    assert proc.stderr.endswith(f"it is in WAL mode, whose readers must write {copy}-shm beside it: where it is "
                                f"writable, convert it once with sqlite3 {copy} 'PRAGMA journal_mode=DELETE'\n")


def test_the_docs_state_the_shipped_files_trials_and_size(tmp_path):
    """README.md and docs/tuning.md say how many trials the shipped studies have (those of the
    workload tunes, one shape each, apart), and pyproject.toml how large the file is: read from a
    copy of the file."""
    import re

    from gemmgen.describe.problem import parse_shape
    from gemmgen.describe.workload import load_workload

    copy = tmp_path / DB.name
    shutil.copyfile(DB, copy)
    with sqlite3.connect(copy) as connection:
        counts = connection.execute("SELECT s.study_name, COUNT(t.trial_id) FROM studies s JOIN trials t ON "
                                    "t.study_id = s.study_id AND t.state = 'COMPLETE' GROUP BY s.study_id").fetchall()
    connection.close()
    workload = set(load_workload(WORKLOAD).shapes)

    def of_the_workload(study: str) -> bool:  # its tunes' studies: hopper (their family on sm_90), one shape each
        shapes = study.rsplit("-", 1)[1]
        return study.startswith("hopper-") and "_" not in shapes and parse_shape(shapes) in workload

    per_shape = [n for name, n in counts if of_the_workload(name)]
    others = [n for name, n in counts if not of_the_workload(name)]
    said = (f"the shipped studies have {min(others)}-{max(others)} trials, and {min(per_shape)}-{max(per_shape)} "
            "for each shape of the workload tunes")
    for doc in ("README.md", "docs/tuning.md"):
        assert said in " ".join((ROOT / doc).read_text().split()), doc
    megabytes = re.search(r"not results/h100\.db \((\d+) MB", (ROOT / "pyproject.toml").read_text())
    assert megabytes and int(megabytes[1]) == round(DB.stat().st_size / 1e6)
