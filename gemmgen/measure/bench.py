"""Measuring on the GPU (:class:`Bench`): build, verify, time and record one point (or the cuBLAS
baseline) at one shape. Every outcome, including compile errors and wrong results, is recorded in the
results database and committed at once.
"""

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace

import numpy as np

from gemmgen.build.nvcc import BuildResult, build_kernel, kernel_usage
from gemmgen.codegen.render import render_kernel, source_hash, template_hash
from gemmgen.describe.config import KernelConfig
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import GemmgenError
from gemmgen.measure import verify
from gemmgen.measure.cublas import WORKSPACE_BYTES, Cublas, CublasError, baseline_api, baseline_build, uses_cublaslt
from gemmgen.measure.cublaslt import CublasLt
from gemmgen.measure.device import Gpu, LaunchFailed
from gemmgen.measure.gpucheck import GpuChecker
from gemmgen.measure.l2flush import L2Flush
from gemmgen.measure.launcher import LoadedKernel, ShapeRefused
from gemmgen.measure.operands import HostMatrices, Operands
from gemmgen.measure.outcome import CUT_PREFIX, TIMED_ALPHA, TIMED_BETA, Measured, cublas_name, timed_problem_id
from gemmgen.measure.timing import Timing, time_interleaved
from gemmgen.store.db import ResultsDB

# Run a kernel on the current operands: run(alpha, beta) queues C = alpha * A @ B + beta * C.
Runner = Callable[[float, float], None]
# The timed problem on the current operands, its host work done ahead: one call queues one run.
Launch = Callable[[], None]


class ContextLost(GemmgenError):
    """A fault left the CUDA context unusable; nothing more can run in this process."""


class Bench:
    """Measures points and baselines on one GPU and records every outcome in ``db``."""

    def __init__(self, gpu: Gpu, db: ResultsDB, *, tag: str | None = "bench", seed: int | None = None,
                 min_total_ms: float = 300.0, interleave: bool = False, batch_count: int = 1):
        """With ``interleave``, each point is timed in alternation with cuBLAS on the same operands
        (Measured.baseline), and that cuBLAS timing is recorded too. ``batch_count``: the products
        of one launch of a batched variant (batch=strided), at packed strides; every other variant
        computes one (ValueError for a count below 1)."""
        if batch_count < 1:
            raise ValueError(f"batch_count must be at least 1; got {batch_count}")
        self.gpu, self.db, self.tag, self.min_total_ms = gpu, db, tag, min_total_ms
        self.interleave, self.batch_count = interleave, batch_count
        self.rng = np.random.default_rng(seed)
        self.matrices = HostMatrices(self.rng)  # a layer's B, A and C0 drawn once for its token counts
        self.cublas = Cublas(WORKSPACE_BYTES)
        self._cublas_lt: CublasLt | None = None  # made for the first variant with an epilogue
        self.checker = GpuChecker(gpu, self.cublas)
        info = gpu.info
        self.device_id = db.device(name=info.name, arch=info.arch.name, sm_count=info.sm_count,
                                   clock_mhz=info.clock_mhz, memory_clock_mhz=info.memory_clock_mhz,
                                   driver_version=info.driver_version, cuda_version=info.cuda_version)
        self.flush = L2Flush(gpu)  # before every timed run
        self._ops: Operands | None = None

    def batch(self, variant: Variant) -> int:
        """The products one launch of ``variant`` computes here: batch_count where it is batched, else 1."""
        return self.batch_count if variant.batched else 1

    def operands(self, shape: Shape, precision: str, variant: Variant = Variant()) -> Operands:
        batch = self.batch(variant)
        ops = self._ops
        if ops is None or (ops.shape, ops.precision, ops.variant, ops.batch) != (shape, precision, variant, batch):
            if ops is not None:
                ops.free()
                self._ops = None
            self._ops = Operands(self.gpu, shape, precision, variant, batch)
        return self._ops

    # ---- verification and timing, shared by kernels and cuBLAS ----

    def verify(self, run: Runner, ops: Operands) -> verify.Verdict:
        """Both checks of verify.CHECKS on the operands' random inputs (filled once per shape and
        precision, from self.matrices: every kernel measured there sees the same), judged on the GPU against float64
        references made once for them (gemmgen.measure.gpucheck). C is reset before each check (NaN for
        beta == 0), so no kernel passes on what another left. Every matrix of a batch is judged
        on its own, against its own reference. The first failure (its message names the matrix
        of a batch), or the check and matrix with the largest error."""
        if not ops.filled:
            ops.fill(self.rng, self.matrices)
        s = ops.shape
        if ops.references is None:
            ops.references = self.checker.references(ops.a, ops.b, s.m, s.n, s.k, ops.precision,
                                                     ops.variant.b_transposed, ops.variant.a_transposed, ops.batch,
                                                     ops.variant.scale, ops.scales)
        worst = None
        var = ops.variant
        for alpha, beta in verify.CHECKS:
            ops.reset_c(beta)
            run(alpha, beta)
            self.gpu.synchronize()
            for i in range(ops.batch):
                c, c0, bias = ops.matrix(i)
                stats = self.checker.stats(c, ops.references.matrix(i), c0, s.m, s.n, s.k, alpha, beta, ops.precision,
                                           var, bias)
                verdict = verify.judge(stats, ops.precision, s.k, var.out, var.act)
                if not verdict.ok:
                    return replace(verdict, message=f"matrix {i} of the batch of {ops.batch}: {verdict.message}") \
                        if var.batched else verdict
                worst = verdict if worst is None or verdict.rel_error > worst.rel_error else worst
        return worst

    def time(self, ops: Operands, *launches: Launch, give_up_ms: float | None = None) -> list[Timing]:
        """The timed problem (TIMED_ALPHA, TIMED_BETA) on the checks' random inputs; C poisoned
        and L2 flushed before every run, outside the timed region. The ``launches`` (already
        verified) run in alternation: one Timing each. With ``give_up_ms``, a first launch whose
        median after a few runs is above it stops there (timing.time_interleaved)."""
        drv = self.gpu.drv
        c_size = ops.c_size

        def before():
            drv.memset_d8(ops.c, 0xFF, c_size)
            self.flush()  # after the poisoning: C's dirty lines are written back outside the timing

        return time_interleaved(self.gpu, list(launches), before, min_total_ms=self.min_total_ms,
                                give_up_ms=give_up_ms)

    def _verify_and_time(self, run: Runner, ops: Operands, result: Measured, *launches: Launch,
                         give_up_ms: float | None = None) -> Measured:
        """Verify ``run``, then time ``launches`` (the same point's timed problem first, then
        the runs to alternate with it)."""
        try:
            verdict = self.verify(run, ops)
            result.rel_error = verdict.rel_error
            if not verdict.ok:
                result.status, result.message = "wrong_result", verdict.message
                return result
            result.timing, *rest = self.time(ops, *launches, give_up_ms=give_up_ms)
            if give_up_ms is not None and result.timing.median_ms > give_up_ms:
                result.cut = True
                result.message = (f"{CUT_PREFIX}{result.timing.runs} runs: slower than {give_up_ms:.4g} ms, the "
                                  "cut for a candidate near the best so far")
            result.baseline = rest[0] if rest else None
            result.status = "ok"
        except LaunchFailed as err:
            result.status, result.message = "launch_error", str(err)
        return result

    # ---- the two kinds of measurement ----

    def measure_point(self, label: str, config: KernelConfig, shape: Shape,
                      build: BuildResult | None = None, give_up_ms: float | None = None) -> Measured:
        """Build (unless ``build`` is given), verify, time and record ``config`` at ``shape``.
        With ``give_up_ms`` (a tuner's cut: 1.25 x its best median so far), a point whose median
        after a few runs is above it is timed no further; its row says how many runs it had."""
        source = render_kernel(config)
        kernel_id = self.db.kernel(name=config.name, family=config.family.name, precision=config.precision,
                                   arch=config.arch.name, params=config.params, template_hash=template_hash(config),
                                   source_hash=source_hash(source))
        variant = config.variant
        batch = self.batch(variant)
        result = Measured(label, config.name, config.precision, shape, "infeasible", variant=variant, batch=batch)
        build = build or build_kernel(config)
        usage = kernel_usage(config, build) if build.ok else None
        if not build.ok:
            result.status, result.message = "compile_error", build.log
        else:
            kernel = None
            try:
                with ExitStack() as stack:
                    kernel = LoadedKernel(self.gpu, config, build.library)
                    kernel.describe(shape.m, shape.n, shape.k, batch=batch)  # refuses before anything is allocated
                    ops = self.operands(shape, config.precision, variant)

                    def run(alpha, beta):  # a batch at packed strides: the Launcher's default
                        kernel.launch(shape.m, shape.n, shape.k, alpha, int(ops.a), int(ops.b), beta, int(ops.c),
                                      bias=ops.bias_address, batch=batch, scales=ops.scales)

                    # the timed launch: checks, grid, workspace and tensor maps made once, here
                    plan = stack.enter_context(kernel.plan(shape.m, shape.n, shape.k, TIMED_ALPHA, int(ops.a),
                                                           int(ops.b), TIMED_BETA, int(ops.c), bias=ops.bias_address,
                                                           batch=batch, scales=ops.scales))
                    launches = [plan.run]
                    if self.interleave:
                        result.message = self._add_cublas(launches, config.precision, ops)
                    self._verify_and_time(run, ops, result, *launches, give_up_ms=give_up_ms)
            except ShapeRefused as err:
                result.status, result.message = "infeasible", str(err)
            except LaunchFailed as err:
                result.status, result.message = "launch_error", str(err)
            finally:
                if kernel is not None:
                    kernel.close()
        self._record(kernel_id, result, registers=usage.registers if usage else None,
                     smem_bytes=config.geometry.smem_bytes,
                     spill_bytes=(usage.spill_store_bytes + usage.spill_load_bytes) if usage else None)
        if result.baseline is not None:
            baseline = Measured("cublas", cublas_name(config.precision, variant), config.precision, shape, "ok",
                                timing=result.baseline, message=f"timed in alternation with {config.name}",
                                variant=variant, batch=batch)
            self._record(self._cublas_kernel_id(config.precision, variant), baseline)
        return result

    def _cublas_kernel_id(self, precision: str, variant: Variant = Variant()) -> int:
        api = (("api", baseline_api(precision, variant)),)
        try:
            build = baseline_build(precision, variant)
        except CublasError:  # no library to ask (an infeasible row says why): no version recorded
            build = ""
        return self.db.kernel(name=cublas_name(precision, variant), family="cublas", precision=precision,
                              arch=self.gpu.info.arch.name, source_hash=build,
                              params={**dict(PRECISIONS[precision].baseline), **dict(api), **dict(variant.items)})

    def _add_cublas(self, launches: list, precision: str, ops: Operands) -> str:
        """Appends cuBLAS's timed launch of the operands' problem to ``launches``, to be timed in
        alternation with a point's, where cuBLAS computes it and its result passes the checks (once
        per operands): a baseline row is recorded as ok only so. Else the point is timed alone; the
        returned message says why ("" where cuBLAS is added)."""
        try:
            cublas = self._cublas_runner(precision, ops)
            if ops.cublas_verdict is None:
                ops.cublas_verdict = self.verify(cublas, ops)
        except CublasError as err:  # cublasGemmEx refuses some variants only when called
            return f"timed alone: no cuBLAS baseline here ({err})"
        if not ops.cublas_verdict.ok:
            return f"timed alone: cuBLAS's own result failed the check here ({ops.cublas_verdict.message})"
        launches.append(lambda: cublas(TIMED_ALPHA, TIMED_BETA))
        return ""

    def _cublas_runner(self, precision: str, ops: Operands) -> Runner:
        """cuBLAS's GEMM of the operands' variant: cuBLASLt (with its fused epilogue where the
        variant has one) where uses_cublaslt, else cublasGemmEx / cublasSgemm."""
        s = ops.shape
        batched = ops.variant.batched  # the operands' batch, at their (packed) strides
        if uses_cublaslt(precision, ops.variant):
            if self._cublas_lt is None:
                self._cublas_lt = CublasLt()
            lt = self._cublas_lt
            lt.prepare(precision, s.m, s.n, s.k, ops.variant, bias=ops.bias_address, batch=ops.batch,
                       strides=ops.strides if batched else None, scales=ops.scales)  # raises CublasError now

            def run(alpha, beta):  # scale=tensor: the two scales, known here, folded into alpha
                if ops.variant.scale == "tensor":
                    alpha *= float(ops.host_scales[0][0]) * float(ops.host_scales[1][0])
                lt.gemm(precision, s.m, s.n, s.k, alpha, int(ops.a), int(ops.b), beta, int(ops.c), ops.variant,
                        bias=ops.bias_address, batch=ops.batch, strides=ops.strides if batched else None,
                        scales=ops.scales)

            return run

        def run(alpha, beta):
            self.cublas.gemm(precision, s.m, s.n, s.k, alpha, int(ops.a), int(ops.b), beta, int(ops.c), ops.variant,
                             batch=ops.batch, strides=ops.strides[:3] if batched else None)

        return run

    def measure_cublas(self, precision: str, shape: Shape, variant: Variant = Variant()) -> Measured:
        """Verify, time and record cuBLAS's GEMM for ``precision`` (see dtypes.Precision.baseline)
        and ``variant`` (layouts, C's type, epilogue; a batched one: Bench's batch_count products per
        call, cublasGemmStridedBatchedEx or cuBLASLt with batched layouts)."""
        ops = self.operands(shape, precision, variant)
        result = Measured("cublas", cublas_name(precision, variant), precision, shape, "infeasible", variant=variant,
                          batch=ops.batch)
        try:
            run = self._cublas_runner(precision, ops)
        except CublasError as err:  # cuBLAS does not compute this: a result, not a crash
            result.message = str(err)
        else:
            result = self._verify_and_time(run, ops, result, lambda: run(TIMED_ALPHA, TIMED_BETA))
        self._record(self._cublas_kernel_id(precision, variant), result)
        return result

    def _record(self, kernel_id: int, result: Measured, **extra) -> None:
        problem_id = timed_problem_id(self.db, result.shape)
        t = result.timing
        self.db.record(kernel_id=kernel_id, device_id=self.device_id, problem_id=problem_id, status=result.status,
                       median_ms=t.median_ms if t else None, min_ms=t.min_ms if t else None,
                       max_ms=t.max_ms if t else None, runs=t.runs if t else None, tflops=result.tflops,
                       rel_error=result.rel_error, message=result.message[:20000], tag=self.tag,
                       batch_count=result.batch, **extra)
        if result.status == "launch_error" and not self.gpu.healthy():
            raise ContextLost(f"{result.kernel} broke the CUDA context ({result.message}); every measurement "
                              "so far is stored; run again to measure the rest")

    def close(self) -> None:
        if self._ops is not None:
            self._ops.free()
        self.flush.free()
        self.checker.close()
        if self._cublas_lt is not None:
            self._cublas_lt.close()
        self.cublas.close()
