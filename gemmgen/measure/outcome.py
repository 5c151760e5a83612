"""What one measurement gives (:class:`Measured`) and how the store names it: the problem that is
timed (alpha 1, beta 0), the name cuBLAS's rows go under, the prefix of a row timed a few runs
only. Read by the tuner and the selection model as well as by :mod:`gemmgen.measure.bench`,
without loading anything of the GPU.
"""

from dataclasses import dataclass

from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Shape, Variant
from gemmgen.measure.timing import Timing
from gemmgen.store.db import ResultsDB

# The problem that is timed and stored (the checks also cover other alpha and beta).
TIMED_ALPHA, TIMED_BETA = 1.0, 0.0
# How a stored row says its point was timed a few runs only (Measured.cut).
CUT_PREFIX = "timed only "


def timed_problem_id(db: ResultsDB, shape: Shape) -> int:
    """The database id of the timed problem at ``shape``."""
    return db.problem(shape.m, shape.n, shape.k, TIMED_ALPHA, TIMED_BETA)


def cublas_name(precision: str, variant: Variant = Variant()) -> str:
    """The name cuBLAS's rows are stored under: ``cublas_<precision>`` and the variant's suffix,
    as a kernel's name has it (``cublas_bf16_nt_obf16``)."""
    return f"cublas_{precision}{variant.suffix}"


@dataclass
class Measured:
    label: str  # as asked: v4, cublas, or a canonical name
    kernel: str  # canonical name
    precision: str
    shape: Shape
    status: str  # ok, wrong_result, compile_error, launch_error, infeasible
    timing: Timing | None = None
    rel_error: float | None = None
    message: str = ""
    baseline: Timing | None = None  # cuBLAS, timed in alternation with this point (Bench.interleave)
    cut: bool = False  # timed a few runs only: slower than the give_up_ms it was measured with
    variant: Variant = Variant()  # layouts of A and B, type of C
    batch: int = 1  # products per launch (a batched variant's count; stored as the row's batch_count)

    @property
    def tflops(self) -> float | None:
        """Every product of the launch's flops over the median time."""
        return self.batch * self.shape.flops / (self.timing.median_ms * 1e-3) / 1e12 if self.timing else None

    @property
    def bandwidth(self) -> float | None:
        """Achieved bytes/s: Shape.bytes_moved (A, B read once, C written once in its type) of every product
        of the launch over the median time."""
        if not self.timing:
            return None
        c_bytes = PRECISIONS[self.variant.out].bytes
        moved = self.batch * self.shape.bytes_moved(PRECISIONS[self.precision].bytes, c_bytes)
        return moved / (self.timing.median_ms * 1e-3)

    @property
    def baseline_ratio(self) -> float | None:
        """This point's speed over cuBLAS's in the same alternating runs (1.0 = as fast)."""
        return self.baseline.median_ms / self.timing.median_ms if self.timing and self.baseline else None
