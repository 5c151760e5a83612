"""Workloads: the shapes a user runs (e.g. an LLM's linear layers at several token counts), with
a weight each and the precisions to tune, read from a TOML file::

    name = "llama3-8b-linear"          # optional; default: the file's stem
    description = "..."                # optional
    precisions = ["fp16", "bf16"]      # required: fp32, tf32, fp16, bf16, e4m3, e4m3e5m2, e5m2e4m3
    trans = "nt"                       # optional, the problem variant (gemmgen.describe.problem.Variant):
    out = "bf16"                       #   trans, out, bias and act, each as `gemmgen tune --trans`
    bias = "col"                       #   etc. take it; a key left out is the default (nn, fp32,
    act = "gelu"                       #   none, none)

    [[shape]]                          # one or more
    label = "qkv_proj"                 # optional
    m = [16, 128, 1024, 4096]          # m, n and k: a number, or a list: one shape per value
    n = 6144                           # (lists in several of them: every combination)
    k = 4096
    weight = 1.0                       # optional, > 0 (default 1); each expanded shape gets it

The weights weigh each shape in the geometric means a report gives (Workload.weighted_mean).
Every shape is of the one variant the file names; the command line's --trans, --out, --bias and
--act may add the keys the file leaves out, and must agree with those it gives
(Workload.variant_with).

A shape that two [[shape]] tables give (e.g. two layers of the same size) is one entry, tuned
once: its weight is the sum of theirs and its label theirs joined with "+". A value repeated in
one list (``m = [16, 16]``) is a mistake and is refused.
"""

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from gemmgen.describe.dtypes import PRECISIONS as _PRECISIONS
from gemmgen.describe.problem import MAX_DIM, VARIANT_KEYS, Shape, Variant, option_of
from gemmgen.errors import InvalidParameter

PRECISIONS = tuple(_PRECISIONS)
TOP_KEYS = ("name", "description", "precisions", *VARIANT_KEYS, "shape")
SHAPE_KEYS = ("m", "n", "k", "label", "weight")


class InvalidWorkload(InvalidParameter):
    """A workload file that cannot be read or breaks the format; the message names the file, the
    entry and what is allowed."""


@dataclass(frozen=True)
class WorkloadEntry:
    shape: Shape
    weight: float  # > 0
    label: str  # "" where the file gives none


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    precisions: tuple[str, ...]
    entries: tuple[WorkloadEntry, ...]  # one per distinct shape, in the file's order
    path: Path | None = None
    variant_given: tuple[tuple[str, str], ...] = ()  # the variant's (key, value) pairs the file gives

    @property
    def variant(self) -> Variant:
        """The variant the file names: its keys, the default's where it gives none."""
        return Variant(**dict(self.variant_given))

    def variant_with(self, options: dict[str, str]) -> Variant:
        """The variant to tune or serve: the file's keys and ``options`` (variant key -> value,
        the command line's --trans, --out, --bias and --act that were given) together. Raises
        InvalidParameter where an option gives a key the file gives another value."""
        given = dict(self.variant_given)
        for key, value in options.items():
            if key in given and given[key] != value:
                raise InvalidParameter(f"{option_of(key)} {value} disagrees with workload {self.path or self.name}, "
                                       f"which says {key} = \"{given[key]}\"; leave {option_of(key)} out, or change "
                                       "the file")
        return Variant(**{**given, **options})

    @property
    def shapes(self) -> list[Shape]:
        """The distinct shapes, in the file's order."""
        return [e.shape for e in self.entries]

    def entry(self, shape: Shape) -> WorkloadEntry:
        """The entry of ``shape``; raises KeyError where the workload has no such shape."""
        for e in self.entries:
            if e.shape == shape:
                return e
        raise KeyError(shape)

    def weighted_mean(self, values: dict[Shape, float | None]) -> float | None:
        """The weighted geometric mean of ``values`` (shape -> a positive number, e.g. a ratio to
        cuBLAS; None where it has none) over the workload's shapes that have one: exp(sum w log v /
        sum w). None where no shape has one."""
        pairs = [(e.weight, values[e.shape]) for e in self.entries if values.get(e.shape)]
        if not pairs:
            return None
        return math.exp(math.fsum(w * math.log(v) for w, v in pairs) / math.fsum(w for w, _ in pairs))


def load_workload(path: str | Path) -> Workload:
    """Read and check a workload file (format: this module's docstring). Raises InvalidWorkload
    with one line naming the file, the entry and what is allowed, at the first problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise InvalidWorkload(f"workload {path}: cannot read it: {err.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidWorkload(f"workload {path}: not a text file (TOML is UTF-8)") from None
    except tomllib.TOMLDecodeError as err:
        raise InvalidWorkload(f"workload {path}: not valid TOML: {err}") from None
    return parse_workload(data, path)


def parse_workload(data: dict, path: Path) -> Workload:
    """A workload from a TOML document already read (``path`` names it in messages); raises
    InvalidWorkload as load_workload does."""
    def fail(text: str):
        raise InvalidWorkload(f"workload {path}: {text}")

    unknown = [key for key in data if key not in TOP_KEYS]
    if unknown:
        fail(f"unknown key {unknown[0]!r}; allowed: {', '.join(TOP_KEYS)} (shapes go in [[shape]] tables)")
    name, description = data.get("name", path.stem), data.get("description", "")
    for key, value in (("name", name), ("description", description)):
        if not isinstance(value, str):
            fail(f"{key} must be a string, not {value!r}")
    precisions = _precisions(data.get("precisions"), fail)
    variant_given = _variant(data, fail)
    tables = data.get("shape")
    if tables is None or tables == []:
        fail("no shapes; add [[shape]] tables, each with m, n and k")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        fail("shape must be [[shape]] tables, each with m, n and k")
    merged: dict[Shape, WorkloadEntry] = {}
    for index, table in enumerate(tables, 1):
        for entry in _expand(table, lambda text, i=index, t=table: fail(f"[[shape]] #{i}{_named(t)}: {text}")):
            if entry.shape in merged:
                old = merged[entry.shape]
                labels = "+".join(x for x in (old.label, entry.label) if x)
                entry = WorkloadEntry(entry.shape, old.weight + entry.weight, labels)
            merged[entry.shape] = entry
    return Workload(name, description, precisions, tuple(merged.values()), path, variant_given)


def _variant(data: dict, fail) -> tuple[tuple[str, str], ...]:
    """The variant keys the file gives, as (key, value) in VARIANT_KEYS' order, each value one
    gemmgen.describe.problem.Variant takes (its message names the allowed ones)."""
    given = tuple((key, data[key]) for key in VARIANT_KEYS if key in data)
    for key, value in given:
        if not isinstance(value, str):
            fail(f"{key} must be a string, e.g. {key} = \"{_EXAMPLES[key]}\", not {value!r}")
        try:
            Variant(**{key: value})
        except InvalidParameter as err:
            fail(str(err))
    return given


_EXAMPLES = {"trans": "nt", "out": "bf16", "bias": "col", "act": "gelu", "batch": "strided",
             "scale": "row"}  # one per VARIANT_KEYS


def _named(table: dict) -> str:
    label = table.get("label")
    return f" ({label})" if isinstance(label, str) and label else ""


def _precisions(value, fail) -> tuple[str, ...]:
    if value is None:
        fail(f"precisions is missing; list the ones to tune, e.g. precisions = [\"fp16\", \"bf16\"] "
             f"(allowed: {', '.join(PRECISIONS)})")
    if not isinstance(value, list) or not value or not all(isinstance(p, str) for p in value):
        fail(f"precisions must be a non-empty list of names, e.g. [\"fp16\", \"bf16\"]; got {value!r}")
    for p in value:
        if p not in PRECISIONS:
            fail(f"unknown precision {p!r}; allowed: {', '.join(PRECISIONS)}")
    if len(set(value)) != len(value):
        fail(f"precisions lists {next(p for p in value if value.count(p) > 1)} twice")
    return tuple(value)


def _expand(table: dict, fail) -> list[WorkloadEntry]:
    """The entries one [[shape]] table gives: every combination of its m, n and k values."""
    unknown = [key for key in table if key not in SHAPE_KEYS]
    if unknown:
        fail(f"unknown key {unknown[0]!r}; allowed: {', '.join(SHAPE_KEYS)}")
    missing = [key for key in "mnk" if key not in table]
    if missing:
        fail(f"{' and '.join(missing)} missing; give m, n and k, each a number or a list of numbers")
    dims = {key: _dim_values(key, table[key], fail) for key in "mnk"}
    label = table.get("label", "")
    if not isinstance(label, str):
        fail(f"label must be a string, not {label!r}")
    weight = table.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
        fail(f"weight = {weight!r}: a weight must be a number > 0")
    return [WorkloadEntry(Shape(m, n, k), float(weight), label)
            for m in dims["m"] for n in dims["n"] for k in dims["k"]]


def _dim_values(key: str, value, fail) -> list[int]:
    values = value if isinstance(value, list) else [value]
    if not values:
        fail(f"{key} = []: give at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIM:
            fail(f"{key} = {v!r}: M, N and K must be whole numbers from 1 to {MAX_DIM} (2^31 - 1)")
    repeated = [v for v in values if values.count(v) > 1]
    if repeated:
        fail(f"{key} lists {repeated[0]} twice")
    return values
