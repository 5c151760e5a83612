"""What a kernel family is: a template plus a small declaration of its parameters, the launch
geometry derived from them, and the constraints that are particular to it.

Constraints shared by every family (threads per block, shared memory, architecture) are applied
in :mod:`gemmgen.describe.constraints`, so a family only states what is its own.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gemmgen.describe.problem import Variant, Variants
from gemmgen.errors import InvalidParameter

Value = int | str
Params = Mapping[str, Value]



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
            value = int(raw.strip()) if re.fullmatch(r"[0-9]+", raw.strip()) else raw  # ASCII digits only
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
    which the emitted launcher builds over A (M x K) and B (K x N), or over their packed copies.

    With ``box_c``, the kernel may also store C through TMA and takes a third map, over C (fp32,
    M x N), with that box; the launcher and the kernel decide when by one rule
    (gg_tma_stores_c in common.cuh.j2).

    With ``tail_a`` (A stored M x K, one box per tile), the kernel also takes a map over A whose box
    is the rows of the last tile row (M % box rows; zeros where M is a multiple), so that no load of
    A reaches past M: a box partly outside the matrix loads far slower than a whole one
    (docs/problems.md)."""

    box_a: tuple[int, int]
    box_b: tuple[int, int]
    box_c: tuple[int, int] | None = None
    tail_a: bool = False

    @property
    def maps(self) -> tuple[str, ...]:
        """The kernel's tensor-map parameters, in order: ``tma_<name>`` for each name."""
        return ("a", "b") + (("c",) if self.box_c is not None else ()) + (("a_tail",) if self.tail_a else ())


@dataclass(frozen=True)
class Geometry:
    """What a kernel is, for its launcher to launch: threads per block, the C tile one block
    computes, and its dynamic shared memory in bytes; the grid's kind (tiles along x over N and y
    over M, ``split_k`` blocks along z sharing a tile's K range; or ``persistent``, one block per
    SM walking the tiles, in clusters of ``cluster``); whether it keeps ``stream_k`` state, packs
    misaligned operands (``pack_vec``) or loads through ``tma``.

    These are facts of the kernel, rendered into its source. The rules that turn them into a launch
    at a given M, N, K -- the grid, the workspace (split-K counters and partial tiles, stream-K flags
    and slots, packed operands), which shapes are refused -- live in one place: the emitted
    launcher (gg_describe in base.cu.j2), which gemmgen's runtime calls too.
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
    stream_k: bool = False  # persistent: the last partial wave's tiles shared out by k

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True, eq=False)  # families are singletons: compared and hashed by identity
class Family:
    """One algorithm family: a template in templates/ and the rules of its parameter space.

    ``derive(params, precision, variant)`` returns the constants the template needs, including
    ``geometry``, for the problem variant ``variant`` (gemmgen.describe.problem.Variant; one of
    ``computes``, which a family that computes only the default ignores); it must not fail on a
    point that violates constraints (it may give nonsense there: ``check`` reports the point first).
    ``check(params, precision, derived, variant)`` returns one human-readable line per violated
    family-specific constraint, with the values involved.
    ``computes`` declares the variants the template computes (gemmgen.describe.problem.Variants): the
    default alone unless it says more; gemmgen.describe.constraints refuses the others in one line a key.
    ``name_format`` builds the canonical name's middle part from the parameters (gemmgen.describe.names).
    ``name_options`` lists parameters that join the name only away from their neutral value:
    (parameter, format, neutral value), appended in order after ``name_format``; a format without
    a field is a flag, for a parameter of two values. Parameters added
    to a family later go here, so that the names of existing points do not change.
    ``allowed(precision, variant)`` gives, for some parameters, the only values ``check`` can take
    in that precision and variant (hopper: ``promote`` 0 for 16-bit types, 1 for block scales), so
    that a search narrows its space to them instead of drawing points that cannot be built.
    """

    name: str
    template: str
    doc: str
    precisions: tuple[str, ...]
    params: tuple[Param, ...]
    defaults: dict[str, Value]
    name_format: str
    derive: Callable[[Params, str, Variant], dict]
    check: Callable[[Params, str, dict, Variant], list[str]]
    requires: str = "any M, N, K >= 1"
    min_cc: int = 0  # lowest compute capability the template's instructions need
    min_cc_why: str = ""  # which instructions need min_cc (and max_cc)
    max_cc: int = 0  # highest compute capability the code runs on; 0: no limit
    arch_specific: bool = False  # built for the "a" target (sm_90a): its code runs on that cc alone
    name_options: tuple[tuple[str, str, Value], ...] = ()
    computes: Variants = Variants()
    allowed: Callable[[str, Variant], dict[str, tuple]] = lambda precision, variant: {}

    def __post_init__(self):
        for param, fmt, neutral in self.name_options:
            assert self.defaults[param] == neutral, f"{self.name}: {param}'s default must be its neutral value"
            assert "{" in fmt or len(self.param(param).choices) == 2, f"{self.name}: flag {fmt} needs a two-valued {param}"

    def runs_on(self, cc: int) -> bool:
        """Whether the family's code can target compute capability ``cc`` (min_cc..max_cc)."""
        return cc >= self.min_cc and (not self.max_cc or cc <= self.max_cc)

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
