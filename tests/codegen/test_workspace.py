"""The launch in the caller's workspace, without a GPU: each launcher's _workspace_size (host
arithmetic, asked through gemmgen.measure.launcher.Launcher.workspace_size) against the parts _describe
gives, laid out as the launcher's rule says (flags, partial sums, packed operands, each rounded up
to 256 bytes), over sequences of shapes and misaligned operands, for split-K, stream-K, packing
and batched kernels and a dispatcher; and the emitted source's promise that such a launch zeroes
its flags on the stream and allocates, frees and waits for nothing. The GPU tests
(test_gpu_torch_graphs.py) run these launches, captured in CUDA graphs.
"""

import re
import zlib

import pytest
from conftest import call_sequence, launcher_of, table_plan

from gemmgen.build.nvcc import build_library
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.config import make_config
from gemmgen.describe.points import NAMED_POINTS, resolve_point
from gemmgen.describe.problem import Shape, Variant
from gemmgen.measure.launcher import Launcher, ShapeRefused

pytestmark = pytest.mark.nvcc

H100_SMS = 132
ESIZE = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
SM90 = parse_arch("sm_90")
HOPPER = {"BM": 128, "BN": 256, "consumers": 2, "stages": 4}


def configs():
    """Kernels with each part of a workspace: split-K (flags and partial sums), stream-K with
    F.linear's layout, a bias and GELU (flags, partial sums, and packed A and B where K is odd), mma
    (packed operands only), a strided batch split 2 ways (with packing), and v4 (none)."""
    return {
        "splitk": resolve_point("splitk"),
        "hopper_sk_linear": make_config("hopper", {**HOPPER, "streamk": 1, "trans": "nt", "out": "bf16",
                                                   "bias": "col", "act": "gelu"}, "bf16", "sm_90"),
        "mma_bf16": NAMED_POINTS["mma_bf16"].config("sm_90"),
        # test_batched's point (one build for both)
        "mma_k2_batched": make_config("mma", {"split_k": 2, "batch": "strided"}, "fp16", "sm_90"),
        "v4": resolve_point("v4"),
    }


CONFIGS = configs()


def rounded(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def laid_out(info) -> int:
    """The caller's workspace for a launch that needs ``info`` (LaunchInfo), by the rule the
    launcher documents: the flags (4 bytes each), the partial sums, then the packed copies of A
    and B, each part rounded up to 256 bytes."""
    return rounded(4 * info.flag_words) + rounded(info.partial_bytes) + rounded(info.packed_a_bytes
                                                                                 + info.packed_b_bytes)


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_the_workspace_size_is_the_described_parts_laid_out(label):
    """Over 30 calls of a user's sequence (growing and shrinking shapes, misaligned A, B and C),
    the size asked is the parts describe() gives, laid out; batched kernels at 3 products with
    padding between C's matrices."""
    config = CONFIGS[label]
    launcher = launcher_of(config)
    assert launcher.takes_workspace
    esize, batched = ESIZE[config.precision], config.variant.batched
    sizes = set()
    for m, n, k, a_off, b_off, c_off, _, beta in call_sequence(seed=zlib.crc32(label.encode())):
        where = dict(a=256 + a_off * esize, b=512 + b_off * esize, beta=beta, c=768 + 4 * c_off, resident=H100_SMS)
        if batched:
            where.update(batch=3, stride_c=m * n + 8)
        info = launcher.describe(m, n, k, **where)
        size = launcher.workspace_size(m, n, k, **where)
        assert size == laid_out(info), (m, n, k, a_off, b_off)
        sizes.add(size)
    if label == "v4":
        assert sizes == {0}
    else:
        assert len(sizes) > 3  # the sequence did exercise the arithmetic


def test_known_sizes():
    """Worked by hand. splitk (16 x 64 tiles, 8 splits) at 16x4096x4096: 64 counters (256 bytes)
    and 64 * 8 partial 16 x 64 fp32 tiles. Stream-K (128 x 256 tiles, 132 blocks, 2 flags each) at
    16x4096x4096: 264 flags (1056 bytes, 1280 rounded) and a partial tile per block; with K odd,
    A (16 x 4093 bf16, rows padded to 4096) and B (4096 x 4093) are packed after them."""
    splitk = launcher_of(CONFIGS["splitk"])
    assert splitk.workspace_size(16, 4096, 4096) == 256 + 64 * 8 * 16 * 64 * 4
    sk = launcher_of(CONFIGS["hopper_sk_linear"])
    partials = 132 * 128 * 256 * 4
    assert sk.workspace_size(16, 4096, 4096, resident=H100_SMS) == 1280 + partials
    assert sk.workspace_size(16, 4096, 4093, resident=H100_SMS) == 1280 + partials + rounded(16 * 4096 * 2) \
        + rounded(4096 * 4096 * 2)
    assert launcher_of(CONFIGS["mma_bf16"]).workspace_size(1024, 1024, 1024) == 0  # aligned: read in place


def test_a_refused_shape_is_refused_by_the_size_query_too():
    splitk = launcher_of(CONFIGS["splitk"])
    with pytest.raises(ShapeRefused, match=re.escape("refused M=0 N=4 K=4: M, N and K must be >= 1")):
        splitk.workspace_size(0, 4, 4)
    with pytest.raises(ShapeRefused, match=re.escape("M must be <= 1048560 (at most 65535 blocks along y)")):
        splitk.workspace_size(65535 * 16 + 1, 4, 4)  # 16-row tiles


@pytest.fixture(scope="module")
def dispatcher(tmp_path_factory):
    """A dispatcher of v4 (tuned for 4096^3: no workspace) and splitk (16x4096x4096), built."""
    from gemmgen.selection.dispatch.emit import render_dispatcher

    big, thin = CONFIGS["v4"], CONFIGS["splitk"]
    plan = table_plan((big, thin), {Shape(4096, 4096, 4096): 0, Shape(16, 4096, 4096): 1}, variant=Variant())
    build = build_library(render_dispatcher(plan, ["--dispatch"]), SM90)
    assert build.ok, build.log
    return Launcher(build.library), {c.name: launcher_of(c) for c in plan.kernels}


def test_a_dispatcher_asks_the_kernel_it_picks(dispatcher):
    launcher, own = dispatcher
    assert launcher.takes_workspace
    picked = set()
    for m, n, k in ((16, 4096, 4096), (4096, 4096, 4096), (20, 4000, 4100), (33, 17, 9), (3000, 3000, 3000)):
        kernel = launcher.choice(m, n, k)
        picked.add(kernel)
        assert launcher.workspace_size(m, n, k) == own[kernel].workspace_size(m, n, k), (m, n, k)
    assert picked == set(own)  # both kernels were asked
    assert launcher.workspace_size(16, 4096, 4096) > 0 and launcher.workspace_size(4096, 4096, 4096) == 0
    with pytest.raises(ShapeRefused, match="M, N and K must be >= 1"):
        launcher.workspace_size(0, 4, 4)


def _function(source: str, signature: str) -> str:
    """The body of the C++ function of ``source`` whose definition starts with ``signature``."""
    start = source.index(signature)
    body = source.index("\n{\n", start)
    return source[body:source.index("\n}\n", body)]


@pytest.mark.parametrize("label", ["splitk", "hopper_sk_linear", "mma_k2_batched"])
def test_a_launch_in_the_callers_workspace_zeroes_its_flags_on_the_stream_and_allocates_nothing(label):
    """The run of such a plan (gg_plan_run_in) zeroes the flags with cudaMemsetAsync on the plan's
    stream and never reaches the launcher's own workspace (gg_reserve: cudaMalloc, cudaFree,
    cudaStreamSynchronize); the plan it runs is made without the slot (gg_device_ready)."""
    source = render_kernel(CONFIGS[label])
    run = _function(source, "cudaError_t gg_plan_run_in(")
    assert "cudaMemsetAsync(parts.flags, 0, parts.flag_bytes, p.stream)" in run
    queue = _function(source, "cudaError_t gg_plan_queue(")
    for body in (run, queue):
        for call in ("cudaMalloc(", "cudaFree(", "Synchronize(", "gg_reserve(", "gg_find_slot(", "slot->"):
            assert call not in body, (call, body)
    init = _function(source, "cudaError_t gg_plan_init(")
    assert 'if (err == cudaSuccess && !caller_ws)\n        err = gg_find_slot("' in init


@pytest.mark.parametrize("label", ["splitk", "hopper_sk_linear", "mma_k2_batched"])
def test_a_run_with_kept_flags_queues_no_memset_and_takes_the_callers_flags(label):
    """gg_plan_run_kept (<launcher>_run_workspace_kept, what gemmgen.torch's eager calls use):
    the plan's own layout with the flags' part replaced by the caller's (checked long enough and
    aligned first), no memset, nothing allocated, freed or waited for; the launcher and a
    dispatcher export it with _plan_flag_bytes."""
    source = render_kernel(CONFIGS[label])
    run = _function(source, "cudaError_t gg_plan_run_kept(")
    check = _function(source, "cudaError_t gg_check_caller_run(")  # the checks run_in makes too
    for body in (run, check):
        for call in ("cudaMemset", "cudaMalloc(", "cudaFree(", "Synchronize(", "gg_reserve(", "gg_find_slot(", "slot->"):
            assert call not in body, (call, body)
    assert "kept && p.layout.flag_bytes > 0" in check and "flag_bytes < p.layout.flag_bytes" in check
    assert "parts.flags = flags;" in run
    checked = "gg_check_caller_run(p, workspace, bytes, true, flags, flag_bytes, none)"
    assert run.index(checked) < run.index("gg_plan_queue(p, parts)")
    assert "gg_check_caller_run(p, workspace, bytes, false, nullptr, 0, none)" in _function(source, "cudaError_t gg_plan_run_in(")
    for name in ("_plan_flag_bytes)(void* plan)", "_run_workspace_kept)(void* plan, void* flags"):
        assert f'extern "C" {"unsigned long long" if "flag_bytes)" in name else "cudaError_t"} GG_API({name}' in source


def test_a_dispatcher_forwards_the_run_with_kept_flags(dispatcher):
    """The dispatcher's _run_workspace_kept and _plan_flag_bytes are bound by Launcher (so
    WorkspacePlan.run_kept reaches the plan's kernel), as each kernel's are."""
    launcher, own = dispatcher
    assert launcher._run_ws_kept is not None and launcher._plan_flag_bytes is not None
    assert all(k._run_ws_kept is not None for k in own.values())
