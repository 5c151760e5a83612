"""wmma (FastCuda V5, V6): tensor cores through nvcuda::wmma, FP32 accumulate and output.

Fragments are 16x16x8 for tf32 and 16x16x16 for fp16/bf16. The block's WARPS_M x WARPS_N warps
each own a (BM/WARPS_M) x (BN/WARPS_N) tile of C, i.e. FM x FN accumulator fragments. A (BM x BK)
and B (BK x BN) are staged row-major in shared memory, rows padded by PAD elements; the
accumulators are staged through shared memory for a guarded, vectorized epilogue.
"""

from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families.base import Family, Geometry, Param, cdiv, divides

C_PAD = 4  # floats per staged C row; store_matrix_sync needs a multiple of 4
MAX_ACC_REGS = 128


def derive(p, precision, variant):
    esize = PRECISIONS[precision].bytes
    threads = 32 * p["WARPS_M"] * p["WARPS_N"]
    vec = 16 // esize
    lda, ldb, ldc = p["BK"] + p["PAD"], p["BN"] + p["PAD"], p["BN"] + C_PAD
    smem_ab = (p["BM"] * lda + p["BK"] * ldb) * esize
    smem_c = p["BM"] * ldc * 4
    return {
        "geometry": Geometry((threads, 1, 1), tile_m=p["BM"], tile_n=p["BN"], smem_bytes=max(smem_ab, smem_c)),
        "FRAG_K": PRECISIONS[precision].mma_k,
        "FM": max(p["BM"] // p["WARPS_M"] // 16, 1),
        "FN": max(p["BN"] // p["WARPS_N"] // 16, 1),
        "VEC": vec,
        "LDA": lda,
        "LDB": ldb,
        "LDC": ldc,
        "B_OFFSET": p["BM"] * lda,  # elements from the start of A's tile to B's
        "A_ITERS": cdiv(p["BM"] * p["BK"], threads * vec),
        "B_ITERS": cdiv(p["BK"] * p["BN"], threads * vec),
        "C_ITERS": cdiv(p["BM"] * p["BN"], threads * 4),
    }


def check(p, precision, d, variant):
    v: list[str] = []
    divides(v, "each warp's rows must be whole 16-row fragments", "BM", p["BM"], "16*WARPS_M", 16 * p["WARPS_M"])
    divides(v, "each warp's columns must be whole 16-column fragments", "BN", p["BN"], "16*WARPS_N",
            16 * p["WARPS_N"])
    divides(v, f"a {precision} fragment is {d['FRAG_K']} deep", "BK", p["BK"], "fragment K", d["FRAG_K"])
    acc_regs = d["FM"] * d["FN"] * 8  # a 16x16 fp32 accumulator fragment is 8 registers per thread
    if acc_regs > MAX_ACC_REGS:
        v.append(f"accumulators need FM*FN*8 = {d['FM']}*{d['FN']}*8 = {acc_regs} registers per thread; "
                 f"at most {MAX_ACC_REGS} leave room for the fragments of A and B without spilling")
    esize = PRECISIONS[precision].bytes
    if (p["PAD"] * esize) % 16:
        v.append(f"wmma needs shared-memory rows in multiples of 16 bytes: PAD={p['PAD']} {precision} elements "
                 f"= {p['PAD'] * esize} bytes, must be a multiple of 16")
    return v


FAMILY = Family(
    name="wmma",
    template="wmma.cu.j2",
    doc="tensor cores through nvcuda::wmma (tf32, fp16, bf16 inputs; fp32 accumulate and output)",
    precisions=("tf32", "fp16", "bf16"),
    params=(
        Param("BM", (16, 32, 64, 128, 256), "rows of C per block"),
        Param("BN", (16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", (8, 16, 32, 64), "depth of one K step staged in shared memory"),
        Param("WARPS_M", (1, 2, 4, 8), "warps along M"),
        Param("WARPS_N", (1, 2, 4, 8), "warps along N"),
        Param("PAD", (0, 4, 8, 16), "extra elements at the end of each shared-memory row of A and B"),
    ),
    defaults={"BM": 64, "BN": 64, "BK": 16, "WARPS_M": 2, "WARPS_N": 2, "PAD": 8},
    name_format="{BM}x{BN}x{BK}_w{WARPS_M}x{WARPS_N}_p{PAD}",
    derive=derive,
    check=check,
)
