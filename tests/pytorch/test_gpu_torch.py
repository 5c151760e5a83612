"""On the GPU, with PyTorch: gemmgen.torch as a user calls it. Named points are emitted to .cu files
and loaded with gemmgen.torch.load (built for the target their header names), then called on torch
tensors in ONE process, kernels and odd shapes in a shuffled order, with out allocated, given and
NaN-poisoned, and accumulated into (beta != 0); every result is judged against torch's float64
product by gemmgen.measure.verify (the bounds of gemmgen/describe/tolerance.py). Then: the work goes on torch's
current stream (a side stream kept busy first), a call from another thread, empty products, and
each of gemmgen.torch's refusals raised through real tensors. Last, a problem variant (sm_90): a
hopper kernel, and a dispatcher of two, computing F.gelu(F.linear(x, w, b), approximate="tanh")
in bf16 (trans nt, bf16 C, a bias per column, tanh-GELU), against float64 and against torch.
"""

import random
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import table_plan

torch = pytest.importorskip("torch")

import gemmgen.torch as gt  # noqa: E402 (needs torch, checked above)
from gemmgen.build.nvcc import build_library  # noqa: E402
from gemmgen.codegen.render import render_kernel  # noqa: E402
from gemmgen.describe.points import NAMED_POINTS  # noqa: E402
from gemmgen.measure import verify  # noqa: E402
from gemmgen.measure.launcher import ShapeRefused  # noqa: E402
from gemmgen.torch.checks import TargetMismatch, TensorError  # noqa: E402

pytestmark = pytest.mark.gpu

SEED = 20261123
# thin, odd, cubic, 1x1x1, K = 1 and N = 1 shapes
SHAPES = [(17, 33, 65), (1000, 1000, 1000), (4095, 4097, 4093), (16, 4096, 4096), (1, 1, 1), (257, 130, 1),
          (3000, 1, 2000)]
# fp32 FFMA with and without split-K (a workspace per stream), tensor cores in bf16 and tf32, and hopper
POINTS = ("v4", "splitk", "mma_bf16", "mma_tf32", "hopper_fp16")


@pytest.fixture(scope="module")
def arch(torch_arch):
    return torch_arch


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
    """uniform(-1, 1) values (gemmgen.measure.verify's), rounded to ``dtype`` on the GPU."""
    return torch.from_numpy(verify.random_matrix(rng, rows, cols, "fp32")).cuda().to(dtype)


def judge(op, a, b, c, c0, alpha, beta):
    """gemmgen.measure.verify's verdict on C against torch's float64 product of the values the kernel read;
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
    call come before (the first cuBLAS call on a stream waits, and so may torch's allocator where
    it has no block cached for the stream: the second call's workspace reuses the first's), and
    no other tensor is allocated after the products."""
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
    # split-K's partial sums lie in a workspace from torch's allocator: the launcher keeps none
    assert op.launcher.held(side.cuda_stream).partial_bytes == 0


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
    from gemmgen.torch.op import _operand
    from gemmgen.torch.checks import check_call

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
        found = op._plain(x, y, z, beta, None)
        if found is None:
            continue
        quick += 1
        ops_ = _operand("a", x), _operand("b", y), None if z is None else _operand("out", z)
        assert check_call(op.precision, *ops_, beta) == found[:3] == (x.shape[0], y.shape[1], x.shape[1]), f"case {i}"
        assert found[3] == (x.data_ptr(), y.data_ptr(), None if z is None else z.data_ptr(), None), f"case {i}"
    assert quick >= 4  # the good calls did take the quick path


def test_the_quick_check_of_a_variant_accepts_only_what_the_full_check_accepts(linear_ops):
    """As above, for nt / bf16 C / col bias: w is N x K, out bf16, the bias N values of bf16."""
    from gemmgen.torch.op import _operand
    from gemmgen.torch.checks import check_call

    op = linear_ops["kernel"]
    bf = torch.bfloat16
    x, w, out = (torch.rand(64, 32, device="cuda", dtype=bf), torch.rand(48, 32, device="cuda", dtype=bf),
                 torch.empty(64, 48, device="cuda", dtype=bf))
    b = torch.rand(48, device="cuda", dtype=bf)
    raw = torch.empty(64 * 48 + 48, device="cuda", dtype=bf)
    cases = [
        (x, w, None, 0.0, b), (x, w, out, 0.0, b), (x, w, out, 0.5, b), (x, w, None, 0.5, b), (x, w, out, 0.0, None),
        (x, w.t().contiguous(), out, 0.0, b), (x, w, out.float(), 0.0, b), (x, w, out, 0.0, b.float()),
        (x, w, out, 0.0, b[:47]), (x, w, out, 0.0, torch.rand(64, device="cuda", dtype=bf)), (x, w, out, 0.0, b[None]),
        (x, w, out, 0.0, torch.rand(96, device="cuda", dtype=bf)[::2]), (x, w, out, 0.0, b.cpu()),
        (x, w, out, 0.0, b.clone().requires_grad_(True)), (x.float(), w, out, 0.0, b), (x, w[:, :16], out, 0.0, b),
        (x, w, raw[:64 * 48].view(64, 48), 0.0, raw[64 * 48:]),  # apart, in one buffer
        (x, w, raw[48:].view(64, 48), 0.0, raw[:48]),  # the bias right before out
        (x, w, raw[:64 * 48].view(64, 48), 0.0, raw[64 * 48 - 1:64 * 48 + 47]),  # the bias overlaps out
    ]
    quick = 0
    for i, (p, q, z, beta, bias) in enumerate(cases):
        found = op._plain(p, q, z, beta, bias)
        if found is None:
            continue
        quick += 1
        ops_ = (_operand("a", p), _operand("b", q), None if z is None else _operand("out", z),
                beta, op.variant, None if bias is None else _operand("bias", bias))
        assert check_call(op.precision, *ops_) == found[:3] == (p.shape[0], q.shape[0], p.shape[1]), f"case {i}"
        assert found[3] == (p.data_ptr(), q.data_ptr(), None if z is None else z.data_ptr(),
                            None if bias is None else bias.data_ptr()), f"case {i}"
    assert quick >= 3


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


# ---- a problem variant: F.gelu(F.linear(x, w, b), approximate="tanh") in bf16 ----

F = torch.nn.functional
LINEAR_SHAPES = [(17, 33, 65), (1000, 1000, 1000), (16, 4096, 4096), (128, 11008, 4096), (4095, 4097, 33), (1, 1, 1),
                 (257, 130, 1), (3000, 1, 2000)]


def _linear_config(arch, **params):
    """hopper_bf16 (with ``params``) computing the variant nt / bf16 C / col bias / tanh-GELU."""
    from gemmgen.describe.config import make_config

    return make_config("hopper", {**NAMED_POINTS["hopper_bf16"].params, "overlap": 0, "trans": "nt", "out": "bf16",
                                  "bias": "col", "act": "gelu", **params}, "bf16", arch)


@pytest.fixture(scope="module")
def linear_ops(arch, tmp_path_factory, build_cache):
    """name -> GemmOp of the variant, loaded by gemmgen.torch.load: a kernel's .cu file (hopper_bf16's
    point: overlap=1, the right half of each tile held and stored later), and a dispatcher (`emit
    --dispatch`) of two kernels of it, without overlap, one of them swap-AB for thin M."""
    if arch.cc != 90:
        pytest.skip(f"the hopper family runs on sm_90 only; this GPU is {arch.name}")
    from gemmgen.describe.problem import Shape, Variant
    from gemmgen.selection.dispatch.emit import render_dispatcher

    folder = tmp_path_factory.mktemp("linear")
    big, thin = _linear_config(arch, overlap=0), _linear_config(arch, BM=32, BN=128, consumers=1, swap=1, overlap=0)
    (folder / "kernel.cu").write_text(render_kernel(_linear_config(arch)))
    plan = table_plan((big, thin), {Shape(4096, 4096, 4096): 0, Shape(16, 4096, 4096): 1},
                      variant=Variant("nt", "bf16", "col", "gelu"))
    (folder / "dispatcher.cu").write_text(render_dispatcher(plan, ["--dispatch"]))
    with ThreadPoolExecutor(2) as pool:
        loaded = {name: pool.submit(gt.load, folder / f"{name}.cu") for name in ("kernel", "dispatcher")}
        return {name: future.result() for name, future in loaded.items()}


def linear_inputs(np_rng, m, n, k):
    """x (M x K), w (N x K: nn.Linear's weight) and b (N): uniform(-1, 1) rounded to bf16."""
    return (random_input(np_rng, m, k, torch.bfloat16), random_input(np_rng, n, k, torch.bfloat16),
            random_input(np_rng, 1, n, torch.bfloat16).reshape(n))


def judge_linear(c, x, w, b, c0=None, alpha=1.0, beta=0.0):
    """gemmgen.measure.verify's verdict on C = gelu(alpha * x @ w^T + beta * C0 + b) (bf16 C, tanh GELU)
    against the float64 result of the values the kernel read, by the bounds of tolerance.py."""
    x64, w64 = x.double(), w.double()
    ref = alpha * (x64 @ w64.T)
    scale = abs(alpha) * (x64.abs() @ w64.abs().T)
    if beta != 0:
        ref += beta * c0.double()
        scale += (beta * c0.double()).abs()
    ref, scale = verify.epilogue(ref.cpu().numpy(), scale.cpu().numpy(), b.double().cpu().numpy(), "col", "gelu")
    return verify.compare(c.float().cpu().numpy(), ref, scale, "bf16", x.shape[1], "bf16", "gelu")


def close_to(c, expected):
    """Empty where C is as close to torch's bf16 ``expected`` as two bf16 results of one product
    are (each rounded to bf16, torch's twice: after the linear and after the GELU; torch's bf16
    GEMM may also reduce partial sums in bf16): in norm within 2^-6 of it, and elementwise within
    2^-5 of each element plus 2^-6 of the elements' RMS; else what differs. (A missing bias or
    GELU, or a wrong tile, is 10^-2 to 1 apart in norm.)"""
    c, expected = c.float(), expected.float()
    diff = (c - expected).abs()
    rms = expected.pow(2).mean().sqrt()
    norm = (diff.norm() / expected.norm()).item() if expected.norm() > 0 else diff.norm().item()
    over = diff > 2.0**-5 * expected.abs() + 2.0**-6 * rms
    if norm <= 2.0**-6 and not over.any():
        return ""
    i, j = (int(v) for v in torch.nonzero(over)[0]) if over.any() else (0, 0)
    return (f"relative Frobenius difference {norm:.2e}, {int(over.sum())} element(s) apart, the first "
            f"[{i}][{j}]: {c[i, j].item()!r} against torch's {expected[i, j].item()!r}")


@pytest.mark.parametrize("which", ["kernel", "dispatcher"])
def test_nt_bf16_bias_gelu_is_torchs_gelu_of_linear(linear_ops, which):
    """op(x, w, bias=b) with w as nn.Linear keeps it (N x K): bf16 C, right by gemmgen.measure.verify's
    float64 check and as close to F.gelu(F.linear(x, w, b), approximate="tanh") as bf16 allows;
    also with out given (NaN-poisoned) and accumulated into (beta != 0)."""
    op, np_rng, failures = linear_ops[which], np.random.default_rng(SEED), []
    assert (op.dtype, op.out_dtype, op.variant.text) == (torch.bfloat16, torch.bfloat16, "nt bf16 col gelu")
    for m, n, k in LINEAR_SHAPES:
        x, w, b = linear_inputs(np_rng, m, n, k)
        with torch.no_grad():
            expected = F.gelu(F.linear(x, w, b), approximate="tanh")
        c = op(x, w, bias=b)
        assert c.shape == (m, n) and c.dtype == torch.bfloat16 and c.device == x.device
        verdict = judge_linear(c, x, w, b)
        if not verdict.ok:
            failures.append(f"{m}x{n}x{k}: {verdict.message}")
        if (apart := close_to(c, expected)):
            failures.append(f"{m}x{n}x{k} against torch: {apart}")
        poisoned = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        assert op(x, w, poisoned, bias=b) is poisoned
        if (apart := close_to(poisoned, expected)):
            failures.append(f"{m}x{n}x{k} into a NaN-filled out: {apart}")
        c0 = random_input(np_rng, m, n, torch.bfloat16)
        out = c0.clone()
        op(x, w, out, alpha=1.25, beta=-0.75, bias=b)
        verdict = judge_linear(out, x, w, b, c0, 1.25, -0.75)
        if not verdict.ok:
            failures.append(f"{m}x{n}x{k}, alpha 1.25, beta -0.75: {verdict.message}")
    assert not failures, "\n".join(failures)
    if which == "dispatcher":
        assert op.choice(16, 4096, 4096) != op.choice(4096, 4096, 4096)  # both kernels were used


def test_the_variants_empty_products_and_refusals(linear_ops, ops):
    op = linear_ops["kernel"]
    x, w, b = (torch.rand(4, 0, device="cuda", dtype=torch.bfloat16),
               torch.rand(3, 0, device="cuda", dtype=torch.bfloat16),
               torch.rand(3, device="cuda", dtype=torch.bfloat16) - 0.5)
    with torch.no_grad():  # K = 0: gelu(b) in every row, as torch gives it
        torch.testing.assert_close(op(x, w, bias=b), F.gelu(F.linear(x, w, b), approximate="tanh"))
    assert op(torch.rand(0, 5, device="cuda", dtype=torch.bfloat16), torch.rand(3, 5, device="cuda", dtype=torch.bfloat16),
              bias=b).shape == (0, 3)
    x, w = torch.rand(4, 5, device="cuda", dtype=torch.bfloat16), torch.rand(3, 5, device="cuda", dtype=torch.bfloat16)
    with refused("this kernel adds a bias (variant nt bf16 col gelu): pass bias=, a tensor of shape (3,) (N values, "
                 "one per column of C) of torch.bfloat16"):
        op(x, w)
    with refused("a is 4 x 5 and b is 5 x 3 (N x K: trans=nt takes B stored transposed, as F.linear's weight): a's "
                 "columns (K=5) must equal b's columns (3)"):
        op(x, w.t().contiguous(), bias=b)
    with refused("out is torch.float32; this kernel writes C in torch.bfloat16 (out=bf16): make it with "
                 "torch.empty(4, 3, dtype=torch.bfloat16, device=a.device)"):
        op(x, w, torch.empty(4, 3, device="cuda"), bias=b)
    with refused("bias is torch.float32; this kernel reads the bias in C's type, torch.bfloat16: convert it with "
                 "bias.to(torch.bfloat16)"):
        op(x, w, bias=b.float())
    with refused("bias must have shape (3,) (N values, one per column of C, bias=col); it has shape (4,)"):
        op(x, w, bias=torch.rand(4, device="cuda", dtype=torch.bfloat16))
    assert repr(op).endswith(", precision='bf16', variant='nt bf16 col gelu')")
    with refused("bias was given, but this kernel adds no bias (variant nn fp32 none none): pass no bias, or emit a "
                 "kernel that adds one (gemmgen emit ... --bias col: N values, one per column of C; --bias row: M "
                 "values)"):
        ops["v4"](torch.rand(4, 5, device="cuda"), torch.rand(5, 3, device="cuda"), bias=torch.rand(3, device="cuda"))
