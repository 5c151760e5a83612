"""warp (FastCuda V4): block tile -> warp tiles (WM x WN) -> thread tiles (TM x TN).

The 32 threads of a warp form a (WM/TM) x (WN/TN) grid. A thread's TM rows (and TN columns) are
taken in runs of up to 4 consecutive elements, the runs spaced across the warp tile, so that its
shared-memory reads are 128-bit and conflict-free. A is stored transposed in shared memory
(BK x BM, padded), B as BK x BN. ``buffers`` = 2 double-buffers shared memory: the next K tile is
loaded from global memory into registers while the current one is computed.

Layouts (the variant's ``trans``): nn, nt, tn and tt, into fp32 C. Shared memory always holds
A's tile as BK x BM and B's as BK x BN; an operand whose rows run along K as stored (A of nn/nt,
B stored N x K of nt/tt) is loaded as float4 along K and transposed on its way into shared
memory (padded rows), one whose rows run along M or N (A stored K x M of tn/tt, B of nn/tn) is
stored as loaded, in float4s. The compute loop is the same for every layout.

``split_k`` > 1 divides the K range among that many blocks per C tile (grid z). Each stores its
partial tile in the workspace; the last of them to finish adds all of them in split order and
runs the epilogue, so results are deterministic (common.cuh.j2's gg_splitk_reduce). ``swizzle`` = G
walks the blocks G tile rows at a time, column by column, so that blocks running together share
tiles of A and B in L2 (1: plain row-major order).

Epilogue (the variant's ``bias`` and ``act``): C = act(alpha * acc + beta * C + bias) in fp32 at
the store (gg_store_c), after the split-K reduction where there is one, so only the final sum
goes through it. A thread loads the bias of its TN columns (or of each of its TM rows) once.
"""

from gemmgen.describe.families.base import Family, Geometry, Param, cdiv, divides
from gemmgen.describe.problem import EVERY_VARIANT

A_PAD = 4  # floats; keeps 16-byte alignment of the transposed A rows and spreads their stores
B_PAD = A_PAD  # the same for B's rows where B is stored N x K (trans nt, tt) and transposed too


def derive(p, precision, variant):
    warps_m, warps_n = max(p["BM"] // p["WM"], 1), max(p["BN"] // p["WN"], 1)
    threads = 32 * warps_m * warps_n
    a_t, b_t = variant.a_transposed, variant.b_transposed
    lda = p["BM"] + (0 if a_t else A_PAD)  # A stored K x M is stored as loaded: no transposing stores
    ldb = p["BN"] + (B_PAD if b_t else 0)
    return {
        "geometry": Geometry((threads, 1, 1), tile_m=p["BM"], tile_n=p["BN"],
                             smem_bytes=p["buffers"] * (p["BK"] * lda + p["BK"] * ldb) * 4,
                             split_k=p["split_k"]),
        "WARPS_M": warps_m,
        "WARPS_N": warps_n,
        "WTR": max(p["WM"] // p["TM"], 1),  # thread rows in a warp
        "WTC": max(p["WN"] // p["TN"], 1),  # thread columns in a warp
        "VM": min(p["TM"], 4),
        "VN": min(p["TN"], 4),
        "LDA": lda,
        "LDB": ldb,
        "A_ITERS": cdiv(p["BM"] * p["BK"], threads * 4),
        "B_ITERS": cdiv(p["BK"] * p["BN"], threads * 4),
    }


def check(p, precision, d, variant):
    v: list[str] = []
    divides(v, "warp tile must divide block tile", "BM", p["BM"], "WM", p["WM"])
    divides(v, "warp tile must divide block tile", "BN", p["BN"], "WN", p["WN"])
    divides(v, "thread tile must divide warp tile", "WM", p["WM"], "TM", p["TM"])
    divides(v, "thread tile must divide warp tile", "WN", p["WN"], "TN", p["TN"])
    per_warp = (p["WM"] // p["TM"]) * (p["WN"] // p["TN"])
    if per_warp != 32:
        v.append(f"a warp is 32 threads: (WM/TM)*(WN/TN) = ({p['WM']}/{p['TM']})*({p['WN']}/{p['TN']}) "
                 f"= {per_warp}, must be 32")
    divides(v, "A (and B stored N x K) are loaded as float4 along K", "BK", p["BK"], "4", 4)
    return v


FAMILY = Family(
    name="warp",
    template="warp.cu.j2",
    doc="warp tiling with 128-bit shared loads, optional double-buffered prefetch, split-K, block swizzle",
    precisions=("fp32",),
    params=(
        Param("BM", (16, 32, 64, 128, 256), "rows of C per block"),
        Param("BN", (16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", (4, 8, 16, 32), "depth of one K step staged in shared memory"),
        Param("WM", (8, 16, 32, 64, 128), "rows of C per warp"),
        Param("WN", (8, 16, 32, 64, 128), "columns of C per warp"),
        Param("TM", (2, 4, 8, 16), "rows of C per thread"),
        Param("TN", (2, 4, 8, 16), "columns of C per thread"),
        Param("buffers", (1, 2), "shared-memory buffers: 2 = prefetch the next K tile while computing"),
        Param("split_k", (1, 2, 4, 8, 16), "blocks sharing one C tile's K range, added in order (1 = no split)"),
        Param("swizzle", (1, 2, 4, 8, 16), "block order: tile rows walked together, column by column (1 = row-major)"),
    ),
    defaults={"BM": 128, "BN": 128, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "buffers": 2,
              "split_k": 1, "swizzle": 1},
    name_format="{BM}x{BN}x{BK}_w{WM}x{WN}_t{TM}x{TN}_b{buffers}",
    name_options=(("split_k", "_k{split_k}", 1), ("swizzle", "_g{swizzle}", 1)),
    derive=derive,
    check=check,
    computes=EVERY_VARIANT.but(out=("fp32",), scale=("none",)),
)
