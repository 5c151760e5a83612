"""On the GPU, with PyTorch: gemmgen.torch with batched libraries (batch=strided, BatchedGemmOp),
as a user calls them, in ONE process: mma and warp kernels of several variants loaded from emitted
.cu files and called on 3-D tensors -- batch counts 1, 3 and 7, odd shapes, a shared operand from
expand (batch stride 0), a padded out (batch stride > M * N), a NaN-poisoned out with beta = 0,
accumulation (beta != 0), a bias per product and one for all -- each result against torch.bmm /
torch.baddbmm in float64 with the bias and activation (the bounds of gemmgen/describe/tolerance.py), every
matrix of the batch; then empty batches and a refusal raised through real tensors. One of the
libraries is a batched dispatcher (emit --dispatch --batch-mode strided) of two kernels: load()
gives a BatchedGemmOp for it too, and its calls go to both kernels."""

import random

import pytest
from conftest import SMALL_MMA, table_plan

torch = pytest.importorskip("torch")

import gemmgen.torch as gt  # noqa: E402 (needs torch, checked above)
from gemmgen.codegen.render import render_kernel  # noqa: E402
from gemmgen.describe.config import make_config  # noqa: E402
from gemmgen.describe.problem import Shape  # noqa: E402
from gemmgen.measure import verify  # noqa: E402
from gemmgen.selection.dispatch.emit import render_dispatcher  # noqa: E402
from gemmgen.torch.checks import TensorError  # noqa: E402

pytestmark = pytest.mark.gpu

SEED = 20261124
SHAPES = [(17, 33, 65), (128, 256, 64), (1, 1, 1), (257, 130, 31), (64, 1000, 17)]
KERNELS = {
    "mma_fp16_nn": ("mma", "fp16", {}),
    "mma_bf16_nt_obf16_bcol_gelu": ("mma", "bf16", {**SMALL_MMA, "trans": "nt", "out": "bf16", "bias": "col",
                                                    "act": "gelu"}),
    "mma_fp16_tt_ofp16_brow_k2": ("mma", "fp16", {**SMALL_MMA, "trans": "tt", "out": "fp16", "bias": "row",
                                                  "split_k": 2}),
    "warp_tn_silu": ("warp", "fp32", {"trans": "tn", "act": "silu"}),
}
ACT = {"none": lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu,
       "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}


@pytest.fixture(scope="module")
def ops(torch_arch, tmp_path_factory, build_cache):
    arch = torch_arch
    folder, loaded = tmp_path_factory.mktemp("batched"), {}
    for name, (family, precision, params) in KERNELS.items():
        path = folder / f"{name}.cu"
        path.write_text(render_kernel(make_config(family, {**params, "batch": "strided"}, precision, arch)))
        loaded[name] = gt.load(path)
    # a dispatcher of the bf16 variant's kernel and a split-K twin, a tuned shape each
    family, precision, params = KERNELS["mma_bf16_nt_obf16_bcol_gelu"]
    kernels = tuple(make_config(family, {**params, **extra, "batch": "strided"}, precision, arch)
                    for extra in ({}, {"split_k": 2}))
    path = folder / "dispatcher.cu"
    path.write_text(render_dispatcher(table_plan(kernels, {Shape(128, 256, 64): 0, Shape(17, 33, 65): 1}),
                                      ["--dispatch", "--batch-mode", "strided"]))
    loaded["dispatcher"] = gt.load(path)
    assert isinstance(loaded["dispatcher"], gt.BatchedGemmOp)
    assert {loaded["dispatcher"].choice(*s) for s in SHAPES} == {k.name for k in kernels}
    return loaded


def _expected(op, a, b, c0, alpha, beta, bias):
    """(ref, scale) in float64, batch x M x N: torch.baddbmm of the layouts as stored, the bias and activation."""
    v = op.variant
    a64, b64 = a.double(), b.double()
    a64 = a64.transpose(1, 2) if v.a_transposed else a64
    b64 = b64.transpose(1, 2) if v.b_transposed else b64
    start = c0.double() if beta != 0 else torch.zeros(a64.shape[0], a64.shape[1], b64.shape[2], dtype=torch.float64,
                                                      device=a.device)
    ref = torch.baddbmm(start, a64, b64, beta=beta, alpha=alpha)
    scale = abs(alpha) * torch.bmm(a64.abs(), b64.abs()) + abs(beta) * start.abs()
    if bias is not None:
        vec = bias.double().unsqueeze(-2) if v.bias == "col" else bias.double().unsqueeze(-1)
        ref, scale = ref + vec, scale + vec.abs()
    return ACT[v.act](ref), scale


def test_batched_ops_match_torch_bmm_in_float64_for_every_matrix(ops):
    rng, gen = random.Random(SEED), torch.Generator(device="cuda").manual_seed(SEED)
    calls = [(name, shape, batch) for name in ops for shape in SHAPES for batch in (1, 3, 7)]
    rng.shuffle(calls)
    for i, (name, (m, n, k), batch) in enumerate(calls):
        op = ops[name]
        v = op.variant
        a_dims, b_dims = ((k, m) if v.a_transposed else (m, k)), ((n, k) if v.b_transposed else (k, n))

        def rand(*shape, dtype=op.dtype):
            return (torch.rand(*shape, generator=gen, device="cuda") * 2 - 1).to(dtype)

        a = rand(batch, *a_dims)
        b = rand(1, *b_dims).expand(batch, -1, -1) if i % 4 == 1 else rand(batch, *b_dims)  # shared: stride 0
        count = n if v.bias == "col" else m
        bias = None if v.bias == "none" else (rand(count, dtype=op.out_dtype) if i % 3 == 0
                                               else rand(batch, count, dtype=op.out_dtype))
        alpha, beta = (1.0, 0.0) if i % 2 == 0 else (1.25, -0.75)
        padded = torch.empty(batch, m * n + 5 * (i % 2), dtype=op.out_dtype, device="cuda")  # stride >= M * N
        out = padded[:, :m * n].view(batch, m, n)
        if beta != 0:
            out.copy_(rand(batch, m, n, dtype=op.out_dtype))
        else:  # NaN: an element left unwritten fails
            out.fill_(float("nan"))
        c0 = out.clone()
        got = op(a, b, out if (beta != 0 or i % 3) else None, alpha=alpha, beta=beta, bias=bias)
        torch.cuda.synchronize()
        ref, scale = _expected(op, a, b, c0, alpha, beta, bias)
        for j in range(batch):
            verdict = verify.compare(got[j].double().cpu().numpy(), ref[j].cpu().numpy(), scale[j].cpu().numpy(),
                                     op.precision, k, v.out, v.act)
            assert verdict.ok, (name, (m, n, k), batch, j, verdict.message)


def test_empty_batches_and_a_refusal_through_real_tensors(ops):
    op = ops["mma_fp16_nn"]
    a, b = torch.ones(0, 8, 16, dtype=torch.float16, device="cuda"), torch.ones(0, 16, 8, dtype=torch.float16,
                                                                                device="cuda")
    assert op(a, b).shape == (0, 8, 8)
    a, b = torch.ones(2, 8, 0, dtype=torch.float16, device="cuda"), torch.ones(2, 0, 8, dtype=torch.float16,
                                                                               device="cuda")
    assert torch.equal(op(a, b), torch.zeros(2, 8, 8, device="cuda"))  # K = 0: C = beta * C = 0
    with pytest.raises(TensorError, match="a must be a 3-D batch"):
        op(torch.ones(8, 16, dtype=torch.float16, device="cuda"), torch.ones(16, 8, dtype=torch.float16, device="cuda"))
    assert isinstance(op, gt.BatchedGemmOp) and op.bmm == op.__call__
