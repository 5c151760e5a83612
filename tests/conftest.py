"""Test markers: `gpu` tests skip where there is no NVIDIA GPU, `nvcc` tests where nvcc is absent.
This is the one place that decides; tests only mark themselves.

The order the modules run in (longest first, for pytest-xdist's workers): LONGEST_FIRST.

Shared fixtures: `build_cache` (the session's build cache, used by every test and every xdist
worker: each kernel is compiled once per session) and `bench` (a Bench on GPU 0 with its own
database per module; a module may set BENCH_SEED and BENCH_TAG). How many xdist workers `-n auto`
starts: pytest_xdist_auto_num_workers.

Shared helpers, for `from conftest import ...`: the fastgemm and split-K test points (each built
by the GPU-free module and run by its GPU twin), and helpers to build (build_once: one compile of
a kernel, whichever worker asks), compile and measure them.
"""

import fcntl
import hashlib
import os
import random
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import pytest

from gemmgen.build.nvcc import build_kernel, find_tool, kernel_usage
from gemmgen.errors import ToolNotFound
from gemmgen.paths import cache_dir


@lru_cache(maxsize=None)
def nvcc_missing() -> str | None:
    try:
        find_tool("nvcc")
        return None
    except ToolNotFound as err:
        return str(err)


@lru_cache(maxsize=None)
def gpu_missing() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "no NVIDIA GPU here (nvidia-smi not found); run `pytest -m gpu` on the GPU machine"
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    if out.returncode != 0 or "GPU" not in out.stdout:
        return f"no NVIDIA GPU visible to nvidia-smi: {out.stdout.strip() or out.stderr.strip()}"
    return nvcc_missing()


# The modules that take longest (20 s or more of one worker on a 2-core machine, 2026-11-28), in
# that order: they are handed out first (`--no-loadscope-reorder` in pyproject's addopts keeps this
# order; xdist's own puts the modules with the most tests first), so that no worker is left running
# a long one while the other has finished. Only the time depends on it.
LONGEST_FIRST = ["cli/test_docs.py", "tune/test_tune.py", "plot/test_plot.py", "tune/test_tune_node.py",
                 "codegen/test_hopper.py", "codegen/test_batched_hopper.py", "build/test_build.py",
                 "codegen/test_epilogue.py", "codegen/test_harness.py", "tune/test_workload.py",
                 "tune/test_tune_concurrency.py", "codegen/test_trim.py", "selection/test_dispatch.py",
                 "store/test_shipped_results.py"]


def _module_rank(item) -> int:
    path = item.path.as_posix()
    return next((n for n, name in enumerate(LONGEST_FIRST) if path.endswith("tests/" + name)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_module_rank)  # stable: a module's tests, and the other modules, keep their order
    for item in items:
        if "gpu" in item.keywords and gpu_missing():
            item.add_marker(pytest.mark.skip(reason=gpu_missing()))
        elif "nvcc" in item.keywords and nvcc_missing():
            item.add_marker(pytest.mark.skip(reason=f"nvcc not available: {nvcc_missing()}"))


# ---- on several CPUs (pytest-xdist: `-n auto --dist loadfile` in pyproject's addopts) -------------
#
# A module's tests run in one worker, so its module fixtures are made once. The workers share one
# build cache (build_cache), and the helpers below build through build_once, which holds a lock
# per kernel: a kernel two workers ask for at once is compiled once.

def pytest_xdist_auto_num_workers(config):
    """How many workers `-n auto` starts: one per CPU this process may use, at most 4; none (the
    tests run in this process, as without xdist) where a test's prints are asked for (-s) and for
    the GPU tests (`-m gpu`: one GPU, whose timings a second worker would disturb)."""
    if config.option.capture == "no" or "gpu" in (config.option.markexpr or ""):
        return 0
    return max(1, min(4, len(os.sched_getaffinity(0))))


@lru_cache(maxsize=None)
def postgres_missing() -> str | None:
    """Why no throwaway PostgreSQL server can be started here, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the psycopg driver is not installed (pip install 'gemmgen[postgres]')"
    if not _postgres_bin("initdb"):
        return "PostgreSQL's server programs (initdb, pg_ctl) are not installed (apt-get install postgresql)"
    return None


def _postgres_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(candidates[-1]) if candidates else None


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of the test session's own, on a Unix socket in a temporary folder (no
    network): a function that makes a fresh database and returns its SQLAlchemy URL. Skips with
    the reason where no server can be started."""
    if postgres_missing():
        pytest.skip(postgres_missing())

    import psycopg

    # not under pytest's temporary tree, which only root may enter
    folder = Path(tempfile.mkdtemp(prefix="gemmgen-postgres-"))
    data, socket = folder / "data", folder / "socket"
    socket.mkdir()
    as_user = []
    if os.geteuid() == 0:  # initdb refuses to run as root: run the server as the postgres user
        shutil.chown(folder, "postgres")
        shutil.chown(socket, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = 5400 + os.getpid() % 500
    subprocess.run([*as_user, _postgres_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "gemmgen"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, _postgres_bin("pg_ctl"), "-D", str(data), "-w", "-l", str(folder / "log"), "-o",
                    f"-c listen_addresses='' -k {socket} -p {port} -c max_connections=200", "start"],
                   check=True, capture_output=True)
    counter = iter(range(10**6))

    def new_database() -> str:
        name = f"t{next(counter)}"
        with psycopg.connect(host=str(socket), port=port, user="gemmgen", dbname="postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return f"postgresql+psycopg://gemmgen@/{name}?host={socket}&port={port}"

    try:
        yield new_database
    finally:
        subprocess.run([*as_user, _postgres_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def build_cache(tmp_path_factory):
    """The session's GEMMGEN_CACHE, fresh and shared by every test module (and every xdist worker),
    so that each kernel is compiled once per session (the cache key is the source, the target, the flags and nvcc's
    version: a hit is the same compile), and no test reads or writes ~/.cache. A test that needs
    a cache of its own sets GEMMGEN_CACHE itself (monkeypatch)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one cache for all the workers: beside their temporary folders
        folder = tmp_path_factory.getbasetemp().parent / "gemmgen-cache"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("gemmgen-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMGEN_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def torch_arch():
    """The Arch of the CUDA device PyTorch sees (tests/pytorch's GPU modules); skips where there is
    no torch or it sees no CUDA device."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device (a CPU-only torch?)")
    from gemmgen.describe.arch import parse_arch

    major, minor = torch.cuda.get_device_capability()
    return parse_arch(f"{major}{minor}")


@pytest.fixture(scope="module")
def bench(request, tmp_path_factory):
    """A Bench on GPU 0 recording into a database of the module's own (short timings)."""
    pytest.importorskip("pycuda.driver", reason="PyCUDA is needed for the runtime tests")
    from gemmgen.measure.bench import Bench
    from gemmgen.measure.device import Gpu
    from gemmgen.store.db import ResultsDB

    db = ResultsDB(f"sqlite:///{tmp_path_factory.mktemp('db') / 'test.db'}")
    gpu = Gpu()
    b = Bench(gpu, db, tag=getattr(request.module, "BENCH_TAG", "test"), seed=getattr(request.module, "BENCH_SEED", 1),
              min_total_ms=5.0)
    yield b
    b.close()
    gpu.close()


def slow_after(count: int, cases: list) -> list:
    """``cases`` for pytest.mark.parametrize, the first ``count`` as they are and the rest marked
    slow: a compile matrix whose first cases run every time (the README's `pytest`) and all of
    them in the slow run (`pytest -m slow`, which CI runs too)."""
    return [case if i < count else pytest.param(*(case if isinstance(case, tuple) else (case,)),
                                                 marks=pytest.mark.slow)
            for i, case in enumerate(cases)]


# ---- test points ---------------------------------------------------------------------------------

# a small mma tile (64 x 64, 2 x 2 warps): the batched GPU tests' points start from it
SMALL_MMA = {"BM": 64, "BN": 64, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2}

FASTGEMM_SEED = {"BM": 24, "BN": 512, "BK": 8, "THREADS": 128, "AV": 24, "KC": 1, "preload": 1}
# fastgemm points that exercise each part of its template: the wiki's point (C updated in shared
# memory at every k step); sums kept in registers for a whole K tile; no preloading; two thread
# groups along M (A vectors); two float4 B vectors per thread; small blocks; 512 threads (at most
# 128 registers each); a deep K tile.
FASTGEMM_POINTS = {
    "seed": FASTGEMM_SEED,
    "kc_tile": {**FASTGEMM_SEED, "KC": 8},
    "no_preload": {**FASTGEMM_SEED, "KC": 4, "preload": 0},
    "two_groups": {"BM": 48, "BN": 256, "BK": 8, "THREADS": 128, "AV": 24, "KC": 8, "preload": 1},
    "two_b_vectors": {"BM": 16, "BN": 1024, "BK": 4, "THREADS": 128, "AV": 16, "KC": 4, "preload": 1},
    "small": {"BM": 16, "BN": 128, "BK": 4, "THREADS": 64, "AV": 8, "KC": 2, "preload": 0},
    "wide_block": {"BM": 128, "BN": 128, "BK": 8, "THREADS": 512, "AV": 8, "KC": 4, "preload": 1},
    "deep_k": {"BM": 32, "BN": 256, "BK": 16, "THREADS": 128, "AV": 16, "KC": 16, "preload": 1},
}


def split_points() -> dict[str, dict]:
    """`warp` points with split-K and block swizzle, by label: the named point `splitk`; BM = 16 with
    16 splits and one buffer; v4 split 4 ways and swizzled; v4 swizzled only; BN = 16 split 2 ways."""
    from gemmgen.describe.points import NAMED_POINTS

    v4 = dict(NAMED_POINTS["v4"].params)
    return {
        "splitk": dict(NAMED_POINTS["splitk"].params),
        "m16_k16_g2_b1": {"BM": 16, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "TM": 4, "TN": 4, "buffers": 1,
                          "split_k": 16, "swizzle": 2},
        "v4_k4_g8": {**v4, "split_k": 4, "swizzle": 8},
        "v4_g4": {**v4, "swizzle": 4},
        "n16_k2_g16": {"BM": 64, "BN": 16, "BK": 16, "WM": 32, "WN": 16, "TM": 4, "TN": 4, "split_k": 2,
                       "swizzle": 16},
    }


def call_sequence(seed: int, count: int = 30) -> list[tuple]:
    """``count`` calls as a user makes them, in one process: (M, N, K, A offset, B offset, C offset
    (in elements, from 16-byte aligned buffers), alpha, beta). They hold a 1x5000x3 product and
    then 3000x1x2000 (fewer tiles, a workspace no larger: the old split-K bug), 1x1x1, K = 1, thin
    shapes, growing and shrinking runs in a random order, misaligned pointers about one call in
    three, and every other call beta = 0 (C poisoned with NaN by the GPU tests). M * N stays at
    most 2^22 and M * N * K at most 2^31, so that the float64 reference is quick on the host."""
    rng = random.Random(seed)
    fixed = [(1, 5000, 3), (3000, 1, 2000), (1, 1, 1), (257, 130, 1), (16, 4096, 512), (4095, 17, 33)]
    dims = [1, 2, 3, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 2049, 4097]
    shapes = list(fixed)
    while len(shapes) < count:
        m, n, k = (rng.choice(dims) for _ in range(3))
        if m * n <= 2**22 and m * n * k <= 2**31:
            shapes.append((m, n, k))
    order = [2, 0, 1] + [i for i in range(3, count)]  # 1x1x1 first, then the split-K pair
    tail = order[3:]
    rng.shuffle(tail)
    calls = []
    for i, index in enumerate(order[:3] + tail):
        m, n, k = shapes[index]
        alpha, beta = ((1.0, 0.0), (1.25, -0.75))[i % 2]
        calls.append((m, n, k, rng.choice((0, 0, 1)), rng.choice((0, 0, 3)), rng.choice((0, 0, 1)), alpha, beta))
    return calls


# ---- building, compiling, measuring ---------------------------------------------------------------

REGISTERS_PER_SM = 64 * 1024


@contextmanager
def cache_lock(name: str):
    """Holds the lock file ``name`` of the current GEMMGEN_CACHE (the session's, from the build_cache
    fixture) for the block: where xdist's workers (or threads) ask for one build at once, the first
    makes it and the others find it cached."""
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_once(config):
    """build_kernel(config) into the current GEMMGEN_CACHE, under a lock named after the kernel
    (cache_lock)."""
    with cache_lock(f"{config.name}.{config.build_arch.name}"):
        return build_kernel(config)


def build_all(configs: dict) -> dict:
    """{key: (config, BuildResult)} for {key: KernelConfig}: every config compiled (build_once),
    two at a time."""
    with ThreadPoolExecutor(2) as pool:
        futures = {key: pool.submit(build_once, config) for key, config in configs.items()}
        return {key: (configs[key], future.result()) for key, future in futures.items()}


def assert_compiles_without_spills(config, result):
    """Fails the test unless ``result`` (config's BuildResult) compiled and ptxas reported the kernel
    with registers, no spills, and a block's registers within one SM's. Returns the ResourceUsage."""
    assert result.ok, result.log
    usage = kernel_usage(config, result)
    assert usage is not None and usage.registers > 0, result.log
    assert usage.spills is False, usage
    assert usage.registers * config.geometry.threads <= REGISTERS_PER_SM, usage
    return usage


def nvcc_compile(source: str, out: Path, arch: str | None, *flags: str) -> Path:
    """Writes ``source`` to ``out`` with the suffix .cu and runs ``nvcc -O3 -arch=<arch> <flags> -o out``
    on it (no -arch where ``arch`` is None: the flags name the targets); fails the test with nvcc's
    output where nvcc fails. Returns ``out``."""
    cu = out.with_suffix(".cu")
    cu.write_text(source)
    target = [f"-arch={arch}"] if arch else []
    proc = subprocess.run([find_tool("nvcc"), "-O3", *target, *flags, str(cu), "-o", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def assert_measured_ok(bench, label: str, config, shape):
    """Measures ``config`` at ``shape`` through ``bench`` (build, both checks, timing, record) and
    fails the test unless it passed and was timed. Returns the Measured."""
    m = bench.measure_point(label, config, shape)
    assert m.status == "ok", m.message
    assert m.timing.median_ms > 0 and m.rel_error is not None
    return m


# The named points every run compiles in full for sm_90 (test_build.py checks them for spills): one
# of each family, and those the launcher tests ask.
EVERY_RUN_POINTS = ["v1", "v2", "v3", "v4", "v6", "fastgemm", "splitk", "mma_fp16", "mma_bf16", "hopper_fp16",
                    "hopper_tf32"]


@lru_cache(maxsize=None)
def _built_in_full() -> frozenset:
    from gemmgen.describe.points import resolve_point

    return frozenset((c.name, c.build_arch.name) for c in (resolve_point(p, "sm_90") for p in EVERY_RUN_POINTS))


def host_library(config) -> Path:
    """The shared library of ``config``'s emitted file with its device code as PTX only: no ptxas
    (about 40% of a Hopper kernel's build), so no cubin and no resource report, but the launcher's
    host code as users build it. Compiled once per session into the build cache; fails the test
    with nvcc's output where nvcc fails."""
    from gemmgen.build.nvcc import DEFAULT_FLAGS, LIBRARY_FLAGS
    from gemmgen.codegen.render import render_kernel

    source, arch = render_kernel(config), config.build_arch
    target = f"compute_{arch.cc}{arch.suffix}"
    flags = [*DEFAULT_FLAGS, f"-gencode=arch={target},code={target}", *LIBRARY_FLAGS]
    key = hashlib.sha256("\0".join([source, *flags]).encode()).hexdigest()[:32]
    library = cache_dir() / "ptx" / f"{key}.so"
    library.parent.mkdir(parents=True, exist_ok=True)
    with cache_lock(f"ptx-{key}"):
        if not library.is_file():
            with tempfile.TemporaryDirectory(prefix="gemmgen-") as tmp:
                src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.so"
                src.write_text(source)
                proc = subprocess.run([find_tool("nvcc"), *flags, str(src), "-o", str(out)], capture_output=True,
                                      text=True, timeout=600, check=False)
                assert proc.returncode == 0, proc.stdout + proc.stderr
                shutil.copyfile(out, library.with_suffix(".part"))
                os.replace(library.with_suffix(".part"), library)
    return library


def launcher_of(config):
    """``config``'s emitted launcher, built and loaded; its describe() and its refusals need no GPU
    (it is for those only: a point other than EVERY_RUN_POINTS' is built to PTX only, host_library,
    as no other quick test builds it)."""
    from gemmgen.measure.launcher import Launcher

    if (config.name, config.build_arch.name) not in _built_in_full():
        return Launcher(host_library(config))
    build = build_once(config)
    assert build.ok, build.log
    return Launcher(build.library)


def device_array(drv, host, offset_elements: int):
    """A device copy of the NumPy array ``host`` starting ``offset_elements`` past a 256-byte
    aligned buffer (misaligned pointers, as users pass them): (the buffer, to free; the address)."""
    import numpy as np

    buffer = drv.mem_alloc(host.nbytes + 16 * host.itemsize + 256)
    address = int(buffer) + offset_elements * host.itemsize
    drv.memcpy_htod(address, np.ascontiguousarray(host))
    return buffer, address


def check_calls_in_one_process(bench, kernel, config, calls, rng) -> None:
    """Calls the loaded ``kernel`` (of ``config``) once per entry of ``calls`` (as call_sequence
    gives them), with fresh random operands stored as ``config.variant`` stores them, at the given
    element offsets (a bias vector at C's offset, where the variant adds one), C poisoned with NaN
    where beta == 0; fails the test at the first result outside the tolerance of its float64
    reference (bias and activation applied)."""
    import numpy as np

    from gemmgen.describe.problem import Shape
    from gemmgen.measure import verify

    drv, variant, precision = bench.gpu.drv, config.variant, config.precision
    for m, n, k, a_off, b_off, c_off, alpha, beta in calls:
        shape = Shape(m, n, k)
        a = verify.random_matrix(rng, *variant.a_dims(shape), precision)
        b = verify.random_matrix(rng, *variant.b_dims(shape), precision, "b")
        c0 = verify.random_matrix(rng, m, n, variant.out)
        hosts = [(a, a_off), (b, b_off), (c0 if beta != 0 else _poisoned(c0), c_off)]
        bias = None
        if variant.bias != "none":
            bias = verify.random_matrix(rng, 1, m if variant.bias == "row" else n, variant.out)
            hosts.append((bias, c_off))
        buffers = []
        try:
            for host, off in hosts:
                buffers.append(device_array(drv, host, off))
            pa, pb, pc = (address for _, address in buffers[:3])
            kernel.launch(m, n, k, alpha, pa, pb, beta, pc, bias=buffers[3][1] if bias is not None else None)
            bench.gpu.synchronize()
            got = np.empty(c0.shape, dtype=verify.host_dtype(variant.out))
            drv.memcpy_dtoh(got, pc)
        finally:
            for buffer, _ in buffers:
                buffer.free()
        a64, b64 = verify.product_operands(verify.as_float64(a, precision), verify.as_float64(b, precision, "b"),
                                           variant)
        ref, scale = verify.host_reference(a64, b64, verify.as_float64(c0, variant.out), alpha, beta)
        if variant.has_epilogue:
            bias64 = verify.as_float64(bias, variant.out) if bias is not None else None
            ref, scale = verify.epilogue(ref, scale, bias64, variant.bias, variant.act)
        verdict = verify.compare(verify.as_float64(got, variant.out), ref, scale, precision, k, variant.out,
                                 variant.act)
        assert verdict.ok, f"{m}x{n}x{k} offsets {a_off},{b_off},{c_off} beta={beta}: {verdict.message}"


#: The shapes of batched_calls (M, N, K): 1x1x1, odd and thin ones.
BATCHED_SHAPES = [(1, 1, 1), (17, 33, 9), (127, 129, 65), (257, 255, 1023), (64, 128, 256), (3, 1000, 17)]


def batched_calls(seed: int, count: int = 24, shapes=BATCHED_SHAPES) -> list[dict]:
    """A call of batch 0 (17x33x9), then ``count`` batched calls as a user makes them: ``shapes``
    (M, N, K) in turn at batch counts 1, 3 and 8 in turn, with padding (elements) between
    consecutive matrices of A, B, C and the bias (0: packed), stride 0 for A, B or the bias now
    and then, a misaligned first pointer now and then, beta = 0 every other call. The same
    ``seed`` and ``count`` give the same calls whatever ``shapes``."""
    rng = random.Random(seed)
    calls = []
    for i in range(count):
        m, n, k = shapes[i % len(shapes)]
        batch = (1, 3, 8)[i % 3]
        calls.append({
            "shape": (m, n, k), "batch": batch,
            "pad": tuple(rng.choice((0, 0, 1, 8, 13)) for _ in range(4)),  # A, B, C, bias
            "shared": tuple(rng.random() < 0.2 for _ in range(3)),  # stride 0 for A, B, bias
            "offset": tuple(rng.choice((0, 0, 0, 1)) for _ in range(3)),
            "alpha": (1.0, 1.25)[i % 2], "beta": (0.0, -0.75)[i % 2],
        })
    calls.insert(0, {"shape": (17, 33, 9), "batch": 0, "pad": (0,) * 4, "shared": (False,) * 3,
                     "offset": (0,) * 3, "alpha": 1.0, "beta": 0.0})
    return calls


def check_batched_call(bench, kernel, config, call, rng) -> None:
    """One batched launch of ``kernel`` as ``call`` (batched_calls) describes it; fails the test
    unless every matrix of the batch is within the tolerance of its float64 reference (bias and
    activation applied) and C's padding between matrices keeps its sentinel. ``kernel``: a batched
    gemmgen.measure.launcher.Launcher (a kernel's, or a dispatcher's); ``config``: what it computes, its
    ``variant`` and ``precision`` (a KernelConfig, or a DispatchPlan)."""
    import numpy as np

    from gemmgen.describe.problem import Shape
    from gemmgen.measure import verify

    drv, variant, precision = bench.gpu.drv, config.variant, config.precision
    (m, n, k), batch = call["shape"], call["batch"]
    shape = Shape(m, n, k)
    a_dims, b_dims = variant.a_dims(shape), variant.b_dims(shape)
    pad_a, pad_b, pad_c, pad_bias = call["pad"]
    shared_a, shared_b, shared_bias = call["shared"]
    n_bias = {"row": m, "col": n}.get(variant.bias, 0)
    stride_a = 0 if shared_a else m * k + pad_a
    stride_b = 0 if shared_b else k * n + pad_b
    stride_c = m * n + pad_c
    stride_bias = 0 if shared_bias else n_bias + pad_bias
    count = max(batch, 1)

    def stack(rows, cols, prec, stride, fill, operand="a"):
        """The batch's matrices at ``stride`` elements from one another (one where stride is 0),
        the padding between them ``fill``; returns (flat host array, [matrices])."""
        mats = [verify.random_matrix(rng, rows, cols, prec, operand) for _ in range(count if stride else 1)]
        flat = np.full((stride * (count - 1) + rows * cols) if stride else rows * cols, fill,
                       dtype=mats[0].dtype)
        for i, mat in enumerate(mats):
            flat[i * stride:i * stride + rows * cols] = mat.reshape(-1)
        return flat, mats

    a_flat, a_mats = stack(*a_dims, precision, stride_a, 0)
    b_flat, b_mats = stack(*b_dims, precision, stride_b, 0, "b")
    sentinel = verify.random_matrix(rng, 1, 1, variant.out).reshape(-1)[0]
    c_flat, c_mats = stack(m, n, variant.out, stride_c, sentinel)
    c_start = c_flat.copy()
    if call["beta"] == 0.0:  # poison C's matrices (not the padding) with NaN
        poison = np.frombuffer(b"\xff" * c_flat.itemsize, dtype=c_flat.dtype)[0]
        for i in range(count):
            c_start[i * stride_c:i * stride_c + m * n] = poison
    hosts = [(a_flat, call["offset"][0]), (b_flat, call["offset"][1]), (c_start, call["offset"][2])]
    bias_mats = None
    if n_bias:
        bias_flat, bias_mats = stack(1, n_bias, variant.out, stride_bias, 0)
        hosts.append((bias_flat, call["offset"][2]))
    buffers = []
    try:
        for host, off in hosts:
            buffers.append(device_array(drv, host, off))
        pa, pb, pc = (address for _, address in buffers[:3])
        kernel.launch(m, n, k, call["alpha"], pa, pb, call["beta"], pc, bias=buffers[3][1] if n_bias else None,
                      batch=batch, strides=(stride_a, stride_b, stride_c, stride_bias))
        bench.gpu.synchronize()
        got = np.empty_like(c_start)
        drv.memcpy_dtoh(got, pc)
    finally:
        for buffer, _ in buffers:
            buffer.free()
    what = f"{m}x{n}x{k} batch={batch} strides={stride_a},{stride_b},{stride_c},{stride_bias} beta={call['beta']}"
    if batch == 0:
        assert got.tobytes() == c_start.tobytes(), f"{what}: batch 0 wrote C"
        return
    for i in range(batch):
        start = i * stride_c
        if i + 1 < batch:  # the padding after matrix i is untouched
            assert got[start + m * n:start + stride_c].tobytes() == c_start[start + m * n:start + stride_c].tobytes(), \
                f"{what}: matrix {i} wrote past its end"
        a64, b64 = verify.product_operands(verify.as_float64(a_mats[i if stride_a else 0], precision),
                                           verify.as_float64(b_mats[i if stride_b else 0], precision, "b"), variant)
        ref, scale = verify.host_reference(a64, b64, verify.as_float64(c_mats[i], variant.out), call["alpha"],
                                           call["beta"])
        if variant.has_epilogue:
            bias64 = verify.as_float64(bias_mats[i if stride_bias else 0], variant.out) if n_bias else None
            ref, scale = verify.epilogue(ref, scale, bias64, variant.bias, variant.act)
        c = got[start:start + m * n].reshape(m, n)
        verdict = verify.compare(verify.as_float64(c, variant.out), ref, scale, precision, k, variant.out, variant.act)
        assert verdict.ok, f"{what}: matrix {i}: {verdict.message}"


def _poisoned(c0):
    """All-ones bits in C's storage: NaN in fp32, fp16 and bf16."""
    import numpy as np

    return np.frombuffer(b"\xff" * c0.nbytes, dtype=c0.dtype).reshape(c0.shape)


def load_kernel(bench, config):
    """``config`` built (failing the test with the build log where it does not) and loaded on the GPU."""
    from gemmgen.measure.launcher import LoadedKernel

    build = build_once(config)
    assert build.ok, build.log
    return LoadedKernel(bench.gpu, config, build.library)


def check_without_workspace(bench, config, shape) -> None:
    """The kernel of ``config`` launched straight from its cubin with a null workspace (no pack
    kernel first: its element-wise copy path) at ``shape``, whose M, N, K must make the launcher
    pack; the bias after C where the variant adds one. Fails the test unless both checks pass."""
    import numpy as np

    from gemmgen.measure.launcher import LoadedKernel

    build = build_once(config)
    assert build.ok, build.log
    info = LoadedKernel(bench.gpu, config, build.library).describe(shape.m, shape.n, shape.k)
    assert info.packed_a_bytes or info.packed_b_bytes  # the launcher would pack
    kernel = bench.gpu.drv.module_from_file(str(build.cubin)).get_function(config.name)
    if config.geometry.smem_bytes > 48 * 1024:
        kernel.set_attribute(bench.gpu.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, config.geometry.smem_bytes)
    bias = config.variant.bias != "none"
    # M, N, K, alpha, A, B, beta, C, [bias,] gg_workspace{flags, partials, packed}
    kernel.prepare("iiifPPfPP" + ("P" if bias else "") + "PP")
    ops = bench.operands(shape, config.precision, config.variant)

    def run(alpha, beta):
        kernel.prepared_call(tuple(info.grid), config.geometry.block, np.int32(shape.m), np.int32(shape.n),
                             np.int32(shape.k), np.float32(alpha), int(ops.a), int(ops.b), np.float32(beta),
                             int(ops.c), *((ops.bias_address,) if bias else ()), 0, 0, 0,
                             shared_size=config.geometry.smem_bytes)

    verdict = bench.verify(run, ops)
    assert verdict.ok, verdict.message


def run_gemm(bench, kernel, ops, alpha, beta):
    """One launch of ``kernel`` on ``ops`` (C reset for beta first); C downloaded."""
    s = ops.shape
    ops.reset_c(beta)
    kernel.launch(s.m, s.n, s.k, alpha, int(ops.a), int(ops.b), beta, int(ops.c))
    bench.gpu.synchronize()
    return ops.download_c()


@pytest.fixture
def needs_sm90(bench):
    """Skips a test on any GPU but sm_90 (the hopper family's only target)."""
    if bench.gpu.info.arch.cc != 90:
        pytest.skip(f"the hopper family runs on sm_90 only; this GPU is {bench.gpu.info.arch.name}")


def table_plan(kernels, served: dict, devices=("test",), variant=None):
    """A DispatchPlan whose tables give each shape of ``served`` (Shape -> kernel index) its kernel:
    a layer per N x K, the token counts between two given shapes split at their geometric middle
    (for tests of the emitted lookup, without a results database)."""
    from gemmgen.selection.dispatch.select import MAX_M, DispatchPlan, Layer, Span

    layers = {}
    for shape, i in sorted(served.items(), key=lambda item: (item[0].n, item[0].k, item[0].m)):
        layers.setdefault((shape.n, shape.k), []).append((shape.m, i))
    table = []
    for (n, k), given in layers.items():
        ends = [int((a * b) ** 0.5) for (a, _), (b, _) in zip(given, given[1:])] + [MAX_M]
        starts = [1] + [e + 1 for e in ends[:-1]]
        table.append(Layer(n, k, tuple(Span(lo, hi, i, 1.0, 1.0, (m,)) for lo, hi, (m, i) in zip(starts, ends, given)),
                           tuple(m for m, _ in given), "test"))
    return DispatchPlan(kernels[0].precision, kernels[0].arch, tuple(kernels), tuple(table), tuple(devices),
                        variant or kernels[0].variant, 132)
