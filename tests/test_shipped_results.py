"""The shipped results (results/h100.db) as a fresh clone without a GPU uses them: query them,
ask for the best kernel, and emit a dispatcher for the example workload that nvcc compiles."""

from pathlib import Path

import pytest

from gemmgen.build import build_library
from gemmgen.cli import main
from gemmgen.points import resolve_point

ROOT = Path(__file__).resolve().parent.parent
DB = ROOT / "results" / "h100.db"
WORKLOAD = ROOT / "workloads" / "llama3-8b.toml"

pytestmark = pytest.mark.skipif(not DB.is_file(), reason="results/h100.db is not in this checkout")


def test_results_and_best_read_the_shipped_file(capsys):
    assert main(["results", "--db", str(DB), "--shape", "4096", "--precision", "fp16", "--limit", "3"]) == 0
    assert "hopper_" in capsys.readouterr().out
    assert main(["best", "--db", str(DB), "--precision", "bf16", "--shape", "128x4096x14336", "--gpu", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hopper_") and "% of cuBLAS (median)" in out and "NVIDIA H100 80GB HBM3" in out


@pytest.mark.nvcc
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_dispatcher_for_the_example_workload_builds_from_the_shipped_file(capsys, tmp_path, build_cache, precision):
    out = tmp_path / "gemm.cu"
    assert main(["emit", "--dispatch", "--workload", str(WORKLOAD), "--precision", precision, "--gpu", "sm_90",
                 "--db", str(DB), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "for 68 tuned shape(s);" in err and "nothing verified stored" not in err
    source = out.read_text()
    first = source.split("//   0  ", 1)[1].split()[0]  # the first kernel of the header's list
    build = build_library(source, resolve_point(first, "sm_90").build_arch)
    assert build.ok, build.log
