"""On the GPU (PyCUDA): measuring a strided batch (Bench.batch_count, `bench --batch N`): the
cuBLAS baselines (cublasGemmStridedBatchedEx / cublasSgemmStridedBatched with transposes and C
types, cuBLASLt with batched layouts and bias batch stride for a fused epilogue) and batched
kernels pass the float64 check of every matrix and are stored with their count; a run that gets
one matrix wrong (left unwritten, or computed from another matrix's B) fails naming it."""

import pytest

from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Shape, Variant

pytestmark = pytest.mark.gpu

BENCH_TAG = "batched"
SHAPES = [Shape(17, 33, 65), Shape(128, 256, 64)]
BASELINES = [("fp32", Variant("tn", batch="strided")), ("tf32", Variant("nt", batch="strided")),
             ("fp16", Variant("nt", "fp16", batch="strided")), ("bf16", Variant("tt", "bf16", batch="strided")),
             ("fp16", Variant("nn", "fp32", "col", "gelu", "strided")),
             ("bf16", Variant("nt", "bf16", "col", "relu", "strided"))]


@pytest.fixture
def batch_of(bench):
    """Sets bench.batch_count for one test."""
    before = bench.batch_count

    def set_count(count):
        bench.batch_count = count
        return bench

    yield set_count
    bench.batch_count = before


def test_batched_cublas_baselines_check_every_matrix_and_store_the_count(batch_of):
    bench = batch_of(3)
    for precision, variant in BASELINES:
        for shape in SHAPES:
            m = bench.measure_cublas(precision, shape, variant)
            assert m.status == "ok", (precision, variant.text, shape, m.message)
            assert m.batch == 3 and m.tflops == pytest.approx(3 * shape.flops / (m.timing.median_ms * 1e-3) / 1e12)
    rows = bench.db.results(tag=BENCH_TAG, status="ok", family="cublas")
    assert len(rows) == len(BASELINES) * len(SHAPES) and {r.batch_count for r in rows} == {3}
    api = {r.kernel: r.params["api"] for r in rows}
    assert api["cublas_fp32_tn_batched"] == "cublasSgemmStridedBatched"
    assert api["cublas_fp16_nt_ofp16_batched"] == "cublasGemmStridedBatchedEx"
    assert api["cublas_fp16_bcol_gelu_batched"] == "cublasLtMatmul"


def test_batched_kernels_are_measured_against_batched_cublas(batch_of):
    bench = batch_of(5)
    arch, previous = bench.gpu.info.arch, bench.interleave
    bench.interleave = True
    try:
        for family, precision, params in (("mma", "fp16", {"trans": "nt", "out": "fp16", "bias": "col",
                                                           "act": "gelu"}),
                                          ("mma", "bf16", {"trans": "tn", "split_k": 2}),
                                          ("warp", "fp32", {"trans": "nt", "bias": "col"})):
            config = make_config(family, {**params, "batch": "strided"}, precision, arch)
            for shape in SHAPES:
                m = bench.measure_point(config.name, config, shape)
                assert m.status == "ok", (config.name, shape, m.message)
                assert m.batch == 5 and m.baseline is not None
                stored = bench.db.results(tag=BENCH_TAG, shape=(shape.m, shape.n, shape.k), variant=config.variant,
                                          batch_count=5)
                assert {r.kernel for r in stored} >= {config.name, f"cublas_{precision}{config.variant.suffix}"}
    finally:
        bench.interleave = previous


def test_a_wrong_matrix_of_the_batch_fails_naming_it(batch_of):
    bench = batch_of(3)
    shape, variant = Shape(96, 80, 48), Variant("nt", "fp16", batch="strided")
    ops = bench.operands(shape, "fp16", variant)
    sa, sb, sc, _ = ops.strides

    def two_of_three(alpha, beta):  # matrix 2 never written (NaN for beta = 0, C0 otherwise)
        bench.cublas.gemm("fp16", shape.m, shape.n, shape.k, alpha, int(ops.a), int(ops.b), beta, int(ops.c),
                          variant, batch=2, strides=(sa, sb, sc))

    verdict = bench.verify(two_of_three, ops)
    assert not verdict.ok and verdict.message.startswith("matrix 2 of the batch of 3: wrong result"), verdict.message

    def one_b(alpha, beta):  # every product with matrix 0 of B: matrix 1 is the first wrong one
        bench.cublas.gemm("fp16", shape.m, shape.n, shape.k, alpha, int(ops.a), int(ops.b), beta, int(ops.c),
                          variant, batch=3, strides=(sa, 0, sc))

    verdict = bench.verify(one_b, ops)
    assert not verdict.ok and verdict.message.startswith("matrix 1 of the batch of 3: wrong result"), verdict.message
