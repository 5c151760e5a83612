"""Many tuners on one study, without a GPU: tuner processes (tune_worker.py, the fake GPU step) on
a fresh SQLite file and on a fresh database of a real PostgreSQL server started by the test
session. On SQLite once in every run; on both twenty times over in the slow run (the soak,
`pytest -m slow`), which also runs the tests below on PostgreSQL:
no process crashes, every trial ends told (none left running or waiting), the trials add up to
what the tuners report, and no point is measured twice. Then, in the slow run with the other
fault tests, a tuner killed with SIGKILL in the middle of a measurement: its trial goes stale,
another tuner fails it, Optuna enqueues it again, and that tuner takes the claim over and
measures it."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

from gemmgen.store.db import ResultsDB

WORKER = Path(__file__).with_name("tune_worker.py")
SOAK = 20  # repetitions of the slow run: the races are rare


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def fresh_url(request, tmp_path):
    """A function giving the URL of a fresh, empty database of the parameter's kind (PostgreSQL's
    in the slow run: each of these tests starts tuner processes for 10-12 s)."""
    if request.param == "sqlite":
        counter = iter(range(10**6))
        return lambda: f"sqlite:///{tmp_path / f'study{next(counter)}.db'}"
    return request.getfixturevalue("postgres")


def start(url: str, study: str, trials: int, seed: int, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), url, study, str(trials), str(seed), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"a tuner crashed (exit {proc.returncode}):\n{err}"
    return json.loads(out.strip().splitlines()[-1])


def measured_rows(url: str) -> Counter:
    """How often each kernel was measured, by the rows recorded (the fake bench records one per
    measurement)."""
    with ResultsDB(url, create=False) as db:
        return Counter(r.kernel for r in db.results() if not r.kernel.startswith("cublas"))


@pytest.mark.parametrize("repetitions", [1, pytest.param(SOAK, marks=pytest.mark.slow)], ids=["once", "soak"])
def test_tuners_starting_together_on_a_fresh_study_never_crash_and_account_for_every_trial(fresh_url, repetitions):
    for repetition in range(repetitions):
        url = fresh_url()
        procs = [start(url, "shared", 4, seed) for seed in range(3)]
        reports = [finish(p) for p in procs]
        trials = optuna.load_study(study_name="shared", storage=url).trials
        states = Counter(t.state.name for t in trials)
        assert set(states) <= {"COMPLETE", "FAIL"}, (repetition, states)  # nothing left running or waiting
        assert states["COMPLETE"] == sum(r["trials"] for r in reports) == 12, (repetition, states, reports)
        measured = [name for r in reports for name in r["measured"]]
        assert len(measured) == len(set(measured)), f"repetition {repetition}: a point measured twice: {measured}"
        assert all(count == 1 for count in measured_rows(url).values())
        # every trial names its point, and each point measured is a trial's
        assert set(measured) <= {t.user_attrs["kernel"] for t in trials}


@pytest.mark.slow
def test_a_killed_tuners_trial_is_retried_by_another(fresh_url, tmp_path):
    url, marker = fresh_url(), tmp_path / "measuring"
    doomed = start(url, "s", 3, 0, "--sleep", "60", "--marker", str(marker), "--heartbeat", "1", "--grace", "3")
    deadline = time.monotonic() + 120
    while not (marker.exists() and marker.read_text().strip()):
        assert doomed.poll() is None and time.monotonic() < deadline, doomed.stderr.read() if doomed.stderr else ""
        time.sleep(0.1)
    victim = marker.read_text().split()[0]  # the point it was measuring when it died
    os.killpg(doomed.pid, signal.SIGKILL)  # the tuner and its compile workers: a machine lost
    doomed.wait()
    time.sleep(4)  # past the grace period: the trial's heartbeat has stopped
    report = finish(start(url, "s", 2, 1, "--heartbeat", "1", "--grace", "3"))
    trials = optuna.load_study(study_name="s", storage=url).trials
    # the trials the dead tuner held (the one it measured, and those it had asked ahead) went
    # stale: failed, each retried once and measured by the other tuner
    dead = [t for t in trials if t.state.name == "FAIL" and "kernel" not in t.user_attrs]  # never told
    assert dead, [(t.number, t.state.name, t.user_attrs) for t in trials]
    for t in dead:
        retry = [r for r in trials if r.system_attrs.get("failed_trial") == t.number]
        assert len(retry) == 1 and retry[0].state.name == "COMPLETE", (t.number, retry)
    retried = {r.user_attrs["kernel"] for r in trials if "failed_trial" in r.system_attrs}
    assert victim in retried and victim in report["measured"] and measured_rows(url)[victim] == 1
    assert {t.state.name for t in trials} <= {"COMPLETE", "FAIL"}
