"""hopper: Hopper's own path -- TMA loads, wgmma, a warp-specialized persistent kernel (sm_90a).

A block is ``consumers`` + 1 warpgroups of 128 threads. Warpgroup 0 is the producer: one of its
threads issues the tensor-memory-accelerator (TMA) copies of A and B tiles into a ring of
``stages`` shared-memory slots, each completing on that slot's "full" mbarrier. With ``schedule``
= coop the consumer warpgroups each own BM / consumers rows of every BM x BN tile; with pingpong
the two consumers take alternate tiles whole, so that one stores its tile while the other
multiplies (the ring's order staggers them). They multiply with
``wgmma.mma_async`` straight from shared memory (m64nBNk16 for fp16/bf16, m64nBNk8 for tf32),
fp32 accumulators in registers; once the tensor cores are done with a slot they arrive on its
"empty" mbarrier and the producer refills it. ``setmaxnreg`` moves registers from the producer
(40 per thread) to the consumers.

The grid is persistent: one block per SM (at most one per tile), each block walking the C tiles
blockIdx.x, blockIdx.x + gridDim.x, ... in grouped order (``swizzle`` tile rows at a time, or all
of them where A is at most 16 MB, so that the walk passes over B once), so that while the
consumers store one tile, the producer already loads the next. With ``cluster``
= 2, blocks run in pairs on vertically adjacent tiles (one tile column, two tile rows): each
loads its own A and half of the B tile they share, multicast by TMA into both blocks' shared
memory, and a stage is refilled once the consumers of both blocks are done with it.

Shared memory, per stage: A as BM rows of 128 bytes (one 128-byte-swizzled TMA box of BK
elements), B as BN / (128 bytes) column chunks of BK rows x 128 bytes, all 128-byte swizzled (the
layout wgmma's descriptors name), so the copies and the tensor-core reads are conflict-free. After
the stages, fp16/bf16 have two 2 KB C staging buffers per consumer warp (below), then the
barriers.
fp16/bf16 B is read N-major (wgmma's transpose bit). With ``swap`` = 1 fp16/bf16 compute C^T = B^T A^T
like tf32 below, both operands straight from shared memory (B^T as wgmma's A, M-major through the
transpose bit; the A tile as wgmma's B, K-major), so that BM = 16 or 32 rows are wgmma's N and a
thin problem multiplies no rows of zeros.
Each operand's tile lies in shared memory as the operand is stored, and wgmma reads it with or
without its transpose bit (16-bit types; derive's TRANSPOSE_A/B): B stored N x K (trans nt, tt)
arrives as BN rows of 128 bytes, K-major like A; A stored K x M (trans tn, tt) as B stored K x N
does, BM / 64 column chunks of BK rows x 128 bytes, M-major (with swap=1 wgmma's N-major B, so BM
is a multiple of 64 there). tf32 wgmma reads shared-memory operands
K-major only, and B lies N-major, so tf32 computes C^T = B^T A^T instead: wgmma's A operand is a
consumer's columns of B^T, which its threads load from the B tile into registers (the loads do the
transposing, conflict-free through the swizzle), and wgmma's B operand is the A tile, K-major as it
lies. For tf32 the consumers therefore split the tile's columns (BN / consumers each) and every
consumer covers all BM rows (wgmma m64nBMk8).

The fp16/bf16 epilogue stores C through TMA where it can: with beta == 0 (C is not read), N % 4 == 0 and C
16-byte aligned (TMA needs 16-byte row strides and bases). Each consumer warp then writes its 16
rows of the tile box by box -- 16 rows x 32 fp32 columns, alpha * its accumulators, into one of
its two 128-byte-swizzled staging buffers -- and its lane 0 stores each box to C with a bulk
tensor store (a third tensor map, over C), once the store two boxes before is done reading that
buffer. Only the warp synchronizes, never the warpgroup. The warp goes on to its next tile while
its last stores drain. The kernel
tests the condition itself; where it fails (beta != 0, or C's rows or base misaligned), the host
passes a zero-filled map, never read, and each thread stores its accumulators straight to C.
tf32's accumulators hold C^T; each thread stores them straight to C (each store instruction covers
8 consecutive columns of 4 rows: full 32-byte sectors).

With ``overlap`` = 1 (coop, fp16/bf16, one m64 row block per consumer, BN a multiple of 128) a
consumer stores only the left half of a tile's C at once: the right half's accumulators move,
times alpha and through the variant's epilogue, to registers of their own (``held``, fp32 for any
C type) and go out one box (32 fp32 or 64 16-bit columns) per k tile during the next
item's first k tiles, after its wgmmas are issued, so the tensor cores multiply meanwhile; what an
item of fewer k tiles leaves is stored after its k loop, and the last tile's half at the end.

With ``streamk`` = 1 (coop only), the grid is every SM, and the tiles of the last, partial wave
are shared out by k among all blocks (stream-K; where that wave is at most 3/4 full and a tile
has at least 8 k tiles; all tiles where there are at most 3/4 as many as SMs: split-K for thin
and small problems, with a split the kernel works out from the shape). Where the partial wave is
under half full, the last full wave joins it (the data-parallel + stream-K hybrid), so that each
block takes 1 to 1.5 tiles' worth and a tile's partial sums come from two or three blocks rather
than a dozen. Each block takes a near-equal range (at least 4 k tiles) of their k tiles laid end
to end, the part in its last tile first (so that all blocks read the same k tiles at once, from
L2), and the block holding a tile's last k tiles adds the others' partial sums, left in the
workspace (a slot and a flag each; the launcher sizes it), in a fixed order, and stores C. The
schedule is HpWork in the template; the kernel decides it at run time.

With ``batch=strided`` (the variant; the launcher takes the batch count and the strides) one
launch computes every matrix of a strided batch: the work is batch x the units of one matrix, one
list that the persistent walk, grouping, stream-K (its flags and partial slots are per block, so
per unit of any matrix) and ping-pong take as they take the units of one product. The tensor maps
over A, B and C are 3-D, the matrix outermost with its stride (16-byte multiples), and each load
and store adds its matrix's coordinate; an operand every matrix shares (stride 0) has a map of one
matrix, read at coordinate 0. The direct and swap-AB stores and the bias address matrix b's C and
bias vector. A or B whose stride TMA cannot take (not a multiple of 16 bytes) is packed per matrix
like a misaligned one (once where its stride is 0); strides smaller than a matrix (operands that
overlap) are read in place, as the driver encodes them. C whose stride is not 16-byte multiples
is stored directly (the kernel's and the launcher's one rule, gg_tma_stores_c).

A stored M x K arrives in one box of BM rows per tile, except in the last tile row where M ends
inside it: that row loads through a second map over A whose box is M % BM rows (the launcher
builds it per launch), expecting only those bytes, so that no load reaches past M. A box partly
past M loaded far slower than a whole one: on an H100 a 128 x 64 FP8 tile took 58.5 us at 137 x
4096 x 14336 against 34.7 us at 256 rows, with the same blocks; through the tail map, 34.6 us
(docs/problems.md). The rows of the stage it does not fill keep what they held; they reach only
rows of C past M, never stored. With ``abox`` the A tile arrives instead in BM / abox boxes of abox
rows, those wholly past M not loaded: an earlier answer to the same slowdown, slower than the tail
map at every M measured (many small boxes cost), kept for comparison and out of the tuner's space.
B's boxes (64 columns of C or fewer) wholly past N, in a partial last tile column, are not loaded,
and not expected either: they cost a 64 x 192 tile 6-9% at 1024 x 4096 x 4096 (docs/problems.md).

Where the rows of A or B as stored are not 16-byte aligned (rows of K, N or, for A stored K x M,
M elements that are not a multiple of 16 bytes, or a misaligned pointer), the launch packs that
operand as it is stored into zero-padded aligned rows in the workspace first, as ``mma`` does
(gg_pack_plan); TMA's bounds checks zero-fill every tile edge of the loads and clip the stores at
C's edges, and the direct stores stay inside C, so any M, N, K >= 1 is correct.
"""

import math

from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families.base import Family, Geometry, Param, Tma, divides
from gemmgen.describe.problem import EVERY_VARIANT

SWIZZLE_BYTES = 128  # TMA and wgmma 128-byte swizzle: one shared-memory row of a tile
MAX_ACC_REGS = 160  # fp32 accumulators per consumer thread; the rest of its 232-240 registers is headroom (144 = three m64n96 blocks, cuBLAS's 192x96 tile, compiles without spills)
# Rows of a tile: wgmma's N takes 8..256 in steps of 8, which is what BM is with swap=1 (and for tf32);
# without swap the rows are m64 blocks (check() says so).
BM_CHOICES = tuple(range(8, 257, 8))
BARRIER_BYTES = 16  # a full and an empty mbarrier per stage
ALIGN_SLACK = 1024  # the 128-byte swizzle wants 1024-byte aligned tiles; the dynamic base is 128-aligned
# The TMA-store epilogue stages C in boxes of 16 rows x 32 fp32 columns (one 128-byte swizzled row
# per tile row), C_BUFFERS of them per consumer warp: one fills while the other drains.
# C stored as fp16/bf16: boxes of 16 rows x 64 columns (128 bytes a row again).
C_BOX = (SWIZZLE_BYTES // 4, 16)
C_BOX_BYTES = C_BOX[0] * C_BOX[1] * 4
C_BUFFERS = 2


def derive(p, precision, variant):
    dt = PRECISIONS[precision]
    esize = dt.bytes
    # elements in one 128-byte swizzled row: the K depth of a stage, and B's column chunk
    bk = SWIZZLE_BYTES // esize
    # C^T = B^T A^T: consumers split columns, and the tile's BM rows are wgmma's N (8..256 in steps
    # of 8), so a thin M needs no 64-row tile. tf32 always (B^T fragments from registers).
    tf32 = precision == "tf32"
    swap = tf32 or p["swap"] == 1
    a_t = variant.a_transposed  # A stored K x M: its tile lies M-major, in 64-column chunks like an N-major B's
    b_t = variant.b_transposed  # B stored N x K: K-major, like an M x K A
    c_esize = PRECISIONS[variant.out].bytes
    share = 1 if p["schedule"] == "pingpong" else p["consumers"]
    rows, cols = (p["BM"], p["BN"] // share) if swap else (p["BM"] // share, p["BN"])
    wgmma_n = p["BM"] if swap else p["BN"]
    mi = (cols if swap else rows) // 64
    a_bytes, b_bytes = p["BM"] * bk * esize, bk * p["BN"] * esize
    c_bytes = 0 if swap else p["consumers"] * 4 * C_BUFFERS * C_BOX_BYTES  # tf32 stores C^T fragments directly
    smem = p["stages"] * (a_bytes + b_bytes + BARRIER_BYTES) + c_bytes + ALIGN_SLACK
    # TMA boxes are {inner, outer} in elements: A is M x K (K inner), B is K x N (N inner); B
    # arrives in B_LOADS boxes of BK rows x 128 bytes, which the blocks of a cluster share out.
    # B stored N x K (trans=nt, tt) arrives in boxes of 64 rows (of N) x 128 bytes (of K), any
    # element size, the tile then BN rows of 128 bytes, K-major; as many boxes as the cluster has
    # blocks where BN / 64 is fewer or no multiple of them (BN = 64 in a cluster of 2: two boxes of
    # 32 rows, one multicast by each block). A box of 8k rows is whole 1024-byte swizzle atoms, so
    # the boxes lie as one box of BN rows would.
    # A stored K x M (trans=tn, tt) arrives as B stored K x N does: A_LOADS boxes of BK rows (of K)
    # x 128 bytes (of M), each 64 columns of the tile, M-major; otherwise as one box of BM rows, or
    # with abox as BM / abox boxes of abox rows, the producer skipping those wholly past M.
    b_loads = math.lcm(p["BN"] // 64, p["cluster"]) if b_t else p["BN"] // bk
    b_box_n = p["BN"] // b_loads if b_t else bk  # columns of C (rows of B^T) one box brings
    a_box_m = p["BM"] if a_t or not p["abox"] else p["abox"]  # rows (of M) one box of A stored M x K brings
    a_loads = p["BM"] // bk if a_t else max(1, p["BM"] // a_box_m)
    # wgmma's transpose bits (16-bit types only): whether its A and B operands lie MN-major in
    # shared memory. The A tile does where A is stored K x M, the B tile where B is stored K x N;
    # C^T = B^T A^T (swap) gives the B tile to wgmma's A and the A tile to its B.
    a_mn, b_mn = a_t, not b_t
    transpose = (b_mn, a_mn) if swap else (a_mn, b_mn)
    c_box = (SWIZZLE_BYTES // c_esize, 16)
    return {
        "geometry": Geometry((128 * (p["consumers"] + 1), 1, 1), tile_m=p["BM"], tile_n=p["BN"], smem_bytes=smem,
                             pack_vec=16 // esize, persistent=True, cluster=p["cluster"],
                             tma=Tma(box_a=(bk, bk) if a_t else (bk, a_box_m), box_b=(bk, b_box_n) if b_t else (bk, bk),
                                     box_c=None if swap else c_box, tail_a=not a_t and not p["abox"]),
                             stream_k=p["streamk"] == 1),
        "BK": bk,
        "ESIZE": esize,
        "SWAP_AB": swap,
        "A_T": a_t,
        "B_T": b_t,
        "TRANSPOSE_A": int(transpose[0]),  # wgmma's A operand is MN-major (the transpose bit)
        "TRANSPOSE_B": int(transpose[1]),  # wgmma's B operand is MN-major
        # the instruction's transpose operands: 16-bit types have them, 8-bit ones none (K-major only)
        "WGMMA_TRANSPOSE": f", {int(transpose[0])}, {int(transpose[1])}" if esize == 2 else "",
        "C_ESIZE": c_esize,
        "C_BOX_COLS": c_box[0],  # columns of C in one staged box
        "TF32_FRAGS": tf32,  # wgmma's A operand (B^T) from registers: tf32 reads smem K-major only
        "ROWS": rows,  # rows of the tile per consumer warpgroup
        "COLS": cols,  # columns of the tile per consumer warpgroup
        "MI": mi,  # wgmma m64 instructions per consumer per k step (over rows, or for tf32 columns)
        "WGMMA_N": wgmma_n,
        "ACC": mi * wgmma_n // 2,  # fp32 accumulators per consumer thread
        "A_BYTES": a_bytes,
        "B_BYTES": b_bytes,
        "C_BOX_BYTES": C_BOX_BYTES,
        "C_BUFFERS": C_BUFFERS,
        "A_LOADS": a_loads,
        "A_BOX_M": 0 if a_t else a_box_m,
        "B_LOADS": b_loads,
        "B_BOX_N": b_box_n,
        "SK_FLAGS_PER_BLOCK": p["consumers"],  # stream-K: a flag per consumer warpgroup of each block
        "WGMMA_K": dt.mma_k,
        # wgmma's operand types: A's and B's (FP8 of two formats differ), swapped with C^T = B^T A^T
        "WGMMA_TYPE_A": (dt.b if swap else dt).ptx_type,
        "WGMMA_TYPE_B": (dt if swap else dt.b).ptx_type,
        "TMA_TYPE": dt.tma_type,
        # 128 * (40 + consumers * REGS) must fit the SM's 64K registers
        "PRODUCER_REGS": 40,
        "CONSUMER_REGS": 232 if p["consumers"] == 2 else 240,
    }


def check(p, precision, d, variant):
    v: list[str] = []
    split, what = ("BN", "columns") if d["SWAP_AB"] else ("BM", "rows")
    if d["TF32_FRAGS"] and (variant.trans != "nn" or variant.out != "fp32"):
        a_t = ("; wgmma transposes 16-bit operands only, so A stored K x M (trans=tn, tt) takes fp16 or bf16"
               if d["A_T"] else "")
        v.append("tf32 computes trans=nn into fp32 C only so far (its B^T fragments are loaded from an N-major "
                 f"B{a_t})")
    fp8 = PRECISIONS[precision].fp8
    if fp8 and (d["TRANSPOSE_A"] or d["TRANSPOSE_B"]):
        v.append(f"{precision}'s wgmma reads A and B K-major only (8-bit types have no transpose bit): it computes "
                 f"trans=nt (B stored N x K, as torch's linear weight), not trans={variant.trans}")
    if d["A_T"] and d["SWAP_AB"] and not d["TF32_FRAGS"] and p["BM"] % 64:
        v.append(f"swap=1 reads A stored K x M (trans={variant.trans}) as wgmma's N-major B operand, in the 128-byte "
                 f"swizzle's 64-column chunks of M: BM={p['BM']} must be a multiple of 64 (BM=16 and 32 take "
                 "trans=nn or nt)")
    if p["swap"] and d["TF32_FRAGS"]:
        v.append("tf32 always computes C^T = B^T A^T (wgmma reads its operands K-major only): leave swap=0")
    if p["BM"] % 64 and not d["SWAP_AB"]:
        v.append(f"BM={p['BM']} is not a multiple of 64: it fits only with swap=1 (the rows of the tile become "
                 "wgmma's N, any multiple of 8); wgmma's M is 64 rows")
    if p["schedule"] == "pingpong":
        if p["streamk"]:
            v.append("streamk=1 shares tiles between blocks by k, which schedule=pingpong's alternating tiles do "
                     "not follow: use schedule=coop, or streamk=0")
        if p["consumers"] != 2:
            v.append(f"schedule=pingpong alternates tiles between two consumer warpgroups: consumers={p['consumers']} "
                     "must be 2")
        if d["SWAP_AB"] or p["BM"] % 64 == 0:
            divides(v, f"a consumer's tile {what} must be whole m64 wgmma tiles", split, p[split], "64", 64)
    elif d["SWAP_AB"] or p["BM"] % 64 == 0:
        divides(v, f"each consumer warpgroup's {what} must be whole m64 wgmma tiles", split, p[split],
                "64*consumers", 64 * p["consumers"])
    if d["B_T"]:  # B stored N x K: boxes of 64 rows (of N) x 128 bytes, any element size
        divides(v, "B stored N x K is loaded in boxes of 64 rows", "BN", p["BN"], "64", 64)
    else:
        divides(v, f"{precision} B stored K x N is loaded in 128-byte column chunks", "BN", p["BN"], str(d["BK"]),
                d["BK"])
    divides(v, "each block of a cluster loads an equal share of B's boxes for all", "B boxes",
            d["B_LOADS"], "cluster", p["cluster"])
    if p["abox"]:
        if d["A_T"]:
            v.append(f"abox={p['abox']} splits the tile of A stored M x K into boxes of rows; A stored K x M "
                     f"(trans={variant.trans}) arrives in boxes of 64 columns of M already: use abox=0")
        elif p["abox"] >= p["BM"] or p["BM"] % p["abox"]:
            v.append(f"abox={p['abox']} must divide BM={p['BM']} and be smaller (abox=0 loads the tile's rows as "
                     "one box)")
    if p["overlap"]:
        if d["SWAP_AB"]:
            v.append("overlap=1 staggers the TMA-store epilogue, and C^T = B^T A^T (tf32, or swap=1) stores its "
                     "registers directly: use overlap=0 there")
        if p["schedule"] == "pingpong":
            v.append("overlap=1 is for schedule=coop; schedule=pingpong overlaps whole tiles already: use "
                     "overlap=0")
        elif d["MI"] != 1:
            v.append(f"overlap=1 holds half of one m64 block of accumulators per consumer: BM/consumers = "
                     f"{d['ROWS']} must be 64")
        divides(v, "overlap=1 is tested only with tile halves of whole 64-column chunks", "BN", p["BN"], "128", 128)
    if variant.scaled:
        if not fp8:
            v.append(f"scale={variant.scale} multiplies FP8's products by fp32 scales in device memory; {precision} "
                     "scales through alpha: use scale=none")
        if variant.batched:
            v.append(f"scale={variant.scale} takes one product per launch so far (the scales have no batch strides): "
                     "use batch=none")
        if variant.scale == "block":
            if p["promote"] != 1:
                v.append(f"scale=block scales each 128 of K's sums (one k tile) before they are added: promote="
                         f"{p['promote']} must be 1")
    if p["promote"]:
        pr = f"promote={p['promote']}"
        if not fp8:
            v.append(f"{pr} adds k tiles' sums in fp32 for FP8, whose tensor cores accumulate in about 14 bits; "
                     f"{precision}'s accumulate in fp32 already: use promote=0")
        if p["overlap"]:
            v.append(f"{pr} waits for an interval's wgmmas, where overlap=1 stores a box per k tile: use overlap=0")
        if 2 * d["ACC"] > MAX_ACC_REGS:
            v.append(f"{pr} holds an interval's sums beside the accumulators: 2*{d['ACC']} = {2 * d['ACC']} "
                     f"registers per consumer thread; at most {MAX_ACC_REGS} fit (e.g. BN=128 with two consumers)")
    if d["ACC"] > MAX_ACC_REGS:
        n = "BM" if d["SWAP_AB"] else "BN"
        v.append(f"accumulators need ({split}/{'1' if p['schedule'] == 'pingpong' else 'consumers'}/64)*({n}/2) = "
                 f"{d['MI']}*{d['WGMMA_N'] // 2} = {d['ACC']} registers per consumer thread; at most {MAX_ACC_REGS} "
                 "fit beside the addressing without spilling")
    return v


def allowed(precision, variant):
    """promote: 0 for the 16-bit types and tf32 (check() refuses the rest), 1 for FP8's block scales."""
    if not PRECISIONS[precision].fp8:
        return {"promote": (0,)}
    return {"promote": (1,)} if variant.scale == "block" else {}


FAMILY = Family(
    name="hopper",
    template="hopper.cu.j2",
    doc="TMA + wgmma, warp-specialized producer/consumer warpgroups, persistent grid (sm_90a)",
    precisions=("fp16", "bf16", "tf32", "e4m3", "e4m3e5m2", "e5m2e4m3"),
    params=(
        Param("BM", BM_CHOICES, "rows of C per tile: multiples of 64 (whole m64 wgmma blocks per consumer), or with "
                                "swap=1 and for tf32 any multiple of 8 (the rows are wgmma's N), so that a tile count "
                                "fits the SMs at any M"),
        Param("BN", (64, 128, 192, 256), "columns of C per tile (the wgmma N)"),
        Param("consumers", (1, 2), "consumer warpgroups, each owning BM/consumers rows of the tile (tf32: "
                                   "BN/consumers columns)"),
        Param("stages", (2, 3, 4, 5, 6, 8, 12, 16), "shared-memory slots in the TMA -> wgmma ring (a thin tile's "
                                                    "stages are small: 12 or 16 keep more of B in flight per SM)"),
        Param("swizzle", (1, 2, 4, 8, 16), "tile order: tile rows walked together, column by column (1 = row-major; "
                                           "all of them where A is at most 16 MB)"),
        Param("schedule", ("coop", "pingpong"), "coop: the consumers split each tile's rows; pingpong: they take "
                                                 "alternate tiles, one storing while the other multiplies"),
        Param("cluster", (1, 2), "blocks per cluster, on vertically adjacent tiles: each loads its share of the "
                                 "B tile they have in common and multicasts it to both (1 = no cluster)"),
        Param("streamk", (0, 1), "1: the tiles of the last, partial wave (with the last full wave where the "
                                 "partial one is under half full; all of them where there are fewer tiles than "
                                 "SMs) are shared out by k among all blocks (stream-K), the block with a tile's "
                                 "last k tiles adding the others' partial sums; 0: every block computes whole "
                                 "tiles"),
        Param("swap", (0, 1), "1 (fp16/bf16): compute C^T = B^T A^T, the tile's rows being wgmma's N and each "
                              "consumer taking BN/consumers columns, so that thin problems (M = 16..64) need "
                              "no 64-row tiles; C stored directly. tf32 always does this (leave 0)"),
        Param("overlap", (0, 1), "1: each consumer stores the left half of a tile's C at once and holds the "
                                 "right half in registers, stored while its next tile multiplies; 0: the "
                                 "tensor cores wait for the whole store"),
        Param("promote", (0, 1, 2, 4, 8, 16), "FP8 (e4m3): the promotion interval in k tiles of 128: the tensor cores sum "
                                       "that many k tiles from zero, then the sum is added to the accumulators in "
                                       "fp32; 0 lets the tensor cores accumulate all of K in their own precision "
                                       "(fast accumulation); 16-bit types: 0"),
        Param("abox", (0, 8, 16, 32, 64, 128), "rows of A (stored M x K) per TMA box: the tile's rows arrive as "
                                               "BM/abox boxes, those wholly past M not loaded; 0: one box of BM "
                                               "rows, a partial last tile row through a map of its own rows "
                                               "(faster at every M measured)"),
    ),
    defaults={"BM": 128, "BN": 256, "consumers": 2, "stages": 4, "swizzle": 1, "schedule": "coop", "cluster": 1,
              "streamk": 0, "overlap": 0, "swap": 0, "promote": 0, "abox": 0},
    name_format="{BM}x{BN}_c{consumers}_s{stages}",
    derive=derive,
    check=check,
    allowed=allowed,
    min_cc=90,
    max_cc=90,
    min_cc_why="TMA, wgmma and setmaxnreg; built for sm_90a, whose code runs on sm_90 only",
    computes=EVERY_VARIANT,
    arch_specific=True,
    name_options=(("swizzle", "_g{swizzle}", 1), ("cluster", "_x{cluster}", 1), ("schedule", "_{schedule}", "coop"),
                  ("streamk", "_sk", 0), ("overlap", "_ov", 0), ("swap", "_sw", 0), ("promote", "_pr{promote}", 0),
                  ("abox", "_ab{abox}", 0)),
)
