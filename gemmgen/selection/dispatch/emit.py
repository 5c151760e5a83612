"""The dispatcher's CUDA file: each kernel of a DispatchPlan as `gemmgen emit` writes it alone, in
a namespace of its own with its launcher renamed, then templates/dispatch.cu.j2's launcher.

The kernels' #include lines are hoisted to the top (headers cannot be included inside a
namespace); everything else of each kernel's file is kept as it is, so a reader finds each kernel
exactly as `gemmgen emit <name>` gives it.
"""

import hashlib
import math
import shlex

from gemmgen import __version__
from gemmgen.codegen.render import environment, harness_checks, render_kernel
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import Variant
from gemmgen.selection.dispatch.select import DispatchPlan

def _split_includes(source: str) -> tuple[list[str], str]:
    includes, rest = [], []
    for line in source.splitlines():
        (includes if line.startswith("#include ") else rest).append(line)
    return includes, "\n".join(rest)


def _counts(ms: tuple[int, ...]) -> str:
    return ", ".join(map(str, ms[:4])) + (", ..." if len(ms) > 4 else "")


def computes(variant: Variant) -> str:
    """What a launcher of ``variant`` computes, as its header and comments say it."""
    inner = "alpha * A @ B + beta * C" + (" + bias" if variant.bias != "none" else "")
    return f"{variant.act}({inner})" if variant.act != "none" else inner


def launcher_abi(variant: Variant) -> dict[str, str]:
    """The parts of the dispatcher's C signatures (templates/dispatch.cu.j2) that ``variant``
    decides, as a single kernel's launcher of it has them (templates/base.cu.j2): ``bias_*``
    C's-type bias after C where it adds one; for a strided batch, ``bat*`` the batch count after
    K and ``s*`` a stride (long long elements) after A, B, C and the bias. ``*_t``: types only;
    ``*_arg``: the names passed on. ``launch_args`` and ``describe_args`` are the argument lists of
    a kernel's launcher/_plan and _describe. Each is empty text where a one-product launcher has
    nothing, so that its dispatcher is what it was before batches."""
    bias, batched = variant.bias != "none", variant.batched
    stride = ", long long" if batched else ""
    parts = {"bat_t": ", int" if batched else "", "st": stride, "bat": ", int batch" if batched else "",
             "bat_arg": ", batch" if batched else ""}
    for x in "abc":
        parts[f"s{x}"] = f"{stride} stride_{x}" if batched else ""
        parts[f"s{x}_arg"] = f", stride_{x}" if batched else ""
    parts.update(bias_type=f"const gg_dout*{stride}, " if bias else "",
                 bias_param=f"const gg_dout* bias{stride and stride + ' stride_bias'}, " if bias else "",
                 bias_arg=("bias, stride_bias, " if batched else "bias, ") if bias else "")
    p = parts
    parts["describe_args"] = f"M, N, K{p['bat_arg']}, A{p['sa_arg']}, B{p['sb_arg']}, beta, C{p['sc_arg']}"
    parts["launch_args"] = (f"M, N, K{p['bat_arg']}, alpha, A{p['sa_arg']}, B{p['sb_arg']}, beta, C{p['sc_arg']}, "
                            f"{p['bias_arg']}stream")
    return parts


def render_dispatcher(plan: DispatchPlan, emit_args: list[str], harness: bool = False) -> str:
    """Standalone CUDA source of the dispatcher for ``plan``; ``emit_args`` are the `gemmgen
    emit` arguments that reproduce it (written in its header). With ``harness``, a main() that
    checks the dispatcher's variant at a shape against a float64 reference and times it, as
    `emit --harness` does a kernel.

    Every kernel computes ``plan.variant``; the launcher, _plan and _describe have a single
    kernel's signatures for it (launcher_abi): C of its type and, where it adds a bias, ``const CT*
    bias`` right after C; for batch=strided, the batch count after K and a stride after each
    matrix and the bias. The kernel is chosen by (M, N, K) alone, whatever the batch."""
    variant = plan.variant
    other = [c.name for c in plan.kernels if c.variant != variant]
    if other:
        raise ValueError(f"a dispatcher of {variant.text} cannot hold {', '.join(other)}: its kernels compute one variant")
    includes, parts = [], []
    # the part names come from the kernels, so two dispatchers linked into one program do not clash
    # unless they hold the same kernels
    tag = hashlib.sha256(" ".join(c.name for c in plan.kernels).encode()).hexdigest()[:8]
    for i, config in enumerate(plan.kernels):
        found, text = _split_includes(render_kernel(config))
        includes.extend(line for line in found if line not in includes)
        parts.append({"prefix": f"gg_{tag}_k{i}", "name": config.name, "text": text})
    first = plan.kernels[0]
    # one build for all: the arch-specific target (sm_90a) where any kernel needs it
    build = next((c.build_arch for c in plan.kernels if c.build_arch != c.arch), first.build_arch)
    ct = PRECISIONS[variant.out].c_type
    return environment().get_template("dispatch.cu.j2").render(
        version=__version__,
        emit_args=shlex.join(emit_args),
        kernels=plan.kernels,
        layers=plan.layers,
        max_m=plan.max_m,
        sm_count=plan.sm_count,
        samples=plan.samples,
        counts=_counts,
        share=f"{100 * plan.share_within:g}%",
        log=lambda x: repr(math.log(x)),
        devices=", ".join(plan.devices) or "no device",
        precision=plan.precision,
        T=first.element_type,
        CT=ct,
        v=variant,
        computes=computes(variant),
        bias_doc={"row": "M values, bias[i] added to row i", "col": "N values, bias[j] added to column j"}.get(
            variant.bias, ""),
        **launcher_abi(variant),
        arch=build.name,
        arch_flags=" ".join(build.nvcc_flags),
        includes=includes,
        parts=parts,
        harness=harness,
        name="dispatcher",
        judge=harness_checks(plan.precision, variant) if harness else None,
    )
