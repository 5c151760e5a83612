"""Canonical kernel names, built and read back in one place.

A name is ``<family>_<middle>_<precision><variant>``, e.g. ``warp_128x128x8_w64x32_t8x8_b2_fp32``
or ``hopper_128x256_c2_s4_g8_bf16_nt_obf16``: the middle from the family's ``name_format``, then
each of its ``name_options`` whose parameter is away from its neutral value; the variant's part
from gemmgen.describe.problem.FIELDS, each key only away from its default. It names the kernel everywhere:
its symbol in the emitted source, the build-cache key (with the target) and the database key.

:func:`kernel_name` builds it; :func:`parse_name` reads it back (family, precision, parameters
as text, variant); :func:`variant_of` reads only the variant part, of any stored kernel's name
(cuBLAS's ``cublas_<precision><variant>`` too).
"""

import re
from functools import lru_cache

from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families import FAMILIES, Family
from gemmgen.describe.families.base import Params
from gemmgen.describe.problem import FIELDS, VARIANT_KEYS, Variant

#: The variant part of a name, as a regular expression: a group per key (its word), each optional.
VARIANT_PATTERN = "".join(f.name_pattern() for f in FIELDS)


def middle(family: Family, params: Params) -> str:
    """The name's middle part: ``name_format``, then each ``name_options`` part whose parameter is
    away from its neutral value."""
    text = family.name_format.format(**params)
    for param, fmt, neutral in family.name_options:
        if params[param] != neutral:
            text += fmt.format(**params)
    return text


def kernel_name(family: Family, params: Params, precision: str, variant: Variant) -> str:
    """The canonical name of a point (parse_name reads it back)."""
    return f"{family.name}_{middle(family, params)}_{precision}{variant.suffix}"


def _variant(groups: dict) -> Variant:
    """The Variant of a match of VARIANT_PATTERN (groups of other names are ignored)."""
    return Variant(**{f.key: f.name_value(groups[f.key]) for f in FIELDS if groups.get(f.key)})


def _fields(fmt: str, family: Family) -> str:
    """A name format as a regular expression: each {param} becomes a named group: any number for
    a numeric parameter (make_config then names a bad value), one of its words for a word-valued
    one (so that a word is never mistaken for a flag option such as ``_sk``)."""
    def group(m: re.Match) -> str:
        choices = family.param(m.group(1)).choices
        if isinstance(choices[0], int):
            return f"(?P<{m.group(1)}>[0-9]+)"
        return f"(?P<{m.group(1)}>{'|'.join(map(re.escape, sorted(choices, key=len, reverse=True)))})"
    return re.sub(r"\\\{(\w+)\\\}", group, re.escape(fmt))


@lru_cache(maxsize=None)
def _pattern(family: Family) -> re.Pattern:
    # an option without a {field} is a flag: its parameter's one non-neutral value
    optional = "".join(f"(?:{_fields(fmt, family)})?" if "{" in fmt else f"(?P<{param}>{re.escape(fmt)})?"
                       for param, fmt, _ in family.name_options)
    return re.compile(f"{family.name}_{_fields(family.name_format, family)}{optional}_(?P<precision>[a-z0-9]+)"
                      f"{VARIANT_PATTERN}")


def parse_name(name: str) -> tuple[Family, str, dict[str, str], Variant] | None:
    """(family, precision, every parameter as text, variant) of a canonical name, not validated
    (make_config does that); None where ``name`` is not one. A parameter of ``name_options`` left
    out of the name is its neutral value."""
    for family in FAMILIES.values():
        m = _pattern(family).fullmatch(name.strip())
        if m is None:
            continue
        groups = m.groupdict()
        params = {key: value for key, value in groups.items() if key != "precision" and key not in VARIANT_KEYS}
        for param, fmt, neutral in family.name_options:
            if params[param] is None:
                params[param] = str(neutral)
            elif "{" not in fmt:  # a flag: the parameter's one non-neutral value
                params[param] = str(next(c for c in family.param(param).choices if c != neutral))
        return family, groups["precision"], params, _variant(groups)
    return None


_NAME_VARIANT = re.compile(f"_(?:{'|'.join(PRECISIONS)}){VARIANT_PATTERN}$")


@lru_cache(maxsize=4096)  # a database's rows name a few thousand kernels, each many times
def variant_of(name: str) -> Variant:
    """The variant a stored kernel's name (a canonical name, or cuBLAS's ``cublas_<precision>...``)
    says it computes: the part after its precision; the default where there is none."""
    found = _NAME_VARIANT.search(name)
    return Variant() if found is None else _variant(found.groupdict())

