"""Test markers: `gpu` tests skip where there is no NVIDIA GPU, `nvcc` tests where nvcc is absent.
This is the one place that decides; tests only mark themselves.

Shared fixtures: `build_cache` (a fresh build cache per module) and `bench` (a Bench on GPU 0 with
its own database per module; a module may set BENCH_SEED and BENCH_TAG).
"""

import shutil
import subprocess
from functools import lru_cache

import pytest

from gemmgen.build import find_tool
from gemmgen.errors import ToolNotFound


@lru_cache(maxsize=None)
def nvcc_missing() -> str | None:
    try:
        find_tool("nvcc")
        return None
    except ToolNotFound as err:
        return str(err)


@lru_cache(maxsize=None)
def gpu_missing() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "no NVIDIA GPU here (nvidia-smi not found); run `pytest -m gpu` on the GPU machine"
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    if out.returncode != 0 or "GPU" not in out.stdout:
        return f"no NVIDIA GPU visible to nvidia-smi: {out.stdout.strip() or out.stderr.strip()}"
    return nvcc_missing()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and gpu_missing():
            item.add_marker(pytest.mark.skip(reason=gpu_missing()))
        elif "nvcc" in item.keywords and nvcc_missing():
            item.add_marker(pytest.mark.skip(reason=f"nvcc not available: {nvcc_missing()}"))


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory):
    """A fresh GEMMGEN_CACHE for the module: tests never read or write ~/.cache."""
    folder = tmp_path_factory.mktemp("gemmgen-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMGEN_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def bench(request, tmp_path_factory):
    """A Bench on GPU 0 recording into a database of the module's own (short timings)."""
    pytest.importorskip("pycuda.driver", reason="PyCUDA is needed for the runtime tests")
    from gemmgen.db import ResultsDB
    from gemmgen.measure import Bench
    from gemmgen.runtime import Gpu

    db = ResultsDB(f"sqlite:///{tmp_path_factory.mktemp('db') / 'test.db'}")
    gpu = Gpu()
    b = Bench(gpu, db, tag=getattr(request.module, "BENCH_TAG", "test"), seed=getattr(request.module, "BENCH_SEED", 1),
              min_total_ms=5.0)
    yield b
    b.close()
    gpu.close()
