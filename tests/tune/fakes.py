"""A stand-in for the GPU step of tuning, for the GPU-free tuner tests (test_tune.py) and for
worker processes they start (tune_worker.py, tune.node's device workers: FakeDevice and its kin):
deterministic speeds, real database records."""

import os
import signal
import time

from gemmgen.build.nvcc import BuildResult
from gemmgen.codegen.render import render_kernel, source_hash
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.points import resolve_point
from gemmgen.describe.problem import Shape, Variant
from gemmgen.measure.outcome import Measured, cublas_name, timed_problem_id
from gemmgen.measure.timing import Timing
from gemmgen.store.db import ResultsDB

SM90 = parse_arch("sm_90")
SHAPES = [Shape(256, 256, 256)]


def fake_tflops(config) -> float:
    """Deterministic 'speed': bigger tiles and double buffering are faster."""
    p, g = config.params, config.geometry
    return g.tile_m * g.tile_n / 1000.0 + p.get("buffers", 1) + p.get("BK", 0) / 100.0


def fake_compile(name, arch, timeout_s):
    """No compile: the result's key is the name of the kernel the worker was asked for, which
    FakeBench checks against the kernel it measures."""
    return BuildResult(True, resolve_point(name, arch).name, "")


class FakeBench:
    """Stands in for gemmgen.measure.Bench: same interface, no GPU; records like the real one.
    ``sleep_s``: how long a measurement takes; ``marker``: a file touched when one starts."""

    gpu = None
    batch_count = 1  # the products of a batched variant's launch (Bench.batch_count); its rows say so
    tag = None  # the tuner sets it (the study's name; the re-timing's ends in :final); rows get it, else "test"

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
                       median_ms=m.timing.median_ms if m.timing else None, tflops=m.tflops, tag=self.tag or "test",
                       batch_count=self.batch_count if config.variant.batched else 1)
        if self.stop_after and len(self.measured) == self.stop_after:
            self.tuner.request_stop()
        return m

    def close(self):
        pass


def slow_build(family, params, precision, arch, timeout_s):
    """A 'compile' that takes 0.5 s and says what it built, in which process."""
    time.sleep(0.5)
    return f"built {','.join(f'{k}={v}' for k, v in sorted(params.items()))} in {os.getpid()}"


class FakeDevice:
    """Stands in for tune.node.Device in a device worker process: an sm_90 'GPU' whose benches are
    FakeBenches (each measurement sleeps SLEEP_S), recording into the run's database. Subclasses
    fail in the ways a GPU can; each is picked by reference, so it must live here, at module level."""

    SLEEP_S = 0.02

    def __init__(self, spec, index: int):
        self.index, self.arch, self.db = index, SM90, ResultsDB(spec.url)

    def bench(self, spec):
        bench = self.make_bench()
        bench.batch_count = spec.batch_count
        return bench

    def make_bench(self) -> FakeBench:
        return FakeBench(self.db, sleep_s=self.SLEEP_S)

    def close(self):
        self.db.close()


class UnopenableDevice(FakeDevice):
    """GPU 1 cannot be opened (as a GPU of another architecture than --gpu's)."""

    def __init__(self, spec, index: int):
        if index == 1:
            from gemmgen.errors import GemmgenError

            raise GemmgenError(f"GPU {index} is a fake of another architecture")
        super().__init__(spec, index)


class NoDevice(FakeDevice):
    """No GPU can be opened."""

    def __init__(self, spec, index: int):
        from gemmgen.errors import GemmgenError

        raise GemmgenError(f"GPU {index} cannot be opened")


class _Doomed(FakeBench):
    """A FakeBench whose process ends abruptly at its ``at``-th measurement (a GPU fault, the OOM
    killer), or that sends its parent Ctrl-C then."""

    def __init__(self, db, at: int, how: str):
        super().__init__(db, sleep_s=FakeDevice.SLEEP_S)
        self.at, self.how = at, how

    def measure_point(self, label, config, shape, build=None, give_up_ms=None):
        if not self.interleave and len(self.measured) + 1 == self.at:
            if self.how == "die":
                os._exit(9)
            os.kill(os.getppid(), signal.SIGINT)
        return super().measure_point(label, config, shape, build=build, give_up_ms=give_up_ms)


class DyingDevice(FakeDevice):
    """GPU 1's worker dies at its third measurement."""

    def make_bench(self) -> FakeBench:
        return _Doomed(self.db, 3, "die") if self.index == 1 else super().make_bench()


class InterruptingDevice(FakeDevice):
    """GPU 0's worker, at its third measurement, sends the run Ctrl-C (as a terminal does to the
    run's main process, which passes it on)."""

    def make_bench(self) -> FakeBench:
        return _Doomed(self.db, 3, "interrupt") if self.index == 0 else super().make_bench()
