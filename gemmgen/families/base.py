"""What a kernel family is: a template plus a small declaration of its parameters, the launch
geometry derived from them, and the constraints that are particular to it.

Constraints shared by every family (threads per block, shared memory, architecture) are applied
in :mod:`gemmgen.constraints`, so a family only states what is its own.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gemmgen.errors import InvalidParameter

Value = int | str
Params = Mapping[str, Value]

# Precision name -> (C type of A and B in global memory, bytes per element).
ELEMENT_TYPES = {
    "fp32": ("float", 4),
    "tf32": ("float", 4),
    "fp16": ("__half", 2),
    "bf16": ("__nv_bfloat16", 2),
}


@dataclass(frozen=True)
class Param:
    """A tunable parameter and its allowed values (integers or short lowercase words)."""

    name: str
    choices: tuple[Value, ...]
    doc: str

    def parse(self, raw: object) -> Value:
        """Turn a command-line string or a Python value into an allowed value.

        Raises InvalidParameter naming the parameter and its allowed values.
        """
        allowed = ", ".join(str(c) for c in self.choices)
        is_int = isinstance(self.choices[0], int)
        value: object = raw
        if is_int and isinstance(raw, str):
            value = int(raw.strip()) if re.fullmatch(r"\d+", raw.strip()) else raw
        elif isinstance(raw, str):
            value = raw.strip().lower()
        if isinstance(value, bool) or value not in self.choices or type(value) is not type(self.choices[0]):
            raise InvalidParameter(f"{self.name}={raw!r} is not allowed; {self.name} must be one of: {allowed}")
        return value  # type: ignore[return-value]


@dataclass(frozen=True)
class Tma:
    """How a kernel loads A and B through the tensor memory accelerator: the box (tile) of each
    tensor map, {inner, outer} in elements, always with the 128-byte swizzle and zero fill outside
    the matrix. The maps are the kernel's first two parameters (``__grid_constant__ CUtensorMap``),
    built at launch over A (M x K) and B (K x N), or over their packed copies in the workspace.

    With ``box_c``, the kernel also stores C through TMA and takes a third map, over C (fp32,
    M x N, leading dimension N), with that box. The map can exist only where :meth:`stores_c`
    holds (beta == 0, so C is not read; 16-byte rows and base); elsewhere the launch passes 128
    zero bytes instead, and the kernel, deciding by the same rule, stores C directly."""

    box_a: tuple[int, int]
    box_b: tuple[int, int]
    box_c: tuple[int, int] | None = None

    def stores_c(self, n: int, beta: float, c_ptr: int) -> bool:
        """Whether a launch with this N, beta (as the kernel's float32) and C's address stores C
        through TMA: gg_tma_stores_c in common.cuh.j2, which the kernel and the launcher use."""
        return self.box_c is not None and beta == 0.0 and n % 4 == 0 and c_ptr % 16 == 0


# Stream-K kernels keep a 4-byte flag per block and consumer warpgroup (at most 2) at the start of
# their workspace, for grids of at most STREAM_K_MAX_BLOCKS blocks (more SMs than any GPU has).
STREAM_K_MAX_BLOCKS = 1024
STREAM_K_FLAG_BYTES = STREAM_K_MAX_BLOCKS * 2 * 4


@dataclass(frozen=True)
class Geometry:
    """Launch geometry of a kernel: threads per block, the C tile one block computes, and its
    dynamic shared memory in bytes. The grid covers C with tiles: x over N, y over M, and z over
    the ``split_k`` parts of the K range (1: no split).

    Every kernel takes a trailing ``unsigned int* workspace`` argument. A kernel with
    ``split_k`` > 1 needs ``workspace_bytes(m, n)`` there (common.cuh.j2's gg_splitk_reduce): one
    counter per C tile, which must be zero before the first launch (each launch leaves them zero),
    then every split's partial tile. A persistent ``stream_k`` kernel needs
    ``workspace_bytes(m, n, blocks)``: a flag per block and consumer warpgroup, zero before the
    first launch (each launch leaves them zero), then a partial tile per block. Other kernels get
    the packed operands there (``pack_vec``, non-TMA kernels) or a null pointer.
    """

    block: tuple[int, int, int]
    tile_m: int
    tile_n: int
    smem_bytes: int
    split_k: int = 1
    pack_vec: int = 0  # elements per 16 bytes where misaligned operands are packed first; 0: never
    persistent: bool = False  # grid = min(tiles, SMs) blocks along x, each looping over tiles
    cluster: int = 1  # blocks per cluster (along x; persistent kernels), working on adjacent tiles
    tma: Tma | None = None
    stream_k: bool = False  # persistent: the last partial wave's tiles shared out by k (workspace below)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        """The C tiles: (ceil(N / tile_n), ceil(M / tile_m), split_k)."""
        return (-(-n // self.tile_n), -(-m // self.tile_m), self.split_k)

    def launch_grid(self, m: int, n: int, resident: int) -> tuple[int, int, int]:
        """The grid to launch: :meth:`grid`, or for a persistent kernel as many blocks along x as
        can run at once (``resident``: the SM count, or with clusters of c blocks, c times the
        number of clusters that fit), at most one per tile (with clusters: c per c tile rows of a
        tile column). More would make a second wave of whole persistent blocks."""
        if not self.persistent:
            return self.grid(m, n)
        gx, gy, _ = self.grid(m, n)
        c = self.cluster  # a cluster takes c tile rows of one tile column at a time
        blocks = min(resident, STREAM_K_MAX_BLOCKS) if self.stream_k else resident  # its flags' room
        return (min(-(-gy // c) * gx, blocks // c) * c, 1, 1)

    def workspace_bytes(self, m: int, n: int, blocks: int = 0) -> int:
        """Bytes of workspace a launch at M x N needs (``blocks``: a persistent launch's grid, see
        :meth:`launch_grid`); 0 without split-K or stream-K. With split-K, per C tile: a 4-byte
        counter (the counters padded to 16 bytes together) and ``split_k`` fp32 partial tiles of
        tile_m x tile_n. With stream-K: STREAM_K_FLAG_BYTES of flags (always the same room, so a
        larger grid never finds anything but zeros there), then a tile_m x tile_n fp32 partial
        tile per block."""
        if self.stream_k:
            return STREAM_K_FLAG_BYTES + blocks * self.tile_m * self.tile_n * 4
        if self.split_k == 1:
            return 0
        gx, gy, _ = self.grid(m, n)
        tiles = gx * gy
        return 4 * (-(-tiles // 4) * 4) + tiles * self.split_k * self.tile_m * self.tile_n * 4

    def pack_plan(self, m: int, n: int, k: int, a_ptr: int, b_ptr: int) -> tuple[int, int]:
        """Bytes of workspace for the packed copies of A and of B (0: that operand is read in
        place). A kernel with ``pack_vec`` reads an operand whose rows are not 16-byte aligned
        (K, or N, not a multiple of pack_vec, or the pointer not 16-byte aligned) from a
        zero-padded copy that a pack kernel writes first: A as M x roundup(K, pack_vec), B as
        K x roundup(N, pack_vec), A's copy first, each rounded up to 256 bytes. The same rule is
        gg_pack_plan in common.cuh.j2."""
        if not self.pack_vec:
            return 0, 0
        v, esize = self.pack_vec, 16 // self.pack_vec

        def copy_bytes(rows: int, cols: int) -> int:
            return -(-rows * self.packed_ld(cols) * esize // 256) * 256

        a = 0 if k % v == 0 and a_ptr % 16 == 0 else copy_bytes(m, k)
        b = 0 if n % v == 0 and b_ptr % 16 == 0 else copy_bytes(k, n)
        return a, b

    def packed_ld(self, cols: int) -> int:
        """The leading dimension of a packed copy whose rows hold ``cols`` elements: cols rounded
        up to a multiple of pack_vec (16 bytes)."""
        return -(-cols // self.pack_vec) * self.pack_vec


@dataclass(frozen=True, eq=False)  # families are singletons: compared and hashed by identity
class Family:
    """One algorithm family: a template in templates/ and the rules of its parameter space.

    ``derive(params, precision)`` returns the constants the template needs, including
    ``geometry``; it must not fail on a point that violates constraints (it may give nonsense
    there: ``check`` reports the point first).
    ``check(params, precision, derived)`` returns one human-readable line per violated
    family-specific constraint, with the values involved.
    ``name_format`` builds the canonical name's middle part from the parameters.
    ``name_options`` lists parameters that join the name only away from their neutral value:
    (parameter, format, neutral value), appended in order after ``name_format``; a format without
    a field is a flag, for a parameter of two values. Parameters added
    to a family later go here, so that the names of existing points do not change.
    """

    name: str
    template: str
    doc: str
    precisions: tuple[str, ...]
    params: tuple[Param, ...]
    defaults: dict[str, Value]
    name_format: str
    derive: Callable[[Params, str], dict]
    check: Callable[[Params, str, dict], list[str]]
    requires: str = "any M, N, K >= 1"
    min_cc: int = 0  # lowest compute capability the template's instructions need
    min_cc_why: str = ""  # which instructions need min_cc (and max_cc)
    max_cc: int = 0  # highest compute capability the code runs on; 0: no limit
    arch_specific: bool = False  # built for the "a" target (sm_90a): its code runs on that cc alone
    name_options: tuple[tuple[str, str, Value], ...] = ()

    def __post_init__(self):
        for param, fmt, neutral in self.name_options:
            assert self.defaults[param] == neutral, f"{self.name}: {param}'s default must be its neutral value"
            assert "{" in fmt or len(self.param(param).choices) == 2, f"{self.name}: flag {fmt} needs a two-valued {param}"

    def runs_on(self, cc: int) -> bool:
        """Whether the family's code can target compute capability ``cc`` (min_cc..max_cc)."""
        return cc >= self.min_cc and (not self.max_cc or cc <= self.max_cc)

    def name_middle(self, params: Params) -> str:
        """The canonical name's middle part: ``name_format``, then each ``name_options`` part
        whose parameter is away from its neutral value."""
        text = self.name_format.format(**params)
        for param, fmt, neutral in self.name_options:
            if params[param] != neutral:
                text += fmt.format(**params)
        return text

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name.lower() == name.lower():
                return p
        raise InvalidParameter(
            f"family {self.name!r} has no parameter {name!r}; its parameters are: "
            + ", ".join(p.name for p in self.params)
        )


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def divides(violations: list[str], what: str, a_name: str, a: int, b_name: str, b: int) -> None:
    """Append a violation unless ``b`` divides ``a``."""
    if b == 0 or a % b:
        violations.append(f"{what}: {a_name}={a} must be a multiple of {b_name}={b}")
