"""Every constraint a point must meet, checked in one place before anything is rendered.

The family declares the constraints particular to it (``Family.check``); the ones that hold for
every family live here: the variants the family computes (its declared ``computes``), precision
and family support on the target, threads per block, shared memory per block.
"""

from gemmgen.describe.arch import MAX_THREADS_PER_BLOCK, Arch
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families.base import Family, Params
from gemmgen.describe.problem import Variant


def violations(family: Family, params: Params, variant: Variant, precision: str, arch: Arch,
               derived: dict) -> list[str]:
    """Every violated constraint of the point, one line each with its values; [] if it is valid."""
    found = [f"family {family.name} computes {line}" for line in family.computes.refused(variant)]
    found += family.check(params, precision, derived, variant)
    geometry = derived["geometry"]
    need = PRECISIONS[precision].min_cc
    if arch.cc < need:
        found.append(f"{precision} needs sm_{need} or newer; target is {arch.name}")
    if not family.runs_on(arch.cc):
        if family.max_cc == family.min_cc:
            supported = f"runs on sm_{family.min_cc} only"
        elif arch.cc < family.min_cc:
            supported = f"needs sm_{family.min_cc} or newer"
        else:
            supported = f"runs on sm_{family.max_cc} or older"
        found.append(f"family {family.name} {supported} ({family.min_cc_why}); target is {arch.name}")
    if geometry.threads > MAX_THREADS_PER_BLOCK:
        found.append(f"threads per block = {geometry.threads} exceeds {MAX_THREADS_PER_BLOCK}")
    if geometry.threads < 1:
        found.append(f"threads per block = {geometry.threads} must be at least 1")
    if geometry.smem_bytes > arch.max_smem_per_block:
        found.append(f"shared memory = {geometry.smem_bytes} bytes exceeds {arch.name}'s limit of "
                     f"{arch.max_smem_per_block} bytes per block")
    return found
