"""What one `gemmgen bench` measures, in which order, and each point's ratio to cuBLAS.

A plan is a list of :class:`Job`: for every (shape, precision, variant) it measures, cuBLAS
first, in a row of its own, then the points of that triple (:func:`bench_plan`). The named points
of `gemmgen bench POINT...` make one with :func:`point_plan`, the suite with
gemmgen.selection.suite.suite_plan. :func:`run_plan` measures a plan with a
:class:`gemmgen.measure.bench.Bench` that times each point in alternation with cuBLAS again;
a point's ratio is to that cuBLAS timing, else to its triple's cuBLAS row.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gemmgen.describe.arch import Arch
from gemmgen.describe.config import KernelConfig, make_config
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import InvalidPoint
from gemmgen.measure.cublaslt import precision_refused
from gemmgen.measure.outcome import Measured


@dataclass(frozen=True)
class Job:
    """One measurement of a plan: ``config`` at ``shape``, or cuBLAS's row where it is None."""

    shape: Shape
    precision: str
    label: str  # as asked: v4, a canonical name, "stored best" (the suite), or cublas
    config: KernelConfig | None
    variant: Variant

    @property
    def triple(self) -> tuple[Shape, str, Variant]:
        """What its cuBLAS row is measured at: (shape, precision, variant)."""
        return self.shape, self.precision, self.variant


def bench_plan(jobs: list[Job], triples: list[tuple[Shape, str, Variant]]) -> list[Job]:
    """For each of ``triples`` in order: cuBLAS's job, then the ``jobs`` of that triple."""
    plan = []
    for shape, precision, variant in triples:
        plan.append(Job(shape, precision, "cublas", None, variant))
        plan += [job for job in jobs if job.triple == (shape, precision, variant)]
    return plan


def point_plan(specs: dict[str, tuple[str, str, dict]], shapes: list[Shape], arch: Arch,
               cublas_variant: Variant = Variant()) -> tuple[list[Job], dict[str, InvalidPoint]]:
    """The plan of `gemmgen bench POINT...`: ``specs`` are the points named, by label as asked
    ((family, precision, params) each, gemmgen.describe.points.point_spec), made for ``arch``
    and measured at every shape. cuBLAS is measured in the points' precisions (where none is
    named, in every precision whose inputs it takes in the variant's layouts) and variants
    (``cublas_variant`` where none is named), at each shape.
    Returns the plan and, by label, the points that cannot run on ``arch`` (left out)."""
    configs, skipped = {}, {}
    for label, (family, precision, params) in specs.items():
        try:
            configs[label] = make_config(family, params, precision, arch)
        except InvalidPoint as err:
            skipped[label] = err
    # cuBLAS alone: every precision it is a baseline of in that variant (FP8: trans=nt, no epilogue)
    precisions = (list(dict.fromkeys(precision for _, precision, _ in specs.values()))
                  or [p for p in PRECISIONS if not precision_refused(cublas_variant, p)])
    jobs = [Job(shape, precision, label, config, config.variant) for shape in shapes for precision in precisions
            for label, config in configs.items() if config.precision == precision]
    variants = list(dict.fromkeys(config.variant for config in configs.values())) or [cublas_variant]
    triples = [(shape, precision, variant) for shape in shapes for precision in precisions for variant in variants]
    return bench_plan(jobs, triples), skipped


def build_plan(plan: list[Job], jobs: int | None = None) -> dict:
    """Every distinct kernel of ``plan`` built at once (gemmgen.build.nvcc.build_kernels, ``jobs``
    at a time): kernel name -> BuildResult. A kernel whose build raised is left out, so that
    measuring it builds it again and records why it failed, as without this step."""
    from gemmgen.build.nvcc import BuildResult, build_kernels

    built = build_kernels((job.config for job in plan if job.config is not None), jobs)
    return {name: result for name, result in built.items() if isinstance(result, BuildResult)}


def run_plan(bench, plan: list[Job], starting: Callable[[int, Job], None] = lambda i, job: None,
             builds: dict | None = None) -> Iterator[tuple[Job, Measured, float | None]]:
    """Measures ``plan`` in order with ``bench`` (a Bench with interleave=True): yields each job,
    its Measured and its ratio to cuBLAS (cuBLAS's time over its own, 1.0 = as fast; None where
    either has no time). ``starting(i, job)`` is called before job ``i`` (from 1) is measured.
    ``builds`` (:func:`build_plan`) gives kernels built already; the others are built as measured."""
    baselines: dict[tuple, float | None] = {}
    for i, job in enumerate(plan, 1):
        starting(i, job)
        if job.config is None:
            measured = bench.measure_cublas(job.precision, job.shape, job.variant)
            baselines[job.triple] = measured.tflops
        else:
            measured = bench.measure_point(job.label, job.config, job.shape, build=(builds or {}).get(job.config.name))
        base = baselines.get(job.triple)
        ratio = measured.baseline_ratio or (measured.tflops / base if measured.tflops and base else None)
        yield job, measured, ratio
