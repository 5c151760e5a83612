"""register (FastCuda V3): each thread accumulates a TM x TN tile of C in registers.

A is staged row-major in shared memory (BM x BK, rows padded by PAD floats), B as BK x BN.
``layout`` places a thread's TM x TN outputs either contiguously (``contig``) or strided by the
thread grid (``strided``, as in the CUDA-007 blog). ``vec`` is the global-load width in floats.
"""

from gemmgen.describe.families.base import Family, Geometry, Param, cdiv, divides


def derive(p, precision, variant):
    tx, ty = max(p["BN"] // p["TN"], 1), max(p["BM"] // p["TM"], 1)
    threads = tx * ty
    vec = p["vec"]
    contig = p["layout"] == "contig"
    store_vec = next(w for w in (4, 2, 1) if p["TN"] % w == 0) if contig else 1
    return {
        "geometry": Geometry((threads, 1, 1), tile_m=p["BM"], tile_n=p["BN"],
                             smem_bytes=(p["BM"] * (p["BK"] + p["PAD"]) + p["BK"] * p["BN"]) * 4),
        "TX": tx,
        "TY": ty,
        "LDA": p["BK"] + p["PAD"],
        "A_ITERS": cdiv(p["BM"] * p["BK"], threads * vec),
        "B_ITERS": cdiv(p["BK"] * p["BN"], threads * vec),
        "STORE_VEC": store_vec,
        "B_SMEM_VEC": store_vec,
    }


def check(p, precision, d, variant):
    v: list[str] = []
    divides(v, "thread tile must divide block tile", "BM", p["BM"], "TM", p["TM"])
    divides(v, "thread tile must divide block tile", "BN", p["BN"], "TN", p["TN"])
    divides(v, "global loads of A are vec wide along K", "BK", p["BK"], "vec", p["vec"])
    divides(v, "global loads of B are vec wide along N", "BN", p["BN"], "vec", p["vec"])
    return v


FAMILY = Family(
    name="register",
    template="register.cu.j2",
    doc="register blocking: a TM x TN output tile per thread, optional float4 global loads",
    precisions=("fp32",),
    params=(
        Param("BM", (16, 32, 64, 128, 256), "rows of C per block"),
        Param("BN", (16, 32, 64, 128, 256), "columns of C per block"),
        Param("BK", (4, 8, 16, 32, 64), "depth of one K step staged in shared memory"),
        Param("TM", (1, 2, 4, 8, 16), "rows of C per thread"),
        Param("TN", (1, 2, 4, 8, 16), "columns of C per thread"),
        Param("layout", ("contig", "strided"), "a thread's outputs: contiguous, or strided by the thread grid"),
        Param("vec", (1, 4), "global-load width in floats (4 = float4 where shape and alignment allow)"),
        Param("PAD", (0, 1, 2, 4), "extra floats at the end of each shared-memory row of A"),
    ),
    defaults={"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "layout": "contig", "vec": 4, "PAD": 0},
    name_format="{BM}x{BN}x{BK}_t{TM}x{TN}_{layout}_v{vec}_p{PAD}",
    derive=derive,
    check=check,
)
