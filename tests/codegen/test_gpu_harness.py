"""On the GPU: the --harness programs of problem variants pass, and catch planted bugs.

tests/codegen/test_harness.py's POINTS (hopper, mma and warp; every layout, 16-bit C, a bias by row and by
column, ReLU, GELU and SiLU) and DISPATCHERS (two kernels of one variant, a shape each), built
with nvcc as their headers say, report PASS for both checks at odd, thin and aligned shapes. A
program whose kernel computes another variant than its harness checks (the activation, the bias,
the layout of A or of B), or whose checked launch is given a wrong alpha, the wrong bias or FP8's
scales swapped, exits 1 with FAIL: the harness's reference follows the variant and its tolerance is tight enough."""

import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import nvcc_compile
from test_harness import DISPATCHERS, POINTS, build_flags, dispatch_plan, point_config, spliced

from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import detect_arch
from gemmgen.describe.config import make_config
from gemmgen.measure import verify
from gemmgen.selection.dispatch.emit import render_dispatcher

SHAPES = [(1, 1, 1), (17, 33, 65), (129, 257, 1000), (1024, 1024, 1024), (4095, 4097, 264)]
PASSES = len(verify.CHECKS) + 1  # each check's line and the RESULT line


def _replaced(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"{old!r} is not in the harness once"
    return source.replace(old, new)


def _planted(label: str, arch):
    """(the source of a program with a planted bug, the shape where it must fail)."""
    if label == "gelu_judged_as_silu":  # K = 8: GELU and SiLU differ by ~0.1 where |x| ~ 1, over bf16's bound
        kernel = point_config("hopper_nt_obf16_bcol_gelu", arch)
        return spliced(kernel, make_config("hopper", {**dict(kernel.variant.items), "act": "silu"}, "bf16", arch)), \
            (64, 48, 8)
    if label == "row_bias_judged_as_col":
        kernel = point_config("hopper_ofp16_brow_silu", arch)
        return spliced(kernel, make_config("hopper", {**dict(kernel.variant.items), "bias": "col"}, "fp16", arch)), \
            (64, 48, 8)
    if label == "a_tn_judged_as_nn":  # K > 1: A stored K x M and M x K differ
        return spliced(point_config("mma_tn_ofp16", arch), make_config("mma", {"out": "fp16"}, "fp16", arch)), \
            (64, 48, 8)
    if label == "b_tt_judged_as_tn":
        return spliced(point_config("warp_tt", arch), make_config("warp", {"trans": "tn"}, "fp32", arch)), (64, 48, 8)
    if label == "alpha_off_by_1e-4":  # fp32 C: far over the normwise bound (~4e-6 at K = 256)
        source = render_kernel(point_config("warp_tt", arch), harness=True)
        return _replaced(source, "GEMMGEN_LAUNCHER(M, N, K, alpha, ", "GEMMGEN_LAUNCHER(M, N, K, alpha * 1.0001f, "), \
            (200, 300, 256)
    if label == "bias_from_c0":  # the checked launch adds C0's first row instead of the bias
        source = render_kernel(point_config("hopper_nt_obf16_bcol_gelu", arch), harness=True)
        return _replaced(source, "beta, dC, dBias, 0)", "beta, dC, dC0, 0)"), (64, 48, 8)
    if label == "batch_2_left_unwritten":  # the launch computes 2 of the batch of 3: matrix 2 stays NaN (or C0)
        source = render_kernel(point_config("mma_batched_nt_obf16_bcol_gelu_k2", arch), harness=True)
        return _replaced(source, "GEMMGEN_LAUNCHER(M, N, K, batch, ", "GEMMGEN_LAUNCHER(M, N, K, batch - 1, "), \
            (64, 48, 8)
    if label == "batch_b_stride_0":  # every product reads matrix 0 of B: matrix 1 is the first wrong one
        source = render_kernel(point_config("warp_batched_tt_brow", arch), harness=True)
        return _replaced(source, "dB_all, (long long)kn, beta", "dB_all, 0LL, beta"), (64, 48, 8)
    if label == "row_scales_swapped":  # scale_b's M = N values read as scale_a's: rows scaled by columns' scales
        source = render_kernel(point_config("hopper_e4m3_nt_obf16_bcol_gelu_srow", arch), harness=True)
        return _replaced(source, "beta, dC, dBias, dScaleA, dScaleB, 0)", "beta, dC, dBias, dScaleB, dScaleA, 0)"), \
            (64, 64, 256)
    raise KeyError(label)


# a planted bug -> the family of its program's kernel
PLANTED = {"gelu_judged_as_silu": "hopper", "row_bias_judged_as_col": "hopper", "a_tn_judged_as_nn": "mma",
           "b_tt_judged_as_tn": "warp", "alpha_off_by_1e-4": "warp", "bias_from_c0": "hopper",
           "batch_2_left_unwritten": "mma", "batch_b_stride_0": "warp", "row_scales_swapped": "hopper"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """Every program that runs on the GPU present, built four at a time: key -> (executable, shape
    or None). Keys: ("point", label), ("dispatcher", label), ("planted", label)."""
    from gemmgen.describe.families import FAMILIES

    arch = detect_arch()
    folder = tmp_path_factory.mktemp("harness")
    jobs = {}
    for label, (family, _, _) in POINTS.items():
        if FAMILIES[family].runs_on(arch.cc):
            jobs[("point", label)] = (render_kernel(point_config(label, arch), harness=True), None)
    for label, (names, _) in DISPATCHERS.items():
        if all(FAMILIES[name.split("_")[0]].runs_on(arch.cc) for name in names):
            jobs[("dispatcher", label)] = (render_dispatcher(dispatch_plan(label, arch), ["--dispatch"], harness=True),
                                           None)
    for label, family in PLANTED.items():
        if FAMILIES[family].runs_on(arch.cc):
            jobs[("planted", label)] = _planted(label, arch)

    def build(key):
        source, shape = jobs[key]
        return nvcc_compile(source, folder / "_".join(key), None, *build_flags(source)), shape

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(jobs, pool.map(build, jobs)))


def run(exe, shape) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *map(str, shape), "3"], capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("label", list(POINTS))
def test_a_variants_harness_passes(programs, label, shape):
    if ("point", label) not in programs:
        pytest.skip(f"{label}'s family does not run on this GPU")
    proc = run(programs[("point", label)][0], shape)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{label} at {shape}:\n{report}"
    assert report.count("PASS") == PASSES and "(C poisoned)" in report, report


@pytest.mark.gpu
@pytest.mark.parametrize("label", list(DISPATCHERS))
def test_a_dispatcher_of_a_variant_passes_its_harness_at_each_kernels_shape(programs, label):
    if ("dispatcher", label) not in programs:
        pytest.skip(f"the kernels of {label} do not run on this GPU")
    _, served = DISPATCHERS[label]
    for shape in [(s.m, s.n, s.k) for s in served] + [(17, 1000, 333)]:
        proc = run(programs[("dispatcher", label)][0], shape)
        report = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{label} at {shape}:\n{report}"
        assert report.count("PASS") == PASSES, report


@pytest.mark.gpu
@pytest.mark.parametrize("label", list(PLANTED))
def test_a_planted_bug_fails_the_harness(programs, label):
    if ("planted", label) not in programs:
        pytest.skip(f"{label}: its kernel's family does not run on this GPU")
    exe, shape = programs[("planted", label)]
    proc = run(exe, shape)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"{label} at {shape} (exit {proc.returncode}):\n{report}"
    checks = [line for line in proc.stdout.splitlines() if line.startswith("check alpha=")]
    assert len(checks) == len(verify.CHECKS) and checks[0].endswith("FAIL"), report
    if label.startswith("batch_"):  # the failing matrix is named
        assert f" matrix {2 if label == 'batch_2_left_unwritten' else 1} of 3: " in checks[0], report
    assert any(line.startswith("RESULT ") and " FAIL " in line for line in proc.stdout.splitlines()), report
