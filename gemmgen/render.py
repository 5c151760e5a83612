"""Jinja -> CUDA source for a KernelConfig."""

import hashlib
import shlex
from functools import lru_cache

import jinja2

from gemmgen import __version__
from gemmgen.arch import MAX_GRID_Y
from gemmgen.config import KernelConfig
from gemmgen.dtypes import PRECISIONS
from gemmgen.errors import InvalidParameter
from gemmgen.problem import Variant
from gemmgen.paths import templates_dir


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,  # a missing variable is an error, never empty text
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def requirements(config: KernelConfig) -> str:
    """What the kernel requires of M, N, K, in words (also written in the emitted header)."""
    if config.geometry.persistent:  # tiles are walked by index: no grid limit on M
        return config.family.requires
    return f"{config.family.requires}; M <= {MAX_GRID_Y * config.geometry.tile_m} (grid y limit)"


def emit_args(config: KernelConfig, harness: bool = False) -> str:
    """The `gemmgen emit` arguments that reproduce this source."""
    sets = ",".join(f"{k}={v}" for k, v in (*config.values, *config.variant.items))
    words = ["--family", config.family.name, "--precision", config.precision, "--set", sets,
             "--gpu", config.arch.name] + (["--harness"] if harness else [])
    return shlex.join(words)


def render_kernel(config: KernelConfig, harness: bool = False) -> str:
    """Standalone CUDA source for ``config``: header comment, kernel, C launcher and, with
    ``harness``, a main() that checks and times it. Every value in the source comes from a
    validated KernelConfig; raises jinja2.TemplateError only on a bug in a template."""
    if harness and config.variant != Variant():
        raise InvalidParameter(f"--harness checks trans=nn into fp32 C only so far; {config.name} computes "
                               f"trans={config.variant.trans} into {config.variant.out} C (bench checks it on the GPU)")
    g = config.geometry
    dt = PRECISIONS[config.precision]
    template = environment().get_template(config.family.template)
    return template.render(
        version=__version__,
        name=config.name,
        family=config.family,
        param_text=", ".join(f"{k}={v}" for k, v in config.values),
        p=config.params,
        d=config.derived,
        precision=config.precision,
        T=config.element_type,
        CT=config.output_type,
        v=config.variant,
        b_t="true" if config.variant.b_transposed else "false",
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
        requires=requirements(config),
        emit_args=emit_args(config, harness),
        harness=harness,
        u_in=repr(dt.u_in),
        u_acc=repr(dt.u_acc),
        u_store=repr(0.0 if config.variant.out == "fp32" else PRECISIONS[config.variant.out].u_store),
    )


def template_hash(config: KernelConfig) -> str:
    """SHA-256 (first 16 hex digits) of the template files a config's source is made from."""
    folder = templates_dir()
    digest = hashlib.sha256()
    for name in ("base.cu.j2", "common.cuh.j2", "launcher.cuh.j2", "launch_types.cuh", "ptx.cuh", "ptx_sm90.cuh",
                 config.family.template):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:16]


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]
