"""The benchmark suite: a fixed list of shapes and, for each shape and precision, one kernel,
measured next to cuBLAS in the same run. The kernel is the fastest verified one stored in the
database for that shape, precision and architecture (any family; "fastest" as gemmgen.selection.best says);
where that shape has none, the fastest stored at the nearest shape that has one (a dispatcher's
guess: it is verified at this shape like every other; for FP8 one a dispatcher would hold accurate
at this shape's K, gemmgen.selection.dispatch.select.accuracy_rule); else the precision's named point. Progress
is judged by the geometric mean of the ratios to cuBLAS.

Each precision is measured in one variant (SUITE_VARIANTS): the default (A @ B into fp32 C), but
FP8, which wgmma reads K-major only: B stored N x K into bf16 C with per-tensor scales in device
memory, torch._scaled_mm's product. A precision the target's tensor cores do not take (FP8 before
sm_90) has no entries there."""

from gemmgen.describe.arch import Arch
from gemmgen.describe.config import KernelConfig, make_config
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.points import NAMED_POINTS, point_spec
from gemmgen.describe.problem import Shape, Variant, parse_shape
from gemmgen.errors import InvalidPoint
from gemmgen.measure.plan import Job, bench_plan
from gemmgen.selection.best import best, shape_distance
from gemmgen.selection.dispatch.select import accuracy_rule
from gemmgen.selection.report import geometric_mean

SUITE_SHAPES = tuple(parse_shape(s) for s in (
    "1024", "2048", "4096", "8192", "4096x11008x4096", "8192x8192x1024",
    "16x4096x4096", "128x4096x4096", "1000", "4095x4097x4093"))
SUITE_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "e4m3")
SUITE_VARIANTS = {"e4m3": Variant("nt", "bf16", scale="tensor")}  # the rest: Variant()
# Named points used where nothing verified is stored: the first valid on the target.
FALLBACK = {"fp32": ("v4",), "tf32": ("hopper_tf32", "mma_tf32"), "fp16": ("hopper_fp16", "mma_fp16"),
            "bf16": ("hopper_bf16", "mma_bf16"), "e4m3": ("hopper_e4m3",)}


def suite_variant(precision: str) -> Variant:
    """The variant the suite measures ``precision`` in (see the module)."""
    return SUITE_VARIANTS.get(precision, Variant())


def fallback_config(precision: str, arch: Arch) -> tuple[str, KernelConfig]:
    """The first of the precision's FALLBACK points that is valid on ``arch`` (hopper points need
    sm_90), in the suite's variant, and its name."""
    for name in FALLBACK[precision]:
        point = NAMED_POINTS[name]
        try:
            return name, make_config(point.family, point.params, precision, arch, suite_variant(precision))
        except InvalidPoint:
            continue
    raise InvalidPoint(FALLBACK[precision][-1], [f"no fallback point of {precision} is valid on {arch.name}"])


def _stored_config(db, precision: str, shape: Shape, arch: Arch) -> KernelConfig | None:
    """The best stored kernel at ``shape``, or None where none is stored, or (FP8) where the best
    stored is over the error bound there (gemmgen.selection.best: no kernel within it is stored)."""
    found = best(db, precision, shape, arch, variant=suite_variant(precision))
    if found is None or not found.within_error:
        return None
    family, prec, params = point_spec(found.kernel)
    try:
        return make_config(family, params, prec, arch)
    except InvalidPoint:  # stored by another version of gemmgen whose constraints differ
        return None


def suite_jobs(db, arch: Arch, precisions=SUITE_PRECISIONS, shapes=SUITE_SHAPES) -> list[tuple[Shape, str, str,
                                                                                                KernelConfig]]:
    """(shape, precision, label, config) for every suite entry; label says where it came from.
    Precisions whose tensor cores ``arch`` lacks are left out."""
    jobs = []
    for precision in (p for p in precisions if PRECISIONS[p].min_cc <= arch.cc):
        measured = {Shape(r.M, r.N, r.K) for r in db.results(precision=precision, arch=arch.name, status="ok",
                                                              variant=suite_variant(precision))
                    if r.family != "cublas"}
        accurate = accuracy_rule(db, precision, suite_variant(precision), arch)
        for shape in shapes:
            config, label = _stored_config(db, precision, shape, arch), "stored best"
            if config is None:
                for near in sorted(measured - {shape}, key=lambda s: shape_distance(shape, s)):
                    config, label = _stored_config(db, precision, near, arch), f"best at {near}"
                    # FP8: not one whose sums in the tensor cores are too long for this K
                    if config is not None and accurate({config.name: config}, shape.n, shape.k):
                        break
                    config = None
            if config is None:
                label, config = fallback_config(precision, arch)
            jobs.append((shape, precision, label, config))
    jobs.sort(key=lambda job: (SUITE_SHAPES.index(job[0]) if job[0] in SUITE_SHAPES else len(SUITE_SHAPES),
                               SUITE_PRECISIONS.index(job[1])))
    return jobs


def suite_plan(db, arch: Arch, precisions=SUITE_PRECISIONS) -> list[Job]:
    """The plan `gemmgen bench --suite` measures (gemmgen.measure.plan): every entry of
    :func:`suite_jobs`, in its precision's suite variant, each (shape, precision) led by cuBLAS's row."""
    jobs = [Job(shape, precision, label, config, suite_variant(precision))
            for shape, precision, label, config in suite_jobs(db, arch, precisions)]
    return bench_plan(jobs, list(dict.fromkeys(job.triple for job in jobs)))


def geometric_mean_ratios(rows: list[dict]) -> dict[str, float | None]:
    """precision -> geometric mean of "% cuBLAS" / 100 over the suite rows that have one."""
    by_precision: dict[str, list[float]] = {}
    for row in rows:
        if row["point"] != "cublas":
            by_precision.setdefault(row["precision"], [])
            if row["% cuBLAS"]:
                by_precision[row["precision"]].append(row["% cuBLAS"] / 100.0)
    return {p: geometric_mean(r) if r else None for p, r in by_precision.items()}
