"""gemmgen.torch as torch sees it, without a GPU: the registered operators (torch.ops.gemmgen.gemm
and gemm_out) and their schemas, their fake implementation (C's shape, dtype, strides and device,
and the same refusals as an eager call) on FakeTensors of a CUDA device, torch.compile with
fullgraph=True over static and dynamic shapes (one graph, the operator one node of it).

No library is loaded: a GemmOp here wraps a stand-in launcher that has only what a GemmOp reads
(precision, variant, name) and no launch functions, so any call that reached the launcher would
fail. The GPU twin, tests/test_gpu_torch_graphs.py, runs the same on real kernels.
"""

import copy
import re
import types

import pytest

torch = pytest.importorskip("torch")

import gemmgen.torch as gt  # noqa: E402 (needs torch, checked above)
from gemmgen.errors import GemmgenError  # noqa: E402
from gemmgen.problem import Variant  # noqa: E402
from gemmgen.torch_checks import TensorError  # noqa: E402

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

BF, HALF, F32 = torch.bfloat16, torch.float16, torch.float32


def op_of(variant: str, precision: str = "bf16", path: str = "/libs/libgemm.so") -> gt.GemmOp:
    """A GemmOp (BatchedGemmOp for a batched variant) over a stand-in launcher of ``variant``."""
    launcher = types.SimpleNamespace(precision=precision, variant=Variant.parse(variant), name="gemmgen_gemm")
    return (gt.BatchedGemmOp if launcher.variant.batched else gt.GemmOp)(launcher, path)


LINEAR = op_of("nt bf16 col none", path="/libs/linear_bias.so")


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
    assert gt._LOADED[LINEAR.key] is LINEAR


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
    """The rules of gemmgen.torch_checks, on the traced tensors, with the eager call's messages
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
    if dynamic:  # the shapes are symbols of the graph, not constants
        placeholders = [str(n.target) for n in backend.graphs[0].graph.nodes if n.op == "placeholder"]
        assert sum(1 for p in placeholders if re.fullmatch(r"s\d+", p)) >= 2, placeholders


def test_a_gemm_op_is_one_handle_under_copies():
    assert copy.deepcopy(LINEAR) is LINEAR
    assert copy.deepcopy({"op": LINEAR})["op"] is LINEAR
    assert LINEAR.__reduce__() == (gt._reload, ("/libs/linear_bias.so", "gemmgen_gemm"))

