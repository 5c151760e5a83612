"""naive (FastCuda V1): one thread per element of C, a BX x BY thread block."""

from gemmgen.describe.families.base import Family, Geometry, Param

POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def derive(p, precision, variant):
    return {"geometry": Geometry((p["BX"], p["BY"], 1), tile_m=p["BY"], tile_n=p["BX"], smem_bytes=0)}


def check(p, precision, d, variant):
    return []


FAMILY = Family(
    name="naive",
    template="naive.cu.j2",
    doc="one thread per output element; the block shape is the only parameter",
    precisions=("fp32",),
    params=(
        Param("BX", POW2, "threads per block along N (columns of C)"),
        Param("BY", POW2, "threads per block along M (rows of C)"),
    ),
    defaults={"BX": 16, "BY": 16},
    name_format="b{BX}x{BY}",
    derive=derive,
    check=check,
)
