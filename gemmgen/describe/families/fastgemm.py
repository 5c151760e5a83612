"""fastgemm (the FastGeMM wiki's kernel design): the block's BM x BN tile of C lives in shared
memory, and each k step is an outer product of a column of A with a row of B.

The block's THREADS threads form BM/AV groups along M. All the threads of a group share one
"A vector": AV consecutive rows of A's column k, read from shared memory (one broadcast address
per warp) into registers and reused against every B vector the thread owns. A thread owns NB
float4 B vectors of each row of B: columns (j * TC + tc) * 4 .. + 3 for j < NB, where TC =
THREADS / (BM / AV) threads share a group, so a warp's float4 loads of B are 512 contiguous
bytes. B is loaded straight from global memory into registers, BK rows ahead of their use
(branch-free in blocks whose columns all lie inside N, through gg_load's guards at the edges).
A's BM x BK tile is staged transposed in shared memory, double-buffered.

The products are summed in registers for KC k steps and then added into the thread's part of the
C tile in shared memory (KC = 1 is the wiki's design: C is updated in shared memory at every k
step). With ``preload`` the next k step's A vector is read into a second set of registers before
the current step's multiply-adds, as the wiki describes.
"""

from gemmgen.describe.families.base import Family, Geometry, Param, cdiv, divides

A_PAD = 4  # floats at the end of each transposed row of A's tile; keeps float4 alignment
REGISTERS_PER_SM = 64 * 1024
MAX_REGISTERS = 255  # per thread
MAX_ACC = 128  # products summed in registers per thread (AV * 4 * NB)
OVERHEAD_REGISTERS = 24  # indices, pointers, loop counters, predicates (an estimate)


def derive(p, precision, variant):
    threads = p["THREADS"]
    groups = max(p["BM"] // p["AV"], 1)  # thread groups along M, one A vector each
    tc = max(threads // groups, 1)  # threads per group, along N
    nb = max(p["BN"] // (4 * tc), 1)  # float4 B vectors per thread per k step
    lda = p["BM"] + A_PAD
    a_iters = cdiv(p["BM"] * p["BK"], threads * 4)
    acc = p["AV"] * 4 * nb
    registers = (acc + p["AV"] * (2 if p["preload"] else 1) + p["BK"] * nb * 4 + a_iters * 4
                 + OVERHEAD_REGISTERS)
    return {
        "geometry": Geometry((threads, 1, 1), tile_m=p["BM"], tile_n=p["BN"],
                             smem_bytes=(p["BM"] * p["BN"] + 2 * p["BK"] * lda) * 4),
        "GROUPS": groups,
        "TC": tc,
        "NB": nb,
        "LDA": lda,
        "A_ITERS": a_iters,
        "ACC": acc,
        "REGISTERS": registers,  # estimated registers per thread
        "REGISTER_LIMIT": min(MAX_REGISTERS, REGISTERS_PER_SM // threads // 8 * 8),
    }


def check(p, precision, d, variant):
    v: list[str] = []
    divides(v, "each thread group along M holds one A vector of AV rows", "BM", p["BM"], "AV", p["AV"])
    groups, tc = d["GROUPS"], d["TC"]
    if p["BM"] % p["AV"] == 0 and (p["THREADS"] % groups or tc % 32):
        v.append(f"the threads of a warp share one A vector: THREADS/(BM/AV) = {p['THREADS']}/({p['BM']}/{p['AV']}) "
                 f"= {p['THREADS'] / groups:g} threads per A vector, must be a whole multiple of 32")
    divides(v, "each thread owns whole float4 column vectors of B", "BN", p["BN"], "4*THREADS/(BM/AV)", 4 * tc)
    divides(v, "products are added into the C tile every KC k steps, within one K tile", "BK", p["BK"], "KC",
            p["KC"])
    if v:
        return v  # the register counts below assume the thread layout above
    if d["ACC"] > MAX_ACC:
        v.append(f"register sums per thread AV*4*NB = {p['AV']}*4*{d['NB']} = {d['ACC']} exceed {MAX_ACC}")
    if d["REGISTERS"] > d["REGISTER_LIMIT"]:
        v.append(f"estimated registers per thread = {d['REGISTERS']} (sums {d['ACC']}, A vectors "
                 f"{p['AV'] * (2 if p['preload'] else 1)}, B window BK*NB*4 = {p['BK'] * d['NB'] * 4}, A staging "
                 f"{d['A_ITERS'] * 4}, other {OVERHEAD_REGISTERS}) exceed the limit of {d['REGISTER_LIMIT']} "
                 f"for {p['THREADS']} threads; it would spill")
    return v


FAMILY = Family(
    name="fastgemm",
    template="fastgemm.cu.j2",
    doc="FastGeMM design: C tile in shared memory, a broadcast A vector in registers, float4 B from global",
    precisions=("fp32",),
    params=(
        Param("BM", (8, 16, 24, 32, 48, 64, 96, 128), "rows of C per block (the wiki's m)"),
        Param("BN", (128, 256, 512, 1024, 2048), "columns of C per block (the wiki's n)"),
        Param("BK", (4, 8, 16, 32), "k steps per shared-memory tile of A, and how far ahead B is loaded"),
        Param("THREADS", (32, 64, 128, 256, 512, 1024), "threads per block"),
        Param("AV", (4, 8, 12, 16, 24, 32, 48, 64), "A-vector length: rows of C per thread"),
        Param("KC", (1, 2, 4, 8, 16, 32),
              "k steps summed in registers before they are added into the shared-memory C tile (1: every step)"),
        Param("preload", (0, 1), "1 = read the next k step's A vector into registers before this step's FMAs"),
    ),
    defaults={"BM": 24, "BN": 512, "BK": 8, "THREADS": 128, "AV": 24, "KC": 1, "preload": 1},
    name_format="{BM}x{BN}x{BK}_t{THREADS}_a{AV}_c{KC}_p{preload}",
    derive=derive,
    check=check,
)
