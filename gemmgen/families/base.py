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
class Geometry:
    """Launch geometry of a kernel: threads per block, the C tile one block computes, and its
    dynamic shared memory in bytes. The grid covers C with tiles: x over N, y over M."""

    block: tuple[int, int, int]
    tile_m: int
    tile_n: int
    smem_bytes: int

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        return (-(-n // self.tile_n), -(-m // self.tile_m), 1)


@dataclass(frozen=True, eq=False)  # families are singletons: compared and hashed by identity
class Family:
    """One algorithm family: a template in templates/ and the rules of its parameter space.

    ``derive(params, precision)`` returns the constants the template needs, including
    ``geometry``; it must not fail on a point that violates constraints (it may give nonsense
    there: ``check`` reports the point first).
    ``check(params, precision, derived)`` returns one human-readable line per violated
    family-specific constraint, with the values involved.
    ``name_format`` builds the canonical name's middle part from the parameters.
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
