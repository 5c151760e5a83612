"""Jinja -> CUDA source for a KernelConfig."""

import hashlib
import math
from functools import lru_cache

import jinja2
import jinja2.meta

from gemmgen.codegen.header import header_lines
from gemmgen.codegen.launcher_abi import launcher_abi
from gemmgen.codegen.trim import trim
from gemmgen.describe import scaling, tolerance
from gemmgen.describe.arch import MAX_GRID_Y
from gemmgen.describe.config import KernelConfig
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.problem import MAX_DIM, Variant
from gemmgen.paths import templates_dir


def cpp(value: bool | int) -> str:
    """A Python bool or int as a C++ literal (the templates' ``| cpp``): true, false, 42."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"no C++ literal for {value!r}")


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,  # a missing variable is an error, never empty text
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["cpp"] = cpp
    return env


def harness_checks(precision: str, variant: Variant) -> dict:
    """What templates/harness.cuh.j2 renders from Python, so that the harness judges a kernel as
    gemmgen/measure/verify.py does: ``checks``, verify.CHECKS' (alpha, beta) pairs as C literals' digits,
    and the tolerances of gemmgen/describe/tolerance.py for ``precision`` into ``variant``'s C type with
    its activation, which the harness needs at any K it is run with: ``elem`` = (e0, e1) with
    ``elementwise_tolerance(K) = e0 + e1 * K`` and ``norm`` = (n0, n1) with
    ``normwise_tolerance(K) = n0 + n1 * sqrt(K)``, as reprs. The coefficients are read off
    tolerance.py at K = 0 and 2^20 and checked at other K up to MAX_DIM (to 1e-9, relative);
    raises ValueError where the tolerance is no longer of that form (then this function and the
    template must change)."""
    def elem(k):
        return tolerance.elementwise_tolerance(precision, k, variant.out, variant.act)

    def norm(k):
        return tolerance.normwise_tolerance(precision, k, variant.out, variant.act)

    far = 2**20  # the slopes from K = 0 and a far K: the difference of two near numbers loses digits
    e0, n0 = elem(0), norm(0)
    e1, n1 = (elem(far) - e0) / far, (norm(far) - n0) / math.sqrt(far)
    for k in (1, 2, 3, 1000, 4093, MAX_DIM):
        if not (math.isclose(e0 + e1 * k, elem(k), rel_tol=1e-9)
                and math.isclose(n0 + n1 * math.sqrt(k), norm(k), rel_tol=1e-9)):
            raise ValueError(f"gemmgen/describe/tolerance.py's tolerance for {precision} {variant.text} is not affine in K "
                             f"and sqrt(K) (at K = {k}): the harness cannot render it")
    return {"elem": (repr(e0), repr(e1)), "norm": (repr(n0), repr(n1)),
            "checks": [(repr(float(alpha)), repr(float(beta))) for alpha, beta in tolerance.CHECKS]}


def render_kernel(config: KernelConfig, harness: bool = False, untrimmed: bool = False) -> str:
    """Standalone CUDA source for ``config``: header comment, kernel, C launcher and, with
    ``harness``, a main() that checks the kernel's variant against a float64 reference (as
    gemmgen/measure/verify.py) and times it. Every value in the source comes from a validated
    KernelConfig; raises jinja2.TemplateError only on a bug in a template. The templates' code
    for other points and variants is trimmed away (gemmgen.codegen.trim), unless ``untrimmed``."""
    g = config.geometry
    template = environment().get_template(config.family.template)
    source = template.render(
        header=header_lines(config, harness),
        abi=launcher_abi(config.variant, config.element_type, config.output_type,
                         maps=g.tma.maps if g.tma else (), elem_b=config.element_type_b),
        name=config.name,
        p=config.params,
        d=config.derived,
        precision=config.precision,
        T=config.element_type,
        TB=config.element_type_b,  # B's: T but for FP8 of two formats
        CT=config.output_type,
        v=config.variant,
        scale_words=scaling.describe(config.variant.scale),  # what scale_a and scale_b hold, in words
        b_t="true" if config.variant.b_transposed else "false",
        cuda_headers=config.cuda_headers,
        c_bytes=PRECISIONS[config.variant.out].bytes,
        c_tma_type=PRECISIONS[config.variant.out].tma_type,
        arch=config.build_arch.name,
        arch_flags=" ".join(config.build_arch.nvcc_flags),
        block=g.block,
        threads=g.threads,
        tile_m=g.tile_m,
        tile_n=g.tile_n,
        smem_bytes=g.smem_bytes,
        max_grid_y=MAX_GRID_Y,
        max_m=MAX_GRID_Y * g.tile_m,
        sk_flags_per_block=config.derived.get("SK_FLAGS_PER_BLOCK", 0),  # stream-K's flags per block
        c_box=g.tma.box_c if g.tma and g.tma.box_c else (0, 0),  # the box of the map over C (none: 0 x 0)
        harness=harness,
        judge=harness_checks(config.precision, config.variant) if harness else None,
    )
    return source if untrimmed else trim(source)


def template_hash(config: KernelConfig) -> str:
    """SHA-256 (first 16 hex digits) of the template files a config's source can be made from: its
    family's template and every file that one extends or includes, found by reading them (so a new
    included file counts without a list to keep)."""
    folder = templates_dir()
    digest = hashlib.sha256()
    for name in sorted(_template_files(config.family.template)):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=None)
def _template_files(name: str) -> frozenset[str]:
    """``name`` and the templates it extends or includes, recursively (all by literal names)."""
    env = environment()
    found, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in found:
            found.add(current)
            source = env.loader.get_source(env, current)[0]
            todo += [ref for ref in jinja2.meta.find_referenced_templates(env.parse(source)) if ref is not None]
    return frozenset(found)


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]
