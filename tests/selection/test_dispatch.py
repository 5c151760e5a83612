"""`emit --dispatch` without a GPU: which kernels a dispatcher takes from the results database
(gemmgen.selection.dispatch.select), the file it writes, built as a library with nvcc, asked which kernel
each shape gets (<launcher>_choice) and what a launch needs (_describe), and the CLI's errors."""

import shlex
import time

import pytest
from conftest import launcher_of
from stored import CUBE, FAST_FP8, NT_GELU, PROMOTED_FP8, SKINNY, V_BIG, V_THIN, store, stored_variant

from gemmgen.build.nvcc import build_library
from gemmgen.cli.main import main
from gemmgen.describe.arch import parse_arch
from gemmgen.describe.points import resolve_point
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import GemmgenError
from gemmgen.measure.launcher import Launcher, ShapeRefused
from gemmgen.selection.dispatch.emit import render_dispatcher
from gemmgen.selection.dispatch.select import DispatchPlan, plan_dispatch
from gemmgen.store.db import ResultsDB

SM90 = parse_arch("sm_90")
BIG, MID, THIN = "hopper_128x256_c2_s4_g8_ov_fp16", "hopper_64x128_c1_s8_g4_fp16", "hopper_32x64_c1_s8_sw_fp16"
WIDE = Shape(4096, 11008, 4096)
SMALL = Shape(1024, 1024, 1024)


# cuBLAS's TFLOP/s on an H100 at these shapes (near what it runs at): the selection model scales
# times by waves of tiles and memory, so made-up measurements must be of the right size
CUBLAS_TFLOPS = {CUBE: 700.0, WIDE: 680.0, SMALL: 250.0, SKINNY: 30.0}


def _stored(tmp_path, rows, precision="fp16"):
    """A results database holding, for each (shape, kernel, ratio), the kernel at ratio x a cuBLAS
    time (CUBLAS_TFLOPS, else 100 TFLOP/s) stored just before it."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    db = ResultsDB(url)
    for shape, kernel, ratio in rows:
        tflops = CUBLAS_TFLOPS.get(shape, 100.0)
        store(db, f"cublas_{precision}", "cublas", precision, shape, tflops)
        store(db, kernel, kernel.split("_")[0], precision, shape, tflops * ratio)
        time.sleep(0.002)
    return db, url


def span_kernel(plan, m: int, n: int, k: int) -> str:
    """The kernel plan's table gives M on layer N x K (the layer must be in the plan)."""
    layer = next(layer for layer in plan.layers if (layer.n, layer.k) == (n, k))
    assert layer.spans[0].m_lo == 1 and all(a.m_hi + 1 == b.m_lo for a, b in zip(layer.spans, layer.spans[1:]))
    return plan.kernels[next((s for s in layer.spans if m <= s.m_hi), layer.spans[-1]).kernel].name


def test_layers_share_a_kernel_within_a_percent_of_their_best(tmp_path):
    other = "hopper_128x128_c2_s5_g4_ov_fp16"
    db, _ = _stored(tmp_path, [
        (CUBE, BIG, 1.01), (CUBE, MID, 0.95),
        (WIDE, other, 1.04), (WIDE, BIG, 1.035),  # BIG is 0.5% behind the best at WIDE: it may serve both
        (SMALL, MID, 1.06), (SMALL, BIG, 0.90),   # BIG is 15% behind: SMALL keeps MID
        (SKINNY, THIN, 1.05)])
    plan = plan_dispatch(db, "fp16", SM90, [CUBE, WIDE, SMALL, SKINNY, CUBE, Shape(7, 7, 7)])
    assert [(layer.n, layer.k) for layer in plan.layers] == [(4096, 4096), (11008, 4096), (1024, 1024), (7, 7)]
    assert all(layer.spans[-1].m_hi == 8192 for layer in plan.layers) and plan.devices == ("H100",)
    assert {s: span_kernel(plan, s.m, s.n, s.k) for s in (CUBE, SMALL, SKINNY)} == {CUBE: BIG, SMALL: MID, SKINNY: THIN}
    assert span_kernel(plan, WIDE.m, WIDE.n, WIDE.k) in (BIG, other)  # within 1%: whichever the layer's other M take
    assert {c.name for c in plan.kernels} <= {BIG, MID, THIN, other}  # only kernels measured somewhere
    assert plan.layers[3].basis.startswith("nothing measured on this layer")
    cube = next(s for s in plan.layers[0].spans if s.m_lo <= 4096 <= s.m_hi)
    assert 4096 in cube.measured and cube.us_lo > 0
    # with no sharing allowed every measured shape keeps its own best
    strict = plan_dispatch(db, "fp16", SM90, [CUBE, WIDE, SMALL, SKINNY], share_within=0.0)
    assert span_kernel(strict, WIDE.m, WIDE.n, WIDE.k) == other


def test_an_fp8_dispatcher_leaves_out_kernels_over_the_error_bound(tmp_path):
    """FP8: fast accumulation (promote=0) 4% faster than a promoting kernel, within 1.5x cuBLAS's
    error at K = 4096 (1.23x) and over it at K = 14336 (1.9x), serves the first layer and not the
    second, whose header says why; on an unmeasured layer it serves only up to the K it was
    within the bound at (2048: yes; 8192: no), the promoting kernel at any K."""
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    short, deep = Shape(2048, 4096, 4096), Shape(2048, 4096, 14336)
    for shape, fast_error in ((short, 1.23), (deep, 1.9)):
        for m in (512, 2048, 8192):
            at = Shape(m, shape.n, shape.k)
            store(db, "cublas_e4m3_nt_obf16", "cublas", "e4m3", at, 1300.0, rel_error=1e-3)
            store(db, FAST_FP8, "hopper", "e4m3", at, 1352.0, rel_error=fast_error * 1e-3)
            store(db, PROMOTED_FP8, "hopper", "e4m3", at, 1300.0, rel_error=1.05e-3)
            time.sleep(0.002)
    fp8 = Variant("nt", "bf16")
    plan = plan_dispatch(db, "e4m3", SM90, [short, deep, Shape(2048, 6144, 2048), Shape(2048, 6144, 8192)],
                         variant=fp8)
    assert span_kernel(plan, 2048, 4096, 4096) == FAST_FP8
    assert span_kernel(plan, 2048, 4096, 14336) == PROMOTED_FP8
    assert span_kernel(plan, 2048, 6144, 2048) == FAST_FP8
    assert span_kernel(plan, 2048, 6144, 8192) == PROMOTED_FP8
    assert "1 over 1.5x cuBLAS's error left out" in plan.layers[1].basis
    assert "error" not in plan.layers[0].basis


def test_an_fp8_stream_k_kernel_within_the_bound_where_it_split_k_is_held_to_whole_k(tmp_path):
    """A fast-accumulation stream-K kernel, fastest and within the bound at the token counts it
    was measured at on K = 14336 (every tile shared, so shorter sums), sums whole K at other counts
    (1.9x on an H200): with whole-K accumulation over the bound at that K it is left out there,
    and kept at K = 4096, where whole K is within it."""
    db = ResultsDB(f"sqlite:///{tmp_path / 'r.db'}")
    sk_fast = "hopper_128x128_c2_s6_g8_sk_e4m3_nt_obf16"
    for k, fast_error in ((4096, 1.23), (14336, 1.9)):
        for m in (512, 2048):
            at = Shape(m, 4096, k)
            store(db, "cublas_e4m3_nt_obf16", "cublas", "e4m3", at, 1300.0, rel_error=1e-3)
            store(db, FAST_FP8, "hopper", "e4m3", at, 1352.0, rel_error=fast_error * 1e-3)
            store(db, sk_fast, "hopper", "e4m3", at, 1400.0, rel_error=1.3e-3)
            store(db, PROMOTED_FP8, "hopper", "e4m3", at, 1300.0, rel_error=1.05e-3)
            time.sleep(0.002)
    plan = plan_dispatch(db, "e4m3", SM90, [Shape(2048, 4096, 4096), Shape(2048, 4096, 14336)],
                         variant=Variant("nt", "bf16"))
    assert span_kernel(plan, 2048, 4096, 4096) == sk_fast
    assert span_kernel(plan, 2048, 4096, 14336) == PROMOTED_FP8
    assert "2 over 1.5x cuBLAS's error left out" in plan.layers[1].basis


def test_nothing_stored_is_one_clear_error(tmp_path):
    db, _ = _stored(tmp_path, [(CUBE, BIG, 1.0)])
    with pytest.raises(GemmgenError, match=r"no verified bf16 kernel stored for sm_90 with a cuBLAS time beside it, "
                                           r"at any shape; tune first"):
        plan_dispatch(db, "bf16", SM90, [CUBE])
    with pytest.raises(GemmgenError, match="no verified fp16 kernel stored for sm_80"):
        plan_dispatch(db, "fp16", parse_arch("sm_80"), [CUBE])  # the hopper kernels do not build for sm_80


@pytest.fixture(scope="module")
def dispatcher_source(tmp_path_factory):
    """(plan, source) of the dispatcher of BIG / MID / THIN over three layers."""
    db, _ = _stored(tmp_path_factory.mktemp("db"), [(CUBE, BIG, 1.01), (SMALL, MID, 1.06), (SKINNY, THIN, 1.05),
                                                    (WIDE, BIG, 1.03)])
    plan = plan_dispatch(db, "fp16", SM90, [CUBE, SMALL, SKINNY, WIDE])
    return plan, render_dispatcher(plan, ["--dispatch", "--shape", "4096"])


# The dispatcher built: of fp32 kernels every run builds anyway (test_build's named points v4, v3 and
# splitk, from the session's build cache), so that the dispatcher is the module's one compile.
F_BIG, F_MID, F_THIN = (resolve_point(p, "sm_90").name for p in ("v4", "v3", "splitk"))
F_ARGV = ["emit", "--dispatch", "--shape", "4096", "--shape", "1024", "--shape", "16x4096x4096", "--shape",
          "4096x11008x4096", "--precision", "fp32", "--gpu", "sm_90", "--harness"]


@pytest.fixture(scope="module")
def dispatcher(tmp_path_factory):
    """(plan, launcher) of the dispatcher `emit --dispatch --harness -o FILE` writes for F_BIG /
    F_MID / F_THIN over three layers, built as a library: nvcc building it is the check that the
    dispatcher with its harness compiles."""
    folder = tmp_path_factory.mktemp("dispatcher")
    db, url = _stored(folder, [(CUBE, F_BIG, 1.01), (SMALL, F_MID, 1.06), (SKINNY, F_THIN, 1.05),
                               (WIDE, F_BIG, 1.03)], precision="fp32")
    assert main([*F_ARGV, "--db", url, "-o", str(folder / "dispatch.cu")]) == 0
    source = (folder / "dispatch.cu").read_text()
    assert "int main(" in source
    plan = plan_dispatch(db, "fp32", SM90, [CUBE, SMALL, SKINNY, WIDE])
    build = build_library(source, plan.kernels[0].build_arch)
    assert build.ok, build.log
    return plan, Launcher(build.library)


@pytest.mark.nvcc
def test_the_library_looks_up_its_tables(dispatcher):
    """The emitted lookup gives what the plan's tables say at every span's ends, on every layer;
    an N x K not in the plan takes the nearest layer's table (by the sum of |log ratios|)."""
    plan, launcher = dispatcher
    choice = launcher.choice
    for layer in plan.layers:
        for s in layer.spans:
            for m in (s.m_lo, s.m_hi):
                assert choice(m, layer.n, layer.k) == plan.kernels[s.kernel].name
        assert choice(100000, layer.n, layer.k) == plan.kernels[layer.spans[-1].kernel].name
    assert choice(16, 4096, 4096) == F_THIN and choice(4096, 4096, 4096) == F_BIG and choice(1024, 1024, 1024) == F_MID
    assert choice(8000, 8000, 8000) == choice(8000, 11008, 4096)  # nearer 11008x4096 than 4096x4096
    assert choice(900, 1100, 1000) == choice(900, 1024, 1024)
    assert choice(0, 5, 5) == plan.kernels[plan.layers[0].spans[0].kernel].name


def test_token_counts_between_measurements_take_the_kernel_that_needs_the_fewest_waves(tmp_path):
    """A tile that fits the tuned M exactly needs another row of tiles a few rows later: there the
    model's waves of tiles (132 SMs, the measuring GPU's) make the other kernel faster. Stored, on
    28672 x 4096 (compute-bound at these M): 768 rows in 296 us by a 192-row tile (4 rows of 224
    tiles, 7 waves), 1024 in 370 us by 128 x 256 tiles (8 rows of 112, 7 waves)."""
    fits, wide, n, k = "hopper_192x128_c2_s5_g8_sw_fp16", BIG, 28672, 4096
    tflops = {768: 2 * 768 * n * k / 296e6, 1024: 2 * 1024 * n * k / 370e6}
    db, _ = _stored(tmp_path, [(Shape(768, n, k), fits, tflops[768] / 100),
                               (Shape(1024, n, k), wide, tflops[1024] / 100)])
    plan = plan_dispatch(db, "fp16", SM90, [Shape(768, n, k), Shape(1024, n, k)])
    assert plan.sm_count == 132
    assert span_kernel(plan, 760, n, k) == fits  # 7 waves of the 192-row tile: 296 us; 128 x 256: 6 waves, 317
    assert span_kernel(plan, 770, n, k) == wide  # a fifth row: 9 waves, 381 us; 128 x 256 still 6


@pytest.mark.nvcc
def test_the_dispatcher_describes_the_launch_of_the_kernel_it_picks(dispatcher):
    """The same grid and workspace as the chosen kernel's own launcher; shapes it cannot take are
    refused with that kernel's message."""
    plan, launcher = dispatcher
    choice = launcher.choice
    own = {c.name: launcher_of(c) for c in plan.kernels}
    for m, n, k in ((16, 4096, 4096), (1000, 1000, 1000), (4095, 4097, 4093), (33, 17, 9)):
        mine = launcher.describe(m, n, k, resident=132)
        theirs = own[choice(m, n, k)].describe(m, n, k, resident=132)
        assert (tuple(mine.grid), mine.flag_words, mine.partial_bytes) == \
               (tuple(theirs.grid), theirs.flag_words, theirs.partial_bytes)
    assert {choice(m, n, k) for m, n, k in ((16, 4096, 4096), (1000, 1000, 1000), (4095, 4097, 4093))} == set(own)
    assert launcher.precision == "fp32"
    assert launcher_of(plan.kernels[0]).choice(5, 5, 5) is None  # a single kernel's library has no rule
    from gemmgen.measure.launcher import ShapeRefused
    with pytest.raises(ShapeRefused, match="M, N and K must be >= 1"):
        launcher.describe(0, 4, 4, resident=132)


def test_the_header_lists_the_kernels_and_each_layers_table(dispatcher_source):
    plan, source = dispatcher_source
    assert f"//   0  {plan.kernels[0].name}" in source
    assert "// layer 4096 x 4096 (N x K; asked at M = 16, 4096): 2 kernels measured on this layer" in source
    first = plan.layers[0].spans[0]
    assert f"//   1-{first.m_hi} " in source and "measured there (M)" in source
    assert source.count("namespace gg_") == 2 * len(plan.kernels)  # each kernel opened and closed once
    assert source.count("#include <cuda_runtime.h>") == 1  # hoisted out of the kernels' namespaces
    lock = "#if defined(_WIN32)\n#include <mutex>\n#else\n#include <pthread.h>\n#endif\n"  # a group, hoisted whole
    assert source.count(lock) == 1 and source.index(lock) < source.index("namespace gg_")
    words = " ".join(line[2:].strip() for line in source.splitlines() if line.startswith("//"))
    assert "`gemmgen model` with this file's --precision and variant options prints the model's error on held-out" \
        in words  # not computed here: five more fits, seconds per emit


@pytest.mark.parametrize("variant", [Variant(), Variant("nt", "fp16", "col", "gelu", "strided")], ids=["plain", "batched"])
def test_the_header_has_each_section_on_its_own_line(tmp_path, variant):
    """The choice's paragraph ends before "kernels" (it once ran into it where the variant was not
    batched), and each layer's table says its columns."""
    db, _ = _stored_batched(tmp_path) if variant.batched else _stored(tmp_path, [(CUBE, BIG, 1.01), (SKINNY, THIN, 1.05)])
    source = render_dispatcher(plan_dispatch(db, "fp16", SM90, [CUBE, SKINNY], variant=variant), ["--dispatch"])
    header = source[:source.index("// ====", 1)]
    assert "that takes it." in header and "\n// kernels    :\n" in header
    assert [line for line in header.splitlines() if "//" in line[2:]] == []  # no line runs into the next
    assert "//   M             kernel predicted us        measured there (M)" in header


def test_the_note_on_stderr_is_one_short_line(capsys, tmp_path):
    """However many shapes: the mapping is in the file's header, not on stderr."""
    _, url = _stored(tmp_path, [(CUBE, BIG, 1.01), (SKINNY, THIN, 1.05), (WIDE, BIG, 1.03), (SMALL, MID, 1.06)])
    shapes = [w for n in range(1, 41) for w in ("--shape", f"16x{128 * n}x4096")]
    assert main(["emit", "--dispatch", *shapes, "--shape", "4096", "--precision", "fp16", "--gpu", "sm_90", "--db",
                 url, "-o", str(tmp_path / "d.cu")]) == 0
    note, wrote = capsys.readouterr().err.splitlines()
    assert note.startswith("gemmgen: dispatcher of ") and note.endswith(
        " kernel(s) for 40 layer(s) (N x K), every M from 1 to 8192: " + note.split(": ")[2].split(" ")[0]
        + " spans; 39 layer(s) with nothing measured on them: their choices are predicted; its header has each "
          "layer's table")
    assert wrote == f"gemmgen: wrote {tmp_path / 'd.cu'}"


def test_emit_dispatch_from_the_cli_says_how_to_regenerate_it_and_writes_its_harness(capsys, tmp_path):
    """The note on stderr, the regenerate line, and --harness (the `dispatcher` fixture builds
    such a file)."""
    _, url = _stored(tmp_path, [(CUBE, BIG, 1.01), (SKINNY, THIN, 1.05)])
    argv = ["emit", "--dispatch", "--shape", "4096", "--shape", "16x4096x4096", "--precision", "fp16", "--gpu",
            "sm_90", "--db", url]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "gemmgen: dispatcher of 2 kernel(s) for 1 layer(s) (N x K), every M from 1 to 8192:" in captured.err
    source = captured.out
    line = next(ln for ln in source.splitlines() if ln.startswith("//   gemmgen emit "))
    assert line == "//   gemmgen emit " + " ".join(argv[1:-2])
    assert main([*argv, "--harness"]) == 0
    harness = capsys.readouterr().out
    assert "int main(" in harness and "int main(" not in source


@pytest.mark.parametrize("argv, message", [
    (["--dispatch", "--precision", "fp16"], "--dispatch needs the shapes to serve: --workload FILE or --shape"),
    (["--dispatch", "v4", "--shape", "64", "--precision", "fp32"], "--dispatch takes its kernels from the results"),
    (["--dispatch", "--shape", "64"], "--dispatch needs --precision"),
    (["best", "--shape", "64", "--shape", "128", "--precision", "fp32"], "`emit best` takes one --shape"),
    (["v4", "--workload", "w.toml"], "--workload goes with --dispatch"),
])
def test_emit_dispatch_errors_are_one_line_and_exit_2(capsys, argv, message):
    assert main(["emit", *argv, "--gpu", "sm_90"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err


# ---- a dispatcher of one problem variant ----

# the same ABI as a single kernel of the variant: C of its type, then const CT* bias (nvcc checks it)
ABI = """
static cudaError_t (*const gg_abi_launch)(int, int, int, float, const __nv_bfloat16*, const __nv_bfloat16*, float,
                                          __nv_bfloat16*, const __nv_bfloat16*, cudaStream_t) = gemmgen_gemm;
static cudaError_t (*const gg_abi_plan)(void**, int, int, int, float, const __nv_bfloat16*, const __nv_bfloat16*,
                                        float, __nv_bfloat16*, const __nv_bfloat16*, cudaStream_t) = gemmgen_gemm_plan;
static const char* (*const gg_abi_describe)(int, int, int, const __nv_bfloat16*, const __nv_bfloat16*, float,
                                            const __nv_bfloat16*, int, gemmgen_launch_info*) = gemmgen_gemm_describe;
extern "C" void* gg_abi_keep[] = {(void*)gg_abi_launch, (void*)gg_abi_plan, (void*)gg_abi_describe};
"""


def test_a_variants_dispatcher_holds_only_kernels_of_it(tmp_path):
    db, _ = stored_variant(tmp_path)
    plan = plan_dispatch(db, "bf16", SM90, [CUBE, SKINNY], variant=NT_GELU)
    assert sorted(c.name for c in plan.kernels) == sorted([V_THIN, V_BIG]) and plan.variant == NT_GELU
    assert span_kernel(plan, 4096, 4096, 4096) == V_BIG and span_kernel(plan, 16, 4096, 4096) == V_THIN
    assert [c.name for c in plan_dispatch(db, "bf16", SM90, [CUBE, SKINNY]).kernels] == \
        ["hopper_128x256_c2_s4_g8_ov_bf16"]  # the default variant's
    with pytest.raises(GemmgenError, match=r"no verified bf16 \(nt bf16 none none\) kernel stored for sm_90"):
        plan_dispatch(db, "bf16", SM90, [CUBE], variant=Variant("nt", "bf16"))
    source = render_dispatcher(plan, ["--dispatch"])
    assert "// dispatcher : C = gelu(alpha * A @ B + beta * C + bias) for any M, N, K" in source
    assert "bf16 A and B (__nv_bfloat16), bf16 C (__nv_bfloat16), row-major; B stored N x K" in source
    assert "(variant nt bf16 col gelu; bias: N values, bias[j] added to column j)" in source
    assert "int main(" in render_dispatcher(plan, ["--dispatch"], harness=True)  # the harness checks any variant
    mixed = DispatchPlan("bf16", SM90, (*plan.kernels, resolve_point("hopper_bf16", "sm_90")), plan.layers, (),
                         NT_GELU)
    with pytest.raises(ValueError, match="cannot hold hopper_128x256_c2_s4_g8_ov_bf16: its kernels compute one"):  # noqa
        render_dispatcher(mixed, ["--dispatch"])


@pytest.mark.slow
@pytest.mark.nvcc
def test_a_variants_dispatcher_builds_with_the_variants_abi_and_exports_it(tmp_path, build_cache):
    """nvcc builds it with a caller of the variant's signatures (a mismatch fails to compile); the
    library says its variant and precision, and picks by shape."""
    db, url = stored_variant(tmp_path)
    plan = plan_dispatch(db, "bf16", SM90, [CUBE, SKINNY], variant=NT_GELU)
    build = build_library(render_dispatcher(plan, ["--dispatch"]) + ABI, plan.kernels[0].build_arch)
    assert build.ok, build.log
    launcher = Launcher(build.library)
    assert (launcher.precision, launcher.variant) == ("bf16", NT_GELU)
    assert launcher.choice(16, 4096, 4096) == V_THIN and launcher.choice(4096, 4096, 4096) == V_BIG
    assert tuple(launcher.describe(16, 4096, 4096, resident=132).grid) == \
        tuple(launcher_of(resolve_point(V_THIN, "sm_90")).describe(16, 4096, 4096, resident=132).grid)
    # a dispatcher of the default variant has the signatures it always had, and says so
    default = plan_dispatch(db, "bf16", SM90, [CUBE])
    build = build_library(render_dispatcher(default, ["--dispatch"]) + ABI.replace(
        "__nv_bfloat16*, const __nv_bfloat16*, cudaStream_t", "float*, cudaStream_t").replace(
        "const __nv_bfloat16*, int, gemmgen_launch_info", "const float*, int, gemmgen_launch_info"),
        default.kernels[0].build_arch)
    assert build.ok, build.log
    assert Launcher(build.library).variant == Variant()


def test_emit_dispatch_of_a_variant_from_the_cli(capsys, tmp_path):
    _, url = stored_variant(tmp_path)
    argv = ["emit", "--dispatch", "--shape", "4096", "--shape", "16x4096x4096", "--precision", "bf16", "--gpu",
            "sm_90", "--trans", "nt", "--out", "bf16", "--bias", "col", "--act", "gelu", "--db", url]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "gemmgen: dispatcher of 2 kernel(s) for 1 layer(s) (N x K)" in captured.err
    line = next(ln for ln in captured.out.splitlines() if ln.startswith("//   gemmgen emit "))
    assert line == "//   gemmgen emit --dispatch --shape 4096 --shape 16x4096x4096 --precision bf16 --gpu sm_90 " \
                   "--trans nt --out bf16 --bias col --act gelu"
    assert 'return "nt bf16 col gelu";' in captured.out
    assert main(shlex.split(line.removeprefix("//").strip())[1:] + ["--db", url]) == 0
    assert capsys.readouterr().out == captured.out  # the regenerate line reproduces the file
    assert main([*argv[:-2], "--act", "relu", "--db", url]) == 2
    assert "no verified bf16 (nt bf16 col relu) kernel stored for sm_90" in capsys.readouterr().err
    assert main([*argv, "--harness"]) == 0  # what the harness then checks: tests/codegen/test_harness.py


# ---- a dispatcher of a strided batch (batch=strided) ----

BATCHED = Variant("nt", "fp16", "col", "gelu", "strided")
B_BIG = "mma_128x128x32_w2x2_s3_f2_fp16_nt_ofp16_bcol_gelu_batched"  # batch <= 65535 (grid z)
B_THIN = "mma_32x64x32_w1x2_s3_f2_k4_fp16_nt_ofp16_bcol_gelu_batched"  # split-K 4: batch <= 16383
# a batched kernel's ABI: the batch count after K, a stride after A, B, C and the bias (nvcc checks it)
BATCHED_ABI = """
static cudaError_t (*const gg_abi_launch)(int, int, int, int, float, const __half*, long long, const __half*, long long,
                                          float, __half*, long long, const __half*, long long, cudaStream_t) = gemmgen_gemm;
static cudaError_t (*const gg_abi_plan)(void**, int, int, int, int, float, const __half*, long long, const __half*,
                                        long long, float, __half*, long long, const __half*, long long,
                                        cudaStream_t) = gemmgen_gemm_plan;
static const char* (*const gg_abi_describe)(int, int, int, int, const __half*, long long, const __half*, long long,
                                            float, const __half*, long long, int,
                                            gemmgen_launch_info*) = gemmgen_gemm_describe;
extern "C" void* gg_abi_keep[] = {(void*)gg_abi_launch, (void*)gg_abi_plan, (void*)gg_abi_describe};
"""


def _stored_batched(tmp_path):
    """Batched fp16 kernels (nt, fp16 C, column bias, gelu) stored at a batch of 8 next to cuBLAS's
    batched rows of 8 and of 1: over both counts (and at 8) B_BIG is best at CUBE and B_THIN at
    SKINNY; at a batch of 1 alone B_BIG is best at both. A one-product kernel of the same layouts,
    far faster, must never be taken."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    db = ResultsDB(url)
    for shape, kernel, ratio, count in ((CUBE, B_BIG, 1.02, 8), (SKINNY, B_THIN, 1.04, 8), (SKINNY, B_BIG, 0.8, 8),
                                        (CUBE, B_BIG, 0.99, 1), (SKINNY, B_BIG, 0.97, 1), (SKINNY, B_THIN, 0.9, 1)):
        tflops = CUBLAS_TFLOPS[shape]
        store(db, "cublas_fp16_nt_ofp16_bcol_gelu_batched", "cublas", "fp16", shape, tflops, batch_count=count)
        store(db, "mma_128x128x32_w2x2_s3_f2_fp16_nt_ofp16_bcol_gelu", "mma", "fp16", shape, 5.0 * tflops)
        store(db, kernel, "mma", "fp16", shape, tflops * ratio, batch_count=count)
        time.sleep(0.002)
    return db, url


B_ARGV = ["emit", "--dispatch", "--shape", "4096", "--shape", "16x4096x4096", "--precision", "fp16", "--gpu", "sm_90",
          "--trans", "nt", "--out", "fp16", "--bias", "col", "--act", "gelu", "--batch-mode", "strided"]


def test_emit_dispatch_of_a_strided_batch_from_the_cli(capsys, tmp_path):
    """The kernels are the batched variant's only; the header says that the batch count does not
    enter the choice; the regenerate line reproduces the file, and a workload file that says
    batch = "strided" gives the same kernels."""
    _, url = _stored_batched(tmp_path)
    assert main([*B_ARGV, "--db", url]) == 0
    captured = capsys.readouterr()
    assert "dispatcher of 2 kernel(s) for 1 layer(s) (N x K)" in captured.err
    source = captured.out
    assert f"{B_BIG}(" in source and f"{B_THIN}(" in source
    line = next(ln for ln in source.splitlines() if ln.startswith("//   gemmgen emit "))
    assert line == "//   gemmgen emit " + shlex.join(B_ARGV[1:])
    assert 'return "nt fp16 col gelu strided";' in source
    assert "// batch      : strided: one launch computes C[i] for i < batch" in source
    assert "The batch count and the strides do not enter the choice" in source
    assert "int batch, float alpha, const gg_delem* A, long long stride_a" in source
    assert main(shlex.split(line.removeprefix("//").strip())[1:] + ["--db", url]) == 0
    assert capsys.readouterr().out == source
    workload = tmp_path / "w.toml"
    workload.write_text('precisions = ["fp16"]\ntrans = "nt"\nout = "fp16"\nbias = "col"\nact = "gelu"\n'
                        'batch = "strided"\n[[shape]]\nm = [16, 4096]\nn = 4096\nk = 4096\n')
    assert main(["emit", "--dispatch", "--workload", str(workload), "--gpu", "sm_90", "--db", url]) == 0
    captured = capsys.readouterr()
    assert "dispatcher of 2 kernel(s)" in captured.err and 'return "nt fp16 col gelu strided";' in captured.out
    # nothing batched stored of another variant: the one message, naming the variant
    assert main([*B_ARGV[:-6], "--batch-mode", "strided", "--db", url]) == 2
    assert "no verified fp16 (nt fp16 none none strided) kernel stored for sm_90" in capsys.readouterr().err


@pytest.fixture(scope="module")
def batched_dispatcher(tmp_path_factory, build_cache):
    """The batched dispatcher of B_BIG (CUBE) and B_THIN (SKINNY), with its harness, built as a
    library with a caller of the batched signatures."""
    db, _ = _stored_batched(tmp_path_factory.mktemp("db"))
    plan = plan_dispatch(db, "fp16", SM90, [CUBE, SKINNY], variant=BATCHED)
    assert sorted(c.name for c in plan.kernels) == sorted([B_BIG, B_THIN]) and plan.variant == BATCHED
    build = build_library(render_dispatcher(plan, ["--dispatch"], harness=True) + BATCHED_ABI,
                          plan.kernels[0].build_arch)
    assert build.ok, build.log
    return plan, Launcher(build.library)


@pytest.mark.slow
@pytest.mark.nvcc
def test_a_batched_dispatcher_has_the_batched_abi_and_picks_by_shape_alone(batched_dispatcher):
    """nvcc builds it (with its harness, ./gemm M N K [runs [batch]]) against a caller of the
    batched signatures; it says its variant, picks by (M, N, K) whatever the batch, describes the
    chosen kernel's batched launch, and hands a batch that kernel's grid cannot hold to one that
    takes it."""
    plan, launcher = batched_dispatcher
    assert (launcher.precision, launcher.variant) == ("fp16", BATCHED)
    assert launcher.choice(16, 4096, 4096) == B_THIN and launcher.choice(4096, 4096, 4096) == B_BIG
    own = {c.name: launcher_of(c) for c in plan.kernels}
    for (m, n, k), batch in (((16, 4096, 4096), 3), ((4096, 4096, 4096), 8), ((17, 33, 9), 1000), ((5, 5, 5), 0)):
        mine = launcher.describe(m, n, k, batch=batch, stride_c=m * n + 8)
        theirs = own[launcher.choice(m, n, k)].describe(m, n, k, batch=batch, stride_c=m * n + 8)
        assert (tuple(mine.grid), mine.flag_words, mine.partial_bytes) == \
               (tuple(theirs.grid), theirs.flag_words, theirs.partial_bytes)
    # B_THIN's grid z holds batch * 4 <= 65535 blocks: a batch of 20000 goes to B_BIG
    with pytest.raises(ShapeRefused, match="batch must be <= 16383"):
        own[B_THIN].describe(16, 4096, 4096, batch=20000)
    assert tuple(launcher.describe(16, 4096, 4096, batch=20000).grid) == \
        tuple(own[B_BIG].describe(16, 4096, 4096, batch=20000).grid)
    with pytest.raises(ShapeRefused, match="C's matrices overlap"):  # refused by every kernel: the chosen one's reason
        launcher.describe(16, 4096, 4096, batch=2, stride_c=5)


# ---- --batch N: rank by the measurements of one batch count ----

B_VARIANT = ["--trans", "nt", "--out", "fp16", "--bias", "col", "--act", "gelu"]


@pytest.mark.parametrize("count, kernel", [(None, B_THIN), ("8", B_THIN), ("1", B_BIG)])
def test_best_and_emit_best_rank_by_one_batch_count(capsys, tmp_path, count, kernel):
    """Without --batch, every count's rows (each against cuBLAS's of its count); with --batch N
    those of N only (which implies --batch-mode strided)."""
    _, url = _stored_batched(tmp_path)
    option = ["--batch", count] if count else ["--batch-mode", "strided"]
    argv = ["--precision", "fp16", "--shape", "16x4096x4096", "--gpu", "sm_90", *B_VARIANT, *option, "--db", url]
    assert main(["best", *argv]) == 0
    assert capsys.readouterr().out.startswith(kernel)
    assert main(["emit", "best", *argv]) == 0
    captured = capsys.readouterr()
    assert f"kernel: {kernel}\n" in captured.out.replace("// kernel     : ", "kernel: ")
    assert f"at 16x4096x4096{f' (measured at a batch of {count})' if count else ''} for sm_90: {kernel}" \
        in captured.err


def test_emit_dispatch_ranks_by_one_batch_count(capsys, tmp_path):
    _, url = _stored_batched(tmp_path)
    argv = [*B_ARGV, "--batch", "1", "--db", url]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "dispatcher of 2 kernel(s) for 1 layer(s)" in captured.err
    # at a batch of 1 alone B_BIG is the faster at 16 x 4096 x 4096 (over every count, B_THIN)
    assert "//   11-49         0      " in captured.out and f"//   0  {B_BIG}" in captured.out
    line = next(ln for ln in captured.out.splitlines() if ln.startswith("//   gemmgen emit "))
    assert line.endswith("--batch-mode strided --batch 1")
    assert main(shlex.split(line.removeprefix("//").strip())[1:] + ["--db", url]) == 0
    assert capsys.readouterr().out == captured.out


@pytest.mark.parametrize("argv, message", [
    (["best", "--precision", "fp16", "--shape", "16x4096x4096", *B_VARIANT, "--batch", "4"],
     "no verified fp16 (nt fp16 col gelu strided) kernel measured at a batch of 4 at 16x4096x4096 for sm_90 in "
     "sqlite:///{url}, only at other batch counts"),
    (["emit", "best", "--precision", "fp16", "--shape", "4096", "--batch", "8"],
     "no verified fp16 (nn fp32 none none strided) kernel measured at a batch of 8 at 4096x4096x4096 for sm_90 in "
     "sqlite:///{url}; run `gemmgen tune`"),
    ([*B_ARGV, "--batch", "4"],
     "no verified fp16 (nt fp16 col gelu strided) kernel measured at a batch of 4 stored for sm_90 with a cuBLAS time "
     "beside it, at any shape"),
    (["best", "--precision", "fp16", "--shape", "64", "--batch", "0"], "the batch count must be at least 1"),
    (["emit", "v4", "--batch", "8"], "--batch N goes with `emit best` or --dispatch, not with a named point or "
                                     "--family: it picks stored measurements of N products per launch"),
])
def test_batch_counts_nothing_is_stored_at_are_one_line_and_exit_2(capsys, tmp_path, argv, message):
    _, url = _stored_batched(tmp_path)
    assert main([*argv, "--gpu", "sm_90", "--db", url]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert message.format(url=tmp_path / "r.db") in captured.err, captured.err
