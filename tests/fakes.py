"""A stand-in for the GPU step of tuning, for the GPU-free tuner tests (test_tune.py) and for
worker processes they start (tune_worker.py): deterministic speeds, real database records."""

import time

from gemmgen.arch import parse_arch
from gemmgen.build import BuildResult
from gemmgen.config import make_config
from gemmgen.db import ResultsDB
from gemmgen.measure import Measured, cublas_name, timed_problem_id
from gemmgen.problem import Shape, Variant
from gemmgen.render import render_kernel, source_hash
from gemmgen.runtime import Timing

SM90 = parse_arch("sm_90")
SHAPES = [Shape(256, 256, 256)]


def fake_tflops(config) -> float:
    """Deterministic 'speed': bigger tiles and double buffering are faster."""
    p, g = config.params, config.geometry
    return g.tile_m * g.tile_n / 1000.0 + p.get("buffers", 1) + p.get("BK", 0) / 100.0


def fake_compile(family, params, precision, arch, timeout_s):
    """No compile: the result's key is the name of the kernel the worker was asked for, which
    FakeBench checks against the kernel it measures."""
    return BuildResult(True, make_config(family, params, precision, arch).name, "")


class FakeBench:
    """Stands in for gemmgen.measure.Bench: same interface, no GPU; records like the real one.
    ``sleep_s``: how long a measurement takes; ``marker``: a file touched when one starts."""

    gpu = None
    batch_count = 1  # the products of a batched variant's launch (Bench.batch_count); its rows say so

    def __init__(self, db: ResultsDB, wrong: set[str] = frozenset(), sleep_s: float = 0.0, marker: str | None = None):
        self.db, self.wrong, self.measured, self.stop_after, self.tuner = db, wrong, [], None, None
        self.sleep_s, self.marker = sleep_s, marker
        self.interleave, self.give_ups, self.retimed, self.baselines = False, [], [], []
        self.device_id = db.device(name="Fake GPU", arch="sm_90", sm_count=1, clock_mhz=1, memory_clock_mhz=1,
                                   driver_version="0", cuda_version="0")

    def measure_cublas(self, precision, shape, variant=Variant()):
        self.baselines.append((precision, shape, variant))
        return Measured("cublas", cublas_name(precision, variant), precision, shape, "ok", Timing(1.0, 1.0, 1.0, 1),
                        variant=variant)

    def measure_point(self, label, config, shape, build=None, give_up_ms=None):
        # trials' measurements; the re-timing at the end (in alternation with cuBLAS) apart
        if build is not None and build.key != config.name:  # the compile worker built another kernel
            raise AssertionError(f"measuring {config.name}, built {build.key}")
        (self.retimed if self.interleave else self.measured).append(config.name)
        if self.marker:
            with open(self.marker, "a") as f:
                f.write(config.name + "\n")
        time.sleep(self.sleep_s)
        self.give_ups.append(give_up_ms)
        status = "wrong_result" if config.name in self.wrong else "ok"
        ms = shape.flops / (fake_tflops(config) * 1e12) * 1e3
        cut = give_up_ms is not None and ms > give_up_ms
        m = Measured(label, config.name, config.precision, shape, status,
                     Timing(ms, ms, ms, 5 if cut else 10) if status == "ok" else None, 1e-7, cut=cut,
                     baseline=Timing(1.0, 1.0, 1.0, 10) if self.interleave else None)
        kernel_id = self.db.kernel(name=config.name, family=config.family.name, precision=config.precision,
                                   arch=config.arch.name, params=config.params,
                                   source_hash=source_hash(render_kernel(config)))
        self.db.record(kernel_id=kernel_id, device_id=self.device_id,
                       problem_id=timed_problem_id(self.db, shape), status=status,
                       median_ms=m.timing.median_ms if m.timing else None, tflops=m.tflops, tag="test",
                       batch_count=self.batch_count if config.variant.batched else 1)
        if self.stop_after and len(self.measured) == self.stop_after:
            self.tuner.request_stop()
        return m
