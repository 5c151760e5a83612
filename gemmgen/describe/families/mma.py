"""mma: tensor cores through ``mma.sync`` PTX, fed by ``ldmatrix`` from a ``cp.async`` pipeline.

The block's WARPS_M x WARPS_N warps each own a (BM/WARPS_M) x (BN/WARPS_N) tile of C, computed
as MT x NT instructions of m16n8k16 (fp16, bf16) or m16n8k8 (tf32) with fp32 accumulators in
registers. ``stages`` K tiles are in flight: while one is computed, the copies of the next
stages-1 run asynchronously (cp.async, 16 bytes each, zero-filling outside A and B).

Shared memory holds A as BM x BK and B as BK x BN (trans=nn), row-major and unpadded, XOR-swizzled in
16-byte chunks (the template's mma_swz): the 8 rows of every ldmatrix phase, and every
quarter-warp's 16-byte copies, fall in distinct bank groups. Fragment addresses are one
per-thread offset XORed with compile-time constants, so the main loop does little address
arithmetic, and a tile's cp.async copies are spread over its k steps. tf32 feeds raw fp32 bits
to the mma (which truncates them to tf32; no conversions). tf32 B fragments are read with 8- or
16-byte loads (ldmatrix cannot transpose 32-bit elements): the warp's columns are permuted so
that a thread's columns are contiguous, with a swizzle of their own.

Where the rows of A (or B) are not 16-byte aligned (K, or N, not a multiple of the 16-byte vector,
or a misaligned pointer), the launch first packs that operand into zero-padded aligned rows in
the workspace (``Geometry.pack_vec``; the kernel ``<name>_pack``), and the kernel reads the copy
with the same cp.async path. Called with a null workspace, the kernel copies such an operand
element by element instead: 4-byte cp.async for tf32, plain loads (into registers one tile
ahead) for fp16 and bf16. Either way every shape is correct; only the speed changes.

``split_k`` > 1 divides the K range among that many blocks per C tile (grid z), for thin and
small shapes that leave SMs idle; the partial tiles are added in split order by the last block
to finish, as in warp (common.cuh.j2's gg_splitk_reduce), so results are deterministic.

Layouts (the variant's ``trans``): every one of nn, nt, tn, tt, for every precision. Shared
memory holds each operand as it is stored, so the copies stay 16-byte cp.async; the fragments
come from whichever way the tile lies. A K-contiguous tile (A of nn/nt, B stored N x K of nt/tt,
the mma's own "row"/"col" layouts) is read with plain ldmatrix, for tf32 too (a 16-bit 8x8
matrix is an 8 x 4 one of 32-bit elements); an fp16/bf16 tile stored K-major (A stored K x M,
B of nn/tn) with ldmatrix.trans. ldmatrix cannot transpose 32-bit elements, so a tf32 tile
stored K-major is read with 8-byte loads of two adjacent columns, which become two rows of the
m16 tile (A) or the same column of two n8 tiles (B); the epilogue stores C with those rows and
columns in place. tf32 nn keeps its own formulation (C^T = B^T A^T: B in the mma's A operand).
Misaligned rows of A or B are packed as they are stored (gg_pack_plan: B_T, A_T). C is stored
as fp32, fp16 or bf16 (the variant's ``out``): accumulation, split-K partials and ``beta * C`` in
fp32 (C read in its type), rounded once at the store.

Epilogue (the variant's ``bias`` and ``act``): C = act(alpha * acc + beta * C + bias) in fp32
registers right before that rounding (gg_store_c; the kernel's store_c for 16-bit C), after the
split-K reduction where there is one, so only the final sum goes through it; the packing and the
null workspace path change how A and B are read, not the store. A thread loads each bias value
it needs once: its stores walk the tiles along the bias's dimension in the outer loop.
"""

from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families.base import Family, Geometry, Param, divides
from gemmgen.describe.problem import EVERY_VARIANT

MAX_ACC_REGS = 128  # fp32 accumulators per thread; more leaves too few registers for fragments


def derive(p, precision, variant):
    dt = PRECISIONS[precision]
    esize = dt.bytes
    vec = 16 // esize  # elements per 16-byte copy
    warps = p["WARPS_M"] * p["WARPS_N"]
    wm, wn = p["BM"] // p["WARPS_M"], p["BN"] // p["WARPS_N"]
    stage = p["BM"] * p["BK"] + p["BK"] * p["BN"]  # elements; no padding (swizzled)
    tf32 = precision == "tf32"
    a_t, b_t = variant.a_transposed, variant.b_transposed
    return {
        "geometry": Geometry((32 * warps, 1, 1), tile_m=p["BM"], tile_n=p["BN"],
                             smem_bytes=p["stages"] * stage * esize, pack_vec=vec,
                             split_k=p["split_k"]),
        "MMA_K": dt.mma_k,
        "MMA_INSTRUCTION": f"mma.sync.aligned.m16n8k{dt.mma_k}.row.col.f32.{dt.ptx_type}.{dt.ptx_type}.f32",
        "VEC": vec,
        "WM": wm,
        "WN": wn,
        "MT": max(wm // 16, 1),
        "NT": max(wn // 8, 1),
        # how the operands lie in shared memory and how their fragments are read (mma.cu.j2)
        "A_KC": not a_t,  # A's tile is BM x BK (K-contiguous): ldmatrix; else BK x BM
        "B_KC": b_t,  # B's tile is BN x BK (B stored N x K): ldmatrix; else BK x BN
        "SWAP": tf32 and not a_t and not b_t,  # tf32 nn: C^T = B^T A^T, B in the mma's A operand
        "A_PAIRS": tf32 and a_t,  # tf32 A stored K x M: 8-byte loads of column pairs
        "B_PAIRS": tf32 and not b_t,  # tf32 B stored K x N: 8-byte loads of column pairs
    }


def check(p, precision, d, variant):
    v: list[str] = []
    divides(v, "each warp's rows must be whole m16 tiles", "BM", p["BM"], "16*WARPS_M", 16 * p["WARPS_M"])
    # fp16/bf16 B fragments come in pairs of n8 tiles (one ldmatrix.x4.trans)
    divides(v, "each warp's columns must be whole pairs of n8 tiles", "BN", p["BN"], "16*WARPS_N",
            16 * p["WARPS_N"])
    divides(v, f"a {precision} mma is {d['MMA_K']} deep", "BK", p["BK"], "mma K", d["MMA_K"])
    divides(v, "A's tile rows are copied in 16-byte pieces", "BK", p["BK"], "16-byte vector", d["VEC"])
    acc = d["MT"] * d["NT"] * 4
    if acc > MAX_ACC_REGS:
        v.append(f"accumulators need (WM/16)*(WN/8)*4 = {d['MT']}*{d['NT']}*4 = {acc} registers per thread; "
                 f"at most {MAX_ACC_REGS} leave room for the A and B fragments without spilling")
    return v


FAMILY = Family(
    name="mma",
    template="mma.cu.j2",
    doc="tensor cores through mma.sync PTX, ldmatrix and a cp.async multi-stage pipeline",
    precisions=("fp16", "bf16", "tf32"),
    params=(
        Param("BM", (32, 64, 128, 256), "rows of C per block"),
        Param("BN", (32, 64, 128, 256), "columns of C per block"),
        Param("BK", (8, 16, 32, 64), "depth of one K tile (one pipeline stage)"),
        Param("WARPS_M", (1, 2, 4, 8), "warps along M"),
        Param("WARPS_N", (1, 2, 4, 8), "warps along N"),
        Param("stages", (2, 3, 4, 5), "K tiles in shared memory: one computed while the others load"),
        Param("frags", (1, 2), "register buffers of A and B fragments: 2 = read step s + 1 while multiplying step s"),
        Param("swizzle", (1, 2, 4, 8, 16), "block order: tile rows walked together, column by column (1 = row-major)"),
        Param("split_k", (1, 2, 4, 8, 16), "blocks sharing one C tile's K range, added in order (1 = no split)"),
    ),
    defaults={"BM": 128, "BN": 128, "BK": 32, "WARPS_M": 2, "WARPS_N": 2, "stages": 3, "frags": 2, "swizzle": 1,
              "split_k": 1},
    name_format="{BM}x{BN}x{BK}_w{WARPS_M}x{WARPS_N}_s{stages}_f{frags}",
    derive=derive,
    check=check,
    min_cc=80,
    min_cc_why="cp.async, ldmatrix, mma.sync with bf16/tf32",
    computes=EVERY_VARIANT.but(scale=("none",)),
    name_options=(("split_k", "_k{split_k}", 1), ("swizzle", "_g{swizzle}", 1)),
)
