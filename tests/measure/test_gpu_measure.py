"""On the GPU (PyCUDA): every named point and the cuBLAS baselines are verified against the
float64 reference at odd and aligned shapes, and a wrong kernel is recorded as wrong."""

import dataclasses
import re

import pytest

from gemmgen.describe.config import make_config
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.describe.problem import Shape, Variant

pytestmark = pytest.mark.gpu

SHAPES = [Shape(1, 1, 1), Shape(17, 33, 65), Shape(1000, 1000, 1000), Shape(4095, 4097, 4093),
          Shape(1024, 1024, 1024)]
POINTS = sorted({p.config().name: p.name for p in NAMED_POINTS.values()}.values())


BENCH_SEED = 1  # the `bench` fixture (conftest.py) draws its inputs from this seed


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("point", POINTS)
def test_named_point_is_correct(bench, point, shape):
    config = NAMED_POINTS[point].config(bench.gpu.info.arch)
    m = bench.measure_point(point, config, shape)
    assert m.status == "ok", m.message
    assert m.timing.median_ms > 0 and m.rel_error is not None


@pytest.mark.parametrize("shape", [Shape(17, 33, 65), Shape(1000, 1000, 1000), Shape(4095, 4097, 4093)], ids=str)
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16", "bf16"])
def test_cublas_baseline_matches_reference(bench, precision, shape):
    m = bench.measure_cublas(precision, shape)
    assert m.status == "ok", m.message


def test_cublas_rows_record_the_library_and_its_version(bench):
    """The baseline's kernel row names what ran (cuBLAS of another version picks other kernels)."""
    bench.measure_cublas("bf16", Shape(129, 257, 64))
    bench.measure_cublas("bf16", Shape(129, 257, 64), Variant("nt", "bf16", "col"))  # cuBLASLt's fused bias
    builds = {r.kernel: r.build for r in bench.db.results(tag="test", status="ok", shape=(129, 257, 64))
              if r.kernel.startswith("cublas")}
    assert re.fullmatch(r"cuBLAS \d+\.\d+\.\d+", builds["cublas_bf16"]), builds
    assert re.fullmatch(r"cuBLASLt \d+\.\d+\.\d+", builds["cublas_bf16_nt_obf16_bcol"]), builds


def test_wrong_kernel_is_recorded_as_wrong(bench):
    """cuBLAS asked for K-1 terms: every element misses one product."""
    shape = Shape(257, 129, 300)
    ops = bench.operands(shape, "fp32")

    def drops_last_k(alpha, beta):
        bench.cublas.gemm("fp32", shape.m, shape.n, shape.k - 1, alpha, int(ops.a), int(ops.b), beta, int(ops.c))

    verdict = bench.verify(drops_last_k, ops)
    assert not verdict.ok and verdict.bad > 0 and "wrong result" in verdict.message


def test_each_measurement_is_stored_as_measured(bench):
    """Measures two points under a tag of its own, then reads back exactly their rows."""
    shape, previous = Shape(64, 96, 80), bench.tag
    bench.tag = "stored-rows"
    try:
        measured = {m.kernel: m for m in (bench.measure_point(p, NAMED_POINTS[p].config(bench.gpu.info.arch), shape)
                                          for p in ("v1", "v4"))}
    finally:
        bench.tag = previous
    rows = bench.db.results(tag="stored-rows")
    assert sorted(r.kernel for r in rows) == sorted(measured)
    for row in rows:
        m = measured[row.kernel]
        assert row.status == m.status == "ok" and (row.M, row.N, row.K) == (64, 96, 80)
        assert row.median_ms == pytest.approx(m.timing.median_ms) and row.tflops == pytest.approx(m.tflops)
        assert m.tflops > 0


def test_interleaved_timing_gives_the_point_its_own_cublas(bench):
    """With interleave, a point is timed in alternation with cuBLAS: both timings come back, with as
    many runs each, and the cuBLAS one is recorded as a cuBLAS result."""
    shape = Shape(1024, 1024, 1024)
    config = NAMED_POINTS["v4"].config(bench.gpu.info.arch)
    bench.interleave = True
    try:
        m = bench.measure_point("v4", config, shape)
    finally:
        bench.interleave = False
    assert m.status == "ok", m.message
    assert m.baseline is not None and m.baseline.runs == m.timing.runs >= 10
    assert m.baseline_ratio == pytest.approx(m.baseline.median_ms / m.timing.median_ms)
    rows = bench.db.results(tag="test", status="ok", shape=(1024, 1024, 1024))  # no other cuBLAS test runs here
    assert any(r.kernel == "cublas_fp32" for r in rows)


def test_a_point_is_timed_alone_where_cublas_has_no_right_baseline(bench, monkeypatch):
    """Where cuBLAS cannot compute the problem (FP8 at rows of 1000 bytes: cuBLASLt has no
    algorithm) or computes it wrongly (a runner that leaves C as it is: NaN), the point is still
    verified and timed, alone, and no cuBLAS row is recorded as timed with it."""
    if bench.gpu.info.arch.cc != 90:
        pytest.skip("FP8 kernels are hopper's (sm_90)")
    bench.interleave = True
    try:
        fp8 = NAMED_POINTS["hopper_e4m3"].config(bench.gpu.info.arch)
        m = bench.measure_point("hopper_e4m3", fp8, Shape(1000, 1000, 1000))
        assert m.status == "ok" and m.baseline is None and m.message.startswith("timed alone: no cuBLAS baseline")
        monkeypatch.setattr(bench, "_cublas_runner", lambda precision, ops: lambda alpha, beta: None)
        v4 = NAMED_POINTS["v4"].config(bench.gpu.info.arch)
        m = bench.measure_point("v4", v4, Shape(192, 160, 128))
        assert m.status == "ok" and m.baseline is None
        assert m.message.startswith("timed alone: cuBLAS's own result failed the check")
    finally:
        bench.interleave = False


def test_fp8_row_scales_are_timed_against_cublaslts_outer_vector_scaling(bench):
    """scale=row: cuBLASLt's outer-vector scales (element (i, j) of A @ B times scale_a[i] *
    scale_b[j]) pass the float64 check, M and N apart (its "A" is gemmgen's B, so the vectors cross
    over), and a row-scaled point is timed in alternation with it."""
    if bench.gpu.info.arch.cc != 90:
        pytest.skip("FP8 kernels are hopper's (sm_90)")
    named = NAMED_POINTS["hopper_e4m3"]
    variant = dataclasses.replace(named.variant, scale="row")
    assert variant == Variant(trans="nt", out="bf16", scale="row")
    for shape in (Shape(384, 1024, 512), Shape(80, 4096, 2048)):
        m = bench.measure_cublas("e4m3", shape, variant)
        assert m.status == "ok", m.message
    config = make_config(named.family, named.params, named.precision, bench.gpu.info.arch, variant)
    bench.interleave = True
    try:
        m = bench.measure_point("hopper_e4m3_srow", config, Shape(384, 1024, 512))
    finally:
        bench.interleave = False
    assert m.status == "ok", m.message
    assert m.baseline is not None and m.baseline.runs == m.timing.runs, m.message


def test_fp8_block_scales_are_checked_and_timed_against_cublaslts_block_scaling(bench):
    """scale=block: cuBLASLt's VEC128 x BLK128x128 matmul, given gemmgen's scale buffers (which are
    torch's and its layouts), passes the float64 check made from gemmgen.describe.scaling's rule,
    and a block-scaled point (promote=1) is checked and timed in alternation with it."""
    if bench.gpu.info.arch.cc != 90:
        pytest.skip("FP8 kernels are hopper's (sm_90)")
    named = NAMED_POINTS["hopper_e4m3"]
    variant = dataclasses.replace(named.variant, scale="block")
    for shape in (Shape(384, 1024, 512), Shape(128, 4096, 2064)):  # 2064: 17 blocks of K, padded to 20
        m = bench.measure_cublas("e4m3", shape, variant)
        assert m.status == "ok", m.message
    config = make_config(named.family, {**named.params, "promote": 1}, named.precision, bench.gpu.info.arch, variant)
    bench.interleave = True
    try:
        m = bench.measure_point("hopper_e4m3_sblock", config, Shape(384, 1024, 512))
    finally:
        bench.interleave = False
    assert m.status == "ok", m.message
    assert m.baseline is not None and m.baseline.runs == m.timing.runs, m.message


@pytest.mark.parametrize("precision", ["e5m2e4m3", "e4m3e5m2"])
def test_fp8_of_two_formats_is_checked_and_timed_against_cublaslts_mixed_matmul(bench, precision):
    """A in one FP8 format and B in the other: cuBLASLt's matmul of those types (its "A" is
    gemmgen's B, so the types cross over) passes the float64 check made from each operand's own
    format, and a point, with and without swap (wgmma's operands in the other order), is checked
    and timed in alternation with it."""
    if bench.gpu.info.arch.cc != 90:
        pytest.skip("FP8 kernels are hopper's (sm_90)")
    named = NAMED_POINTS["hopper_e4m3"]
    variant = dataclasses.replace(named.variant, scale="tensor")
    shape = Shape(384, 1024, 512)
    m = bench.measure_cublas(precision, shape, variant)
    assert m.status == "ok", m.message
    bench.interleave = True
    try:
        for params in (named.params, {**named.params, "BM": 64, "BN": 128, "consumers": 1, "swap": 1}):
            config = make_config(named.family, params, precision, bench.gpu.info.arch, variant)
            m = bench.measure_point(config.name, config, shape)
            assert m.status == "ok", m.message
            assert m.baseline is not None and m.baseline.runs == m.timing.runs, m.message
    finally:
        bench.interleave = False


def test_the_gpu_check_gives_the_host_checks_statistics(bench):
    """The same C judged on the GPU (gpucheck) and on the host (verify.host_stats): a correct C, one
    element off, a NaN, and a row left unwritten (NaN from the poisoning), for both checks."""
    import numpy as np

    from gemmgen.measure import verify

    shape = Shape(129, 257, 77)
    ops = bench.operands(shape, "fp16")
    ops.fill(np.random.default_rng(5))
    refs = bench.checker.references(ops.a, ops.b, shape.m, shape.n, shape.k, "fp16")
    a64, b64 = verify.as_float64(ops.host_a, "fp16"), verify.as_float64(ops.host_b, "fp16")
    try:
        for alpha, beta in verify.CHECKS:
            ref, scale = verify.host_reference(a64, b64, ops.host_c0, alpha, beta)
            good = ref.astype(np.float32)
            off, nan, unwritten = good.copy(), good.copy(), good.copy()
            off[70, 200] += 0.5
            nan[3, 4] = np.nan
            unwritten[-1, :] = np.nan
            for c in (good, off, nan, unwritten):
                bench.gpu.drv.memcpy_htod(ops.c, np.ascontiguousarray(c))
                on_gpu = bench.checker.stats(ops.c, refs, ops.c0, shape.m, shape.n, shape.k, alpha, beta, "fp16")
                on_host = verify.host_stats(c, ref, scale, "fp16", shape.k)
                assert (on_gpu.bad, on_gpu.nonfinite) == (on_host.bad, on_host.nonfinite)
                assert on_gpu.first_bad == (pytest.approx(on_host.first_bad, nan_ok=True) if on_host.first_bad else None)
                for field in ("err2", "ref2", "scale2", "worst"):
                    assert getattr(on_gpu, field) == pytest.approx(getattr(on_host, field), rel=1e-9, abs=1e-300)
                assert verify.judge(on_gpu, "fp16", shape.k).ok == verify.judge(on_host, "fp16", shape.k).ok
            assert verify.judge(verify.host_stats(good, ref, scale, "fp16", shape.k), "fp16", shape.k).ok
    finally:
        refs.free()


def test_a_kernel_that_leaves_elements_unwritten_is_caught(bench):
    """cuBLAS asked for M - 1 rows: the last row keeps the NaN poison of the first check."""
    shape = Shape(257, 129, 300)
    ops = bench.operands(shape, "fp32")

    def skips_last_row(alpha, beta):
        bench.cublas.gemm("fp32", shape.m - 1, shape.n, shape.k, alpha, int(ops.a), int(ops.b), beta, int(ops.c))

    verdict = bench.verify(skips_last_row, ops)
    assert not verdict.ok and verdict.nonfinite == shape.n and "first bad C[256][0] = nan" in verdict.message
