"""On the GPU: every named point's emitted --harness program is built with nvcc and checks the
kernel against its float64 reference at odd and aligned shapes (exit code 0 and PASS)."""

import subprocess

import pytest

from gemmgen.build.nvcc import find_tool
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import detect_arch
from gemmgen.describe.points import NAMED_POINTS

SHAPES = [(1, 1, 1), (17, 33, 65), (1000, 1000, 1000), (4095, 4097, 4093), (1024, 1024, 1024)]
# blog_naive is the same kernel as v1: test each distinct kernel once.
POINTS = sorted({p.config().name: p.name for p in NAMED_POINTS.values()}.values())


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    """Build every point's harness for the GPU present, in parallel; name -> executable path."""
    arch = detect_arch()
    folder = tmp_path_factory.mktemp("harness")
    nvcc = find_tool("nvcc")
    procs = {}
    for name in POINTS:
        if not NAMED_POINTS[name].runs_on(arch):
            continue  # e.g. hopper points anywhere but sm_90
        config = NAMED_POINTS[name].config(arch)
        src = folder / f"{name}.cu"
        src.write_text(render_kernel(config, harness=True))
        # the flags the emitted header gives (sm_90a for the hopper family)
        procs[name] = subprocess.Popen([nvcc, "-O3", *config.build_arch.nvcc_flags, str(src), "-o", str(folder / name)],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, proc in procs.items():
        out, _ = proc.communicate()
        assert proc.returncode == 0, f"{name}: nvcc failed:\n{out}"
    return {name: folder / name for name in procs}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("point", POINTS)
def test_named_point_matches_reference(harnesses, point, shape):
    if point not in harnesses:
        pytest.skip(f"{point}'s family does not run on this GPU")
    run = subprocess.run([str(harnesses[point]), *map(str, shape), "3"], capture_output=True, text=True, timeout=300)
    report = run.stdout + run.stderr
    assert run.returncode == 0, f"{point} at {shape}:\n{report}"
    assert report.count("PASS") == 3, report  # two checks and the RESULT line
