"""The nvcc stage: named and random points compile (and the harness links) for the targets
gemmgen knows, a compile error is a result, builds are cached, ptxas reports are parsed.

The named points compile for sm_90 in every run; for every other target nvcc knows, with their
harnesses and random points, in the `slow` run (`pytest -m slow`, which CI runs too), a point's
targets in one nvcc call. Compiles run two at a time (this suite runs on small CPU-only
machines) into the session's build cache, so every (source, target) is compiled once.
"""

import os
import random
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
from conftest import EVERY_RUN_POINTS, build_all, slow_after

from gemmgen.build.nvcc import (
    ResourceUsage,
    build_kernel,
    build_library,
    find_tool,
    kernel_usage,
    nvcc_targets,
    parse_ptxas_report,
)
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import KNOWN_ARCHS, parse_arch
from gemmgen.describe.config import make_config
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.points import NAMED_POINTS, resolve_point
from gemmgen.errors import InvalidPoint, ToolNotFound
from gemmgen.tune.space import load_space


def _buildable_archs() -> tuple[str, ...]:
    """Every target gemmgen accepts that the installed nvcc builds (all of them where there is none:
    the nvcc tests skip then)."""
    try:
        builds = nvcc_targets(find_tool("nvcc"))
    except ToolNotFound:
        return KNOWN_ARCHS
    return tuple(a for a in KNOWN_ARCHS if parse_arch(a).cc in builds)


ARCHS = _buildable_archs()  # every accepted (point, arch) pair must compile
ELF_MAGIC = b"\x7fELF"
REGISTERS_PER_SM = 64 * 1024  # every target here: a block must fit in the register file


def run_two_at_a_time(jobs: dict) -> dict:
    """{key: callable} -> {key: its result}, two jobs at a time."""
    with ThreadPoolExecutor(2) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def valid_or_none(point: str, arch: str):
    try:
        return resolve_point(point, arch)
    except InvalidPoint:
        return None


# ---- named points -------------------------------------------------------------------------------

# conftest's EVERY_RUN_POINTS compile for sm_90 in every run; the others (the blog points, more of
# the same families) in the slow run.
@pytest.fixture(scope="module")
def named_builds():
    """point -> (config, BuildResult) of EVERY_RUN_POINTS for sm_90, as the runtime builds them,
    two at a time (other modules' tests ask these kernels too: conftest's build_all builds each once)."""
    return build_all({p: resolve_point(p, "sm_90") for p in EVERY_RUN_POINTS})


@pytest.mark.nvcc
@pytest.mark.parametrize("point", slow_after(len(EVERY_RUN_POINTS),
                                             EVERY_RUN_POINTS + sorted(set(NAMED_POINTS) - set(EVERY_RUN_POINTS))))
def test_named_point_compiles_for_sm90_without_spills(named_builds, point):
    config = resolve_point(point, "sm_90")
    result = named_builds[point][1] if point in named_builds else build_kernel(config)
    assert result.ok, result.log
    assert f"for '{config.build_arch.name}'" in result.log  # ptxas compiled it for the requested target
    assert "warning" not in result.log, result.log  # e.g. #177-D, a constant left unused
    assert result.cubin.read_bytes()[:4] == ELF_MAGIC
    usage = kernel_usage(config, result)
    assert usage is not None, f"no ptxas report for {config.name} (is the kernel extern \"C\"?)"
    assert usage.spills is False, usage
    assert 0 < usage.registers <= 255
    assert usage.registers * config.geometry.threads <= REGISTERS_PER_SM


def _code(source: str) -> str:
    """An emitted file without its header comment (which names the target)."""
    return source[source.index("#include"):]


def targets_of_each_source() -> dict[str, tuple]:
    """point -> ((source, [configs of the targets it is emitted for]), ...): the named points on
    every target but sm_90 (every run compiles that one), grouped where the emitted code is the
    same (only the header differs between targets today), so that one nvcc call compiles each
    group for all its targets."""
    found = {}
    for point in sorted(NAMED_POINTS):
        groups: dict[str, tuple[str, list]] = {}
        for arch in ARCHS:
            config = valid_or_none(point, arch)
            if config is not None and arch != "sm_90":
                source = render_kernel(config)
                groups.setdefault(_code(source), (source, []))[1].append(config)
        if groups:
            found[point] = tuple(groups.values())
    return found


# the points valid on a target but sm_90; their sources are rendered by the fixture that builds
# them (rendering them at import cost every collection 101 renders)
OTHER_TARGET_POINTS = sorted(p for p in NAMED_POINTS if any(valid_or_none(p, a) for a in ARCHS if a != "sm_90"))


def ptxas_report_per_target(log: str) -> dict[str, dict[str, ResourceUsage]]:
    """target (sm_80) -> parse_ptxas_report of its part of a multi-target nvcc call's log (ptxas
    reports one target after the other, each entry function's lines after its "Compiling entry
    function '...' for 'sm_XX'" line)."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '\w+' for '(sm_\w+)'", line):
            current = m[1]
        if current is not None:
            parts.setdefault(current, []).append(line)
    return {target: parse_ptxas_report("\n".join(lines)) for target, lines in parts.items()}


@pytest.fixture(scope="module")
def multi_target_builds(tmp_path_factory):
    """point -> [(configs, nvcc's CompletedProcess)]: each group of targets_of_each_source built
    in one nvcc call as the runtime builds a library (the launcher and the kernel, -shared),
    with -gencode for each of its targets."""
    nvcc, folder = find_tool("nvcc"), tmp_path_factory.mktemp("multi-target")

    def build(point, index, source, configs):
        cu = folder / f"{point}-{index}.cu"
        cu.write_text(source)
        targets = [f"-gencode=arch=compute_{c.arch.cc},code=sm_{c.arch.cc}" for c in configs]
        return subprocess.run([nvcc, "-O3", *targets, "-Xcompiler", "-fPIC", "-shared", "-DGEMMGEN_QUIET",
                               "-Xptxas", "-v", str(cu), "-o", str(cu.with_suffix(".so"))],
                              capture_output=True, text=True, timeout=600, check=False)

    grouped = targets_of_each_source()
    assert sorted(grouped) == OTHER_TARGET_POINTS
    jobs = {(point, i): partial(build, point, i, source, configs)
            for point, groups in grouped.items() for i, (source, configs) in enumerate(groups)}
    done = run_two_at_a_time(jobs)
    return {point: [(configs, done[(point, i)]) for i, (_, configs) in enumerate(groups)]
            for point, groups in grouped.items()}


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("point", OTHER_TARGET_POINTS)
def test_named_point_compiles_for_every_other_target(multi_target_builds, point):
    """Every target nvcc knows but sm_90 (where the point is valid): ptxas compiled the kernel
    for each, without a warning, with registers."""
    for configs, proc in multi_target_builds[point]:
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log
        assert "warning" not in log, log  # e.g. #177-D, a constant left unused
        report = ptxas_report_per_target(log)
        for config in configs:
            usage = report.get(config.arch.name, {}).get(config.name)
            assert usage is not None, f"no ptxas report of {config.name} for {config.arch.name}:\n{log}"
            assert usage.registers > 0


@pytest.fixture(scope="module")
def harness_executables(tmp_path_factory):
    """canonical name -> (nvcc's CompletedProcess, executable path) for each named point's
    --harness source, compiled and linked as its header says: nvcc -O3 -arch=sm_90 gemm.cu -o gemm
    (-gencode=arch=compute_90a,code=sm_90a for sm_90a families)."""
    nvcc = find_tool("nvcc")
    folder = tmp_path_factory.mktemp("harness")
    configs = {c.name: c for c in (resolve_point(p, "sm_90") for p in NAMED_POINTS)}

    def link(config):
        source, exe = folder / f"{config.name}.cu", folder / config.name
        source.write_text(render_kernel(config, harness=True))
        proc = subprocess.run([nvcc, "-O3", *config.build_arch.nvcc_flags, str(source), "-o", str(exe)],
                              capture_output=True,
                              text=True, timeout=300, check=False)
        return proc, exe

    return run_two_at_a_time({name: partial(link, c) for name, c in configs.items()})


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("point", sorted(NAMED_POINTS))
def test_harness_compiles_and_links(harness_executables, point):
    proc, exe = harness_executables[resolve_point(point, "sm_90").name]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert exe.is_file() and os.access(exe, os.X_OK)


@pytest.mark.nvcc
def test_kernel_and_launcher_symbols_are_unmangled(named_builds):
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm not found")
    config, result = named_builds["v4"]  # the build every run makes (no compile of its own)

    def symbols(path, *options):
        return subprocess.run([nm, *options, "--defined-only", str(path)], capture_output=True, text=True,
                              check=True).stdout.split()

    assert "gemmgen_gemm" in symbols(result.library, "-D")  # the launcher, exported by the library
    assert config.name in symbols(result.cubin)  # the kernel, as the runtime looks it up in the cubin


# ---- random points ------------------------------------------------------------------------------

def random_points(per_space: int = 2) -> list:
    """``per_space`` valid sm_90 points of every family but hopper (whose variants test_hopper's
    slow matrix compiles) and every precision its search space holds, drawn with a fixed seed, so
    every run compiles the same points."""
    points = []
    for family in sorted(f for f in FAMILIES if f != "hopper"):
        space = load_space(family)
        for precision in space.precisions:
            rng = random.Random(f"{family}-{precision}")
            found = []
            for _ in range(1000):
                try:
                    found.append(make_config(family, space.sample(rng), precision, "sm_90"))
                except InvalidPoint:
                    continue
                if len(found) == per_space:
                    break
            assert len(found) == per_space, f"no {per_space} valid points in 1000 draws from {family}/{precision}"
            points += found
    return points


RANDOM_POINTS = {c.name: c for c in random_points()}


@pytest.fixture(scope="module")
def random_builds():
    return run_two_at_a_time({name: partial(build_kernel, c) for name, c in RANDOM_POINTS.items()})


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(RANDOM_POINTS))
def test_random_valid_point_compiles(random_builds, name):
    config, result = RANDOM_POINTS[name], random_builds[name]
    assert result.ok, result.log
    assert result.cubin.read_bytes()[:4] == ELF_MAGIC
    assert kernel_usage(config, result).registers > 0


# ---- errors and the cache -----------------------------------------------------------------------

BROKEN = 'extern "C" __global__ void broken(float* x) { x[0] = undeclared_value; }\n'


@pytest.mark.nvcc
@pytest.mark.parametrize("use_cache", [True, False])
def test_a_compile_error_is_a_result(use_cache):
    result = build_library(BROKEN, parse_arch("sm_90"), use_cache=use_cache)
    assert result.ok is False
    assert result.cubin is None and result.library is None
    assert "error" in result.log
    assert "undeclared_value" in result.log
    assert result.usage == {}


@pytest.mark.nvcc
def test_a_second_build_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path))
    config = resolve_point("v1", "sm_90")
    first = build_kernel(config)
    assert first.ok and not first.cached
    assert first.cubin.parent == tmp_path and first.library.parent == tmp_path
    first_bytes = first.cubin.read_bytes(), first.library.read_bytes()
    second = build_kernel(config)
    assert second.ok and second.cached
    assert second.key == first.key
    assert (second.cubin.read_bytes(), second.library.read_bytes()) == first_bytes
    assert second.usage == first.usage
    assert second.log == first.log
    # another target or other flags are other compiles (of a source that fails at once: quick), and
    # a compile error is cached as such
    broken = build_library(BROKEN, parse_arch("sm_90"))
    assert not broken.ok and not broken.cached and build_library(BROKEN, parse_arch("sm_90")).cached
    other_arch = build_library(BROKEN, parse_arch("sm_89"))
    other_flags = build_library(BROKEN, parse_arch("sm_90"), flags=("-O2",))
    assert len({broken.key, other_arch.key, other_flags.key}) == 3
    assert not other_arch.cached and not other_flags.cached


@pytest.mark.nvcc
def test_an_uncached_build_leaves_the_cache_alone(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GEMMGEN_CACHE", str(cache))
    result = build_kernel(resolve_point("v2", "sm_90"), use_cache=False)
    try:
        assert result.ok and not result.cached
        assert result.cubin.read_bytes()[:4] == ELF_MAGIC and result.library.read_bytes()[:4] == ELF_MAGIC
        # the render keeps its trimmed source there (gemmgen.codegen.trim); the build adds nothing
        assert {p.relative_to(cache).parts[0] for p in cache.rglob("*") if p.is_file()} <= {"trimmed"}
    finally:
        shutil.rmtree(result.library.parent)


def test_find_tool_looks_in_cuda_home(monkeypatch, tmp_path):
    fake = tmp_path / "bin" / "cuobjdump-gemmgen-test"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert find_tool(fake.name) == str(fake)


# ---- ptxas reports ------------------------------------------------------------------------------

PTXAS_REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Used 9 registers
ptxas info    : Compiling entry function 'warp_128x128x8_w64x32_t8x8_b2_fp32' for 'sm_80'
ptxas info    : Function properties for warp_128x128x8_w64x32_t8x8_b2_fp32
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'wmma_256x128x16_w1x2_p16_tf32' for 'sm_90'
ptxas info    : Function properties for wmma_256x128x16_w1x2_p16_tf32
    1024 bytes stack frame, 1060 bytes spill stores, 996 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem
ptxas info    : Compile time = 88.026 ms
"""


def test_parse_ptxas_report():
    usage = parse_ptxas_report(PTXAS_REPORT)
    assert set(usage) == {"warp_128x128x8_w64x32_t8x8_b2_fp32", "wmma_256x128x16_w1x2_p16_tf32"}
    warp = usage["warp_128x128x8_w64x32_t8x8_b2_fp32"]
    assert warp == ResourceUsage(registers=128, stack_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
                                 static_smem_bytes=0)
    assert warp.spills is False
    wmma = usage["wmma_256x128x16_w1x2_p16_tf32"]
    assert wmma == ResourceUsage(registers=255, stack_bytes=1024, spill_store_bytes=1060, spill_load_bytes=996,
                                 static_smem_bytes=4096)
    assert wmma.spills is True


def test_parse_ptxas_report_without_functions():
    assert parse_ptxas_report("") == {}
    assert parse_ptxas_report("ptxas info    : 0 bytes gmem\nptxas info    : Used 9 registers\n") == {}


def test_spills():
    assert ResourceUsage(registers=64).spills is False
    assert ResourceUsage(registers=255, spill_store_bytes=4).spills is True
    assert ResourceUsage(registers=255, spill_load_bytes=4).spills is True
