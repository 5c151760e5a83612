"""Batched strided GEMM without a GPU (the variant key ``batch``; its name part and launcher text:
tests/describe/test_problem.py): the families that do not compute a strided batch refuse it in one
line, the batched launcher's signature and rules, and the CLI's batch options."""

import re

import pytest

from gemmgen.describe.config import make_config
from gemmgen.describe.families import FAMILIES
from gemmgen.describe.problem import Variant
from gemmgen.errors import InvalidPoint


# hopper's batched launcher is its own engineer's (gemmgen/describe/families/hopper.py declares it when it lands)
@pytest.mark.parametrize("family", sorted(f for f in FAMILIES if f not in ("mma", "warp", "hopper")))
def test_families_without_a_batched_template_refuse_it_in_one_line(family):
    fam = FAMILIES[family]
    with pytest.raises(InvalidPoint) as caught:
        make_config(family, {"batch": "strided"}, fam.precisions[0], "sm_90")
    lines = [v for v in caught.value.violations if "batch" in v]
    assert lines == [f"family {family} computes batch=none only, not batch=strided"]


def _batched(family, precision, **params):
    return make_config(family, {**params, "batch": "strided"}, precision, "sm_90")


def test_the_batched_launcher_takes_batch_and_strides():
    from gemmgen.codegen.render import render_kernel

    config = _batched("mma", "fp16", trans="nt", out="fp16", bias="col", split_k=2)
    assert config.name == "mma_128x128x32_w2x2_s3_f2_k2_fp16_nt_ofp16_bcol_batched"
    source = render_kernel(config)
    flat = re.sub(r"\s+", " ", source)
    assert ("GEMMGEN_LAUNCHER(int M, int N, int K, int batch, float alpha, const __half* A, long long stride_a, "
            "const __half* B, long long stride_b, float beta, __half* C, long long stride_c, const __half* bias, "
            "long long stride_bias, cudaStream_t stream)") in flat
    assert ("GG_API(_describe)(int M, int N, int K, int batch, const __half* A, long long stride_a, const __half* B, "
            "long long stride_b, float beta, const __half* C, long long stride_c, int resident, "
            "gemmgen_launch_info* out)") in flat
    assert 'return "nt fp16 col none strided";' in source
    # one launch: the batch is grid z, folded with the split; the workspace is the whole batch's
    assert "static constexpr int split_k = 2;" in source
    assert "out.grid[2] = (unsigned)(o.batch * gg_kernel::split_k);" in source
    assert "gg_splitk_needs(grid_x * grid_y * o.batch, gg_kernel::split_k," in source
    assert "const long long batch_i = blockIdx.z / 2u;" in source
    assert "(blockIdx.z / 2u * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x" in source
    assert "gg_pack_plan_batched<8, __half, GG_B_T, GG_A_T>(M, N, K, batch, A, stride_a, B, stride_b" in source
    assert 'stride_c must be >= M * N' in source and "batch must be <= 32767" in source


@pytest.mark.parametrize("point", [("mma", "fp16", {}), ("warp", "fp32", {"trans": "tt", "split_k": 4}),
                                   ("mma", "tf32", {"trans": "tn", "bias": "row"})])
def test_the_one_product_source_has_no_batch_code(point):
    from gemmgen.codegen.render import render_kernel

    family, precision, params = point
    config = make_config(family, params, precision, "sm_90")
    source = render_kernel(config)
    # the kernel and the launcher's functions take no batch count nor strides; the launcher holds batch 1
    kernel = re.search(rf"{config.name}\(([^)]*)\)", source)[1]
    launchers = re.findall(r"(?:GEMMGEN_LAUNCHER|GG_API\(_\w+\))\(([^)]*)\)\s*\{", source)
    assert len(launchers) == 16  # the launcher, _plan, _run, ..., _run_workspace_kept, _variant
    for params in (kernel, *launchers):
        assert "batch" not in params and "stride" not in params, params
    assert "batch_i" not in source and "gg_pack_plan_batched" not in source
    assert "GG_BATCH" not in re.sub(r"//[^\n]*", "", source)  # nor code for the batch (if constexpr, decided)


# every layout, C type, bias and activation; split-K; tf32's pair loads; warp
COMPILED = {
    "mma_fp16_nn": ("mma", "fp16", {}),
    "mma_bf16_nt_obf16_bcol_gelu_k2": ("mma", "bf16", {"trans": "nt", "out": "bf16", "bias": "col", "act": "gelu",
                                                      "split_k": 2}),
    "mma_fp16_tt_ofp16_brow_relu_k4_g4": ("mma", "fp16", {"trans": "tt", "out": "fp16", "bias": "row", "act": "relu",
                                                          "split_k": 4, "swizzle": 4}),
    "mma_tf32_tn_k2": ("mma", "tf32", {"BM": 64, "BN": 64, "trans": "tn", "split_k": 2}),
    "mma_tf32_nn_obf16_silu": ("mma", "tf32", {"BM": 64, "BN": 64, "out": "bf16", "act": "silu"}),
    "warp_nn": ("warp", "fp32", {}),
    "warp_nt_bcol_silu_k4": ("warp", "fp32", {"trans": "nt", "bias": "col", "act": "silu", "split_k": 4}),
    "warp_tn_brow": ("warp", "fp32", {"trans": "tn", "bias": "row", "swizzle": 8}),
}


@pytest.mark.slow
@pytest.mark.nvcc
def test_batched_mma_and_warp_kernels_compile_without_spills():
    from conftest import assert_compiles_without_spills, build_all

    built = build_all({key: _batched(f, p, **params) for key, (f, p, params) in COMPILED.items()})
    for config, result in built.values():
        assert_compiles_without_spills(config, result)


@pytest.mark.nvcc
def test_the_batched_launcher_describes_and_refuses_without_a_gpu():
    from conftest import launcher_of

    from gemmgen.measure.launcher import ShapeRefused

    launcher = launcher_of(_batched("mma", "fp16", split_k=2))
    assert launcher.variant == Variant(batch="strided")
    info = launcher.describe(129, 257, 64, batch=3, stride_b=64 * 264)
    assert tuple(info.grid) == (3, 2, 6)  # z: 3 matrices x 2 splits
    assert info.packed_a_bytes == 0 and info.packed_b_bytes == 3 * (64 * 264 * 2)  # B's rows of 257: every B packed
    info = launcher.describe(129, 256, 64, batch=3)
    assert info.flag_words == 2 * 2 * 3 and info.partial_bytes == 2 * 2 * 3 * 2 * 128 * 128 * 4  # per tile of each matrix
    assert info.packed_a_bytes == 0 and info.packed_b_bytes == 0
    # K = 65 breaks A's 16-byte rows: every matrix of A packed (one where stride_a = 0); B's stride breaks B's
    info = launcher.describe(129, 256, 65, batch=3, stride_b=65 * 256 + 1)
    each_a = (129 * 72 * 2 + 255) // 256 * 256
    assert info.packed_a_bytes == 3 * each_a and info.packed_b_bytes == 3 * ((65 * 256 * 2 + 255) // 256 * 256)
    assert launcher.describe(129, 256, 65, batch=3, stride_a=0).packed_a_bytes == each_a
    assert tuple(launcher.describe(7, 7, 7, batch=0).grid) == (0, 0, 0)
    for kwargs, why in (({"batch": -1}, "batch must be >= 0"), ({"batch": 2, "stride_c": 48}, r"stride_c must be >= M \* N"),
                        ({"batch": 40000}, "batch must be <= 32767"), ({"batch": 2, "stride_a": -1}, "strides must be >= 0")):
        with pytest.raises(ShapeRefused, match=why):
            launcher.describe(7, 7, 7, **kwargs)


@pytest.mark.parametrize("argv, message", [
    (["bench", "mma_128x128x32_w2x2_s3_f2_fp16_batched", "--shape", "64"], "give --batch N, the products per launch"),
    (["bench", "cublas", "--batch-mode", "strided"], "give --batch N, the products per launch"),
    (["tune", "--family", "wmma", "--batch", "8", "--gpu", "sm_90"],
     "family wmma computes batch=none only, not batch=strided; see gemmgen list"),
    (["bench", "v4", "--batch", "0"], "the batch count must be at least 1"),
    (["bench", "v4", "--batch", "4", "--batch-mode", "none"], "cannot go with --batch-mode none"),
    (["tune", "--family", "mma", "--precision", "fp16", "--batch-mode", "strided", "--gpu", "sm_90"],
     "give --batch N, the products per launch"),
    (["emit", "--family", "wmma", "--batch-mode", "strided", "--gpu", "sm_90"],
     "family wmma computes batch=none only, not batch=strided"),
    (["emit", "--family", "naive", "--set", "batch=strided", "--gpu", "sm_90"],
     "family naive computes batch=none only"),
    (["emit", "--family", "mma", "--set", "batch=strided", "--batch-mode", "none", "--gpu", "sm_90"],
     "--set gives batch=strided and --batch-mode gives none; give batch once"),
])
def test_what_is_not_batched_yet_is_refused_in_one_line_with_exit_2(argv, message, capsys):
    from gemmgen.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_emit_writes_a_batched_kernel_and_names_its_option(capsys):
    from gemmgen.cli.main import main

    assert main(["emit", "--family", "warp", "--batch-mode", "strided", "--trans", "nt", "--gpu", "sm_90"]) == 0
    source = capsys.readouterr().out
    assert "warp_128x128x8_w64x32_t8x8_b2_fp32_nt_batched(int M, int N, int K, int batch," in source
    assert "trans=nt,batch=strided" in source  # the regenerate line
