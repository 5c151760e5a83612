"""Every constraint a point must meet, checked in one place before anything is rendered.

The family declares the constraints particular to it (``Family.check``); the ones that hold for
every family live here: precision and family support on the target, threads per block, shared
memory per block.
"""

from gemmgen.describe.arch import MAX_THREADS_PER_BLOCK, Arch
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.families.base import Family, Params


def violations(family: Family, params: Params, precision: str, arch: Arch, derived: dict) -> list[str]:
    """Every violated constraint of the point, one line each with its values; [] if it is valid.
    ``params`` holds the variant too (``trans``, ``out``, ``bias``, ``act``, ``batch``)."""
    found = []
    if params["trans"] not in family.layouts:
        found.append(f"family {family.name} computes layout {' and '.join(family.layouts)} only, not "
                     f"trans={params['trans']}")
    if params["out"] not in family.outputs:
        found.append(f"family {family.name} stores C as {' or '.join(family.outputs)} only, not out={params['out']}")
    if params["bias"] not in family.biases:
        found.append(f"family {family.name} adds no bias in its epilogue (bias={' or '.join(family.biases)} only), not "
                     f"bias={params['bias']}" if family.biases == ("none",) else
                     f"family {family.name} adds bias={' or '.join(family.biases)} only, not bias={params['bias']}")
    if params["act"] not in family.activations:
        found.append(f"family {family.name} applies act={' or '.join(family.activations)} only, not act={params['act']}")
    if params["batch"] not in family.batches:
        found.append(f"family {family.name} computes one product per launch (batch=none only), not "
                     f"batch={params['batch']}")
    found += family.check(params, precision, derived)
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
