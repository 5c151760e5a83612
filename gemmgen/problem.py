"""Problem shapes: M x N x K as typed on the command line."""

import re
from dataclasses import dataclass

from gemmgen.errors import InvalidParameter

MAX_DIM = 2**31 - 1  # M, N and K are C ints in every launcher (and in cuBLAS)


@dataclass(frozen=True, order=True)
class Shape:
    m: int
    n: int
    k: int

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def bytes_moved(self, element_bytes: int, c_bytes: int = 4) -> int:
        """The least memory traffic of C = A @ B: A and B (elements of ``element_bytes``) read once
        and C (elements of ``c_bytes``) written once. Thin products are bound by it, not by flops."""
        return (self.m * self.k + self.k * self.n) * element_bytes + self.m * self.n * c_bytes


def parse_shape(text: str) -> Shape:
    """``4096`` (a cube) or ``MxNxK``; raises InvalidParameter on anything else."""
    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+", raw):
        side = int(raw)
        dims = (side, side, side)
    elif m := re.fullmatch(r"(\d+)x(\d+)x(\d+)", raw):
        dims = tuple(int(g) for g in m.groups())
    else:
        raise InvalidParameter(f"cannot read shape {text!r}; write MxNxK (e.g. 4095x4097x4093) or one number "
                               "for a cube (e.g. 4096)")
    if min(dims) < 1:
        raise InvalidParameter(f"shape {text!r}: M, N and K must be >= 1")
    if max(dims) > MAX_DIM:
        raise InvalidParameter(f"shape {text!r}: M, N and K must be <= {MAX_DIM} (2^31 - 1): kernels and cuBLAS take "
                               "them as 32-bit integers")
    return Shape(*dims)
