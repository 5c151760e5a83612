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
from gemmgen.dispatch.select import DispatchPlan
from gemmgen.dtypes import PRECISIONS
from gemmgen.render import environment, render_kernel


def _split_includes(source: str) -> tuple[list[str], str]:
    includes, rest = [], []
    for line in source.splitlines():
        (includes if line.startswith("#include ") else rest).append(line)
    return includes, "\n".join(rest)


def _pct(score: float | None) -> str:
    return f"{100 * score:.1f}%" if score is not None else "-"


def render_dispatcher(plan: DispatchPlan, emit_args: list[str], harness: bool = False) -> str:
    """Standalone CUDA source of the dispatcher for ``plan``; ``emit_args`` are the `gemmgen
    emit` arguments that reproduce it (written in its header). With ``harness``, a main() that
    checks and times the dispatcher at a shape."""
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
    dt = PRECISIONS[plan.precision]
    return environment().get_template("dispatch.cu.j2").render(
        version=__version__,
        emit_args=shlex.join(emit_args),
        kernels=plan.kernels,
        served=plan.served,
        missing=[str(s) for s in plan.missing],
        logs=[[repr(math.log(x)) for x in (s.shape.m, s.shape.n, s.shape.k)] for s in plan.served],
        pct=_pct,
        devices=", ".join(plan.devices) or "no device",
        precision=plan.precision,
        T=first.element_type,
        arch=build.name,
        arch_flags=" ".join(build.nvcc_flags),
        includes=includes,
        parts=parts,
        harness=harness,
        name="dispatcher",
        u_in=repr(dt.u_in),
        u_acc=repr(dt.u_acc),
    )
