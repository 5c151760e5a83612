"""gemmgen.torch as torch sees it, without a GPU: the registered operators (torch.ops.gemmgen.gemm
and gemm_out) and their schemas, their fake implementation (C's shape, dtype, strides and device,
and the same refusals as an eager call) on FakeTensors of a CUDA device, torch.compile with
fullgraph=True over static and dynamic shapes (one graph, the operator one node of it), and the
drop-in modules: gemmgen.torch.Linear's state_dict against nn.Linear's, and patch's report.

No library is loaded: a GemmOp here wraps a stand-in launcher that has only what a GemmOp reads
(precision, variant, name) and no launch functions, so any call that reached the launcher would
fail. The GPU twin, tests/pytorch/test_gpu_torch_graphs.py, runs the same on real kernels.
"""

import copy
import re
import types

import pytest

torch = pytest.importorskip("torch")

import gemmgen.torch as gt  # noqa: E402 (needs torch, checked above)
import gemmgen.torch.op as gop  # noqa: E402
from gemmgen.describe.problem import Variant  # noqa: E402
from gemmgen.errors import GemmgenError, InvalidParameter  # noqa: E402
from gemmgen.torch.checks import TensorError  # noqa: E402

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

BF, HALF, F32 = torch.bfloat16, torch.float16, torch.float32


def op_of(variant: str, precision: str = "bf16", path: str = "/libs/libgemm.so") -> gt.GemmOp:
    """A GemmOp (BatchedGemmOp for a batched variant) over a stand-in launcher of ``variant``."""
    launcher = types.SimpleNamespace(precision=precision, variant=Variant.parse(variant), name="gemmgen_gemm")
    return (gt.BatchedGemmOp if launcher.variant.batched else gt.GemmOp)(launcher, path)


LINEAR = op_of("nt bf16 col none", path="/libs/linear_bias.so")
LINEAR_NO_BIAS = op_of("nt bf16 none none", path="/libs/linear.so")


def fake(*shape, dtype=BF):
    """An empty tensor of a CUDA device (a FakeTensor where a FakeTensorMode is active)."""
    return torch.empty(*shape, dtype=dtype, device="cuda")


def refused(message: str):
    return pytest.raises(TensorError, match=f"^{re.escape(message)}$")


def test_the_operators_are_registered_with_their_schemas():
    """One pair for every library, which the first argument names (GemmOp.key): gemm gives a new
    C; gemm_out writes the C given, and says so (Tensor(a!))."""
    assert str(torch.ops.gemmgen.gemm.default._schema) == (
        "gemmgen::gemm(str lib, Tensor a, Tensor b, Tensor? bias, float alpha, float beta) -> Tensor")
    assert str(torch.ops.gemmgen.gemm_out.default._schema) == (
        "gemmgen::gemm_out(str lib, Tensor a, Tensor b, Tensor(a3!) out, Tensor? bias, float alpha, float beta) -> ()")
    assert LINEAR.key == "/libs/linear_bias.so:gemmgen_gemm"
    assert gop._LOADED[LINEAR.key] is LINEAR


# (variant, precision, (a's shape, b's shape, bias's shape or None), C's shape, C's dtype)
CASES = [
    ("nn fp32 none none", "fp16", ((37, 65), (65, 129), None), (37, 129), F32),
    ("nt bf16 col none", "bf16", ((5, 4095), (4096, 4095), (4096,)), (5, 4096), BF),
    ("tn fp16 row gelu", "fp16", ((33, 17), (33, 9), (17,)), (17, 9), HALF),
    ("tt fp32 none relu", "tf32", ((8, 3), (2, 8), None), (3, 2), F32),
    ("nt bf16 col none strided", "bf16", ((6, 5, 64), (6, 32, 64), (32,)), (6, 5, 32), BF),
]


@pytest.mark.parametrize("variant, precision, shapes, c_shape, c_dtype", CASES)
def test_the_fake_implementation_gives_c_as_the_call_makes_it(variant, precision, shapes, c_shape, c_dtype):
    """Under a FakeTensorMode (a dispatch mode) a GemmOp call goes through the operator, whose fake
    implementation gives a new contiguous C of the variant's shape and type on a's device; with
    out given, gemm_out writes it and the call returns it. The stand-in launcher is never asked."""
    op = op_of(variant, precision)
    dtype = op.dtype
    with FakeTensorMode():
        a, b = fake(*shapes[0], dtype=dtype), fake(*shapes[1], dtype=dtype)
        bias = None if shapes[2] is None else fake(*shapes[2], dtype=c_dtype)
        c = op(a, b, bias=bias)
        assert (tuple(c.shape), c.dtype, str(c.device)) == (c_shape, c_dtype, "cuda:0")
        assert c.is_contiguous() and c.stride()[-1] == 1 and c.stride()[-2] == c_shape[-1]
        out = fake(*c_shape, dtype=c_dtype)
        assert op(a, b, out, alpha=2.0, beta=0.5, bias=bias) is out
        assert torch.ops.gemmgen.gemm_out(op.key, a, b, out, bias, 1.0, 0.0) is None


def test_the_fake_implementation_refuses_as_an_eager_call_does():
    """The rules of gemmgen.torch.checks, on the traced tensors, with the eager call's messages
    (those about addresses, out overlapping a, cannot be judged without data)."""
    with FakeTensorMode():
        x, w, b = fake(4, 5), fake(3, 5), fake(3)
        with refused("a is torch.float16, but this kernel's precision is bf16, which takes torch.bfloat16: convert "
                     "it with a.to(torch.bfloat16)"):
            LINEAR(x.half(), w, bias=b)
        with refused("a is 4 x 5 and b is 5 x 3 (N x K: trans=nt takes B stored transposed, as F.linear's weight): "
                     "a's columns (K=5) must equal b's columns (3)"):
            LINEAR(x, fake(5, 3), bias=b)
        with refused("this kernel adds a bias (variant nt bf16 col none): pass bias=, a tensor of shape (3,) (N "
                     "values, one per column of C) of torch.bfloat16"):
            LINEAR(x, w)
        with refused("beta=0.5 adds beta * out to the product, and no out was given: pass out (bf16, M x N), or "
                     "beta=0"):
            LINEAR(x, w, beta=0.5, bias=b)
        with refused("b is not contiguous row-major: shape (3, 5) with strides (1, 3), where row-major has (5, 1); "
                     "pass b.contiguous() (gemmgen does not copy it for you)"):
            LINEAR(x, fake(5, 3).t(), bias=b)
    with FakeTensorMode():
        with refused("a is on cpu; gemmgen kernels take CUDA tensors: move it with a.cuda() (or .to('cuda:N'))"):
            LINEAR(torch.empty(4, 5, dtype=BF), fake(3, 5), bias=fake(3))


def test_an_operator_naming_a_library_not_loaded_says_so():
    with FakeTensorMode():
        with pytest.raises(GemmgenError, match=re.escape(
                "the gemmgen library '/nowhere/lib.so' (launcher gemmgen_gemm) is not loaded in this process: call "
                "gemmgen.torch.load('/nowhere/lib.so', launcher='gemmgen_gemm') before running a graph that calls it")):
            torch.ops.gemmgen.gemm("/nowhere/lib.so:gemmgen_gemm", fake(2, 3), fake(4, 3), None, 1.0, 0.0)


class Graphs:
    """A torch.compile backend that keeps each graph it is given and runs it as traced."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    @staticmethod
    def calls(graph) -> list:
        """The gemmgen operator nodes of ``graph``: (the operator's name, its arguments)."""
        return [(str(node.target).removesuffix(".default"), node.args) for node in graph.graph.nodes
                if node.op == "call_function" and str(node.target).startswith("gemmgen.")]


@pytest.mark.parametrize("dynamic", [True, False])
def test_torch_compile_traces_the_call_as_one_node_of_one_graph(dynamic):
    """fullgraph=True (a graph break would raise) over three shapes: with dynamic shapes one graph
    serves them all; with static ones each shape has its own. Every graph holds the operator
    (gemm, or gemm_out with out given) called with the library's key, and gives C as eager."""
    backend = Graphs()

    def linear_gelu(x, w, b):
        return torch.nn.functional.gelu(LINEAR(x, w, bias=b))

    def into(x, w, b, out):
        LINEAR(x, w, out, alpha=0.5, beta=1.0, bias=b)
        return out * 2

    compiled = torch.compile(linear_gelu, fullgraph=True, dynamic=dynamic, backend=backend)
    compiled_out = torch.compile(into, fullgraph=True, dynamic=dynamic, backend=backend)
    with FakeTensorMode():
        for m, n, k in ((5, 64, 96), (9, 64, 96), (33, 48, 80)):
            x, w, b = fake(m, k), fake(n, k), fake(n)
            c = compiled(x, w, b)
            assert (tuple(c.shape), c.dtype, c.stride()) == ((m, n), BF, (n, 1))
            assert compiled_out(x, w, b, fake(m, n)).shape == (m, n)
    assert len(backend.graphs) == (2 if dynamic else 6)
    for graph in backend.graphs:
        ((name, args),) = backend.calls(graph)
        assert name in ("gemmgen.gemm", "gemmgen.gemm_out") and args[0] == LINEAR.key
    for graph in backend.graphs:  # alpha and beta's defaults are constants of the graph, not inputs
        placeholders = [str(n.target) for n in graph.graph.nodes if n.op == "placeholder"]
        assert not [p for p in placeholders if "alpha" in p or "beta" in p], placeholders
    if dynamic:  # the shapes are symbols of the graph, not constants
        placeholders = [str(n.target) for n in backend.graphs[0].graph.nodes if n.op == "placeholder"]
        assert sum(1 for p in placeholders if re.fullmatch(r"s\d+", p)) >= 2, placeholders


def test_a_gemm_op_is_one_handle_under_copies():
    assert copy.deepcopy(LINEAR) is LINEAR
    assert copy.deepcopy({"op": LINEAR})["op"] is LINEAR
    assert LINEAR.__reduce__() == (gop._reload, ("/libs/linear_bias.so", "gemmgen_gemm"))


# ---- gemmgen.torch.Linear ----

def test_linear_has_nn_linears_state_dict_both_ways():
    torch.manual_seed(0)
    stock = torch.nn.Linear(64, 32, dtype=BF)
    mine = gt.Linear(64, 32, dtype=BF, op=LINEAR)
    assert isinstance(mine, torch.nn.Linear) and mine.op is LINEAR
    assert list(mine.state_dict()) == list(stock.state_dict()) == ["weight", "bias"]
    mine.load_state_dict(stock.state_dict())
    assert torch.equal(mine.weight, stock.weight) and torch.equal(mine.bias, stock.bias)
    other = torch.nn.Linear(64, 32, dtype=BF)
    with torch.no_grad():
        mine.weight.add_(1.0)
    other.load_state_dict(mine.state_dict())
    assert torch.equal(other.weight, mine.weight) and not torch.equal(other.weight, stock.weight)
    bare = gt.Linear(64, 32, bias=False, dtype=BF, op=LINEAR_NO_BIAS)
    assert list(bare.state_dict()) == ["weight"] and bare.bias is None
    assert repr(bare) == ("Linear(in_features=64, out_features=32, bias=False, op=GemmOp('/libs/linear.so', "
                          "precision='bf16', variant='nt bf16 none none'))")


def test_from_linear_holds_the_same_parameters():
    stock = torch.nn.Linear(16, 8, dtype=HALF).eval()
    mine = gt.Linear.from_linear(stock, op_of("nt fp16 col none", "fp16"))
    assert mine.weight is stock.weight and mine.bias is stock.bias and not mine.training
    assert (mine.in_features, mine.out_features) == (16, 8)
    assert list(dict(mine.named_parameters())) == ["weight", "bias"]


@pytest.mark.parametrize("op, layer, why", [
    (LINEAR_NO_BIAS, dict(bias=True), "the layer has a bias, one per output feature (--bias col), and linear.so "
                                      "adds none"),
    (LINEAR, dict(bias=False), "the layer has no bias (--bias none), and linear_bias.so adds one per col"),
    (op_of("nn bf16 col none", path="/l/nn.so"), {}, "nn.so takes B as trans=nn stores it; nn.Linear keeps its "
                                                     "weight N x K (trans=nt: gemmgen emit ... --trans nt --out bf16)"),
    (op_of("nt bf16 col gelu", path="/l/g.so"), {}, "g.so applies gelu after the product; nn.Linear applies none "
                                                    "(--act none)"),
    (op_of("nt fp32 col none", path="/l/f.so"), {}, "the layer is torch.bfloat16, and f.so takes torch.bfloat16 "
                                                    "and writes torch.float32 (variant nt fp32 col none): F.linear "
                                                    "reads and writes the layer's dtype (gemmgen emit ... --trans nt "
                                                    "--out bf16 for torch.bfloat16 layers)"),
    (LINEAR, dict(dtype=HALF), "the layer is torch.float16, and linear_bias.so takes torch.bfloat16 and writes "
                               "torch.bfloat16 (variant nt bf16 col none): F.linear reads and writes the layer's "
                               "dtype (gemmgen emit ... --trans nt --out bf16 for torch.bfloat16 layers)"),
    (LINEAR, dict(dtype=F32), "the layer is torch.float32; gemmgen.torch.Linear takes torch.bfloat16 or "
                              "torch.float16 layers"),
    (op_of("nt bf16 col none strided", path="/l/b.so"), {}, "b.so is batched (variant nt bf16 col none strided); "
                                                            "nn.Linear needs a launcher of one product per launch"),
])
def test_linear_refuses_an_op_that_does_not_compute_it(op, layer, why):
    with pytest.raises(InvalidParameter, match=f"^{re.escape(f'{op.path.name} cannot compute this Linear: {why}')}$"):
        gt.Linear(8, 4, **{"dtype": BF, **layer}, op=op)
    with pytest.raises(InvalidParameter, match="op must be a gemmgen.torch.GemmOp"):
        gt.Linear(8, 4, dtype=BF, op="libgemm.so")


def fake_cuda(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` (made on the meta device) with each parameter replaced by one of a CUDA device
    (a FakeTensor: call inside a FakeTensorMode), of its shape and dtype, not requiring grad."""
    for part in module.modules():
        for name, p in part._parameters.items():
            if p is not None:
                part._parameters[name] = torch.nn.Parameter(fake(*p.shape, dtype=p.dtype), requires_grad=False)
    return module


def test_linear_forward_takes_any_leading_shape_and_compiles():
    """x (..., in_features) is seen as rows of in_features; y has x's leading shape (rows that are
    not contiguous are copied first: a copy needs a GPU, test_gpu_torch_graphs.py). torch.compile
    (dynamic=True) traces the forward to one operator node, alpha and beta constants in it (the
    call's defaults would be graph inputs)."""
    backend = Graphs()
    with torch.no_grad(), FakeTensorMode():
        layer = gt.Linear.from_linear(fake_cuda(torch.nn.Linear(64, 32, dtype=BF, device="meta")), LINEAR)
        assert layer(fake(3, 7, 64)).shape == (3, 7, 32)
        assert layer(fake(64)).shape == (32,)
        with refused("x has shape (4, 2, 32); this Linear takes (..., 64): 64 features in the last dimension"):
            layer(fake(4, 2, 32))  # as many elements as 2 x 64: a reshape alone would not notice
        compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend=backend)
        for rows in (3, 17, 40):
            assert compiled(fake(2, rows, 64)).shape == (2, rows, 32)
    assert len(backend.graphs) == 1
    ((name, args),) = backend.calls(backend.graphs[0])
    assert name == "gemmgen.gemm" and args[0] == LINEAR.key and args[4:] == (1.0, 0.0)


# ---- patch ----

class Block(torch.nn.Module):
    """A model's parts, made on the meta device: bf16 layers with and without a bias, an fp32 one,
    an attention (whose out_proj is a subclass of nn.Linear), and one layer reached by two names."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 128, dtype=BF, device="meta")
        self.down = torch.nn.Linear(128, 64, bias=False, dtype=BF, device="meta")
        self.head = torch.nn.Linear(64, 10, device="meta")
        self.attn = torch.nn.MultiheadAttention(64, 4, dtype=BF, device="meta")
        self.tied = self.up


def test_patch_swaps_the_layers_the_ops_serve_and_says_why_it_left_the_others():
    with torch.no_grad(), FakeTensorMode():
        model = fake_cuda(Block())
        up_weight = model.up.weight
        report = gt.patch(model, [LINEAR_NO_BIAS, LINEAR])
        assert report.swapped == ["up", "down", "tied"]
        assert type(model.up) is gt.Linear and model.up.op is LINEAR and model.up.weight is up_weight
        assert model.tied is model.up  # one module under two names stays one
        assert type(model.down) is gt.Linear and model.down.op is LINEAR_NO_BIAS
        assert report.left == {
            "head": "the layer is torch.float32; gemmgen.torch.Linear takes torch.bfloat16 or torch.float16 layers",
            "attn.out_proj": "a subclass of nn.Linear (NonDynamicallyQuantizableLinear), whose forward may not be "
                             "F.linear's",
        }
        assert model.down(model.up(fake(3, 64))).shape == (3, 64)
        again = gt.patch(model, LINEAR)
        assert again.swapped == [] and again.left["up"] == "already a gemmgen.torch.Linear"
    assert str(report) == (
        "swapped 3 nn.Linear module(s) for gemmgen.torch.Linear: up, down, tied\n"
        "left 2:\n"
        "  head: the layer is torch.float32; gemmgen.torch.Linear takes torch.bfloat16 or torch.float16 layers\n"
        "  attn.out_proj: a subclass of nn.Linear (NonDynamicallyQuantizableLinear), whose forward may not be "
        "F.linear's")


def test_patch_leaves_what_no_op_serves_and_refuses_what_is_no_op():
    with torch.no_grad(), FakeTensorMode():
        model = fake_cuda(Block())
        report = gt.patch(model, LINEAR)  # bias only: the bias-free layer stays
        assert report.swapped == ["up", "tied"]
        assert report.left["down"] == "the layer has no bias (--bias none), and linear_bias.so adds one per col"
        root = fake_cuda(torch.nn.Linear(8, 4, dtype=BF, device="meta"))
        assert gt.patch(root, LINEAR).left == {"": "the model itself is an nn.Linear, which patch cannot replace in "
                                                   "place: use Linear.from_linear(model, op)"}
    on_cpu = torch.nn.Sequential(torch.nn.Linear(8, 4, dtype=BF))
    assert gt.patch(on_cpu, LINEAR).left == {"0": "its weight is on cpu; gemmgen kernels run on CUDA devices: move the "
                                                  "model first"}
    assert type(on_cpu[0]) is torch.nn.Linear
    for wrong in ([], "libgemm.so", [LINEAR, "libgemm.so"]):
        with pytest.raises(InvalidParameter, match="dispatcher must be a gemmgen.torch.GemmOp"):
            gt.patch(on_cpu, wrong)
