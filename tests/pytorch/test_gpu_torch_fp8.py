"""On the GPU, with PyTorch: FP8 through gemmgen.torch as a user calls it. The named point
hopper_e4m3 (promoted sums) is emitted with row-wise scales and a column bias, and with one scale
per tensor, built by gemmgen.torch.load, and called like torch._scaled_mm on float8_e4m3fn tensors
and float32 scale tensors in ONE process, shapes and calls mixed: each result is judged against
the float64 product of the exact FP8 values and scales (gemmgen.measure.verify's bounds), and the
scales' shapes torch._scaled_mm takes ((M, 1) and (1, N), or vectors; one element each) are
taken. Then: torch.compile(fullgraph=True), a CUDA graph replayed after the scales change in
place, the refusals of wrong scales, and Fp8Linear (an nn.Linear quantized row by row, alone and
through patch) against the exact product of what it quantized and against F.linear in bf16; and
the same with block scales (1x128 and 128x128: scale=block)."""

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gemmgen.torch as gt  # noqa: E402 (needs torch, checked above)
from gemmgen.codegen.render import render_kernel  # noqa: E402
from gemmgen.describe.scaling import blocks, expand, k_blocks_padded, lengths  # noqa: E402
from gemmgen.describe.config import make_config  # noqa: E402
from gemmgen.describe.points import NAMED_POINTS  # noqa: E402
from gemmgen.measure import verify  # noqa: E402
from gemmgen.torch.checks import TensorError  # noqa: E402

pytestmark = pytest.mark.gpu

SEED = 20261129
SHAPES = [(1, 1, 1), (17, 33, 65), (129, 6144, 4096), (1000, 1000, 1000), (257, 130, 1), (4095, 4097, 264)]
VARIANTS = {"row": {"scale": "row", "bias": "col"}, "tensor": {"scale": "tensor"}}


@pytest.fixture(scope="module")
def fp8_ops(torch_arch, tmp_path_factory, build_cache):
    """scaling -> GemmOp of hopper_e4m3's parameters with that scaling (bf16 C)."""
    arch = torch_arch
    if arch.cc != 90:
        pytest.skip(f"the hopper family runs on sm_90 only; this GPU is {arch.name}")
    point = NAMED_POINTS["hopper_e4m3"]
    folder = tmp_path_factory.mktemp("fp8")
    ops = {}
    for scaling, items in VARIANTS.items():
        config = make_config("hopper", {**point.params, **dict(point.variant.items), **items}, "e4m3", arch)
        cu = folder / f"{scaling}.cu"
        cu.write_text(render_kernel(config))
        ops[scaling] = gt.load(cu)
    return ops


def fp8(np_rng, rows, cols):
    """uniform(-1, 1) values as float8_e4m3fn (gemmgen.measure.verify's rounding: the values the kernel reads)."""
    return torch.from_numpy(verify.random_matrix(np_rng, rows, cols, "e4m3")).cuda().view(torch.float8_e4m3fn)


def scales_for(np_rng, scaling, m, n, as_vectors=False):
    """uniform(1/4, 4) float32 scales: (M, 1) and (1, N) (row; vectors with ``as_vectors``), or one each."""
    if scaling == "tensor":
        return tuple(torch.tensor(np_rng.uniform(0.25, 4.0), dtype=torch.float32, device="cuda") for _ in "ab")
    sa = torch.from_numpy(np_rng.uniform(0.25, 4.0, m).astype(np.float32)).cuda()
    sb = torch.from_numpy(np_rng.uniform(0.25, 4.0, n).astype(np.float32)).cuda()
    return (sa, sb) if as_vectors else (sa.view(m, 1), sb.view(1, n))


def judge(c, a, b, sa, sb, bias=None, alpha=1.0):
    """gemmgen.measure.verify's verdict on C (bf16) against alpha * sa[i] * sb[j] * (a @ b.T) + bias in
    float64, from the exact FP8 values and fp32 scales."""
    m, n = c.shape
    a64 = a.double() * sa.double().reshape(-1, 1)
    b64 = b.double() * sb.double().reshape(-1, 1)
    ref, bound = (alpha * (a64 @ b64.T)).cpu().numpy(), (abs(alpha) * (a64.abs() @ b64.abs().T)).cpu().numpy()
    if bias is not None:
        ref, bound = verify.epilogue(ref, bound, bias.double().cpu().numpy(), "col", "none")
    return verify.compare(c.float().cpu().numpy(), ref, bound, "e4m3", a.shape[1], "bf16")


def test_scaled_calls_at_odd_shapes_in_mixed_order(fp8_ops):
    rng, np_rng = random.Random(SEED), np.random.default_rng(SEED)
    calls = [(scaling, shape, rng.random() < 0.5) for _ in range(2) for scaling in fp8_ops for shape in SHAPES]
    rng.shuffle(calls)
    failures = []
    for scaling, (m, n, k), vectors in calls:
        op = fp8_ops[scaling]
        a, b = fp8(np_rng, m, k), fp8(np_rng, n, k)
        sa, sb = scales_for(np_rng, scaling, m, n, vectors)
        bias = torch.from_numpy(verify.random_matrix(np_rng, 1, n, "bf16")).cuda().view(torch.bfloat16).reshape(n) \
            if op.variant.bias == "col" else None
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") if rng.random() < 0.5 else None
        c = op(a, b, out, bias=bias, scale_a=sa, scale_b=sb, alpha=1.5)
        assert c.shape == (m, n) and c.dtype == torch.bfloat16
        verdict = judge(c, a, b, sa, sb, bias, alpha=1.5)
        if not verdict.ok:
            failures.append(f"{scaling} {m}x{n}x{k} (vectors={vectors}): {verdict.message}")
    assert not failures, "\n".join(failures)


def test_scaled_mm_agrees_with_torch(fp8_ops):
    """At a Llama layer's shape, torch._scaled_mm's result on the same tensors passes the same check
    (the reference is right), and ours is as close to the float64 product as it (within 1.5x)."""
    np_rng = np.random.default_rng(SEED + 1)
    m, n, k = 777, 4096, 14336
    a, b = fp8(np_rng, m, k), fp8(np_rng, n, k)
    for scaling, op in fp8_ops.items():
        sa, sb = scales_for(np_rng, scaling, m, n)
        bias = None
        theirs = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
        if op.variant.bias == "col":
            bias = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
        ours = op(a, b, bias=bias, scale_a=sa, scale_b=sb)
        v_theirs, v_ours = judge(theirs, a, b, sa, sb), judge(ours, a, b, sa, sb)
        assert v_theirs.ok and v_ours.ok, (v_theirs.message, v_ours.message)
        assert v_ours.rel_error <= 1.5 * v_theirs.rel_error, (scaling, v_ours.rel_error, v_theirs.rel_error)


def test_torch_compile_and_a_cuda_graph_read_the_scales(fp8_ops):
    op, np_rng = fp8_ops["row"], np.random.default_rng(SEED + 2)
    m, n, k = 200, 384, 512
    a, b = fp8(np_rng, m, k), fp8(np_rng, n, k)
    sa, sb = scales_for(np_rng, "row", m, n)
    bias = torch.zeros(n, dtype=torch.bfloat16, device="cuda")

    compiled = torch.compile(lambda x, w, s, t: op(x, w, bias=bias, scale_a=s, scale_b=t), fullgraph=True)
    verdict = judge(compiled(a, b, sa, sb), a, b, sa, sb)
    assert verdict.ok, verdict.message

    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    op(a, b, out, bias=bias, scale_a=sa, scale_b=sb)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(a, b, out, bias=bias, scale_a=sa, scale_b=sb)
    new_sa, new_sb = scales_for(np_rng, "row", m, n)
    sa.copy_(new_sa)
    sb.copy_(new_sb)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    verdict = judge(out, a, b, new_sa, new_sb)
    assert verdict.ok, verdict.message


def test_wrong_scales_are_refused_before_any_work(fp8_ops):
    op, np_rng = fp8_ops["row"], np.random.default_rng(SEED + 3)
    a, b = fp8(np_rng, 64, 128), fp8(np_rng, 32, 128)
    sa, sb = scales_for(np_rng, "row", 64, 32)
    bias = torch.zeros(32, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(TensorError, match="pass scale_a=, a float32 tensor of 64 values"):
        op(a, b, bias=bias)
    with pytest.raises(TensorError, match=r"scale_b must hold 32 values, one per column of C"):
        op(a, b, bias=bias, scale_a=sa, scale_b=sa)
    with pytest.raises(TensorError, match=r"scale_a is torch.float16; scales are float32"):
        op(a, b, bias=bias, scale_a=sa.half(), scale_b=sb)
    with pytest.raises(TensorError, match="a is torch.bfloat16, but this kernel's precision is e4m3"):
        op(a.to(torch.bfloat16), b, bias=bias, scale_a=sa, scale_b=sb)


def test_fp8_linear_is_the_exact_product_of_what_it_quantized(fp8_ops):
    torch.manual_seed(SEED)
    layer = torch.nn.Linear(512, 384, bias=True, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(3, 70, 512, device="cuda", dtype=torch.bfloat16)
    fp8_layer = gt.Fp8Linear.from_linear(layer, fp8_ops["row"])
    with torch.no_grad():
        y = fp8_layer(x)
        q, scale = gt.quantize_rows(x.reshape(-1, 512))
        expected = layer(x)
    assert y.shape == (3, 70, 384) and y.dtype == torch.bfloat16
    verdict = judge(y.reshape(-1, 384), q, fp8_layer.weight, scale, fp8_layer.weight_scale, fp8_layer.bias)
    assert verdict.ok, verdict.message
    # e4m3 keeps 3 mantissa bits: against bf16's F.linear, a few percent in norm
    assert ((y.float() - expected.float()).norm() / expected.float().norm()).item() < 0.08

    model = torch.nn.Sequential(torch.nn.Linear(512, 384, device="cuda", dtype=torch.bfloat16), torch.nn.ReLU(),
                                torch.nn.Linear(384, 256, bias=False, device="cuda", dtype=torch.bfloat16))
    report = gt.patch(model, fp8_ops["row"])
    assert report.swapped == ["0"] and "has no bias (--bias none)" in report.left["2"], str(report)
    assert isinstance(model[0], gt.Fp8Linear)
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
    with pytest.raises(TensorError, match="this FP8 Linear takes torch.bfloat16"):
        model[0](x.half())


# ---- block scales (scale=block): torch._scaled_mm's 1x128 and 128x128 layouts ----

@pytest.fixture(scope="module")
def block_op(fp8_ops, tmp_path_factory):
    """hopper_e4m3's tile with block scales (promote=1: a k tile is a block), bf16 C."""
    point = NAMED_POINTS["hopper_e4m3"]
    params = {**point.params, **dict(point.variant.items), "scale": "block", "promote": 1}
    cu = tmp_path_factory.mktemp("fp8_block") / "block.cu"
    cu.write_text(render_kernel(make_config("hopper", params, "e4m3", "sm_90")))
    return gt.load(cu)


def block_scales(np_rng, m, n, k):
    """uniform(1/4, 4) float32 block scales as torch._scaled_mm takes them: scale_a (M, KB) with
    strides (1, M), scale_b (KBP, ceil(N/128)) with strides (1, KBP)."""
    len_a, len_b = lengths("block", m, n, k)
    kb, kbp = blocks(k), k_blocks_padded(k)
    sa = torch.from_numpy(np_rng.uniform(0.25, 4.0, len_a).astype(np.float32)).cuda()
    sb = torch.from_numpy(np_rng.uniform(0.25, 4.0, len_b).astype(np.float32)).cuda()
    return sa.view(kb, m).t(), sb.view(blocks(n), kbp).t()


def judge_block(c, a, b, sa, sb):
    """verify's verdict on C against (A * SA) @ (B * SB) in float64 (gemmgen.describe.scaling's
    element-wise scales, from the flat memory of sa and sb)."""
    (m, k), n = a.shape, b.shape[0]
    big_a, big_b = expand("block", sa.t().contiguous().view(-1).cpu().numpy(),
                                  sb.t().contiguous().view(-1).cpu().numpy(), m, n, k)
    a64 = a.double().cpu().numpy() * big_a
    b64 = b.double().cpu().numpy() * big_b.T
    ref, bound = a64 @ b64.T, np.abs(a64) @ np.abs(b64).T
    return verify.compare(c.float().cpu().numpy(), ref, bound, "e4m3", k, "bf16")


def test_block_scaled_calls_match_float64_and_torch(block_op):
    """Mixed shapes in one process (M not a multiple of 4, K not of 128, N not of 128), each
    judged against float64; where torch._scaled_mm takes the shape (cuBLASLt's block-scaled
    matmul), its result on the same tensors passes too and ours is within 1.5x its error. Then a
    CUDA graph replays new scales, and a row-major scale_a is refused."""
    np_rng = np.random.default_rng(SEED + 5)
    compared = 0
    for m, n, k in [(777, 4096, 4096), (5, 300, 1000), (128, 256, 4096), (1000, 200, 129), (256, 6144, 14336)]:
        a, b = fp8(np_rng, m, k), fp8(np_rng, n, k)
        sa, sb = block_scales(np_rng, m, n, k)
        ours = block_op(a, b, scale_a=sa, scale_b=sb)
        v_ours = judge_block(ours, a, b, sa, sb)
        assert v_ours.ok, f"{m}x{n}x{k}: {v_ours.message}"
        try:
            theirs = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
        except RuntimeError:  # cuBLASLt has no block-scaled algorithm for this shape (M % 4, K % 16, ...)
            continue
        v_theirs = judge_block(theirs, a, b, sa, sb)
        assert v_theirs.ok and v_ours.rel_error <= 1.5 * v_theirs.rel_error, (m, n, k, v_ours.rel_error,
                                                                             v_theirs.rel_error)
        compared += 1
    assert compared >= 2  # torch took the aligned shapes (128x256x4096, 256x6144x14336)

    m, n, k = 200, 384, 512
    a, b = fp8(np_rng, m, k), fp8(np_rng, n, k)
    sa, sb = block_scales(np_rng, m, n, k)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    block_op(a, b, out, scale_a=sa, scale_b=sb)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        block_op(a, b, out, scale_a=sa, scale_b=sb)
    new_sa, new_sb = block_scales(np_rng, m, n, k)
    sa.copy_(new_sa)
    sb.copy_(new_sb)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    verdict = judge_block(out, a, b, new_sa, new_sb)
    assert verdict.ok, verdict.message
    with pytest.raises(TensorError, match=r"scale_a must have strides \(1, 200\)"):
        block_op(a, b, scale_a=sa.contiguous(), scale_b=sb)


def test_block_quantizers_and_fp8_linear_follow_the_deepseek_recipe(block_op):
    """quantize_1x128 / quantize_128x128: each block's largest magnitude is 448 (scale = amax / 448),
    the values are x / scale rounded to e4m3, and the scales lie as a scale=block launcher reads
    them; an Fp8Linear of a block-scaled launcher is the exact product of what it quantized, and
    a few percent from F.linear in bf16 (one column block of the weight 50x the others: its own
    scale)."""
    torch.manual_seed(SEED)
    x = torch.randn(70, 300, device="cuda", dtype=torch.bfloat16)
    q, s = gt.quantize_1x128(x)
    assert q.shape == (70, 300) and s.shape == (70, 3) and s.stride() == (1, 70)
    assert torch.allclose(s[:, 1], x[:, 128:256].float().abs().amax(dim=1) / 448)
    assert torch.equal(q[:, 128:256].float(), (x[:, 128:256].float() / s[:, 1:2]).to(torch.float8_e4m3fn).float())
    w = torch.randn(260, 300, device="cuda", dtype=torch.bfloat16)
    w[:, 128:256] *= 50
    wq, ws = gt.quantize_128x128(w)
    assert wq.shape == (260, 300) and ws.shape == (4, 3) and ws.stride() == (1, 4)
    assert torch.allclose(ws[1, 2], w[256:, 128:256].float().abs().amax() / 448) and (ws[3] == 1).all()

    layer = torch.nn.Linear(300, 260, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)
        fp8_layer = gt.Fp8Linear.from_linear(layer, block_op)
        y = fp8_layer(x.view(2, 35, 300))
        expected = layer(x)
    assert y.shape == (2, 35, 260)
    verdict = judge_block(y.reshape(70, 260), q, fp8_layer.weight, s, fp8_layer.weight_scale)
    assert verdict.ok, verdict.message
    err = ((y.reshape(70, 260).float() - expected.float()).norm() / expected.float().norm()).item()
    assert err < 0.08
