"""KernelConfig: one validated point of a family's space, and its canonical name.

Its canonical name (e.g. ``warp_128x128x8_w64x32_t8x8_b2_fp32``) is gemmgen.describe.names': built from
every parameter, the precision and the variant, and read back there.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from gemmgen.describe import constraints, names
from gemmgen.describe.arch import Arch, parse_arch
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families import Family, Geometry, get_family
from gemmgen.describe.problem import Variant, split_variant
from gemmgen.errors import InvalidParameter, InvalidPoint

DEFAULT_ARCH = "sm_90"


@dataclass(frozen=True)
class KernelConfig:
    """A valid point: family, precision, target architecture, every parameter's value and the
    problem variant (layouts of A and B, type of C).

    Build one with :func:`make_config`, which validates it.
    """

    family: Family
    precision: str
    arch: Arch
    values: tuple[tuple[str, int | str], ...]  # in the family's parameter order
    variant: Variant = Variant()

    @property
    def params(self) -> dict[str, int | str]:
        """The family's parameters (not the variant)."""
        return dict(self.values)

    @property
    def name(self) -> str:
        return names.kernel_name(self.family, self.params, self.precision, self.variant)

    @cached_property
    def derived(self) -> dict:
        return self.family.derive(self.params, self.precision, self.variant)

    @property
    def geometry(self) -> Geometry:
        return self.derived["geometry"]

    @property
    def build_arch(self) -> Arch:
        """The target nvcc builds for: ``arch``, or its architecture-specific form (sm_90a) for a
        family that needs one."""
        if self.family.arch_specific and not self.arch.suffix:
            return Arch(self.arch.cc, self.arch.max_smem_per_block, "a")
        return self.arch

    @property
    def element_type(self) -> str:
        """C type of A (and of B, but for FP8 of two formats): float, __half, __nv_bfloat16,
        __nv_fp8_e4m3 or __nv_fp8_e5m2."""
        return PRECISIONS[self.precision].c_type

    @property
    def element_type_b(self) -> str:
        """C type of B: element_type's, but for FP8 of two formats (gemmgen.describe.dtypes.Precision.b)."""
        return PRECISIONS[self.precision].b.c_type

    @property
    def output_type(self) -> str:
        """C type of C: float, __half or __nv_bfloat16."""
        return PRECISIONS[self.variant.out].c_type

    @property
    def cuda_headers(self) -> tuple[str, ...]:
        """The CUDA headers that declare the types of A, B and C (cuda_fp16.h, cuda_bf16.h), each
        once: an emitted file includes those only (each adds about 0.7 s to an nvcc build)."""
        return tuple(dict.fromkeys(h for n in (self.precision, self.variant.out) if (h := PRECISIONS[n].header)))


def make_config(family: str | Family, params: Mapping[str, object] | None = None,
                precision: str | None = None, arch: str | Arch = DEFAULT_ARCH,
                variant: Variant | None = None) -> KernelConfig:
    """Validate a point and return its KernelConfig.

    ``params`` may give any subset of the family's parameters (names are case-insensitive;
    values may be strings as typed on a command line); the rest take the family's defaults.
    The problem variant is ``variant``; or, where that is not given, the variant keys of ``params``
    (as ``--set`` and a canonical name give them: ``trans=nt``, ``out=bf16``, ...), the rest the
    default. ``precision`` defaults to the family's first precision.

    Raises InvalidParameter for an unknown family, parameter, precision or architecture or a value
    outside a parameter's allowed set, and InvalidPoint listing every violated constraint.
    """
    fam = family if isinstance(family, Family) else get_family(family)
    target = arch if isinstance(arch, Arch) else parse_arch(arch)
    prec = (precision or fam.precisions[0]).strip().lower()
    if prec not in fam.precisions:
        raise InvalidParameter(
            f"family {fam.name!r} does not take precision {precision!r}; allowed: {', '.join(fam.precisions)}")
    values = dict(fam.defaults)
    given, named = split_variant(dict(params or {}))
    if variant is None:
        variant = named
    elif len(given) < len(params or {}):
        raise ValueError("make_config takes the variant once: as variant= or as keys of params, not both")
    for raw_name, raw_value in given.items():
        p = fam.param(str(raw_name))
        values[p.name] = p.parse(raw_value)
    config = KernelConfig(fam, prec, target, tuple((p.name, values[p.name]) for p in fam.params), variant)
    found = constraints.violations(fam, config.params, variant, prec, target, config.derived)
    if found:
        raise InvalidPoint(config.name, found)
    return config


def parse_assignments(text: str) -> dict[str, str]:
    """Parse ``BM=128,BN=64`` into {"BM": "128", "BN": "64"}; raises InvalidParameter if malformed,
    if a parameter is given twice (names are case-insensitive, as in make_config), or if it gives
    none (``--set ','`` would set nothing)."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidParameter(f"cannot read {item!r} in --set; write NAME=VALUE pairs separated by commas, "
                                   "e.g. --set BM=128,BN=64")
        twice = next((given for given in out if given.lower() == name.strip().lower()), None)
        if twice is not None:
            raise InvalidParameter(f"--set gives {twice} twice ({twice}={out[twice]} and {name.strip()}={value.strip()}); "
                                   "give each parameter once")
        out[name.strip()] = value.strip()
    if not out:
        raise InvalidParameter(f"--set {text!r} gives no NAME=VALUE pair; write e.g. --set BM=128,BN=64")
    return out
