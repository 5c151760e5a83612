"""`gemmgen tune --workload FILE --devices 0,1` without GPUs: the real device workers, compile pool
and shared trial counts of tune.node, with fake GPUs (fakes.FakeDevice and kin: each measurement
sleeps, then records into a real results database) and fake compiles, on SQLite in tmp_path.
What the schedule does with realistic timings at 2 to 8 GPUs is test_tune_schedule.py's. The
tests of a run interrupted or killed (Ctrl-C, a worker or the main process killed) or of a GPU that
cannot be opened are in the slow run (`pytest -m slow`, which CI runs too), with the other fault and soak tests."""

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import fakes
import optuna
import pytest
from test_workload import STUDY, TINY, finished, trials_of, write

import gemmgen.measure.device
import gemmgen.tune.loop
import gemmgen.tune.node
from gemmgen.cli.main import main
from gemmgen.store.db import ResultsDB
from gemmgen.tune.node import _Compiles

SHAPES = ["64x256x256", "128x256x256", "64x512x256"]  # TINY's, in the report's order
ONE = """
precisions = ["bf16"]
[[shape]]
m = 64
n = 256
k = 256
"""


@pytest.fixture
def two_gpus(monkeypatch):
    """Two fake GPUs; returns a function that picks the device class the workers use."""
    monkeypatch.setattr(gemmgen.measure.device, "device_count", lambda: 2)
    monkeypatch.setattr(gemmgen.tune.loop, "_compile", fakes.fake_compile)
    monkeypatch.setattr(gemmgen.tune.node, "Device", fakes.FakeDevice)
    return lambda cls: monkeypatch.setattr(gemmgen.tune.node, "Device", cls)


def argv(path, url, trials=4):
    return ["tune", "--workload", str(path), "--family", "wmma", "--gpu", "sm_90", "--trials", str(trials),
            "--sampler", "random", "--seed", "1", "--jobs", "2", "--devices", "0,1", "--db", url]


def measured_twice(url) -> list:
    """(kernel, shape) pairs measured more than once by trials (the final re-timing apart)."""
    with ResultsDB(url, create=False) as db:
        rows = Counter((r.kernel, (r.M, r.N, r.K)) for r in db.results()
                       if not r.kernel.startswith("cublas") and not (r.tag or "").endswith(":final"))
    return [key for key, n in rows.items() if n > 1]


def gpu_lines(out: str) -> dict:
    """The report's per-GPU lines: GPU name -> (trials, measured s, waited s)."""
    found = re.findall(r"^  (GPU\d): (\d+) trials; measured ([\d.]+) s \([\d.]+%\), waited ([\d.]+) s", out, re.M)
    return {name: (int(n), float(m), float(w)) for name, n, m, w in found}


def test_two_gpus_tune_a_workload_each_shape_once_seeded_and_say_what_each_did(tmp_path, capsys, two_gpus):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    assert main(argv(path, url)) == 0
    out, err = capsys.readouterr()
    assert [len(finished(url, s)) for s in SHAPES] == [4, 4, 4]
    assert measured_twice(url) == []
    for shape in SHAPES:  # each shape re-timed once, by one GPU
        study = optuna.load_study(study_name=STUDY.format(shape), storage=url)
        assert study.user_attrs[gemmgen.tune.loop.RETIMED_ATTR]
    # hand-out order: each layer's largest shape first (128x256x256 and 64x512x256 on the two GPUs),
    # then 64x256x256, seeded from what its neighbours' studies held when it started
    assert "[1/3] wmma bf16 128x256x256 (a): 4 trials on GPU" in err
    assert "[2/3] wmma bf16 64x512x256 (b): 4 trials on GPU" in err
    assert re.search(r"\[3/3\] wmma bf16 64x256x256 \(a\): 4 trials on GPU\d; first \d winners at other shapes: "
                     r"\S+ at 128x256x256", err)
    assert any("seeded_from" in t.user_attrs for t in trials_of(url, "64x256x256"))
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] and line.split()[0] in SHAPES}
    assert all(re.search(r"tuned on GPU[01]", rows[s]) for s in SHAPES), rows
    assert re.search(r"tuned on GPU[01], \d seeded$", rows["64x256x256"])
    gpus = gpu_lines(out)
    assert set(gpus) == {"GPU0", "GPU1"} and sum(n for n, _, _ in gpus.values()) == 12
    assert all(n > 0 and m > 0.02 * n for n, m, _ in gpus.values())  # each measured (0.02 s a measurement)

    # again: every study has its trials; no worker is started, nothing measured
    assert main(argv(path, url)) == 0
    out, err = capsys.readouterr()
    assert sum(1 for line in out.splitlines() if line.endswith(" skipped")) == 3
    assert "compile workers shared" not in err and "per GPU" not in out


def test_two_gpus_on_one_shape_share_its_count_of_trials_and_never_measure_a_point_twice(tmp_path, capsys,
                                                                                           two_gpus):
    path, url = write(tmp_path, ONE), f"sqlite:///{tmp_path / 'tune.db'}"
    assert main(argv(path, url, trials=16)) == 0
    out, err = capsys.readouterr()
    assert re.search(r"\[1/1\] wmma bf16 64x256x256: 16 trials on GPU(\d)", err)
    assert re.search(r"\[1/1\] wmma bf16 64x256x256: GPU\d joins \(1[0-6] trials left\)", err)
    assert len(finished(url, "64x256x256")) == 16 and measured_twice(url) == []
    gpus = gpu_lines(out)
    assert sum(n for n, _, _ in gpus.values()) == 16 and all(n > 0 for n, _, _ in gpus.values()), gpus
    assert re.search(r"^64x256x256 .* tuned on GPU[01]\+GPU[01]$", out, re.M)


@pytest.mark.slow
def test_ctrl_c_stops_every_gpu_after_its_trial_and_the_run_resumes(tmp_path, capsys, two_gpus):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    two_gpus(fakes.InterruptingDevice)
    assert main(argv(path, url, trials=6)) == 130
    out, err = capsys.readouterr()
    assert "stopping after the trials being measured" in err
    assert "interrupted: every trial so far is stored; run the same command again to go on" in out
    for shape in SHAPES:  # every trial asked was told (a shape not reached has no study)
        try:
            trials = trials_of(url, shape)
        except KeyError:
            continue
        assert not [t.number for t in trials if t.state.name == "RUNNING"], shape
    assert any(line.startswith("128x256x256") and line.endswith("interrupted") for line in out.splitlines())
    two_gpus(fakes.FakeDevice)
    assert main(argv(path, url, trials=6)) == 0
    assert [len(finished(url, s)) for s in SHAPES] == [6, 6, 6]
    assert measured_twice(url) == []


@pytest.mark.slow
def test_a_gpu_that_cannot_be_opened_leaves_the_run_to_the_others(tmp_path, capsys, two_gpus):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    two_gpus(fakes.UnopenableDevice)
    assert main(argv(path, url)) == 0
    out, err = capsys.readouterr()
    assert "GPU1 failed: GPU 1 is a fake of another architecture" in err
    assert [len(finished(url, s)) for s in SHAPES] == [4, 4, 4]
    assert sum(1 for line in out.splitlines() if line.endswith("tuned on GPU0") or "tuned on GPU0," in line) == 3
    assert gpu_lines(out)["GPU1"][:2] == (0, 0.0)


@pytest.mark.slow
def test_a_gpu_whose_worker_dies_hands_its_shape_to_another(tmp_path, capsys, two_gpus):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    two_gpus(fakes.DyingDevice)
    assert main(argv(path, url)) == 0
    out, err = capsys.readouterr()
    assert "GPU1 failed: its worker process exited (code 9)" in err
    assert [len(finished(url, s)) for s in SHAPES] == [4, 4, 4]
    assert measured_twice(url) == []


def processes_with(token: str) -> list[int]:
    """The processes whose environment holds ``token`` (a run's, and what it started)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and token.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")
def test_a_run_whose_main_process_is_killed_leaves_no_process_behind_and_keeps_what_it_measured(tmp_path):
    """SIGKILL of the main process (the machine's OOM killer, a lost session): its GPU workers see it
    gone and stop, the compile processes end; every measurement made is in the database."""
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    token = f"GEMMGEN_TEST_RUN={uuid.uuid4().hex}"
    env = {**os.environ, token.split("=")[0]: token.split("=")[1]}
    main_process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("tune_node_main.py")), "2",
                                     *argv(path, url, trials=40)], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "tune.db").exists() or not measured_rows(url):
        assert main_process.poll() is None and time.monotonic() < deadline, "no measurement within 120 s"
        time.sleep(0.2)
    assert len(processes_with(token)) > 3  # the main process, two GPU workers, compile processes, ...
    before = measured_rows(url)
    main_process.kill()
    main_process.wait()
    deadline = time.monotonic() + 30
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with(token)
    commands = [Path(f"/proc/{pid}/cmdline").read_bytes()[:100] for pid in left]
    for pid in left:  # not to leave them to other tests
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes of the killed run still alive: {commands}"
    assert before <= measured_rows(url)  # what was measured is kept (and a worker may have finished its trial)


def measured_rows(url) -> set:
    """The trials' measurements stored: (kernel, M, N, K, id)."""
    try:
        with ResultsDB(url, create=False) as db:
            return {(r.kernel, r.M, r.N, r.K, r.measurement_id) for r in db.results()
                    if not r.kernel.startswith("cublas")}
    except Exception:  # noqa: BLE001 (not created yet)
        return set()


def test_every_gpu_failing_is_one_message_and_exit_2(tmp_path, capsys, two_gpus):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    two_gpus(fakes.NoDevice)
    assert main(argv(path, url)) == 2
    _, err = capsys.readouterr()
    assert err.strip().splitlines()[-1] == ("gemmgen: error: every GPU failed: GPU0: GPU 0 cannot be opened; GPU1: "
                                            "GPU 1 cannot be opened")


def test_jobs_below_one_is_one_message_and_exit_2(tmp_path, capsys, two_gpus):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    assert main([*argv(path, url), "--jobs", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gemmgen: error: --jobs must be at least 1 (compile workers; leave it out for one per CPU core)")
    assert not (tmp_path / "tune.db").exists()


def test_fill_points_below_zero_is_one_message_and_exit_2(tmp_path, capsys, two_gpus):
    path, url = write(tmp_path, TINY), f"sqlite:///{tmp_path / 'tune.db'}"
    assert main([*argv(path, url), "--fill", "--fill-points", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "gemmgen: error: --fill-points must be at least 0 (0: explore no new token counts, only check the "
        "dispatcher's choices that rest on no measurement); got -1")
    assert not (tmp_path / "tune.db").exists()


def test_the_compile_pool_compiles_a_point_asked_for_at_once_by_two_gpus_once(tmp_path):
    context = multiprocessing.get_context("spawn")
    inboxes = {"GPU0": context.Queue(), "GPU1": context.Queue()}
    compiles = _Compiles(1, context, inboxes)
    try:
        args = ("wmma", {"BM": 64, "BN": 64}, "bf16", "sm_90", 1.0)
        compiles.requests.put(("GPU0", 7, fakes.slow_build, args))
        compiles.requests.put(("GPU1", 3, fakes.slow_build, ("wmma", {"BN": 64, "BM": 64}, "bf16", "sm_90", 1.0)))
        compiles.requests.put(("GPU1", 4, fakes.slow_build, ("wmma", {"BM": 32, "BN": 64}, "bf16", "sm_90", 1.0)))
        got = [inboxes["GPU0"].get(timeout=60), inboxes["GPU1"].get(timeout=60), inboxes["GPU1"].get(timeout=60)]
    finally:
        compiles.close()
    assert got[0] == ("built", 7, got[0][2], None) and got[0][2].startswith("built BM=64,BN=64 in ")
    assert got[1] == ("built", 3, got[0][2], None)  # the same build: one compile for both
    assert got[2][:2] == ("built", 4) and got[2][2].startswith("built BM=32,BN=64 in ")
    assert (compiles.compiles, compiles.shared) == (2, 1)
