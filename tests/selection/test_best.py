"""gemmgen.selection.best, the one policy for "which stored kernel is best", without a GPU."""

import pytest
from stored import FAST_FP8, PROMOTED_FP8, dated, store
from test_suite import SM90, db  # noqa: F401 (db is a fixture)

from gemmgen.describe.problem import Shape
from gemmgen.selection.best import best, ranked, shape_distance
from gemmgen.selection.suite import suite_jobs


def test_measurements_are_judged_against_the_cublas_run_nearest_in_time(db):
    """A kernel measured while the GPU ran fast (cuBLAS too) does not win over one that beat cuBLAS
    by more in a slower moment: the median ratio to the nearest cuBLAS measurement decides."""
    shape = Shape(4096, 4096, 4096)
    lucky, steady = "hopper_128x256_c2_s4_g8_x2_fp16", "hopper_128x256_c2_s4_g8_ov_fp16"
    dated(db, store(db, "cublas_fp16", "cublas", "fp16", shape, 740.0), 0.0)
    dated(db, store(db, lucky, "hopper", "fp16", shape, 720.0), 0.01)  # 97% of the cuBLAS run next to it
    for n, (cublas, tflops) in enumerate(((680.0, 690.0), (700.0, 705.0), (690.0, 690.5)), 1):  # 101.5%, 100.7%, 100.1%
        dated(db, store(db, "cublas_fp16", "cublas", "fp16", shape, cublas), 0.2 * n)
        dated(db, store(db, steady, "hopper", "fp16", shape, tflops), 0.2 * n + 0.01)
    raw = max(db.results(precision="fp16", shape=(4096, 4096, 4096), status="ok"), key=lambda r: r.tflops)
    assert raw.kernel == "cublas_fp16"  # by raw TFLOP/s cuBLAS's fast moment, then lucky, would lead
    assert max((r for r in db.results(precision="fp16", status="ok") if r.family != "cublas"),
               key=lambda r: r.tflops).kernel == lucky
    assert best(db, "fp16", shape, SM90).kernel == steady
    assert [r.kernel for r in ranked(db, "fp16", shape, SM90)] == [steady, lucky]
    assert ranked(db, "fp16", shape, SM90)[0].score == pytest.approx(705.0 / 700.0)  # the median of its three
    [(_, _, label, config)] = suite_jobs(db, SM90, precisions=["fp16"], shapes=[shape])  # the suite asks the same
    assert (label, config.name) == ("stored best", steady)
    # a kernel measured on a device with no cuBLAS measurement there ranks after, by TFLOP/s
    other = db.device(name="H200", arch="sm_90", sm_count=132, clock_mhz=1980, memory_clock_mhz=3201,
                      driver_version="580", cuda_version="13.0")
    kernel = db.kernel(name="hopper_128x256_c2_s4_g16_fp16", family="hopper", precision="fp16", arch="sm_90",
                       params={})
    db.record(kernel_id=kernel, device_id=other, problem_id=db.problem(4096, 4096, 4096, 1.0, 0.0), status="ok",
              tflops=800.0, median_ms=1.0)
    assert best(db, "fp16", shape, SM90).kernel == steady
    # the other device's kernel has no score, and ranks last
    assert [(r.kernel, r.score) for r in ranked(db, "fp16", shape, SM90)][-1] == ("hopper_128x256_c2_s4_g16_fp16", None)


def test_family_and_arch_narrow_the_candidates(db):
    shape = Shape(1000, 1000, 1000)
    store(db, "cublas_fp16", "cublas", "fp16", shape, 180.0)
    store(db, "hopper_128x256_c2_s4_g8_ov_fp16", "hopper", "fp16", shape, 400.0, status="wrong_result")  # never
    store(db, "hopper_64x128_c1_s5_fp16", "hopper", "fp16", shape, 150.0)
    store(db, "mma_128x128x32_w2x2_s3_f2_fp16", "mma", "fp16", shape, 120.0)
    assert best(db, "fp16", shape, SM90).kernel == "hopper_64x128_c1_s5_fp16"
    assert best(db, "fp16", shape, SM90, family="mma").kernel == "mma_128x128x32_w2x2_s3_f2_fp16"
    assert best(db, "fp16", shape, SM90, family="warp") is None
    assert best(db, "bf16", shape, SM90) is None
    from gemmgen.describe.arch import parse_arch
    assert best(db, "fp16", shape, parse_arch("sm_80")) is None  # those kernels were built for sm_90


def test_shape_distance_is_symmetric_in_log_space():
    a, b = Shape(16, 4096, 4096), Shape(128, 4096, 4096)
    assert shape_distance(a, b) == shape_distance(b, a) == pytest.approx(3 * 0.6931471805599453)
    assert shape_distance(a, a) == 0


def test_kernels_are_ranked_within_their_variant_against_its_cublas(db):
    """A kernel of nt/bf16/col/gelu is judged against cuBLAS's rows of that variant only, and never
    competes with kernels of another variant (which compute another product)."""
    from gemmgen.describe.problem import Variant

    shape, linear = Shape(128, 4096, 4096), Variant("nt", "bf16", "col", "gelu")
    store(db, "cublas_bf16", "cublas", "bf16", shape, 600.0)
    store(db, "hopper_128x256_c2_s4_g8_ov_bf16", "hopper", "bf16", shape, 590.0)
    store(db, "cublas_bf16_nt_obf16_bcol_gelu", "cublas", "bf16", shape, 400.0)
    store(db, "hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol_gelu", "hopper", "bf16", shape, 420.0)
    store(db, "hopper_64x128_c1_s5_bf16_nt_obf16", "hopper", "bf16", shape, 700.0)  # no cuBLAS of its variant
    assert [(r.kernel, r.score) for r in ranked(db, "bf16", shape, SM90, variant=linear)] == [
        ("hopper_128x256_c2_s4_g8_bf16_nt_obf16_bcol_gelu", pytest.approx(420.0 / 400.0))]
    assert [(r.kernel, r.score) for r in ranked(db, "bf16", shape, SM90)] == [
        ("hopper_128x256_c2_s4_g8_ov_bf16", pytest.approx(590.0 / 600.0))]
    assert [(r.kernel, r.score) for r in ranked(db, "bf16", shape, SM90, variant=Variant("nt", "bf16"))] == [
        ("hopper_64x128_c1_s5_bf16_nt_obf16", None)]
    assert best(db, "bf16", shape, SM90, variant=Variant("nt", "bf16", "row", "gelu")) is None


def test_a_batched_kernel_is_judged_against_cublas_of_its_own_batch_count(db):
    """Rows of a batch of 64 are far faster in TFLOP/s than rows of 1; each is divided by cuBLAS's
    of its count, and batch_count narrows to one count."""
    from gemmgen.describe.problem import Variant

    shape, batched = Shape(64, 64, 64), Variant(batch="strided")
    device = db.device(name="H100", arch="sm_90", sm_count=132, clock_mhz=1980, memory_clock_mhz=2619,
                       driver_version="580", cuda_version="13.0")
    problem = db.problem(64, 64, 64, 1.0, 0.0)
    a, b = "mma_128x128x32_w2x2_s3_f2_fp16_batched", "mma_64x64x32_w2x2_s3_f2_fp16_batched"
    for name, family, count, tflops in (("cublas_fp16_batched", "cublas", 1, 1.0), ("cublas_fp16_batched", "cublas",
                                        64, 100.0), (a, "mma", 1, 1.2), (b, "mma", 64, 90.0)):
        kernel = db.kernel(name=name, family=family, precision="fp16", arch="sm_90", params={})
        db.record(kernel_id=kernel, device_id=device, problem_id=problem, status="ok", tflops=tflops, median_ms=1.0,
                  batch_count=count)
    found = ranked(db, "fp16", shape, SM90, variant=batched)
    assert [(r.kernel, r.score) for r in found] == [(a, pytest.approx(1.2)), (b, pytest.approx(0.9))]
    assert [r.kernel for r in ranked(db, "fp16", shape, SM90, variant=batched, batch_count=64)] == [b]
    assert best(db, "fp16", shape, SM90, variant=batched, batch_count=1).kernel == a
    assert best(db, "fp16", shape, SM90) is None  # no kernel of one product stored



def test_an_fp8_kernel_over_the_error_bound_ranks_after_those_within_it(db):
    """FP8: a kernel faster than cuBLAS with 1.93x its error ranks after a slower one with 1.08x
    (ERROR_BOUND = 1.5); fp16 kernels with the same figures are ranked by speed alone."""
    from gemmgen.describe.problem import Variant
    from gemmgen.selection.best import ERROR_BOUND

    shape, fp8 = Shape(2048, 4096, 14336), Variant("nt", "bf16")
    store(db, "cublas_e4m3_nt_obf16", "cublas", "e4m3", shape, 1300.0, rel_error=1.66e-3)
    store(db, FAST_FP8, "hopper", "e4m3", shape, 1350.0, rel_error=3.2e-3)
    store(db, PROMOTED_FP8, "hopper", "e4m3", shape, 1250.0, rel_error=1.8e-3)
    found = ranked(db, "e4m3", shape, SM90, variant=fp8)
    assert [(r.kernel, r.within_error) for r in found] == [(PROMOTED_FP8, True), (FAST_FP8, False)]
    assert found[1].error_ratio == pytest.approx(3.2 / 1.66) and found[1].score > found[0].score
    assert ERROR_BOUND == 1.5 and best(db, "e4m3", shape, SM90, variant=fp8).kernel == PROMOTED_FP8
    store(db, "cublas_fp16", "cublas", "fp16", shape, 700.0, rel_error=1e-3)
    store(db, "hopper_128x256_c2_s4_g8_fp16", "hopper", "fp16", shape, 720.0, rel_error=1.93e-3)
    store(db, "hopper_128x128_c2_s6_g8_fp16", "hopper", "fp16", shape, 690.0, rel_error=1.08e-3)
    assert [r.kernel for r in ranked(db, "fp16", shape, SM90)] == ["hopper_128x256_c2_s4_g8_fp16",
                                                                    "hopper_128x128_c2_s6_g8_fp16"]


def test_a_kernels_newest_build_replaces_its_older_builds_where_both_were_measured(db):
    """A kernel rebuilt from changed source (a new source hash) and measured again at a shape is
    judged there by the new build's rows alone; at a shape only the old build was measured at, the
    old rows stand. cuBLAS's rows are untouched."""
    from gemmgen.selection.best import newest_builds, stored_rows
    from gemmgen.selection.dispatch.model import stored_samples

    thin, full = Shape(137, 4096, 4096), Shape(256, 4096, 4096)
    name = "hopper_128x64_c2_s6_fp16"
    device = db.device(name="H100", arch="sm_90", sm_count=132, clock_mhz=1980, memory_clock_mhz=2619,
                       driver_version="580", cuda_version="13.0")
    builds = {b: db.kernel(name=name, family="hopper", precision="fp16", arch="sm_90", params={}, source_hash=b)
              for b in ("old", "new")}

    def measure(build, shape, tflops, second):
        problem = db.problem(shape.m, shape.n, shape.k, 1.0, 0.0)
        dated(db, db.record(kernel_id=builds[build], device_id=device, problem_id=problem, status="ok",
                            tflops=tflops, median_ms=1.0), second)

    for n, shape in enumerate((thin, full)):
        dated(db, store(db, "cublas_fp16", "cublas", "fp16", shape, 100.0), n)
    measure("old", thin, 50.0, 1)  # the old build's slow partial tile row
    measure("old", thin, 52.0, 2)
    measure("old", full, 95.0, 3)
    measure("new", thin, 90.0, 10)  # rebuilt, measured again at the thin shape only
    rows = db.results(precision="fp16", status="ok")
    kept = newest_builds(rows)
    assert sorted((r.M, r.build, r.tflops) for r in kept if r.family != "cublas") == [(137, "new", 90.0),
                                                                                      (256, "old", 95.0)]
    assert sum(r.family == "cublas" for r in kept) == 2 and [r.build for r in rows if r.family == "cublas"] == ["", ""]
    assert [r.measurement_id for r in stored_rows(db, precision="fp16", status="ok")] == [r.measurement_id for r in kept]
    [top] = ranked(db, "fp16", thin, SM90)
    assert (top.kernel, top.score, top.runs) == (name, pytest.approx(0.9), 1)  # not the median of 50, 52 and 90
    samples, _, _, _ = stored_samples(db, "fp16", SM90)
    assert sorted(s.shape.m for s in samples) == [137, 256]
    # a newer measurement of the old build makes it the newest there again
    measure("old", thin, 51.0, 20)
    assert sorted(r.tflops for r in newest_builds(db.results(precision="fp16", status="ok", shape=(137, 4096, 4096)))
                  if r.family != "cublas") == [50.0, 51.0, 52.0]
