"""The launcher's C parameters (gemmgen/codegen/launcher_abi.py): the ABI of each kind of variant, and the
emitted launchers and dispatchers written from that one list."""

import re

import pytest

from gemmgen.codegen.launcher_abi import WRAP, launcher_abi, wrap
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.problem import Variant

PLAIN, BIAS = Variant(), Variant(bias="row")
BATCHED, BATCHED_BIAS = Variant(batch="strided"), Variant(bias="col", batch="strided")
ROW_SCALED = Variant("nt", "bf16", bias="col", scale="row")


@pytest.mark.parametrize("variant, launch", [
    (PLAIN, "int M, int N, int K, float alpha, const E* A, const E* B, float beta, O* C"),
    (BIAS, "int M, int N, int K, float alpha, const E* A, const E* B, float beta, O* C, const O* bias"),
    (BATCHED, "int M, int N, int K, int batch, float alpha, const E* A, long long stride_a, const E* B, "
              "long long stride_b, float beta, O* C, long long stride_c"),
    (BATCHED_BIAS, "int M, int N, int K, int batch, float alpha, const E* A, long long stride_a, const E* B, "
                   "long long stride_b, float beta, O* C, long long stride_c, const O* bias, long long stride_bias"),
    (ROW_SCALED, "int M, int N, int K, float alpha, const E* A, const E* B, float beta, O* C, const O* bias, "
                 "const float* scale_a, const float* scale_b"),
])
def test_the_launcher_takes_the_bias_after_c_and_a_batch_after_k_and_a_stride_after_each_operand(variant, launch):
    assert launcher_abi(variant, "E", "O").launch.decl() == launch


def test_describe_takes_neither_alpha_nor_the_bias_and_reads_c():
    assert launcher_abi(BATCHED_BIAS, "E", "O").describe.decl() == (
        "int M, int N, int K, int batch, const E* A, long long stride_a, const E* B, long long stride_b, float beta, "
        "const O* C, long long stride_c")
    assert launcher_abi(ROW_SCALED, "E", "O").describe.decl() == (
        "int M, int N, int K, const E* A, const E* B, float beta, const O* C")


def test_operands_hold_one_product_and_no_bias_where_the_launcher_takes_neither():
    abi = launcher_abi(PLAIN, "E", "O")
    assert [f.name for f in abi.fields] == ["M", "N", "K", "batch", "alpha", "beta", "A", "B", "C", "bias",
                                            "stride_a", "stride_b", "stride_c", "stride_bias", "scale_a", "scale_b"]
    assert abi.members() == ["int M, N, K, batch;", "float alpha, beta;", "const E* A;", "const E* B;", "O* C;",
                             "const O* bias;", "long long stride_a, stride_b, stride_c, stride_bias;",
                             "const float* scale_a;", "const float* scale_b;"]
    assert abi.fill(abi.launch) == "{M, N, K, 1, alpha, beta, A, B, C, nullptr, 0, 0, 0, 0, nullptr, nullptr}"
    assert abi.fill(abi.describe) == ("{M, N, K, 1, 0.0f, beta, A, B, const_cast<O*>(C), nullptr, 0, 0, 0, 0, "
                                      "nullptr, nullptr}")
    full = launcher_abi(BATCHED_BIAS, "E", "O")
    assert full.fill(full.launch) == ("{M, N, K, batch, alpha, beta, A, B, C, bias, stride_a, stride_b, stride_c, "
                                      "stride_bias, nullptr, nullptr}")
    scaled = launcher_abi(ROW_SCALED, "E", "O")
    assert scaled.fill(scaled.launch) == ("{M, N, K, 1, alpha, beta, A, B, C, bias, 0, 0, 0, 0, scale_a, scale_b}")


def test_the_kernel_takes_its_maps_first_restricted_operands_and_the_workspace_last():
    abi = launcher_abi(BATCHED_BIAS, "E", "O", maps=("a", "b", "c"))
    decl = abi.kernel.decl()
    assert decl.startswith("const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b, "
                           "const __grid_constant__ CUtensorMap tma_c, int M, ")
    assert "const E* __restrict__ A, long long stride_a, " in decl and "const O* __restrict__ bias, " in decl
    assert decl.endswith(", const gg_workspace ws")
    assert abi.strided == (("A", "stride_a"), ("B", "stride_b"), ("C", "stride_c"), ("bias", "stride_bias"))
    assert abi.kernel_args("p.ops", "p.maps.map").startswith("p.maps.map[0], p.maps.map[1], p.maps.map[2], p.ops.M, ")
    # each map from its fixed slot, whichever the kernel takes
    swapped = launcher_abi(BATCHED_BIAS, "E", "O", maps=("a", "b", "a_tail"))
    args = swapped.kernel_args("p.ops", "p.maps.map")
    assert args.startswith("p.maps.map[0], p.maps.map[1], p.maps.map[3], p.ops.M, ")
    assert swapped.kernel_decl(4).startswith(
        "const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,\n"
        "    const __grid_constant__ CUtensorMap tma_a_tail,\n")
    assert launcher_abi(BIAS, "E", "O").strided == ()


def test_a_wrapped_list_keeps_its_items_and_its_lines_short():
    items = [f"long long stride_{i}" for i in range(30)]
    text = wrap(items, indent=40)
    lines = text.split("\n")
    assert len(lines) > 1 and all(40 + len(line.strip()) <= WRAP for line in lines)
    assert all(line.startswith(" " * 40) for line in lines[1:])
    assert re.sub(r",\s+", ", ", text) == ", ".join(items)


def _signature(source: str, function: str) -> str:
    """The parameters of ``function``'s definition in ``source``, on one line."""
    found = re.search(re.escape(function) + r"\(([^)]*)\)\s*\{", source)
    assert found, function
    return re.sub(r"\s+", " ", found.group(1))


@pytest.mark.parametrize("variant", [PLAIN, BATCHED_BIAS])
def test_the_emitted_launcher_is_written_from_the_list(variant):
    config = make_config("mma", {"trans": variant.trans, "bias": variant.bias, "batch": variant.batch}, "fp16")
    source = render_kernel(config)
    abi = launcher_abi(variant, "__half", "float")
    launch, describe = abi.launch.decl(), abi.describe.decl()
    assert _signature(source, 'extern "C" cudaError_t GEMMGEN_LAUNCHER') == f"{launch}, cudaStream_t stream"
    assert _signature(source, "GG_API(_plan)") == f"void** plan, {launch}, cudaStream_t stream"
    assert _signature(source, "GG_API(_describe)") == f"{describe}, int resident, gemmgen_launch_info* out"
    assert _signature(source, "GG_API(_workspace_size)") == f"{describe}, int resident, unsigned long long* bytes"
    assert _signature(source, "GG_API(_launch_workspace)") == (
        f"void* workspace, unsigned long long workspace_bytes, {launch}, cudaStream_t stream")
    assert _signature(source, "GG_API(_plan_workspace)") == (
        f"void** plan, unsigned long long* workspace_bytes, {launch}, cudaStream_t stream")
    assert _signature(source, config.name) == abi.kernel.decl()
