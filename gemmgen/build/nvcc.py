"""nvcc on the CPU: an emitted file -> a shared library (its launcher, which
gemmgen.measure.launcher calls) and the kernel's cubin (for SASS), with the compiler's resource
report and an on-disk cache.

The cache key is the SHA-256 of the source, the target, the flags and the nvcc version, so a
cached build is only reused for exactly the same compile. Entries are written atomically
(temporary file, then rename), so worker processes can share one cache folder.
A compile error is a result (``BuildResult.ok`` is False, ``log`` says why), not an exception.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import Arch, nvcc_needed
from gemmgen.describe.config import KernelConfig
from gemmgen.errors import GemmgenError, InvalidParameter, ToolNotFound
from gemmgen.paths import cache_dir

DEFAULT_FLAGS = ("-O3",)
# How gemmgen builds an emitted file to call it: a shared library whose launcher keeps its
# messages to itself (gemmgen.measure.launcher reads them through <launcher>_error), with the
# intermediate files kept for the cubin.
LIBRARY_FLAGS = ("-Xcompiler", "-fPIC", "-shared", "-DGEMMGEN_QUIET")
DEFAULT_TIMEOUT_S = 300


@dataclass(frozen=True)
class ResourceUsage:
    """ptxas's report for one kernel: registers per thread and bytes of stack, spills, smem."""

    registers: int = 0
    stack_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_smem_bytes: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0 or self.stack_bytes > 0


@dataclass
class BuildResult:
    """One compile: ``library`` is the shared library with the launcher
    (gemmgen.measure.launcher.LoadedKernel loads it), ``cubin`` the device code alone (for
    nvdisasm); both None where ``ok`` is False."""

    ok: bool
    key: str
    log: str
    library: Path | None = None
    cubin: Path | None = None
    usage: dict[str, ResourceUsage] = field(default_factory=dict)
    cached: bool = False
    seconds: float = 0.0


def _pip_cuda_bins() -> list[Path]:
    """bin folders of NVIDIA's CUDA tool wheels (e.g. nvidia-cuda-nvdisasm: nvidia/cu13/bin)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
    return [bin_dir for root in roots for bin_dir in sorted(Path(root).glob("*/bin"))]


def find_tool(name: str) -> str:
    """Path of a CUDA tool (nvcc, nvdisasm): PATH, then $CUDA_HOME/bin, /usr/local/cuda/bin, then
    the bin folders of NVIDIA's pip wheels (``pip install nvidia-cuda-nvdisasm``)."""
    found = shutil.which(name)
    if found:
        return found
    folders = [Path(root) / "bin" for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                                                "/usr/local/cuda") if root]
    for folder in folders + _pip_cuda_bins():
        if (folder / name).is_file() and os.access(folder / name, os.X_OK):
            return str(folder / name)
    raise ToolNotFound(f"{name} not found on PATH, in $CUDA_HOME/bin or in NVIDIA's pip wheels; install the "
                       "CUDA toolkit or put its bin folder on PATH")


@lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


@lru_cache(maxsize=None)
def nvcc_targets(nvcc: str) -> frozenset[int]:
    """The compute capabilities ``nvcc --list-gpu-code`` builds (sm_75 -> 75)."""
    out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=False).stdout
    return frozenset(int(cc) for cc in re.findall(r"sm_(\d+)", out))


def check_target(arch: Arch) -> None:
    """Raise InvalidParameter where the installed nvcc cannot build for ``arch``, saying which CUDA
    releases can. Where there is no nvcc nothing is checked (emitting source needs none)."""
    try:
        nvcc = find_tool("nvcc")
    except ToolNotFound:
        return
    builds = nvcc_targets(nvcc)
    if builds and arch.cc not in builds:
        release = re.search(r"release (\d+\.\d+)", subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                                                                 check=False).stdout)
        raise InvalidParameter(
            f"the installed nvcc ({nvcc}{f', CUDA {release[1]}' if release else ''}) cannot build for {arch.name}; "
            f"{arch.name} needs {nvcc_needed(arch.cc)}; this nvcc builds "
            + ", ".join(f"sm_{cc}" for cc in sorted(builds)))


_FUNC = re.compile(r"(?:Compiling entry function|Function properties for) '?([A-Za-z_]\w*)'?")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_report(text: str) -> dict[str, ResourceUsage]:
    """Per-kernel resource usage from `ptxas -v` output (as printed through nvcc -Xptxas -v)."""
    found: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = _FUNC.search(line)
        if m:
            current = found.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        if m := _STACK.search(line):
            current.update(stack_bytes=int(m[1]), spill_store_bytes=int(m[2]), spill_load_bytes=int(m[3]))
        if m := _USED.search(line):
            current["registers"] = int(m[1])
            if s := _SMEM.search(line):
                current["static_smem_bytes"] = int(s[1])
    return {name: ResourceUsage(**vals) for name, vals in found.items()}


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def build_library(source: str, arch: Arch, flags: tuple[str, ...] = DEFAULT_FLAGS, *, use_cache: bool = True,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> BuildResult:
    """Compile CUDA source for ``arch`` into a shared library (and its cubin).

    Returns a BuildResult; ``ok`` is False with nvcc's message in ``log`` on a compile error or a
    timeout. Raises ToolNotFound when nvcc is missing.
    """
    nvcc = find_tool("nvcc")
    cmd_flags = [*flags, *arch.nvcc_flags, *LIBRARY_FLAGS, "-Xptxas", "-v"]
    key = hashlib.sha256("\0".join([source, *cmd_flags, nvcc_version(nvcc)]).encode()).hexdigest()[:32]
    folder = cache_dir()
    meta_path, library_path, cubin_path = folder / f"{key}.json", folder / f"{key}.so", folder / f"{key}.cubin"
    if use_cache and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if not meta["ok"] or (library_path.is_file() and cubin_path.is_file()):
            usage = {k: ResourceUsage(**v) for k, v in meta["usage"].items()}
            ok = meta["ok"]
            return BuildResult(ok, key, meta["log"], library_path if ok else None, cubin_path if ok else None, usage,
                               cached=True)

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gemmgen-") as tmp:
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.so"
        src.write_text(source)
        keep = Path(tmp) / "keep"
        keep.mkdir()
        try:
            proc = subprocess.run([nvcc, *cmd_flags, "--keep", "--keep-dir", str(keep), str(src), "-o", str(out)],
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return BuildResult(False, key, f"nvcc timed out after {timeout_s:g} s", seconds=time.monotonic() - start)
        log = (proc.stdout + proc.stderr).strip()
        # the kernel's own cubin (not the device-link stub's)
        cubins = [c for c in keep.glob("kernel*.cubin") if "dlink" not in c.name]
        ok = proc.returncode == 0 and out.is_file() and len(cubins) == 1
        if proc.returncode == 0 and not ok:
            log += f"\ngemmgen: nvcc left {len(cubins)} kernel cubins, expected one"
        usage = parse_ptxas_report(log) if ok else {}
        seconds = time.monotonic() - start
        if use_cache:
            folder.mkdir(parents=True, exist_ok=True)
            if ok:
                _atomic_write(library_path, out.read_bytes())
                _atomic_write(cubin_path, cubins[0].read_bytes())
            meta = {"ok": ok, "log": log, "usage": {k: asdict(v) for k, v in usage.items()}}
            _atomic_write(meta_path, json.dumps(meta).encode())
            return BuildResult(ok, key, log, library_path if ok else None, cubin_path if ok else None, usage,
                               seconds=seconds)
        if ok:  # uncached: keep the files outside the temporary folder
            kept = Path(tempfile.mkdtemp(prefix="gemmgen-"))
            shutil.copyfile(out, kept / "kernel.so")
            shutil.copyfile(cubins[0], kept / "kernel.cubin")
            return BuildResult(True, key, log, kept / "kernel.so", kept / "kernel.cubin", usage, seconds=seconds)
        return BuildResult(False, key, log, seconds=seconds)


def build_kernel(config: KernelConfig, **kwargs) -> BuildResult:
    """Render ``config`` and compile it; see :func:`build_library`."""
    return build_library(render_kernel(config), config.build_arch, **kwargs)


def build_kernels(configs: Iterable[KernelConfig], jobs: int | None = None) -> dict[str, BuildResult | GemmgenError]:
    """Each of ``configs`` built by :func:`build_kernel`, ``jobs`` at a time (default: one per CPU;
    threads, each nvcc a process of its own; the cache keeps every result): kernel name -> its
    BuildResult, or the GemmgenError its build raised (no nvcc, a target nvcc lacks)."""
    unique = {config.name: config for config in configs}

    def attempt(config: KernelConfig) -> BuildResult | GemmgenError:
        try:
            return build_kernel(config)
        except GemmgenError as err:
            return err
    with ThreadPoolExecutor(max(1, jobs or os.cpu_count() or 1)) as pool:
        return dict(zip(unique, pool.map(attempt, unique.values())))


def kernel_usage(config: KernelConfig, result: BuildResult) -> ResourceUsage | None:
    """The resource report of the config's own kernel in a build result."""
    return result.usage.get(config.name)
