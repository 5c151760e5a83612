"""The command line: `emit` writes only CUDA source to stdout, user errors exit 2 with one
"gemmgen: error:" message and no traceback, `list` shows everything there is."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import gemmgen
import gemmgen.cli.args
import gemmgen.cli.main
from gemmgen.build.nvcc import find_tool
from gemmgen.cli.main import main
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.points import NAMED_POINTS, resolve_point

REPO = Path(__file__).resolve().parents[2]


def test_emit_writes_only_cuda_source(capsys):
    assert main(["emit", "v4", "--gpu", "sm_90"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("//")
    assert 'extern "C" __global__ void __launch_bounds__(256, 1)\nwarp_128x128x8_w64x32_t8x8_b2_fp32(' in out
    assert out == render_kernel(resolve_point("v4", "sm_90"))
    assert err == ""


def test_emit_harness(capsys):
    assert main(["emit", "v6", "--gpu", "sm_80", "--harness"]) == 0
    out = capsys.readouterr().out
    assert "int main(" in out
    assert out == render_kernel(resolve_point("v6", "sm_80"), harness=True)


@pytest.mark.parametrize("argv, words", [
    (["emit", "v9", "--gpu", "sm_90"], ["unknown point 'v9'", "v1, v2"]),
    (["emit", "v4", "--set", "BQ=1", "--gpu", "sm_90"], ["no parameter 'BQ'", "BM, BN, BK"]),
    (["emit", "v4", "--set", "BM=100", "--gpu", "sm_90"], ["BM='100'", "32, 64, 128, 256"]),
    (["emit", "v4", "--set", "BM=", "--gpu", "sm_90"], ["'BM='", "NAME=VALUE"]),
    (["emit", "v4", "--set", "WM=128", "--gpu", "sm_90"], ["invalid point", "(128/8)*(32/8) = 64, must be 32"]),
    (["emit", "v4", "--family", "warp", "--gpu", "sm_90"], ["not both"]),
    (["emit", "--gpu", "sm_90"], ["name a point"]),
    (["emit", "v4", "--gpu", "sm_91"], ["unknown GPU architecture 'sm_91'", "sm_90"]),
    (["emit", "v4", "--precision", "fp16", "--gpu", "sm_90"], ["does not take precision 'fp16'"]),
    (["emit", "v5", "--gpu", "sm_75"], ["tf32 needs sm_80 or newer; target is sm_75"]),
    (["emit", "v4", "--set", "BM=128,BM=64", "--gpu", "sm_90"], ["--set gives BM twice (BM=128 and BM=64)"]),
    (["emit", "v4", "--set", "BK=8,bk=16", "--gpu", "sm_90"], ["--set gives BK twice"]),
    (["emit", "v4", "--gpu", "sm_89a"], ["architecture-specific ('a') targets exist from sm_90a on; use sm_89"]),
    (["bench", "v4", "--shape", "2147483648x16x16"], ["must be <= 2147483647 (2^31 - 1)", "32-bit"]),
    (["best", "--family", "warp", "--precision", "fp32", "--shape", "4096x4096x2147483648"], ["2^31 - 1"]),
    (["emit", "v3", "--bias", "col", "--gpu", "sm_90"],
     ["invalid point register_64x64x16_t4x4_contig_v4_p0_fp32_bcol", "family register computes bias=none only, not bias=col"]),
    (["emit", "hopper_bf16", "--set", "consumers=1", "--out", "bf16", "--act", "relu", "--gpu", "sm_90"],
     ["invalid point hopper_128x256_c1_s4_g8_ov_bf16_obf16_relu: 2 constraint(s) violated",
      "overlap=1 holds half of one m64 block of accumulators per consumer"]),
    (["emit", "hopper_bf16", "--set", "trans=nt", "--trans", "tn", "--gpu", "sm_90"],
     ["--set gives trans=nt and --trans gives tn; give trans once"]),
    (["emit", "hopper_bf16", "--set", "Out=fp16", "--out", "bf16", "--gpu", "sm_90"],
     ["--set gives Out=fp16 and --out gives bf16; give out once"]),
    (["bench", "--suite", "--bias", "row"], ["--trans, --out, --bias and --act apply to named points; the suite "
                                             "measures each precision in its own variant"]),
    # argparse's errors: one line, naming what is allowed
    (["emit", "hopper_bf16", "--act", "tanh"], ["argument --act: invalid choice: 'tanh'", "'relu', 'gelu'"]),
    (["emit", "v4", "--nosuch"], ["unrecognized arguments: --nosuch", "`gemmgen --help` lists the options"]),
    (["best", "--precision", "fp32"], ["the following arguments are required: --shape", "`gemmgen best --help`"]),
    # names: one list of what is allowed, for every command (not "run gemmgen tune", not an empty table)
    (["best", "--precision", "fp64", "--shape", "4096"],
     ["argument --precision: invalid choice: 'fp64' (choose from 'fp32', 'tf32', 'fp16', 'bf16', 'e4m3', "
      "'e4m3e5m2', 'e5m2e4m3')"]),
    (["best", "--precision", "BF16", "--shape", "4096"], ["invalid choice: 'BF16'", "'bf16'"]),
    (["results", "--precision", "fp64"], ["argument --precision: invalid choice: 'fp64'"]),
    (["results", "--family", "nosuch"], ["argument --family: invalid choice: 'nosuch'", "'hopper', 'cublas'"]),
    (["emit", "v4", "--precision", "fp64"], ["argument --precision: invalid choice: 'fp64'"]),
    # options that would do nothing
    (["emit", "v4", "--shape", "4096"], ["--shape goes with `emit best` or --dispatch, not with a named point"]),
    (["emit", "v4", "--db", "results.db"], ["--db goes with `emit best` or --dispatch, not with a named point"]),
    (["emit", "v4", "--set", ""], ["argument --set: '' is empty"]),
    (["emit", "v4", "--set", " "], ["argument --set: ' ' is empty"]),
    (["emit", "v4", "--set", ","], ["--set ',' gives no NAME=VALUE pair"]),
    (["emit", "v4", "-o", ""], ["argument -o/--output: '' is empty"]),
    (["bench", "v4", "--precision", "fp16"], ["--precision goes with --suite"]),
    (["bench", "--suite", "--shape", "64"], ["--shape goes with named points"]),
    (["build", "best", "--precision", "fp32"], ["build takes a named point", "gemmgen best --precision P --shape S"]),
    # numbers in full-width digits (int() reads them as 4096)
    (["best", "--precision", "fp16", "--shape", "\uff14\uff10\uff19\uff16"],
     ["cannot read shape '\uff14\uff10\uff19\uff16'", "ASCII digits"]),
    (["emit", "--family", "warp", "--set", "BM=\uff11\uff12\uff18", "--gpu", "sm_90"],
     ["BM='\uff11\uff12\uff18' is not allowed", "16, 32, 64, 128, 256"]),
    (["emit", "v4", "--gpu", "sm_\uff19\uff10"], ["unknown GPU architecture 'sm_\uff19\uff10'"]),
    (["results", "--limit", "\uff15"], ["argument --limit: '\uff15' is not a whole number in ASCII digits"]),
    (["tune", "--family", "warp", "--timeout", "\uff14"], ["argument --timeout: '\uff14' is not a number"]),
    (["tune", "--family", "warp", "--devices", "0,\uff11"], ["argument --devices: '0,\uff11': write GPU numbers in "
                                                            "ASCII digits"]),
    # -o: read when the command line is, before any work
    (["emit", "v4", "-o", "."], ["argument -o/--output: . is a folder: give a file name"]),
])
def test_user_errors_exit_2_with_one_message(capsys, argv, words):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("gemmgen: error: ")
    assert all(line.startswith("  - ") for line in err.splitlines()[1:])  # one line, or a point's broken rules
    assert "Traceback" not in err
    for word in words:
        assert word in err


@pytest.mark.nvcc
def test_a_target_the_installed_nvcc_cannot_build_is_refused(capsys):
    """nvcc 13 builds sm_75 and newer: sm_70 is refused with the CUDA releases that build it."""
    from gemmgen.build.nvcc import nvcc_targets

    if 70 in nvcc_targets(find_tool("nvcc")):
        pytest.skip("this nvcc still builds sm_70")
    assert main(["emit", "v4", "--gpu", "sm_70"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("gemmgen: error:") == 1
    assert "cannot build for sm_70; sm_70 needs CUDA 9.0 to 12.9; this nvcc builds sm_75" in err


@pytest.mark.parametrize("argv", [["results"], ["best", "--family", "warp", "--precision", "fp32", "--shape", "64"],
                                  ["emit", "best", "--family", "warp", "--precision", "fp32", "--shape", "64"]])
def test_reading_a_database_that_does_not_exist_creates_nothing(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GEMMGEN_DB", raising=False)
    assert main(argv) == 2  # the default, results/gemmgen.db, is not there
    assert main([*argv, "--db", str(tmp_path / "elsewhere" / "r.db")]) == 2
    err = capsys.readouterr().err
    assert err.count("gemmgen: error: no results database at ") == 2 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_best_with_nothing_stored_exits_2_and_says_so(capsys, tmp_path):
    from gemmgen.store.db import ResultsDB

    url = f"sqlite:///{tmp_path / 'r.db'}"
    ResultsDB(url).close()  # a database with its tables and no rows
    assert main(["best", "--family", "warp", "--precision", "fp32", "--shape", "64", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gemmgen: error: no verified warp fp32 kernel at 64x64x64 for sm_") and err.count("\n") == 1
    assert main(["best", "--precision", "fp16", "--shape", "64", "--gpu", "sm_90", "--db", url]) == 2
    assert capsys.readouterr().err.startswith("gemmgen: error: no verified fp16 kernel at 64x64x64 for sm_90 in ")


def test_best_and_emit_best_follow_the_ratio_to_cublas_not_raw_tflops(capsys, tmp_path):
    """The policy of gemmgen.selection.best: a kernel timed once on a fast moment of the GPU loses to one
    that beat the cuBLAS run next to it by more; emit best writes the winner's source."""
    import time

    from stored import store

    from gemmgen.describe.problem import Shape
    from gemmgen.store.db import ResultsDB

    url = f"sqlite:///{tmp_path / 'r.db'}"
    db = ResultsDB(url)
    shape = Shape(64, 64, 64)
    lucky, steady = "warp_64x64x8_w32x32_t4x8_b2_fp32", "warp_64x64x16_w32x32_t4x8_b2_fp32"
    store(db, "cublas_fp32", "cublas", "fp32", shape, 10.0)
    store(db, lucky, "warp", "fp32", shape, 9.0)  # 90%
    time.sleep(0.05)
    store(db, "cublas_fp32", "cublas", "fp32", shape, 5.0)
    store(db, steady, "warp", "fp32", shape, 6.0)  # 120%, at a lower TFLOP/s
    db.close()
    assert main(["best", "--precision", "fp32", "--shape", "64", "--gpu", "sm_90", "--db", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{steady}, 120.0% of cuBLAS (median), 6.00 TFLOP/s at best, on H100\n")
    assert f"emit: gemmgen emit {steady} --gpu sm_90" in out
    assert main(["emit", "best", "--precision", "fp32", "--shape", "64", "--gpu", "sm_90", "--db", url]) == 0
    captured = capsys.readouterr()
    assert f"{steady}(" in captured.out and captured.err.startswith(f"gemmgen: best fp32 kernel at 64x64x64 for sm_90: {steady}")


def test_invalid_point_lists_every_violation_on_stderr(capsys):
    assert main(["emit", "--family", "warp", "--set", "BM=32,BN=32,WM=64,WN=64,TM=2,TN=2", "--gpu", "sm_90"]) == 2
    err = capsys.readouterr().err
    assert "3 constraint(s) violated" in err
    assert len([line for line in err.splitlines() if line.startswith("  - ")]) == 3


def test_emit_a_family_point(capsys):
    argv = ["emit", "--family", "warp", "--set", "BM=128,BN=64,BK=16,WM=64,WN=32,TM=8,TN=8", "--gpu", "sm_89"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "warp_128x64x16_w64x32_t8x8_b2_fp32(" in out
    assert "target     : sm_89" in out
    assert "block = (128, 1, 1) = 128 threads" in out  # 2 x 2 warps


def test_a_warp_tile_that_is_not_32_threads_is_refused(capsys):
    # 64/8 thread rows x 32/4 thread columns = 64 threads: not one warp
    argv = ["emit", "--family", "warp", "--set", "BM=128,BN=64,BK=16,WM=64,WN=32,TM=8,TN=4", "--gpu", "sm_89"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "(64/8)*(32/4) = 64, must be 32" in captured.err


def test_set_overrides_a_named_point(capsys):
    assert main(["emit", "v4", "--set", "BK=16", "--gpu", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "warp_128x128x16_w64x32_t8x8_b2_fp32(" in out
    assert "parameters : BM=128, BN=128, BK=16, WM=64, WN=32, TM=8, TN=8, buffers=2" in out


def test_the_regenerate_line_reproduces_the_source(capsys):
    assert main(["emit", "v5", "--gpu", "sm_89", "--harness"]) == 0
    first = capsys.readouterr().out
    command = first.splitlines()[2].removeprefix("//").strip()
    assert command.startswith("gemmgen emit ")
    assert main(shlex.split(command)[1:]) == 0
    assert capsys.readouterr().out == first


def test_without_gpu_flag_the_detected_gpu_is_the_target(capsys, monkeypatch):
    monkeypatch.setattr(gemmgen.cli.args, "detect_arch", lambda: parse_arch("sm_89"))
    assert main(["emit", "v1"]) == 0
    captured = capsys.readouterr()
    assert "target     : sm_89" in captured.out
    assert captured.err == ""


def test_without_gpu_flag_or_gpu_sm90_is_the_target(capsys, monkeypatch):
    monkeypatch.setattr(gemmgen.cli.args, "detect_arch", lambda: None)
    assert main(["emit", "v1"]) == 0
    captured = capsys.readouterr()
    assert "target     : sm_90" in captured.out
    assert "no GPU detected" in captured.err and "sm_90" in captured.err


def test_list_shows_every_family_parameter_and_named_point(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for fam in FAMILIES.values():
        assert f"family {fam.name}: {fam.doc}" in lines
        assert f"  precisions: {', '.join(fam.precisions)}" in lines
        for p in fam.params:
            choices = ", ".join(str(c) for c in p.choices)
            assert any(line.split()[:3] == [p.name, "default", str(fam.defaults[p.name])]
                       and f"one of {{{choices}}}" in line for line in lines), (fam.name, p.name)
    for point in NAMED_POINTS.values():
        assert any(line.split()[:2] == [point.name, point.config().name] for line in lines), point.name


def test_list_one_family(capsys):
    assert main(["list", "--family", "wmma"]) == 0
    out = capsys.readouterr().out
    assert "family wmma:" in out
    assert "family warp:" not in out
    listed = [line.split()[0] for line in out.split("named points:")[1].splitlines()
              if line.strip() and not line.strip().startswith("note:")]
    assert listed == ["v5", "v6"]


def test_output_file(capsys, tmp_path):
    target = tmp_path / "v4.cu"
    assert main(["emit", "v4", "--gpu", "sm_90", "-o", str(target)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert str(target) in err
    assert target.read_text() == render_kernel(resolve_point("v4", "sm_90"))


def test_output_file_is_not_written_on_error(capsys, tmp_path):
    target = tmp_path / "bad.cu"
    assert main(["emit", "v4", "--set", "BM=100", "--gpu", "sm_90", "-o", str(target)]) == 2
    assert not target.exists()


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gemmgen {gemmgen.__version__}"


def test_python_m_gemmgen_emits_what_gemmgen_emit_does(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "gemmgen", "emit", "v4", "--gpu", "sm_90"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == render_kernel(resolve_point("v4", "sm_90"))  # which test_build compiles


@pytest.mark.nvcc
def test_build_command_reports_registers(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path))
    assert main(["build", "v1", "--gpu", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("naive_b16x16_fp32 for sm_90: ")
    assert "threads 256, dynamic shared memory 0 bytes" in out
    assert "registers " in out and "spill stores 0 bytes" in out
    assert main(["build", "v1", "--gpu", "sm_90"]) == 0
    assert "sm_90: cached" in capsys.readouterr().out


def test_output_to_an_unwritable_path_is_one_message(capsys, tmp_path):
    code = main(["emit", "v4", "--gpu", "sm_90", "-o", str(tmp_path / "missing" / "x.cu")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"gemmgen: error: argument -o/--output: cannot write {tmp_path}/missing/x.cu: folder {tmp_path}/missing " \
           "does not exist" in err


@pytest.mark.parametrize("command", [["emit", "--dispatch", "--precision", "fp16", "--shape", "4096"],
                                     ["emit", "best", "--precision", "fp16", "--shape", "4096"],
                                     ["plot", "suite"]])
def test_output_is_checked_before_any_work(capsys, tmp_path, command):
    """-o names a file in a folder that does not exist: refused before the database (which does
    not exist either) is opened, or a dispatcher planned."""
    missing = tmp_path / "missing"
    assert main([*command, "--gpu", "sm_90", "--db", str(missing / "r.db"), "-o", str(missing / "out.cu")]) == 2
    err = capsys.readouterr().err
    assert err == f"gemmgen: error: argument -o/--output: cannot write {missing}/out.cu: folder {missing} does not " \
                  "exist\n"
    assert not missing.exists()


def test_the_docs_name_each_named_point_by_its_canonical_name():
    """docs/families.md's named-point table is written by hand: it must say what `gemmgen list` says."""
    import re

    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \|", (REPO / "docs" / "families.md").read_text(), re.MULTILINE)
    table = dict(rows)
    assert set(table) == set(NAMED_POINTS)
    for point, name in table.items():
        assert name == resolve_point(point).name, point


NT_GELU_OPTIONS = ["--trans", "nt", "--out", "bf16", "--bias", "col", "--act", "gelu"]


def test_emit_a_variant_by_options_or_by_set(capsys):
    """`--trans nt --out bf16 --bias col --act gelu` and `--set trans=nt,...` name one kernel; the
    regenerate line (which says it with --set) reproduces it."""
    from gemmgen.describe.config import make_config
    from gemmgen.describe.points import point_spec

    assert main(["emit", "hopper_bf16", "--set", "overlap=0", *NT_GELU_OPTIONS, "--gpu", "sm_90"]) == 0
    by_options = capsys.readouterr().out
    assert main(["emit", "hopper_bf16", "--set", "overlap=0,trans=nt,out=bf16,bias=col,act=gelu", "--gpu",
                 "sm_90"]) == 0
    assert capsys.readouterr().out == by_options
    assert main(["emit", "hopper_bf16", "--set", "overlap=0,trans=nt,out=bf16", "--bias", "col", "--act", "gelu",
                 "--trans", "nt", "--gpu", "sm_90"]) == 0  # both, agreeing
    assert capsys.readouterr().out == by_options
    params = {**point_spec("hopper_bf16")[2], "overlap": 0, "trans": "nt", "out": "bf16", "bias": "col",
              "act": "gelu"}
    config = make_config("hopper", params, "bf16", "sm_90")
    assert config.name == "hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol_gelu"
    assert by_options == render_kernel(config)
    command = by_options.splitlines()[2].removeprefix("//").strip()
    assert main(shlex.split(command)[1:]) == 0 and capsys.readouterr().out == by_options
    # a canonical name says its variant; an option given with it changes it
    assert main(["emit", config.name, "--gpu", "sm_90"]) == 0 and capsys.readouterr().out == by_options
    assert main(["emit", config.name, "--act", "none", "--gpu", "sm_90"]) == 0
    assert "hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol(" in capsys.readouterr().out


def test_emit_harness_of_a_variant(capsys):
    """--harness goes with every variant; the regenerate line carries both."""
    from gemmgen.describe.config import make_config

    argv = ["emit", "--family", "mma", "--precision", "fp16", "--trans", "tn", "--out", "fp16", "--gpu", "sm_90",
            "--harness"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.count("int main(") == 1
    assert out == render_kernel(make_config("mma", {"trans": "tn", "out": "fp16"}, "fp16", "sm_90"), harness=True)
    command = out.splitlines()[2].removeprefix("//").strip()
    assert "trans=tn,out=fp16" in command and command.endswith("--harness")
    assert main(shlex.split(command)[1:]) == 0 and capsys.readouterr().out == out


@pytest.mark.parametrize("command", ["emit", "build", "bench", "tune", "best", "results"])
def test_every_command_that_takes_a_variant_takes_the_same_four_options(command):
    """One function adds them (gemmgen.cli.args.add_variant_arguments): the same choices everywhere."""
    from gemmgen.describe.problem import ACTIVATIONS, BIASES, LAYOUTS, OUTPUTS

    parser = gemmgen.cli.main.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    choices = {a.dest: tuple(a.choices) for a in sub._actions if a.dest in ("trans", "out", "bias", "act")}
    assert choices == {"trans": LAYOUTS, "out": OUTPUTS, "bias": BIASES, "act": ACTIVATIONS}


def test_results_and_best_narrow_to_a_variant(capsys, tmp_path):
    from stored import store

    from gemmgen.describe.problem import Shape
    from gemmgen.store.db import ResultsDB

    url = f"sqlite:///{tmp_path / 'r.db'}"
    db = ResultsDB(url)
    shape = Shape(64, 64, 64)
    plain, nt, gelu = ("hopper_64x128_c1_s5_bf16", "hopper_64x128_c1_s5_bf16_nt_obf16",
                       "hopper_64x128_c1_s5_bf16_nt_obf16_bcol_gelu")
    for name, tflops in ((plain, 30.0), (nt, 20.0), (gelu, 10.0)):
        store(db, name, "hopper", "bf16", shape, tflops)
    db.close()
    columns = ["--format", "csv", "--db", url]
    assert main(["results", *columns]) == 0
    assert [line.split(",")[0] for line in capsys.readouterr().out.splitlines()[1:]] == [plain, nt, gelu]
    assert main(["results", "--trans", "nt", *columns]) == 0
    assert [line.split(",")[0] for line in capsys.readouterr().out.splitlines()[1:]] == [nt, gelu]
    assert main(["results", "--act", "gelu", *columns]) == 0
    assert [line.split(",")[0] for line in capsys.readouterr().out.splitlines()[1:]] == [gelu]
    for options, winner in (([], plain), (["--trans", "nt", "--out", "bf16"], nt), (NT_GELU_OPTIONS, gelu)):
        assert main(["best", "--precision", "bf16", "--shape", "64", "--gpu", "sm_90", *options, "--db", url]) == 0
        assert capsys.readouterr().out.startswith(f"{winner}, ")
    assert main(["best", "--precision", "bf16", "--shape", "64", "--gpu", "sm_90", "--act", "relu", "--db", url]) == 2
    assert "no verified bf16 (nn fp32 none relu) kernel at 64x64x64 for sm_90" in capsys.readouterr().err


def test_a_bench_run_fails_on_a_kernel_not_on_a_baseline_cublas_cannot_compute():
    from gemmgen.cli.measuring import measured_ok

    cublas, kernel = {"point": "cublas", "status": "ok"}, {"point": "hopper_e4m3", "status": "ok"}
    assert measured_ok([cublas, kernel])
    assert measured_ok([{**cublas, "status": "infeasible"}, kernel])  # no cuBLASLt algorithm at 1000^3 FP8
    assert not measured_ok([cublas, {**kernel, "status": "wrong_result"}])
    assert not measured_ok([{**cublas, "status": "launch_error"}, kernel])
