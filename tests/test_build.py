"""The nvcc stage: named and random points compile (and the harness links) for the targets
gemmgen knows, a compile error is a result, builds are cached, ptxas reports are parsed.

Compiles run two at a time (this suite runs on small CPU-only machines) into one cache folder
for the module, so every (source, target) is compiled once.
"""

import os
import random
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from gemmgen.arch import KNOWN_ARCHS, parse_arch
from gemmgen.build import (ResourceUsage, build_kernel, build_library, cache_dir, find_tool, kernel_usage,
                           nvcc_targets, parse_ptxas_report)
from gemmgen.config import make_config
from gemmgen.errors import InvalidPoint, ToolNotFound
from gemmgen.points import NAMED_POINTS, resolve_point
from gemmgen.render import render_kernel
from gemmgen.space import load_space

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


@pytest.fixture(scope="module", autouse=True)
def _fresh_build_cache(build_cache):
    """Every test here builds into a fresh cache (conftest.py's build_cache)."""
    return build_cache


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

@pytest.fixture(scope="module")
def named_builds(build_cache):
    """(point, arch) -> (config, BuildResult), or None where the point is not valid for arch."""
    configs = {(p, a): valid_or_none(p, a) for p in NAMED_POINTS for a in ARCHS}
    unique = {(c.name, c.arch.name): c for c in configs.values() if c is not None}
    built = run_two_at_a_time({key: partial(build_kernel, c) for key, c in unique.items()})
    return {key: c and (c, built[(c.name, c.arch.name)]) for key, c in configs.items()}


@pytest.mark.nvcc
@pytest.mark.parametrize("point", sorted(NAMED_POINTS))
@pytest.mark.parametrize("arch", ARCHS)
def test_named_point_compiles(named_builds, point, arch):
    if named_builds[(point, arch)] is None:
        pytest.skip(f"{point} is not a valid point for {arch}")
    config, result = named_builds[(point, arch)]
    assert result.ok, result.log
    assert f"for '{config.build_arch.name}'" in result.log  # ptxas compiled it for the requested target
    assert "warning" not in result.log, result.log  # e.g. #177-D, a constant left unused
    assert result.cubin.read_bytes()[:4] == ELF_MAGIC
    usage = kernel_usage(config, result)
    assert usage is not None, f"no ptxas report for {config.name} (is the kernel extern \"C\"?)"
    assert usage.registers > 0


@pytest.mark.nvcc
@pytest.mark.parametrize("point", sorted(NAMED_POINTS))
def test_named_point_does_not_spill_on_hopper(named_builds, point):
    config, result = named_builds[(point, "sm_90")]
    usage = kernel_usage(config, result)
    assert usage.spills is False, usage
    assert 0 < usage.registers <= 255
    assert usage.registers * config.geometry.threads <= REGISTERS_PER_SM


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


@pytest.mark.nvcc
@pytest.mark.parametrize("point", sorted(NAMED_POINTS))
def test_harness_compiles_and_links(harness_executables, point):
    proc, exe = harness_executables[resolve_point(point, "sm_90").name]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert exe.is_file() and os.access(exe, os.X_OK)


@pytest.mark.nvcc
def test_kernel_and_launcher_symbols_are_unmangled(tmp_path):
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm not found")
    config = resolve_point("v4", "sm_90")
    source, obj = tmp_path / "v4.cu", tmp_path / "v4.o"
    source.write_text(render_kernel(config))
    proc = subprocess.run([find_tool("nvcc"), "-O3", "-arch=sm_90", "-c", str(source), "-o", str(obj)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    symbols = subprocess.run([nm, "-g", "--defined-only", str(obj)], capture_output=True, text=True,
                             check=True).stdout.split()
    assert "gemmgen_gemm" in symbols
    assert config.name in symbols  # the kernel's host stub


# ---- random points ------------------------------------------------------------------------------

def random_points(per_space: int = 2) -> list:
    """``per_space`` valid sm_90 points per family (and per precision for wmma) drawn from the
    family's search space with a fixed seed, so every run compiles the same points."""
    points = []
    for family in ("naive", "shared", "register", "warp", "wmma", "fastgemm", "mma"):
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


def test_random_points_cover_every_family_and_precision():
    drawn = {(c.family.name, c.precision) for c in RANDOM_POINTS.values()}
    assert drawn == {("naive", "fp32"), ("shared", "fp32"), ("register", "fp32"), ("warp", "fp32"),
                     ("wmma", "tf32"), ("wmma", "fp16"), ("wmma", "bf16"), ("fastgemm", "fp32"),
                     ("mma", "fp16"), ("mma", "bf16"), ("mma", "tf32")}


@pytest.fixture(scope="module")
def random_builds(build_cache):
    return run_two_at_a_time({name: partial(build_kernel, c) for name, c in RANDOM_POINTS.items()})


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
    # another target or other flags are other compiles
    other_arch = build_kernel(resolve_point("v1", "sm_89"))
    assert other_arch.key != first.key and not other_arch.cached
    other_flags = build_kernel(config, flags=("-O2",))
    assert other_flags.key != first.key and not other_flags.cached


@pytest.mark.nvcc
def test_an_uncached_build_leaves_the_cache_alone(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GEMMGEN_CACHE", str(cache))
    result = build_kernel(resolve_point("v2", "sm_90"), use_cache=False)
    try:
        assert result.ok and not result.cached
        assert result.cubin.read_bytes()[:4] == ELF_MAGIC and result.library.read_bytes()[:4] == ELF_MAGIC
        assert not cache.exists()
    finally:
        shutil.rmtree(result.library.parent)


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("GEMMGEN_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "gemmgen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "gemmgen"


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
