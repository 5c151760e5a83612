"""`bench --suite` without a GPU: which kernel each suite entry measures, and the summary."""

import math
import time

import pytest
from stored import FAST_FP8, PROMOTED_FP8, store

from gemmgen.describe.arch import parse_arch
from gemmgen.describe.points import resolve_point
from gemmgen.describe.problem import Shape
from gemmgen.selection.report import geometric_mean
from gemmgen.selection.suite import SUITE_SHAPES, geometric_mean_ratios, suite_jobs
from gemmgen.store.db import ResultsDB

SM90 = parse_arch("sm_90")


@pytest.fixture
def db(tmp_path):
    return ResultsDB(f"sqlite:///{tmp_path / 'suite.db'}")


def test_the_suite_is_the_issue_list():
    assert [str(s) for s in SUITE_SHAPES] == [
        "1024x1024x1024", "2048x2048x2048", "4096x4096x4096", "8192x8192x8192", "4096x11008x4096",
        "8192x8192x1024", "16x4096x4096", "128x4096x4096", "1000x1000x1000", "4095x4097x4093"]


def test_named_points_where_nothing_is_stored(db):
    """On sm_90 the hopper points; elsewhere, where they cannot run, the mma points."""
    jobs = suite_jobs(db, SM90)
    assert len(jobs) == len(SUITE_SHAPES) * 5
    first = {prec: (label, config.name) for shape, prec, label, config in jobs if shape == SUITE_SHAPES[0]}
    assert first["e4m3"] == ("hopper_e4m3", resolve_point("hopper_e4m3").name + "_stensor")  # torch._scaled_mm's
    assert first["fp32"] == ("v4", resolve_point("v4").name)
    assert first["tf32"] == ("hopper_tf32", resolve_point("hopper_tf32").name)
    assert first["fp16"] == ("hopper_fp16", "hopper_128x256_c2_s4_g8_ov_fp16")
    assert first["bf16"] == ("hopper_bf16", resolve_point("hopper_bf16").name)
    sm89 = parse_arch("sm_89")
    ada = {prec: (label, config.name) for shape, prec, label, config in suite_jobs(db, sm89)
           if shape == SUITE_SHAPES[0]}
    assert ada["fp16"] == ("mma_fp16", "mma_128x128x32_w2x2_s5_f2_fp16")
    assert set(ada) == {"fp32", "tf32", "fp16", "bf16"}  # no FP8 before sm_90
    assert ada["tf32"] == ("mma_tf32", resolve_point("mma_tf32", sm89).name)


def test_the_fastest_verified_stored_kernel_wins_and_cublas_is_not_a_candidate(db):
    shape = Shape(4096, 4096, 4096)
    tuned = "warp_128x256x16_w128x16_t8x8_b2_fp32"
    store(db, "cublas_fp32", "cublas", "fp32", shape, 51.7)
    store(db, tuned, "warp", "fp32", shape, 46.7)
    store(db, "warp_64x64x8_w32x32_t4x8_b1_fp32", "warp", "fp32", shape, 60.0, status="wrong_result")
    jobs = suite_jobs(db, SM90, precisions=["fp32", "fp16"], shapes=[shape])
    assert [(label, config.name) for _, _, label, config in jobs] == [
        ("stored best", tuned), ("hopper_fp16", resolve_point("hopper_fp16").name)]


def test_a_shape_with_nothing_stored_takes_the_best_of_the_nearest_stored_shape(db):
    near, far = Shape(16, 4096, 4096), Shape(4096, 4096, 4096)
    store(db, "warp_16x64x32_w16x32_t4x4_b2_k8_fp32", "warp", "fp32", near, 14.0)
    store(db, "warp_128x256x16_w128x16_t8x8_b2_fp32", "warp", "fp32", far, 46.7)
    store(db, "cublas_fp32", "cublas", "fp32", Shape(128, 4096, 4096), 20.0)  # never a candidate
    jobs = suite_jobs(db, SM90, precisions=["fp32"], shapes=[Shape(128, 4096, 4096), Shape(2048, 2048, 2048)])
    assert [(str(shape), label, config.name) for shape, _, label, config in jobs] == [  # in suite order
        ("2048x2048x2048", "best at 4096x4096x4096", "warp_128x256x16_w128x16_t8x8_b2_fp32"),
        ("128x4096x4096", "best at 16x4096x4096", "warp_16x64x32_w16x32_t4x4_b2_k8_fp32")]


def test_geometric_mean_of_ratios():
    rows = [{"point": "cublas", "precision": "fp32", "% cuBLAS": 100.0},
            {"point": "v4", "precision": "fp32", "% cuBLAS": 80.0},
            {"point": "stored best", "precision": "fp32", "% cuBLAS": 125.0},
            {"point": "v6", "precision": "fp16", "% cuBLAS": None}]
    means = geometric_mean_ratios(rows)
    assert means["fp32"] == pytest.approx(math.sqrt(0.8 * 1.25)) and means["fp16"] is None


def test_geometric_mean():
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean(iter([0.8, 1.25, 1.0])) == pytest.approx(1.0)
    assert geometric_mean([47.3]) == pytest.approx(47.3)
    assert geometric_mean([1e200, 1e200]) == pytest.approx(1e200)  # the product would overflow
    for values in ([], [1.0, 0.0], [2.0, -1.0], [float("nan")]):
        with pytest.raises(ValueError, match="positive"):
            geometric_mean(values)


def test_fp8_entries_take_a_kernel_within_the_error_bound_at_that_shape(db):
    """FP8 (e4m3 nt, bf16 C, per-tensor scales): a fast-accumulation kernel, within the bound at
    K = 4096 and stored over it at 8192^3, is not what the suite measures at 8192^3 (nor at an
    unstored deeper K); the promoting kernel stored at a deeper layer is; at 4096^3 the fast one
    stays."""
    fast, promoted = FAST_FP8 + "_stensor", PROMOTED_FP8 + "_stensor"
    cube, big, deep = Shape(4096, 4096, 4096), Shape(8192, 8192, 8192), Shape(4096, 4096, 14336)
    for shape, rows in ((cube, ((fast, 1400.0, 1.23),)), (big, ((fast, 1300.0, 1.51),)),
                        (deep, ((fast, 1500.0, 1.9), (promoted, 1400.0, 1.09)))):
        store(db, "cublas_e4m3_nt_obf16_stensor", "cublas", "e4m3", shape, 1300.0, rel_error=1e-3)
        for name, tflops, error in rows:
            store(db, name, "hopper", "e4m3", shape, tflops, rel_error=error * 1e-3)
        time.sleep(0.002)
    jobs = {str(shape): (label, config.name)
            for shape, _, label, config in suite_jobs(db, SM90, ["e4m3"], [cube, big, Shape(2048, 2048, 8192)])}
    assert jobs == {"4096x4096x4096": ("stored best", fast),
                    "8192x8192x8192": ("best at 4096x4096x14336", promoted),
                    "2048x2048x8192": ("best at 4096x4096x14336", promoted)}
