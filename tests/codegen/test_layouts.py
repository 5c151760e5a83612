"""Operand layouts (trans nt, tn, tt) of the mma, warp and hopper families, and mma's 16-bit C,
without a GPU: which families take which variants (and the one-line refusals of the rest), their
names, what the emitted source does for each layout (ldmatrix with or without .trans,
tf32's 8-byte pair loads, transposing stores, C's type; hopper's in tests/codegen/test_hopper.py), that
every new variant compiles for sm_80 and sm_90 without spilling, and that the cuBLAS calls of the
checks (the float64 reference and the baseline) read A and B as each layout stores them.
tests/codegen/test_gpu_layouts.py runs them."""

import re
import subprocess

import numpy as np
import pytest
from conftest import assert_compiles_without_spills, build_all

from gemmgen.build.nvcc import find_tool
from gemmgen.codegen.render import render_kernel
from gemmgen.describe.config import make_config
from gemmgen.describe.points import resolve_point
from gemmgen.describe.problem import LAYOUTS, Shape, Variant
from gemmgen.errors import InvalidPoint, ToolNotFound
from gemmgen.measure import verify

MMA = {"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2}
MMA_TF32 = {"BM": 128, "BN": 128, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 4, "frags": 2}  # mma_tf32
WARP = {"BM": 128, "BN": 128, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "buffers": 2}  # v4


def kernel_body(source: str, name: str) -> str:
    """The GEMM kernel's own text (from its signature to the pack kernel or the launcher)."""
    start = source.index(f"{name}(")
    return source[start:source.index("#ifndef GEMMGEN_LAUNCHER", start)]


# ---- which variants a family takes --------------------------------------------------------------

@pytest.mark.parametrize("trans", LAYOUTS)
def test_mma_and_warp_take_every_layout(trans):
    part = "" if trans == "nn" else f"_{trans}"
    for precision in ("fp16", "bf16", "tf32"):
        config = make_config("mma", {**MMA, "trans": trans}, precision, "sm_80")
        assert config.variant == Variant(trans) and config.name == f"mma_128x128x32_w2x2_s3_f2_{precision}{part}"
    config = make_config("warp", {**WARP, "trans": trans}, "fp32")
    assert config.variant == Variant(trans) and config.name == f"warp_128x128x8_w64x32_t8x8_b2_fp32{part}"


@pytest.mark.parametrize("trans", LAYOUTS)
def test_hopper_takes_every_layout_in_16_bit_types_and_tf32_nn_only(trans):
    for precision in ("fp16", "bf16"):
        for out in ("fp32", precision):
            config = make_config("hopper", {"trans": trans, "out": out}, precision, "sm_90")
            assert config.variant == Variant(trans, out) and config.name.endswith(config.variant.suffix)
    if trans != "nn":
        with pytest.raises(InvalidPoint, match=r"tf32 computes trans=nn into fp32 C only so far"):
            make_config("hopper", {"trans": trans}, "tf32", "sm_90")


@pytest.mark.parametrize("out", ["fp16", "bf16"])
def test_mma_stores_16_bit_c_for_every_precision_and_layout(out):
    for precision in ("fp16", "bf16", "tf32"):
        for trans in LAYOUTS:
            assert make_config("mma", {**MMA, "trans": trans, "out": out}, precision).variant == Variant(trans, out)


@pytest.mark.parametrize("family, params, precision, expected", [
    ("warp", {**WARP, "out": "bf16"}, "fp32", "family warp computes out=fp32 only, not out=bf16"),
    ("warp", {**WARP, "trans": "tt", "out": "fp16"}, "fp32", "family warp computes out=fp32 only, not out=fp16"),
    ("wmma", {"trans": "tn"}, "fp16", "family wmma computes trans=nn only, not trans=tn"),
    ("register", {"trans": "tt"}, "fp32", "family register computes trans=nn only, not trans=tt"),
    ("fastgemm", {"trans": "nt"}, "fp32", "family fastgemm computes trans=nn only, not trans=nt"),
    ("hopper", {"trans": "tn"}, "tf32", "wgmma transposes 16-bit operands only, so A stored K x M (trans=tn, tt) "
                                        "takes fp16 or bf16"),
])
def test_other_variants_are_refused_in_one_line(family, params, precision, expected):
    with pytest.raises(InvalidPoint) as err:
        make_config(family, params, precision)
    assert expected in str(err.value)


def test_existing_names_are_unchanged():
    assert resolve_point("mma_fp16").name == "mma_128x128x32_w2x2_s5_f2_fp16"
    assert make_config("mma", MMA, "tf32").name == "mma_128x128x32_w2x2_s3_f2_tf32"


def test_shared_memory_does_not_grow_with_the_layout():
    for trans in LAYOUTS:
        assert make_config("mma", {**MMA, "trans": trans}, "fp16").geometry.smem_bytes == 3 * 2 * 128 * 32 * 2
    # warp pads the rows of the operand it transposes on the way in (A of nn/nt, B of nt/tt)
    smem = {t: make_config("warp", {**WARP, "trans": t}, "fp32").geometry.smem_bytes for t in LAYOUTS}
    assert smem == {"nn": 2 * 8 * (132 + 128) * 4, "nt": 2 * 8 * (132 + 132) * 4, "tn": 2 * 8 * (128 + 128) * 4,
                    "tt": 2 * 8 * (128 + 132) * 4}


# ---- the emitted source ------------------------------------------------------------------------------

def _bool(flag: bool) -> str:
    return "true" if flag else "false"


@pytest.mark.parametrize("trans", LAYOUTS)
def test_mma_renders_the_stored_layout_for_its_cpp_to_follow(trans):
    """The kernel reads A and B as stored: the layout is two C++ constants (A_T, B_T) that choose
    the code (the instructions each layout gets: test_mma_reads_each_layout_with_its_instructions),
    the leading dimensions, and the packing of A and B as stored, in the kernel and the launcher."""
    config = make_config("mma", {**MMA, "trans": trans}, "bf16")
    source = render_kernel(config)
    body = kernel_body(source, config.name)
    a_t, b_t = (_bool(t == "t") for t in trans)
    assert f"constexpr bool A_T = {a_t}, B_T = {b_t};" in body
    # 16-bit tiles: ldmatrix for all
    assert f"A_KC = {_bool(trans[0] == 'n')}, B_KC = {b_t}, SWAP = false, A_PAIRS = false, B_PAIRS = false;" in body
    assert f'return "{trans} fp32' in source  # the launcher says what it computes
    lda, ldb = ("M" if trans[0] == "t" else "K"), ("K" if trans[1] == "t" else "N")
    assert f"int lda = {lda}, ldb = {ldb};" in body  # of A and B as stored (A_T ? M : K, decided)
    assert "gg_packed_operands<VEC, T, B_T, A_T>(M, N, K, A, B, ws.packed, a_op, lda, b_op, ldb);" in body
    # the pack kernel's plan and the launcher's, of A and B as stored (the vocabulary's GG_A_T, GG_B_T)
    assert f"constexpr bool GG_A_T = {a_t};" in source and f"constexpr bool GG_B_T = {b_t};" in source
    assert "gg_pack_plan<8, __nv_bfloat16, GG_B_T, GG_A_T>(M, N, K, A, B, a_bytes, b_bytes);" in source
    assert "gg_pack_plan<8, __nv_bfloat16, GG_B_T, GG_A_T>(o.M, o.N, o.K, o.A, o.B, out.a_bytes, out.b_bytes);" in source
    assert "(ws), A, GG_A_T ? K : M, GG_A_T ? M : K);" in source


@pytest.mark.parametrize("trans", LAYOUTS)
def test_tf32_chooses_its_fragments_for_each_layout(trans):
    """tf32: K-contiguous tiles through ldmatrix (32-bit elements as pairs of 16-bit ones), tiles
    stored K-major through 8-byte loads of column pairs (PAIRS: ldmatrix cannot transpose them), and
    nn as C^T = B^T A^T (SWAP); the epilogue stores the permuted rows and columns in place."""
    config = make_config("mma", {**MMA_TF32, "trans": trans}, "tf32")
    body = kernel_body(render_kernel(config), config.name)
    swap, a_pairs, b_pairs = (_bool(f) for f in (trans == "nn", trans[0] == "t", trans[1] == "n"))
    assert f"SWAP = {swap}, A_PAIRS = {a_pairs}, B_PAIRS = {b_pairs};" in body


def test_mma_16_bit_c():
    config = make_config("mma", {**MMA, "trans": "tn", "out": "bf16", "split_k": 4}, "fp16")
    source = render_kernel(config)
    body = kernel_body(source, config.name)
    assert "float beta, __nv_bfloat16* __restrict__ C" in source and 'return "tn bf16' in source
    assert "using CT = __nv_bfloat16;" in body and "C16" not in body  # the 16-bit store alone (C16 decided)
    assert "gg_pack2<CT>(out[2 * e], out[2 * e + 1])" in body  # two elements, one rounding each
    assert "out[e] += beta * gg_to_float(old[e]);" in body  # beta * C read in C's type
    assert "gg_splitk_reduce<FI * FJ * 4, THREADS>(&acc[0][0][0], ws)" in body  # fp32 partials
    plain = kernel_body(render_kernel(make_config("mma", MMA, "fp16")), "mma_128x128x32_w2x2_s3_f2_fp16")
    assert "using CT = float;" in plain


@pytest.mark.parametrize("trans", LAYOUTS)
def test_warp_renders_the_stored_layout_for_its_cpp_to_follow(trans):
    """The layout is two C++ constants, which choose each operand's float4 loads along its rows as
    stored and whether its stores into shared memory transpose
    (test_warp_transposes_the_operands_whose_rows_run_along_k)."""
    config = make_config("warp", {**WARP, "trans": trans}, "fp32")
    body = kernel_body(render_kernel(config), config.name)
    assert f"constexpr bool A_T = {_bool(trans[0] == 't')}, B_T = {_bool(trans[1] == 't')};" in body
    assert "const bool a_vec = (A_T ? M : K) % 4 == 0" in body and "const bool b_vec = (B_T ? K : N) % 4 == 0" in body


# ---- every new variant compiles without spilling ----------------------------------------------------

COMPILED = {
    # mma: each layout and precision at the default tiles (tf32: mma_tf32's), and the corners
    **{f"mma-{p}-{t}": ("mma", p, {**(MMA_TF32 if p == "tf32" else MMA), "trans": t}, "sm_90")
       for p in ("fp16", "bf16", "tf32") for t in ("nt", "tn", "tt")},
    "mma-fp16-nn-ofp16": ("mma", "fp16", {**MMA, "out": "fp16"}, "sm_90"),
    "mma-tf32-nn-obf16": ("mma", "tf32", {**MMA_TF32, "out": "bf16"}, "sm_80"),
    "mma-bf16-tt-obf16-sm80": ("mma", "bf16", {**MMA, "trans": "tt", "out": "bf16"}, "sm_80"),
    "mma-tf32-tn-ofp16-sm80": ("mma", "tf32", {**MMA_TF32, "frags": 1, "trans": "tn", "out": "fp16"}, "sm_80"),
    "mma-fp16-tn-k8": ("mma", "fp16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 2, "stages": 4,
                                       "frags": 2, "split_k": 8, "trans": "tn", "out": "bf16"}, "sm_89"),
    "mma-tf32-tt-k4": ("mma", "tf32", {"BM": 32, "BN": 128, "BK": 16, "WARPS_M": 1, "WARPS_N": 4, "stages": 4,
                                       "frags": 1, "split_k": 4, "trans": "tt"}, "sm_80"),
    # narrow rows: B stored N x K in 2-chunk rows (the swizzle's D = 4), one-warp tiles
    "mma-fp16-nt-narrow": ("mma", "fp16", {"BM": 64, "BN": 32, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "stages": 3,
                                           "frags": 1, "trans": "nt"}, "sm_90"),
    "mma-tf32-tt-bk8": ("mma", "tf32", {"BM": 64, "BN": 64, "BK": 8, "WARPS_M": 2, "WARPS_N": 4, "stages": 4,
                                        "frags": 2, "trans": "tt"}, "sm_90"),
    "mma-fp16-tn-w1": ("mma", "fp16", {"BM": 32, "BN": 64, "BK": 32, "WARPS_M": 1, "WARPS_N": 1, "stages": 3,
                                       "frags": 1, "trans": "tn"}, "sm_90"),
    # warp: each layout at v4, and split-K with the block swizzle
    **{f"warp-{t}": ("warp", "fp32", {**WARP, "trans": t}, "sm_90") for t in ("nt", "tn", "tt")},
    "warp-tn-k4-g8": ("warp", "fp32", {**WARP, "split_k": 4, "swizzle": 8, "trans": "tn"}, "sm_80"),
    "warp-nt-splitk": ("warp", "fp32", {"BM": 16, "BN": 64, "BK": 32, "WM": 16, "WN": 16, "TM": 2, "TN": 4,
                                        "buffers": 2, "split_k": 8, "trans": "nt"}, "sm_90"),
    "warp-tt-b1": ("warp", "fp32", {"BM": 64, "BN": 16, "BK": 16, "WM": 32, "WN": 16, "TM": 4, "TN": 4, "buffers": 1,
                                    "split_k": 2, "swizzle": 16, "trans": "tt"}, "sm_90"),
}


@pytest.fixture(scope="module")
def compiled():
    return build_all({key: make_config(f, params, p, arch) for key, (f, p, params, arch) in COMPILED.items()})


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("key", sorted(COMPILED))
def test_variant_compiles_without_spills(compiled, key):
    config, result = compiled[key]
    assert_compiles_without_spills(config, result)


def _kernel_sass(config, result) -> str:
    """The SASS of config's GEMM kernel (nvdisasm); skips the test where nvdisasm is not installed."""
    try:
        tool = find_tool("nvdisasm")
    except ToolNotFound:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    assert result.ok, result.log
    sass = subprocess.run([tool, str(result.cubin)], capture_output=True, text=True, check=True).stdout
    start = sass.index(f".text.{config.name}:")
    end = sass.find(".text.", start + 1)
    return sass[start:end if end > 0 else len(sass)]


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("key", sorted(k for k in COMPILED if k.startswith("mma-")))
def test_mma_reads_each_layout_with_its_instructions(compiled, key):
    """A K-contiguous tile is read with ldmatrix (LDSM.16.M88.4); a 16-bit tile stored K-major with
    ldmatrix.trans (LDSM.16.MT88.4); a tf32 one with 8-byte loads of column pairs (LDS.64)."""
    config, result = compiled[key]
    sass = _kernel_sass(config, result)
    k_major = "LDS.64" if config.precision == "tf32" else "LDSM.16.MT88.4"
    a_t, b_t = config.variant.a_transposed, config.variant.b_transposed
    used = {k_major if a_t else "LDSM.16.M88.4", "LDSM.16.M88.4" if b_t else k_major}
    for instruction in ("LDSM.16.M88.4", "LDSM.16.MT88.4", "LDS.64"):
        assert (instruction in sass) == (instruction in used), (key, instruction)


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.parametrize("key", sorted(k for k in COMPILED if k.startswith("warp-")))
def test_warp_transposes_the_operands_whose_rows_run_along_k(compiled, key):
    """An operand whose rows run along K as stored (A of nn/nt, B of nt/tt) goes into shared
    memory one float at a time (STS), transposed; the others as loaded, a float4 at a time (STS.128)."""
    config, result = compiled[key]
    sass = _kernel_sass(config, result)
    transposed = (not config.variant.a_transposed) + config.variant.b_transposed
    assert bool(re.search(r"\bSTS\s", sass)) == (transposed > 0), key
    assert ("STS.128" in sass) == (transposed < 2), key


# ---- the checks' cuBLAS calls read each layout as stored -----------------------------------------

class _FakeCublas:
    """cuBLAS's column-major GEMMs on NumPy arrays that stand for device memory (addresses are
    keys of ``memory``): enough to check the operations and leading dimensions gemmgen passes."""

    def __init__(self, memory):
        self.memory = memory

    @staticmethod
    def _value(arg):
        return arg._obj.value if hasattr(arg, "_obj") else (arg.value if hasattr(arg, "value") else arg)

    def _gemm(self, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        def stored(address, rows, cols, ld):  # the column-major rows x cols matrix at address
            flat = self.memory[self._value(address)].reshape(-1)
            return np.array([[flat[i + j * ld] for j in range(cols)] for i in range(rows)])
        opa = stored(a, k, m, lda).T if transa else stored(a, m, k, lda)  # op(A): m x k
        opb = stored(b, n, k, ldb).T if transb else stored(b, k, n, ldb)  # op(B): k x n
        flat = self.memory[self._value(c)].reshape(-1)
        alpha, beta = self._value(alpha), self._value(beta)
        for i in range(m):
            for j in range(n):
                old = flat[i + j * ldc] if beta != 0 else 0.0
                flat[i + j * ldc] = alpha * (opa[i] @ opb[:, j]) + beta * old
        return 0

    def cublasCreate_v2(self, handle):
        return 0

    def cublasSetMathMode(self, handle, mode):
        return 0

    def cublasDestroy_v2(self, handle):
        return 0

    def cublasSgemm_v2(self, h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        return self._gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def cublasDgemm_v2(self, h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        return self._gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def cublasGemmEx(self, h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo):
        return self._gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


@pytest.mark.parametrize("trans", LAYOUTS)
@pytest.mark.parametrize("precision", ["fp32", "fp16", "reference"])
def test_cublas_reads_each_layout_as_stored(monkeypatch, trans, precision):
    from gemmgen.measure import cublas

    shape, variant = Shape(5, 3, 4), Variant(trans)
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(variant.a_dims(shape)), rng.standard_normal(variant.b_dims(shape))
    c0 = rng.standard_normal((shape.m, shape.n))
    memory = {1000: a.copy(), 2000: b.copy(), 3000: c0.copy()}
    monkeypatch.setattr(cublas, "_library", lambda: _FakeCublas(memory))
    handle = cublas.Cublas()
    a_op, b_op = verify.product_operands(a, b, variant)
    if precision == "reference":
        handle.dgemm(shape.m, shape.n, shape.k, 1000, 2000, 3000, variant.b_transposed, variant.a_transposed)
        expected = a_op @ b_op
    else:
        handle.gemm(precision, shape.m, shape.n, shape.k, 1.5, 1000, 2000, -0.5, 3000, variant)
        expected = 1.5 * (a_op @ b_op) - 0.5 * c0
    assert np.allclose(memory[3000], expected)
    assert a_op.shape == (shape.m, shape.k) and b_op.shape == (shape.k, shape.n)
