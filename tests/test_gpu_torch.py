"""On the GPU, with PyTorch: gemmgen.torch as a user calls it. Named points are emitted to .cu files
and loaded with gemmgen.torch.load (built for the target their header names), then called on torch
tensors in ONE process, kernels and odd shapes in a shuffled order, with out allocated, given and
NaN-poisoned, and accumulated into (beta != 0); every result is judged against torch's float64
product by gemmgen.verify (the bounds of gemmgen/tolerance.py). Then: the work goes on torch's
current stream (a side stream kept busy first), a call from another thread, empty products, and
each of gemmgen.torch's refusals raised through real tensors.
"""

import random
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gemmgen.torch as gt  # noqa: E402 (needs torch, checked above)
from gemmgen import verify  # noqa: E402
from gemmgen.arch import parse_arch  # noqa: E402
from gemmgen.build import build_library  # noqa: E402
from gemmgen.points import NAMED_POINTS  # noqa: E402
from gemmgen.render import render_kernel  # noqa: E402
from gemmgen.runtime import ShapeRefused  # noqa: E402
from gemmgen.torch_checks import TargetMismatch, TensorError  # noqa: E402

pytestmark = pytest.mark.gpu

SEED = 20261123
# thin, odd, cubic, 1x1x1, K = 1 and N = 1 shapes
SHAPES = [(17, 33, 65), (1000, 1000, 1000), (4095, 4097, 4093), (16, 4096, 4096), (1, 1, 1), (257, 130, 1),
          (3000, 1, 2000)]
# fp32 FFMA with and without split-K (a workspace per stream), tensor cores in bf16 and tf32, and hopper
POINTS = ("v4", "splitk", "mma_bf16", "mma_tf32", "hopper_fp16")


def _device_arch():
    major, minor = torch.cuda.get_device_capability()
    return parse_arch(f"{major}{minor}")


@pytest.fixture(scope="module")
def arch():
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device (a CPU-only torch?)")
    return _device_arch()


@pytest.fixture(scope="module")
def cu_files(arch, tmp_path_factory):
    """point -> its emitted .cu file for this GPU (the points this GPU runs)."""
    folder = tmp_path_factory.mktemp("emitted")
    files = {}
    for point in POINTS:
        if NAMED_POINTS[point].runs_on(arch):
            files[point] = folder / f"{point}.cu"
            files[point].write_text(render_kernel(NAMED_POINTS[point].config(arch)))
    return files


@pytest.fixture(scope="module")
def ops(cu_files, build_cache):
    """point -> GemmOp, each built from its .cu file by gemmgen.torch.load (in a fresh build cache)."""
    with ThreadPoolExecutor(len(cu_files)) as pool:
        loaded = {point: pool.submit(gt.load, cu) for point, cu in cu_files.items()}
        return {point: future.result() for point, future in loaded.items()}


def random_input(rng, rows, cols, dtype):
    """uniform(-1, 1) values (gemmgen.verify's), rounded to ``dtype`` on the GPU."""
    return torch.from_numpy(verify.random_matrix(rng, rows, cols, "fp32")).cuda().to(dtype)


def judge(op, a, b, c, c0, alpha, beta):
    """gemmgen.verify's verdict on C against torch's float64 product of the values the kernel read;
    as verify.host_reference, on the GPU (C0: C before the call, not read where beta == 0)."""
    a64, b64 = a.double(), b.double()
    ref = alpha * (a64 @ b64)
    scale = abs(alpha) * (a64.abs() @ b64.abs())
    if beta != 0:
        ref += beta * c0.double()
        scale += (beta * c0.double()).abs()
    return verify.compare(c.cpu().numpy(), ref.cpu().numpy(), scale.cpu().numpy(), op.precision, a.shape[1])


def test_load_reads_the_files_target_and_the_librarys_precision(ops, cu_files, arch):
    for point, op in ops.items():
        assert op.precision == NAMED_POINTS[point].precision, point
        expected = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        assert op.dtype == expected[op.precision], point
    if "hopper_fp16" in ops:  # its header says sm_90a: a plain sm_90 build would not have compiled
        assert "sm_90a" in cu_files["hopper_fp16"].read_text()
    built = build_library(cu_files["v4"].read_text(), NAMED_POINTS["v4"].config(arch).build_arch)
    assert built.ok, built.log
    library = gt.load(built.library)
    assert library.precision == "fp32" and library.path == built.library
    assert repr(library) == f"GemmOp({str(built.library)!r}, precision='fp32')"
    newer = "sm_120" if arch.cc < 120 else None
    if newer:
        with pytest.raises(TargetMismatch, match=re.escape(f"a kernel built for {newer} cannot run on this GPU")):
            gt.load(cu_files["v4"], gpu=newer)


def test_kernels_at_odd_shapes_in_mixed_order_in_one_process(ops):
    rng = random.Random(SEED)
    np_rng = np.random.default_rng(SEED)
    calls = [(point, shape, mode) for _ in range(2) for point in ops for shape in SHAPES
             for mode in [rng.choice(("new", "poisoned", "accumulate"))]]
    rng.shuffle(calls)
    failures = []
    for point, (m, n, k), mode in calls:
        op = ops[point]
        a, b = random_input(np_rng, m, k, op.dtype), random_input(np_rng, k, n, op.dtype)
        alpha, beta, out = 1.0, 0.0, None
        if mode == "poisoned":
            out = torch.full((m, n), float("nan"), device="cuda")
        elif mode == "accumulate":
            alpha, beta, out = 1.25, -0.75, random_input(np_rng, m, n, torch.float32)
        c0 = None if out is None else out.clone()
        c = op(a, b, out, alpha=alpha, beta=beta)
        assert c.shape == (m, n) and c.dtype == torch.float32 and c.device == a.device
        if out is not None:
            assert c is out
        verdict = judge(op, a, b, c, c0, alpha, beta)
        if not verdict.ok:
            failures.append(f"{point} {m}x{n}x{k} {mode}: {verdict.message}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("point", POINTS)
def test_work_goes_on_the_current_torch_stream(ops, point):
    """Queued on a side stream (torch's are non-blocking) behind ~0.3 s of matrix products, after C
    is NaN-filled there: a launch on any other stream, the legacy default one included, runs first
    and leaves NaN behind (seen on an H100 with GemmOp patched so). Nothing may make the host wait
    meanwhile, or the launch would find the products done: the stream's first product and first
    call come before (the first cuBLAS call on a stream and a launcher growing a stream's
    workspace both wait), and no tensor is allocated after the products."""
    if point not in ops:
        pytest.skip(f"{point} does not run on this GPU")
    op, np_rng = ops[point], np.random.default_rng(SEED)
    m, n, k = 1000, 1000, 1000
    a, b = random_input(np_rng, m, k, op.dtype), random_input(np_rng, k, n, op.dtype)
    busy = torch.rand(8192, 8192, device="cuda")
    scratch, out = torch.empty_like(busy), torch.empty(m, n, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.mm(busy, busy, out=scratch)
        op(a, b, out)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(16):
            torch.mm(busy, busy, out=scratch)
        out.fill_(float("nan"))
        assert op(a, b, out) is out
    assert not side.query(), "the side stream finished before the check could mean anything"
    side.synchronize()
    verdict = judge(op, a, b, out, None, 1.0, 0.0)
    assert verdict.ok, verdict.message
    if op.launcher.describe(m, n, k).partial_bytes:  # split-K keeps its partial sums per stream
        assert op.launcher.held(side.cuda_stream).partial_bytes > 0


def test_a_call_from_another_thread(ops):
    op, np_rng = ops["v4"], np.random.default_rng(SEED)
    a, b = random_input(np_rng, 300, 200, op.dtype), random_input(np_rng, 200, 100, op.dtype)
    torch.cuda.synchronize()

    def call():
        c = op(a, b)
        torch.cuda.current_stream().synchronize()
        return c

    with ThreadPoolExecutor(1) as pool:
        c = pool.submit(call).result()
    verdict = judge(op, a, b, c, None, 1.0, 0.0)
    assert verdict.ok, verdict.message


def test_empty_products_follow_torch_addmm(ops):
    op = ops["v4"]
    assert op(torch.ones(0, 5, device="cuda"), torch.ones(5, 3, device="cuda")).shape == (0, 3)
    assert op(torch.ones(4, 5, device="cuda"), torch.ones(5, 0, device="cuda")).shape == (4, 0)
    a, b = torch.ones(4, 0, device="cuda"), torch.ones(0, 3, device="cuda")
    assert torch.equal(op(a, b), torch.zeros(4, 3, device="cuda"))
    poisoned = torch.full((4, 3), float("nan"), device="cuda")
    assert torch.equal(op(a, b, poisoned), torch.zeros(4, 3, device="cuda"))
    twos = torch.full((4, 3), 2.0, device="cuda")
    assert torch.equal(torch.addmm(twos, a, b, beta=0.5), torch.ones(4, 3, device="cuda"))
    assert torch.equal(op(a, b, twos, beta=0.5), torch.ones(4, 3, device="cuda"))


def refused(message: str):
    return pytest.raises(TensorError, match=f"^{re.escape(message)}$")


def test_each_refusal_through_tensors(ops, arch):
    op = ops["v4"]  # fp32
    a, b = torch.rand(4, 5, device="cuda"), torch.rand(5, 3, device="cuda")
    with refused("a is torch.float16, but this kernel's precision is fp32, which takes torch.float32: convert it "
                 "with a.to(torch.float32)"):
        op(a.half(), b)
    with refused("a is on cpu; gemmgen kernels take CUDA tensors: move it with a.cuda() (or .to('cuda:N'))"):
        op(a.cpu(), b)
    with refused("b is not contiguous row-major: shape (5, 3) with strides (1, 5), where row-major has (3, 1); "
                 "pass b.contiguous() (gemmgen does not copy it for you)"):
        op(a, torch.rand(3, 5, device="cuda").t())
    with refused("a is 4 x 5 and b is 6 x 3: a's columns (K=5) must equal b's rows (6)"):
        op(a, torch.rand(6, 3, device="cuda"))
    with refused("b must be a torch.Tensor, not ndarray"):
        op(a, b.cpu().numpy())
    with refused("beta=0.5 adds beta * out to the product, and no out was given: pass out (fp32, M x N), or beta=0"):
        op(a, b, beta=0.5)
    square = torch.rand(4, 4, device="cuda")
    with refused("out overlaps a in memory; C is written while A and B are read: pass an out of its own"):
        op(square, torch.rand(4, 4, device="cuda"), square)
    weights = torch.rand(5, 3, device="cuda", requires_grad=True)
    with refused("b requires grad, and gemmgen kernels have no backward: call under torch.no_grad() or "
                 "torch.inference_mode(), or pass b.detach()"):
        op(a, weights)
    with torch.no_grad():
        assert op(a, weights).shape == (4, 3)
    # the launcher's own refusal: v4's grid has at most 65535 blocks of 128 rows along M
    tall = torch.rand(65535 * 128 + 1, 1, device="cuda")
    name = NAMED_POINTS["v4"].config(arch).name
    with pytest.raises(ShapeRefused, match=re.escape(
            f"refused M=8388481 N=1 K=1: {name}: M must be <= 8388480 (at most 65535 blocks along y)")):
        op(tall, torch.rand(1, 1, device="cuda"))


def test_the_quick_check_accepts_only_what_the_full_check_accepts(ops):
    """GemmOp._plain (torch's own predicates, for the everyday call) must never pass a call that
    check_call refuses: over tensors breaking each rule, and good ones, _plain True implies the
    full check passes with the same M, N, K."""
    from gemmgen.torch import _operand
    from gemmgen.torch_checks import check_call

    op = ops["hopper_fp16"] if "hopper_fp16" in ops else ops["mma_bf16"]
    dt = op.dtype
    a, b, out = torch.rand(64, 32, device="cuda").to(dt), torch.rand(32, 48, device="cuda").to(dt), torch.empty(64, 48, device="cuda")
    big = torch.empty(64 * 48 + 64 * 32, device="cuda")
    cases = [
        (a, b, None, 0.0), (a, b, out, 0.0), (a, b, out, 0.5), (a, b, None, 0.5),
        (a.float(), b, out, 0.0), (a.cpu(), b.cpu(), None, 0.0), (a.t().contiguous().t(), b, out, 0.0),
        (a[:, :16], b[:16], None, 0.0), (a[1:], b, None, 0.0), (a, b, out[:, :47], 0.0), (a, b, out.double(), 0.0),
        (a, b, out.t().contiguous().t(), 0.0), (a.unsqueeze(0), b, None, 0.0), (a, b, out.half(), 0.0),
        (a, b.requires_grad_(False).clone().requires_grad_(True), None, 0.0), (a.to_sparse(), b, None, 0.0),
        (a, b, big[: 64 * 48].view(64, 48), 0.0),
    ]
    # an out that overlaps a: a's memory seen as fp32
    raw = torch.empty(64 * 48, device="cuda")
    cases.append((raw.view(dt)[: 64 * 32].view(64, 32), b, raw.view(64, 48), 0.0))
    quick = 0
    for i, (x, y, z, beta) in enumerate(cases):
        if not op._plain(x, y, z, beta):
            continue
        quick += 1
        ops_ = _operand("a", x), _operand("b", y), None if z is None else _operand("out", z)
        assert check_call(op.precision, *ops_, beta) == (x.shape[0], y.shape[1], x.shape[1]), f"case {i}"
    assert quick >= 4  # the good calls did take the quick path


def test_a_repeated_call_reuses_its_launch_and_stays_right(ops):
    """The second call with the same arguments runs the plan of the first (no new host work);
    new contents in the same buffers, and the same buffers at another shape, give right results."""
    op = ops["hopper_fp16"] if "hopper_fp16" in ops else ops["mma_bf16"]
    rng = np.random.default_rng(3)
    buf_a = torch.empty(300 * 200, device="cuda", dtype=op.dtype)
    buf_b = torch.empty(200 * 500, device="cuda", dtype=op.dtype)
    buf_c = torch.empty(300 * 500, device="cuda")
    seen = set()
    for m, n, k in ((300, 500, 200), (300, 500, 200), (200, 300, 100), (300, 500, 200)):
        a, b, c = buf_a[: m * k].view(m, k), buf_b[: k * n].view(k, n), buf_c[: m * n].view(m, n)
        a.copy_(random_input(rng, m, k, op.dtype)), b.copy_(random_input(rng, k, n, op.dtype))
        c.fill_(float("nan"))
        before = len(op._plans())
        op(a, b, out=c)
        torch.cuda.synchronize()
        verdict = judge(op, a, b, c, None, 1.0, 0.0)
        assert verdict.ok, f"{m}x{n}x{k}: {verdict.message}"
        assert len(op._plans()) == before + (0 if (m, n, k) in seen else 1)
        seen.add((m, n, k))
