"""The header comment of an emitted kernel file, in words: what the kernel is, how its launcher
launches it (block, grid, workspace, operands), what it requires and computes, how to build it.

templates/base.cu.j2 writes the lines as header_lines gives them; the words that a dispatcher's
header shares with a kernel's (what a variant computes, its bias, its strided batch) are here
too, so that both say them alike.
"""

import shlex

from gemmgen import __version__
from gemmgen.describe import scaling
from gemmgen.describe.arch import MAX_GRID_Y
from gemmgen.describe.config import KernelConfig
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Variant

RULE = "// " + "=" * 85
MORE = " " * 13  # a continued field: under the text after "field      : "


def requirements(config: KernelConfig) -> str:
    """What the kernel requires of M, N, K, in words (also written in the emitted header)."""
    if config.geometry.persistent:  # tiles are walked by index: no grid limit on M
        return config.family.requires
    return f"{config.family.requires}; M <= {MAX_GRID_Y * config.geometry.tile_m} (grid y limit)"


def emit_args(config: KernelConfig, harness: bool = False) -> str:
    """The `gemmgen emit` arguments that reproduce this source."""
    sets = ",".join(f"{k}={v}" for k, v in (*config.values, *config.variant.items))
    words = ["--family", config.family.name, "--precision", config.precision, "--set", sets,
             "--gpu", config.arch.name] + (["--harness"] if harness else [])
    return shlex.join(words)


def computes(variant: Variant) -> str:
    """What a launcher of ``variant`` computes, as its header and comments say it."""
    product = {"tensor": "scale_a[0] * scale_b[0] * A @ B", "row": "scale_a[i] * scale_b[j] * (A @ B)[i][j]",
               "block": "(A * SA) @ (B * SB)"}
    inner = (f"alpha * {product.get(variant.scale, 'A @ B')} + beta * C"
             + (" + bias" if variant.bias != "none" else ""))
    return f"{variant.act}({inner})" if variant.act != "none" else inner


def scale_lines(variant: Variant) -> list[str]:
    """The header's lines on FP8's scales (none for a launcher that is not scaled)."""
    if not variant.scaled:
        return []
    words_a, words_b = scaling.describe(variant.scale)
    blocks = ([f"{MORE}SA and SB: each element's scale (A in 1 x 128 blocks along K, B in 128 x 128;",
               f"{MORE}gemmgen/describe/scaling.py), applied to each 128 of K's sums before they are added"]
              if variant.scale == "block" else [])
    return [f"scales     : scale={variant.scale}: scale_a and scale_b, fp32 in device memory, the launcher's",
            f"{MORE}arguments after C{' and the bias' if variant.bias != 'none' else ''}, read by every launch "
            "(a CUDA graph sees new values):",
            f"{MORE}scale_a {words_a};", f"{MORE}scale_b {words_b}", *blocks]


def bias_doc(variant: Variant) -> str:
    """The bias of ``variant`` in words ("" where it adds none)."""
    words = {"row": "M values, bias[i] added to row i", "col": "N values, bias[j] added to column j"}
    return words.get(variant.bias, "")


def batch_lines(variant: Variant) -> list[str]:
    """The header's "batch" field of a strided batch (none for a launcher of one product)."""
    if not variant.batched:
        return []
    bias = ", stride_bias" if variant.bias != "none" else ""
    return ["batch      : strided: one launch computes C[i] for i < batch, each matrix X[i] at X + i * stride_x",
            f"{MORE}(elements; stride_a, stride_b{bias} may be 0: one for all; C's must not overlap)"]


def comment(lines: list[str]) -> list[str]:
    """``lines`` as C++ comment lines between two rules ("" gives an empty comment line)."""
    return [RULE, *(f"// {line}".rstrip() for line in lines), RULE]


def _grid(config: KernelConfig) -> list[str]:
    g, batched = config.geometry, config.variant.batched
    batch = " * batch" if batched else ""
    c = g.cluster
    if g.persistent and c > 1:
        return [f"{MORE}grid = ({'clusters' if g.stream_k else 'min(units, clusters)'} * {c}, 1, 1), units = "
                f"ceil(M / {g.tile_m * c}) * ceil(N / {g.tile_n}){batch},",
                f"{MORE}clusters = how many fit at once (cudaOccupancyMaxActiveClusters):",
                f"{MORE}persistent, in clusters of {c} blocks (__cluster_dims__), each cluster computing",
                f"{MORE}units blockIdx.x / {c}, + gridDim.x / {c}, ... ({c} vertically adjacent tiles each);"]
    if g.persistent and g.stream_k:
        return [f"{MORE}grid = (SMs, 1, 1): persistent, each block computing tiles blockIdx.x, blockIdx.x + gridDim.x,",
                f"{MORE}... and then its share of the stream-K k tiles (below);"]
    if g.persistent:
        return [f"{MORE}grid = (min(tiles, SMs), 1, 1), tiles = ceil(M / {g.tile_m}) * ceil(N / {g.tile_n}){batch}: "
                "persistent,",
                f"{MORE}each block computes tiles blockIdx.x, blockIdx.x + gridDim.x, ...;"]
    if batched:
        split = f", split z % {g.split_k} of its K range" if g.split_k > 1 else ""
        return [f"{MORE}grid = (ceil(N / {g.tile_n}), ceil(M / {g.tile_m}), batch * {g.split_k}): "
                "block z computes matrix",
                f"{MORE}z / {g.split_k} of the batch{split};"]
    return [f"{MORE}grid = (ceil(N / {g.tile_n}), ceil(M / {g.tile_m}), {g.split_k});"]


def _operands(config: KernelConfig) -> list[str]:
    tma, v = config.geometry.tma, config.variant
    if tma is None:
        return []
    a = f"A ({'K x M as stored' if v.a_transposed else 'M x K'}, box {tma.box_a[1]} x {tma.box_a[0]})"
    b = f"B ({'N x K' if v.b_transposed else 'K x N'} as stored, box {tma.box_b[1]} x {tma.box_b[0]})"
    tail = ", 128-byte swizzle" + ("; 3-D over the batch (the matrix outermost)" if v.batched else "") + ";"
    first = "operands   : through TMA: the kernel's first {} parameters are tensor maps (CUtensorMap, by"
    count = ("two", "three", "four")[len(tma.maps) - 2]
    last = [f"{MORE}and one over A's last tile row: box (M % {tma.box_a[1]}) x {tma.box_a[0]}, so that no load reads",
            f"{MORE}past M (zeros where M % {tma.box_a[1]} == 0: never read);"] if tma.tail_a else []
    if tma.box_c is None:
        return [first.format(count), f"{MORE}value) over {a} and {b}{tail}", *last,
                f"{MORE}the launcher below builds them (gg_tensor_map). A, B stay in the signature."]
    c_vec = 16 // PRECISIONS[v.out].bytes
    return [first.format(count), f"{MORE}value) over {a}, {b} and",
            f"{MORE}C (M x N {v.out}, box {tma.box_c[1]} x {tma.box_c[0]}){tail}", *last,
            f"{MORE}the launcher below builds them (gg_tensor_map). A, B and C stay in the signature.",
            f"{MORE}C is stored through its map only when beta == 0, N % {c_vec} == 0 and C is 16-byte",
            f"{MORE}aligned (gg_tma_stores_c); otherwise the kernel stores C directly and never reads",
            f"{MORE}the map: pass 128 zero bytes then."]


def _workspace(config: KernelConfig, sk_flags: int) -> list[str]:
    g, v = config.geometry, config.variant
    out = []
    if g.split_k > 1:
        out += [f"workspace  : split-K: the {g.split_k} blocks along grid z share a C tile's K range; each stores its",
                f"{MORE}partial tile in the workspace and the last to finish adds them in split order",
                f"{MORE}(deterministic): a counter per C tile (zero before a launch, left zero by it) and",
                f"{MORE}{g.split_k} partial {g.tile_m} x {g.tile_n} fp32 tiles per C tile (gg_splitk_needs)."]
    elif g.stream_k:
        out += ["workspace  : stream-K: the tiles of the last, partial wave (with the last full wave where the",
                f"{MORE}partial one is under half full; all, where there are fewer tiles than blocks) are",
                f"{MORE}shared out by k among all blocks;",
                f"{MORE}the block with a tile's last k tiles adds the others' partial sums: {sk_flags} flag(s) per",
                f"{MORE}block (zero before a launch, left zero by it) and a {g.tile_m} x {g.tile_n} fp32 partial "
                "tile per",
                f"{MORE}block. The blocks of the persistent grid must all be resident at once (the",
                f"{MORE}launcher's grid is), since a block may wait for the partial sums of later ones."]
    if g.pack_vec:
        out += ["packing    : where the rows of A (or B) are not 16-byte aligned "
                f"({'M' if v.a_transposed else 'K'}, or {'K' if v.b_transposed else 'N'}, not a multiple of "
                f"{g.pack_vec}, or the",
                f"{MORE}pointer misaligned), {config.name}_pack first copies that operand into",
                f"{MORE}zero-padded rows (gg_pack_plan), which the GEMM kernel reads"
                f"{' through its tensor map' if g.tma else ''}."]
    if not out:
        return ["workspace  : none"]
    return out + [f"{MORE}The launcher below owns this workspace, one per stream and device (gg_slot).",
                  f"{MORE}Or the caller gives it (<launcher>_workspace_size, _launch_workspace): CUDA-graph safe."]


def _layout(v: Variant) -> list[str]:
    if v.trans == "nt":
        return [f"layout     : trans={v.trans}: row-major A (M x K), B stored transposed (N x K, row-major: B is "
                "column-major),",
                f"{MORE}C (M x N); leading dimensions K, K, N (C = A @ B^T for B as stored: torch's linear(A, B))"]
    if v.a_transposed:
        b = "stored transposed (N x K" if v.b_transposed else "row-major (K x N"
        return [f"layout     : trans={v.trans}: A stored transposed (K x M, row-major: A is column-major), B {b}),",
                f"{MORE}C (M x N, row-major); leading dimensions M, {'K' if v.b_transposed else 'N'}, N "
                f"(C = A^T @ B{'^T' if v.b_transposed else ''} for A and B as stored)"]
    return ["layout     : row-major A (M x K), B (K x N), C (M x N); leading dimensions K, N, N"]


def _computes(config: KernelConfig) -> list[str]:
    v = config.variant
    if not v.has_epilogue:
        return [f"computes   : C = {computes(v)} (C is not read when beta == 0)", *scale_lines(v)]
    gelu = "; gelu: the tanh approximation" if v.act == "gelu" else ""
    first = f"computes   : C = {computes(v)} (C is not read when beta == 0), in fp32,"
    if v.bias == "none":
        return [first, f"{MORE}rounded once to C's type{gelu}", *scale_lines(v)]
    return [first, f"{MORE}rounded once to C's type; bias: {bias_doc(v)}",
            f"{MORE}of C, of C's type ({config.output_type}), the argument after C{gelu}", *scale_lines(v)]


def header_lines(config: KernelConfig, harness: bool = False) -> list[str]:
    """The header comment of ``config``'s emitted file (with ``harness``: of the file with a
    main()), as C++ comment lines, the rules above and below included."""
    g = config.geometry
    flags = " ".join(config.build_arch.nvcc_flags)
    if harness:
        build = [f"build      : nvcc -O3 {flags} gemm.cu -o gemm && ./gemm M N K"]
    else:
        build = [f"build      : nvcc -O3 {flags} -c gemm.cu                                      (an object), or",
                 f"{MORE}nvcc -O3 {flags} -Xcompiler -fPIC -shared gemm.cu -o libgemm.so  (a library)"]
    return comment([
        f"Generated by gemmgen {__version__}. Regenerate with:",
        f"  gemmgen emit {emit_args(config, harness)}",
        "",
        f"kernel     : {config.name}",
        f"family     : {config.family.name} -- {config.family.doc}",
        f"parameters : {', '.join(f'{k}={v}' for k, v in config.values)}",
        f"precision  : {config.precision} (A, B: {config.element_type}"
        + (f", {config.element_type_b}" if config.element_type_b != config.element_type else "")
        + f"; accumulation: float; C: {config.output_type})",
        f"target     : {config.build_arch.name}",
        f"launch     : block = ({g.block[0]}, {g.block[1]}, {g.block[2]}) = {g.threads} threads;",
        *_grid(config),
        f"{MORE}dynamic shared memory = {g.smem_bytes} bytes",
        *_operands(config),
        *_workspace(config, config.derived.get("SK_FLAGS_PER_BLOCK", 0)),
        f"requires   : {requirements(config)}",
        *_layout(config.variant),
        *batch_lines(config.variant),
        *_computes(config),
        *build,
    ])
