"""The registry of kernel families."""

from gemmgen.describe.families import fastgemm, hopper, mma, naive, register, shared, warp, wmma
from gemmgen.describe.families.base import Family, Geometry, Param, Tma
from gemmgen.errors import InvalidParameter

_MODULES = (naive, shared, register, warp, wmma, mma, fastgemm, hopper)
FAMILIES: dict[str, Family] = {m.FAMILY.name: m.FAMILY for m in _MODULES}


def get_family(name: str) -> Family:
    """The family called ``name``; raises InvalidParameter listing the known families."""
    try:
        return FAMILIES[name.strip().lower()]
    except KeyError:
        raise InvalidParameter(f"unknown family {name!r}; families: {', '.join(FAMILIES)}") from None


__all__ = ["FAMILIES", "Family", "Geometry", "Param", "Tma", "get_family"]
