"""On the GPU: a short real tune of the warp family stores its trials and starts from v4."""

import optuna
import pytest

from gemmgen.describe.problem import Shape
from gemmgen.tune.space import load_space

pytestmark = pytest.mark.gpu


def test_short_warp_tune_stores_trials_and_matches_v4(tmp_path):
    pytest.importorskip("pycuda.driver", reason="PyCUDA is needed for the runtime tests")
    from gemmgen.measure.bench import Bench
    from gemmgen.measure.device import Gpu
    from gemmgen.store.db import ResultsDB
    from gemmgen.tune import Tuner

    url = f"sqlite:///{tmp_path / 'tune.db'}"
    with Gpu() as gpu:
        db = ResultsDB(url)
        bench = Bench(gpu, db, tag="gpu-test", seed=0, min_total_ms=20.0)
        try:
            tuner = Tuner(bench, load_space("warp"), "fp32", gpu.info.arch, [Shape(1024, 1024, 1024)],
                          study="gpu-test", storage=url, seed=0, jobs=4, log=print)
            report = tuner.run(10)
        finally:
            bench.close()
    assert report.trials == 10 and "v4" in report.named
    assert report.best.tflops >= report.named["v4"]
    trials = optuna.load_study(study_name="gpu-test", storage=url).trials
    measured = [t for t in trials if t.state.name != "PRUNED"]  # pruned: infeasible, not counted
    assert len(measured) == 10
    # every trial is stored: one row per measured kernel (one shape) and the cuBLAS baseline; a
    # trial's state follows its row's status
    final = db.results(tag="gpu-test:final")  # the best re-timed in alternation with cuBLAS at the end
    assert {r.kernel for r in final} == {r.name for r in report.retimed} | {"cublas_fp32"}
    assert report.retimed[0].ratio == max(r.ratio for r in report.retimed) > 0
    stored = db.results(tag="gpu-test")  # the trials' own rows
    rows = {r.kernel: r for r in stored}
    measured_rows = [r for r in stored if r.status != "infeasible"]
    assert len({r.kernel for r in measured_rows}) == len(measured_rows)  # nothing measured twice
    assert {t.user_attrs["kernel"] for t in trials} | {"cublas_fp32"} == set(rows)
    for t in measured:
        row = rows[t.user_attrs["kernel"]]
        assert (t.state.name == "COMPLETE") == (row.status == "ok"), (t.user_attrs, row.status)
        if row.status == "ok":
            assert t.value == pytest.approx(row.tflops)
    assert rows["warp_128x128x8_w64x32_t8x8_b2_fp32"].status == "ok"


def test_device_workers_share_one_study_and_count(tmp_path):
    """The --devices path (one process per GPU, a shared trial count, the parent re-timing the best),
    on GPU 0 alone: the trials asked are the trials done, and the best is re-timed against cuBLAS."""
    pytest.importorskip("pycuda.driver", reason="PyCUDA is needed for the runtime tests")
    from gemmgen.tune.devices import TuneSpec, _tune_in_processes
    from gemmgen.tune.progress import Progress

    url = f"sqlite:///{tmp_path / 'devices.db'}"
    spec = TuneSpec("warp", "fp32", (Shape(512, 512, 512),), url, "devices", "random", 1, 6, None, 4, 120.0, None)
    events = []
    progress = Progress(6, ["GPU0"], live=False)
    report = _tune_in_processes(spec, [0], lambda e: (events.append(e), progress(e)))
    assert report.trials == 6 and not report.interrupted
    assert sum(1 for e in events if e["event"] == "trial") == 6 and all(e["device"] == "GPU0" for e in events)
    trials = optuna.load_study(study_name="devices", storage=url).trials
    assert sum(1 for t in trials if t.state.name == "COMPLETE") == 6
    assert report.retimed and report.retimed[0].ratio > 0


WORKLOAD = """
precisions = ["fp32"]
[[shape]]
m = [256, 512]
n = 512
k = 512
"""


def test_the_workload_device_workers_tune_on_the_gpus_present(tmp_path):
    """tune.node's path on real GPUs (every GPU present; on one GPU its single worker): each GPU's
    worker makes its CUDA context, the shared pool runs nvcc, each shape gets its trials, is
    re-timed against cuBLAS and says which GPUs tuned it, and no point is measured twice."""
    pytest.importorskip("pycuda.driver", reason="PyCUDA is needed for the runtime tests")
    from gemmgen.describe.arch import detect_arch
    from gemmgen.describe.workload import load_workload
    from gemmgen.measure.device import device_count
    from gemmgen.store.db import ResultsDB
    from gemmgen.tune.devices import TuneSpec
    from gemmgen.tune.node import tune_on_devices
    from gemmgen.tune.progress import Progress
    from gemmgen.tune.workload import plan

    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD)
    workload, url = load_workload(path), f"sqlite:///{tmp_path / 'tune.db'}"
    devices, arch = list(range(device_count())), detect_arch()
    spec = TuneSpec("", "", (), url, None, "random", 1, 4, None, 4, 120.0, None)
    names = [f"GPU{d}" for d in devices]
    results, interrupted = tune_on_devices(workload, plan(workload, None, "warp", arch), arch, spec, devices,
                                           lambda total: Progress(total, names, live=False), print)
    assert not interrupted and [r.trials for r in results] == [4, 4]
    assert all(r.ratio and r.ratio > 0 and r.note.startswith("tuned on GPU") for r in results)
    assert sum(u.trials for r in results for u in r.devices.values()) == 8
    assert all(u.measuring_s > 0 for r in results for u in r.devices.values())
    with ResultsDB(url, create=False) as db:
        rows = [(r.kernel, r.M) for r in db.results() if r.tag and not r.tag.endswith(":final")
                and not r.kernel.startswith("cublas")]
    assert len(rows) == len(set(rows))
