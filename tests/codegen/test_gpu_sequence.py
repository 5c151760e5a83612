"""On the GPU: kernels used the way users use them. Every named point, and random valid points of
every family with each option that keeps state between launches (split-K counters, stream-K flags,
clusters, packed copies of misaligned operands), is called in ONE process over a sequence of 30
calls (conftest.call_sequence: the old split-K failure's 1x5000x3 then 3000x1x2000, 1x1x1, K = 1,
thin shapes, growing and shrinking, misaligned pointers; beta = 0 into NaN-poisoned C and
beta != 0), each checked against the float64 reference. Twice:

- through the emitted file, built as a library the way its header says, called as
  gemmgen_gemm(...) as another program would call it;
- through gemmgen's runtime (LoadedKernel), by plans and by plain launches in turn.

Then the stateful kernels on two streams at once, each stream with its own workspace.
"""

import os
import random
import subprocess
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import call_sequence, split_points

from gemmgen.build.nvcc import build_kernel, find_tool
from gemmgen.codegen.render import render_kernel
from gemmgen.describe import scaling
from gemmgen.describe.arch import detect_arch, parse_arch
from gemmgen.describe.config import DEFAULT_ARCH, make_config
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.points import NAMED_POINTS
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import InvalidPoint
from gemmgen.measure import verify
from gemmgen.measure.launcher import Launcher, LoadedKernel
from gemmgen.tune.space import load_space

pytestmark = pytest.mark.gpu

ARCH = detect_arch() or parse_arch(DEFAULT_ARCH)
SEED = 20261122


def _points() -> dict:
    """label -> KernelConfig for the GPU here: each distinct named point, two random valid points
    of every family the GPU runs, and points forced to each stateful option."""
    configs = {}
    for point in NAMED_POINTS.values():
        if point.runs_on(ARCH):
            config = point.config(ARCH)
            configs.setdefault(config.name, config)
    points = {f"named-{c.name}": c for c in configs.values()}
    rng = random.Random(SEED)
    for family in FAMILIES.values():
        if not family.runs_on(ARCH.cc):
            continue
        space, found = load_space(family.name), 0
        for _ in range(2000):
            try:
                config = make_config(family.name, space.sample(rng), rng.choice(space.precisions), ARCH)
            except InvalidPoint:
                continue
            points[f"random-{config.name}"] = config
            found += 1
            if found == 2:
                break
    for label, params in split_points().items():
        points[f"splitk-{label}"] = make_config("warp", params, "fp32", ARCH)
    if ARCH.cc >= 80:
        for precision, params in (("fp16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "split_k": 8}),
                                  ("tf32", {"BM": 64, "BN": 128, "BK": 16, "split_k": 4, "swizzle": 4})):
            config = make_config("mma", params, precision, ARCH)
            points[f"splitk-{config.name}"] = config
    if ARCH.cc == 90:
        base = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4}
        for precision, params in (("fp16", {**base, "streamk": 1}), ("bf16", {**base, "cluster": 2}),
                                  ("bf16", {**base, "cluster": 2, "streamk": 1, "swizzle": 8}),
                                  ("tf32", {**base, "streamk": 1, "cluster": 2}),
                                  ("fp16", {**base, "BN": 128, "schedule": "pingpong", "stages": 6}),
                                  ("fp16", {**base, "BM": 16, "BN": 128, "consumers": 1, "stages": 8, "swap": 1,
                                            "streamk": 1}),
                                  ("bf16", {**base, "BM": 32, "consumers": 2, "swap": 1, "cluster": 2}),
                                  ("e4m3", {**base, "BN": 128, "stages": 6, "promote": 4, "streamk": 1, "trans": "nt"}),
                                  ("e4m3", {**base, "BM": 64, "BN": 128, "swap": 1, "promote": 1, "cluster": 2,
                                            "trans": "nt", "out": "fp16"}),
                                  ("e4m3", {**base, "streamk": 1, "overlap": 1, "swizzle": 8, "trans": "nt",
                                            "out": "bf16", "scale": "row"}),
                                  ("e4m3", {**base, "BM": 64, "BN": 128, "swap": 1, "trans": "nt", "out": "bf16",
                                            "scale": "row"}),
                                  ("e4m3", {**base, "BN": 128, "schedule": "pingpong", "stages": 6, "trans": "nt",
                                            "scale": "tensor"}),
                                  ("e4m3", {**base, "BN": 128, "stages": 6, "promote": 1, "streamk": 1, "trans": "nt",
                                            "out": "bf16", "scale": "block"}),
                                  ("e4m3", {**base, "BN": 256, "consumers": 2, "stages": 4, "promote": 1, "BM": 64,
                                            "swap": 1, "trans": "nt", "out": "fp32", "scale": "block"}),
                                  ("e4m3", {**base, "BM": 16, "BN": 128, "consumers": 1, "stages": 8, "promote": 1,
                                            "swap": 1, "trans": "nt", "out": "bf16", "scale": "block"}),
                                  # B tiles of 64 rows (one TMA box) in FP8, a ring of 16 stages, 8- and 16-row tiles;
                                  # stream-K on thin tiles, where a tile's fixup adds many holders' partial sums
                                  ("e4m3", {**base, "BM": 16, "BN": 64, "consumers": 1, "stages": 16, "swap": 1,
                                            "trans": "nt", "out": "bf16", "scale": "tensor"}),
                                  ("e4m3", {**base, "BM": 8, "BN": 64, "consumers": 1, "stages": 12, "swap": 1,
                                            "promote": 4, "trans": "nt", "out": "fp32", "scale": "row"}),
                                  ("bf16", {**base, "BM": 16, "BN": 64, "consumers": 1, "stages": 16, "swap": 1,
                                            "streamk": 1, "trans": "nt", "out": "bf16"}),
                                  ("e4m3", {**base, "BM": 16, "BN": 128, "consumers": 2, "stages": 12, "swap": 1,
                                            "streamk": 1, "promote": 16, "trans": "nt", "out": "bf16",
                                            "scale": "tensor"}),
                                  # B stored N x K in boxes of 32 rows, one multicast by each block of a cluster
                                  ("e4m3", {**base, "BM": 64, "BN": 64, "consumers": 1, "stages": 8, "cluster": 2,
                                            "trans": "nt", "out": "bf16", "scale": "tensor"}),
                                  ("bf16", {**base, "BM": 16, "BN": 64, "consumers": 1, "stages": 16, "swap": 1,
                                            "cluster": 2, "streamk": 1, "trans": "nt", "out": "bf16"}),
                                  ("fp16", {**base, "BN": 192, "stages": 3, "cluster": 2, "trans": "nt"}),
                                  # A's tile in boxes of abox rows, those wholly past M not loaded (their rows of
                                  # shared memory keep an earlier stage's values): coop, swap with stream-K and a
                                  # cluster, ping-pong
                                  ("e4m3", {**base, "BN": 64, "stages": 6, "promote": 4, "abox": 16, "trans": "nt",
                                            "out": "bf16", "scale": "tensor"}),
                                  ("bf16", {**base, "BM": 32, "BN": 64, "consumers": 1, "stages": 8, "swap": 1,
                                            "abox": 8, "streamk": 1, "cluster": 2, "trans": "nt", "out": "bf16"}),
                                  ("fp16", {**base, "BN": 128, "schedule": "pingpong", "stages": 6, "abox": 32}),
                                  # FP8 of two formats, wgmma's operands in either order (swap: B's tile first)
                                  ("e5m2e4m3", {**base, "BN": 128, "stages": 6, "promote": 4, "streamk": 1,
                                                "trans": "nt", "out": "bf16", "scale": "tensor"}),
                                  ("e4m3e5m2", {**base, "BM": 64, "BN": 128, "consumers": 1, "stages": 6, "swap": 1,
                                                "trans": "nt", "out": "fp32", "scale": "row"})):
            config = make_config("hopper", params, precision, ARCH)
            points[f"stateful-{config.name}"] = config
    return points


POINTS = _points()
# kernels with split-K counters or stream-K flags (a few of each)
STATEFUL = ([label for label, c in POINTS.items() if c.geometry.split_k > 1][:3]
            + [label for label, c in POINTS.items() if c.geometry.stream_k][:3])


# ---- building -------------------------------------------------------------------------------------

def _emitted_library(config, folder) -> str:
    """The emitted file (what `gemmgen emit` writes), built as a library with its header's flags."""
    source, cu = render_kernel(config), folder / f"{config.name}.cu"
    cu.write_text(source)
    out = folder / f"lib{config.name}.so"
    proc = subprocess.run([find_tool("nvcc"), "-O3", *config.build_arch.nvcc_flags, "-Xcompiler", "-fPIC", "-shared",
                           str(cu), "-o", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(out)


@pytest.fixture(scope="module")
def libraries(request, tmp_path_factory, build_cache):
    """label -> (the emitted library's path, the runtime's BuildResult), compiled at once for the
    points this session's selected tests use (`-k` picks a few without building all of them)."""
    here = request.node.path
    wanted = {item.callspec.params["label"] for item in request.session.items
              if item.path == here and hasattr(item, "callspec") and "label" in item.callspec.params}
    folder = tmp_path_factory.mktemp("emitted")
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        emitted = {label: pool.submit(_emitted_library, POINTS[label], folder) for label in wanted}
        runtime = {label: pool.submit(build_kernel, POINTS[label]) for label in wanted}
        return {label: (emitted[label].result(), runtime[label].result()) for label in wanted}


# ---- operands and references, one set per input type, shared by the kernels -----------------------

class Call:
    """One call of a sequence: device buffers (16-byte aligned, with the pointers offset as the
    call asks), the inputs (B stored N x K where the variant says so; C of the variant's type;
    FP8's scales where the variant is scaled), and the float64 reference for its alpha and beta."""

    def __init__(self, gpu, rng, precision, variant, m, n, k, a_off, b_off, c_off, alpha, beta):
        drv, esize, c_esize = gpu.drv, PRECISIONS[precision].bytes, PRECISIONS[variant.out].bytes
        self.m, self.n, self.k, self.alpha, self.beta, self.out = m, n, k, alpha, beta, variant.out
        shape = Shape(m, n, k)
        host_a = verify.random_matrix(rng, *variant.a_dims(shape), precision)
        host_b = verify.random_matrix(rng, *variant.b_dims(shape), precision, "b")
        self.host_c0 = verify.random_matrix(rng, m, n, variant.out)
        self.c_bytes = m * n * c_esize
        self.buffers = [drv.mem_alloc(m * k * esize + 16), drv.mem_alloc(k * n * esize + 16),
                        drv.mem_alloc(self.c_bytes + 16), drv.mem_alloc(self.c_bytes)]
        self.a = int(self.buffers[0]) + a_off * esize
        self.b = int(self.buffers[1]) + b_off * esize
        self.c = int(self.buffers[2]) + c_esize * c_off
        self.c0 = int(self.buffers[3])
        drv.memcpy_htod(self.a, host_a)
        drv.memcpy_htod(self.b, host_b)
        drv.memcpy_htod(self.c0, self.host_c0)
        a64, b64 = verify.product_operands(verify.as_float64(host_a, precision),
                                           verify.as_float64(host_b, precision, "b"), variant)
        self.scales = None  # (scale_a, scale_b)'s device addresses, where the variant is scaled
        if variant.scaled:
            counts = variant.scale_lengths(m, n, k)
            host_scales = [rng.uniform(0.25, 4.0, count).astype(np.float32) for count in counts]
            self.buffers += [drv.mem_alloc(4 * count) for count in counts]
            for buffer, host in zip(self.buffers[-2:], host_scales):
                drv.memcpy_htod(buffer, host)
            self.scales = (int(self.buffers[-2]), int(self.buffers[-1]))
            sa, sb = scaling.expand(variant.scale, *host_scales, m, n, k)
            a64, b64 = a64 * sa, b64 * sb  # exact in float64
        c0 = verify.as_float64(self.host_c0, variant.out)
        self.ref, self.scale = verify.host_reference(a64, b64, c0, alpha, beta)

    def reset_c(self, drv):
        """C = NaN where beta == 0 (unwritten elements then fail), else C0."""
        if self.beta == 0.0:
            drv.memset_d8(self.c, 0xFF, self.c_bytes)
        else:
            drv.memcpy_dtod(self.c, self.c0, self.c_bytes)

    def check(self, drv, precision, what):
        out = np.empty((self.m, self.n), dtype=verify.host_dtype(self.out))
        drv.memcpy_dtoh(out, self.c)
        verdict = verify.compare(verify.as_float64(out, self.out), self.ref, self.scale, precision, self.k, self.out)
        assert verdict.ok, f"{what} at {self.m}x{self.n}x{self.k} (alpha={self.alpha}, beta={self.beta}): {verdict.message}"


INPUTS = {"tf32": "fp32"}  # tf32 kernels read fp32 inputs; the others their precision's


@pytest.fixture(scope="module")
def calls(bench):
    """calls(precision[, variant]): the sequence's calls for kernels of that precision and variant
    (made once, shared by the kernels and by test_gpu_dispatch.py)."""
    made: dict[tuple, list[Call]] = {}

    def get(precision, variant=Variant()):
        inputs = INPUTS.get(precision, precision)
        if (inputs, variant) not in made:
            rng = np.random.default_rng(zlib.crc32(f"{inputs} {variant.text}".encode()))
            made[inputs, variant] = [Call(bench.gpu, rng, inputs, variant, *call) for call in call_sequence(SEED)]
        return made[inputs, variant]

    yield get
    for sequence in made.values():
        for call in sequence:
            for buffer in call.buffers:
                buffer.free()


# ---- the sequences ----------------------------------------------------------------------------------

@pytest.mark.parametrize("label", sorted(POINTS))
def test_sequence_through_the_emitted_library(bench, libraries, calls, label):
    config, drv = POINTS[label], bench.gpu.drv
    launcher = Launcher(libraries[label][0])
    for i, call in enumerate(calls(config.precision, config.variant)):
        call.reset_c(drv)
        launcher.launch(call.m, call.n, call.k, call.alpha, call.a, call.b, call.beta, call.c, scales=call.scales)
        bench.gpu.synchronize()
        call.check(drv, config.precision, f"{config.name}, call {i} of the sequence")


@pytest.mark.parametrize("label", sorted(POINTS))
def test_sequence_through_the_runtime(bench, libraries, calls, label):
    config, drv = POINTS[label], bench.gpu.drv
    build = libraries[label][1]
    assert build.ok, build.log
    kernel = LoadedKernel(bench.gpu, config, build.library)
    try:
        for i, call in enumerate(calls(config.precision, config.variant)):
            call.reset_c(drv)
            args = (call.m, call.n, call.k, call.alpha, call.a, call.b, call.beta, call.c)
            if i % 2:
                with kernel.plan(*args, scales=call.scales) as plan:
                    plan.run()
                    bench.gpu.synchronize()
            else:
                kernel.launch(*args, scales=call.scales)
                bench.gpu.synchronize()
            call.check(drv, config.precision, f"{config.name}, call {i} of the sequence")
    finally:
        kernel.close()


@pytest.mark.parametrize("label", STATEFUL)
def test_two_streams_at_once_each_with_its_own_workspace(bench, libraries, calls, label):
    """Calls of the sequence queued alternately on two streams with no wait between them: the
    launches of the two streams may run at the same time, so they must not share split-K counters,
    stream-K flags or partial sums."""
    config = POINTS[label]
    launcher = Launcher(libraries[label][0])
    sequence = calls(config.precision, config.variant)[:12]
    streams = on_two_streams(bench, launcher, sequence, config.precision, config.name)
    assert launcher.held(streams[0].handle).flag_bytes > 0 and launcher.held(streams[1].handle).flag_bytes > 0
    assert launcher.held(streams[0].handle).flags != launcher.held(streams[1].handle).flags


def on_two_streams(bench, launcher, sequence, precision, what):
    """Queue the calls alternately on two new streams with no wait between them, then check each
    against its reference; returns the streams."""
    drv = bench.gpu.drv
    streams = [drv.Stream(), drv.Stream()]
    for call in sequence:
        call.reset_c(drv)
    bench.gpu.synchronize()
    for i, call in enumerate(sequence):
        launcher.launch(call.m, call.n, call.k, call.alpha, call.a, call.b, call.beta, call.c,
                        stream=streams[i % 2].handle, scales=call.scales)
    bench.gpu.synchronize()
    for i, call in enumerate(sequence):
        call.check(drv, precision, f"{what}, call {i} on stream {i % 2}")
    return streams


def test_the_points_cover_every_family_and_stateful_option():
    families = {c.family.name for c in POINTS.values()}
    assert families == {f.name for f in FAMILIES.values() if f.runs_on(ARCH.cc)}
    assert any(c.geometry.split_k > 1 for c in POINTS.values())
    assert any(c.geometry.pack_vec for c in POINTS.values())
    if ARCH.cc == 90:
        assert any(c.geometry.stream_k for c in POINTS.values())
        assert any(c.geometry.cluster > 1 for c in POINTS.values())
    assert len(call_sequence(SEED)) >= 25
