"""shared (FastCuda V2): TILE x TILE shared-memory tiles, one output per thread."""

from gemmgen.describe.families.base import Family, Geometry, Param


def derive(p, precision, variant):
    t, pad = p["TILE"], p["PAD"]
    return {
        "geometry": Geometry((t, t, 1), tile_m=t, tile_n=t, smem_bytes=2 * t * (t + pad) * 4),
        "LD": t + pad,
    }


def check(p, precision, d, variant):
    return []


FAMILY = Family(
    name="shared",
    template="shared.cu.j2",
    doc="TILE x TILE tiles of A and B staged in shared memory; one output per thread",
    precisions=("fp32",),
    params=(
        Param("TILE", (4, 8, 16, 32), "tile edge; the block is TILE x TILE threads"),
        Param("PAD", (0, 1, 2, 4), "extra floats at the end of each shared-memory row"),
    ),
    defaults={"TILE": 32, "PAD": 1},
    name_format="t{TILE}_p{PAD}",
    derive=derive,
    check=check,
)
