"""The C parameters of an emitted launcher (its ABI) and of its kernel, listed once.

A launcher of one product takes M, N, K, alpha, A, B, beta, C and, where its variant adds a bias,
the bias right after C, then, where it is scaled (FP8), scale_a and scale_b (fp32, device memory:
one value each, or M and N); a strided batch (batch=strided) takes the batch count after K and a stride
(long long, in elements) after each matrix and the bias. launcher_abi lists those parameters for a
variant, and every signature and argument list written from them comes from that one list: the
launcher's C functions (GEMMGEN_LAUNCHER, _plan, _describe, _workspace_size, _launch_workspace,
_plan_workspace in templates/base.cu.j2), the dispatcher's (templates/dispatch.cu.j2), the kernel's
own, and the host's gg_operands, the struct with every operand that the launcher's code reads
(a launcher of one product holds batch 1 and strides 0 there, one without a bias a null bias).
"""

import ctypes
from dataclasses import dataclass

from gemmgen.describe.problem import Variant

WRAP = 116  # characters per line of a wrapped list, its indent included
# The launcher's slot (gg_maps.map[i], base.cu.j2) of each tensor map a kernel may take (Tma.maps).
MAP_SLOTS = {"a": 0, "b": 1, "c": 2, "a_tail": 3}


@dataclass(frozen=True)
class Param:
    """One C parameter: its type and name; ``absent``: what gg_operands holds for it where a
    launcher does not take it."""

    type: str
    name: str
    absent: str = ""

    @property
    def decl(self) -> str:
        return f"{self.type} {self.name}"


def wrap(items: list[str], indent: int = 0) -> str:
    """``items`` joined by ", "; with ``indent``, wrapped after a comma where a line of the list
    (``indent`` spaces, then items) would pass WRAP characters, the lines after the first indented
    by ``indent`` spaces."""
    if not indent:
        return ", ".join(items)
    lines = [""]
    for item in items:
        if lines[-1] and indent + len(lines[-1]) + len(item) + 2 > WRAP:
            lines[-1] += ","
            lines.append(item)
        else:
            lines[-1] += (", " if lines[-1] else "") + item
    return ("\n" + " " * indent).join(lines)


class Params(tuple):
    """C parameters in order, written out as a declaration, as types or as names: between the
    ``before`` and ``after`` items a function takes around them, wrapped as by ``wrap`` with
    ``indent``."""

    def decl(self, indent: int = 0, before=(), after=()) -> str:
        return wrap([*before, *(p.decl for p in self), *after], indent)

    def types(self, indent: int = 0, before=(), after=()) -> str:
        return wrap([*before, *(p.type for p in self), *after], indent)

    def names(self, prefix: str = "", indent: int = 0, before=(), after=()) -> str:
        return wrap([*before, *(prefix + p.name for p in self), *after], indent)

    def ctypes(self) -> list:
        """The ctypes argument types of these parameters (pointers as void*), for a caller of the
        launcher through ctypes (gemmgen.measure.launcher)."""
        scalars = {"int": ctypes.c_int, "float": ctypes.c_float, "long long": ctypes.c_longlong}
        return [ctypes.c_void_p if p.type.endswith("*") else scalars[p.type] for p in self]


def _restrict(p: Param) -> Param:
    return Param(p.type + " __restrict__", p.name) if p.type.endswith("*") else p


@dataclass(frozen=True)
class LauncherABI:
    """The parameter lists of one variant's launcher, with C's element type ``out``, A's ``elem``
    and B's (C type names):

    ``fields``: gg_operands' fields: every operand any launcher takes.
    ``launch``: the operands GEMMGEN_LAUNCHER, _plan, _launch_workspace and _plan_workspace take
    (after their own leading parameters, before the stream): those of ``fields`` the variant has.
    ``describe``: those _describe and _workspace_size take (before resident): no alpha, no bias,
    no scales, C read-only.
    ``strided``: (pointer, stride) of each operand a kernel of a strided batch advances to its matrix.
    ``maps``: the tensor maps (CUtensorMap) the kernel takes first, by name (Tma.maps; none: it
    loads without TMA); the launcher holds them in fixed slots (MAP_SLOTS).
    """

    fields: Params
    launch: Params
    describe: Params
    strided: tuple[tuple[str, str], ...]
    maps: tuple[str, ...]

    @property
    def kernel(self) -> Params:
        """The kernel's parameters: its tensor maps, the operands (pointers __restrict__) and the workspace."""
        maps = (Param("const __grid_constant__ CUtensorMap", f"tma_{x}") for x in self.maps)
        return Params((*maps, *map(_restrict, self.launch), Param("const gg_workspace", "ws")))

    def kernel_decl(self, indent: int) -> str:
        """The kernel's parameter declarations in lines of their own: the tensor maps, two a line;
        the sizes and A; B, C, the bias and the workspace (the later lines indented by ``indent``)."""
        params = list(self.kernel)
        a_end = max(i for i, p in enumerate(params) if p.name in ("A", "stride_a")) + 1  # A and its stride
        n = len(self.maps)
        lines = [*(params[i:min(i + 2, n)] for i in range(0, n, 2)), params[n:a_end], params[a_end:]]
        return (",\n" + " " * indent).join(", ".join(p.decl for p in line) for line in lines if line)

    def kernel_args(self, ops: str, maps: str, indent: int = 0) -> str:
        """The kernel's arguments: the maps ``maps[slot]`` (MAP_SLOTS), the operands as members of
        ``ops`` (an expression, such as ``p.ops``), and ``ws``."""
        return wrap([*(f"{maps}[{MAP_SLOTS[m]}]" for m in self.maps), *(f"{ops}.{p.name}" for p in self.launch), "ws"],
                    indent)

    def members(self) -> list[str]:
        """gg_operands' member declarations: consecutive fields of one type that is not a
        pointer in one line."""
        lines: list[tuple[str, list[str]]] = []
        for f in self.fields:
            if lines and lines[-1][0] == f.type and not f.type.endswith("*"):
                lines[-1][1].append(f.name)
            else:
                lines.append((f.type, [f.name]))
        return [f"{t} {', '.join(names)};" for t, names in lines]

    def fill(self, given: Params) -> str:
        """gg_operands' initializer from the parameters ``given`` (launch or describe): each
        field's parameter, cast to the field's type where it differs (describe's read-only C),
        or the field's ``absent`` value."""
        by_name = {p.name: p for p in given}
        out = []
        for f in self.fields:
            p = by_name.get(f.name)
            out.append(f.absent if p is None else p.name if p.type == f.type else f"const_cast<{f.type}>({p.name})")
        return "{" + ", ".join(out) + "}"


# The operands, in the order of the ABI (after a function's own leading parameters, before the stream)
ABI_ORDER = ("M", "N", "K", "batch", "alpha", "A", "stride_a", "B", "stride_b", "beta", "C", "stride_c", "bias",
             "stride_bias", "scale_a", "scale_b")
BATCHED_ONLY = ("batch", "stride_a", "stride_b", "stride_c", "stride_bias")
BIAS_ONLY = ("bias", "stride_bias")
SCALED_ONLY = ("scale_a", "scale_b")


def launcher_abi(variant: Variant, elem: str, out: str, maps: tuple[str, ...] = (),
                 elem_b: str | None = None) -> LauncherABI:
    """The parameter lists of ``variant``'s launcher (see LauncherABI); ``maps``: the kernel's
    tensor maps by name; ``elem_b``: B's element type where it is not A's ``elem`` (FP8 of two formats)."""
    stride = "long long"
    fields = Params((  # gg_operands' order: by type
        Param("int", "M"), Param("int", "N"), Param("int", "K"), Param("int", "batch", "1"),
        Param("float", "alpha", "0.0f"), Param("float", "beta"),
        Param(f"const {elem}*", "A"), Param(f"const {elem_b or elem}*", "B"), Param(f"{out}*", "C"),
        Param(f"const {out}*", "bias", "nullptr"),
        Param(stride, "stride_a", "0"), Param(stride, "stride_b", "0"), Param(stride, "stride_c", "0"),
        Param(stride, "stride_bias", "0"),
        Param("const float*", "scale_a", "nullptr"), Param("const float*", "scale_b", "nullptr"),
    ))
    by_name = {f.name: f for f in fields}
    takes = [name for name in ABI_ORDER if (variant.batched or name not in BATCHED_ONLY)
             and (variant.bias != "none" or name not in BIAS_ONLY) and (variant.scaled or name not in SCALED_ONLY)]
    launch = Params(by_name[name] for name in takes)
    describe = Params(Param(f"const {out}*", "C") if p.name == "C" else p for p in launch
                      if p.name not in ("alpha", *BIAS_ONLY, *SCALED_ONLY))
    strided = tuple((p, f"stride_{p.lower()}") for p in ("A", "B", "C", "bias") if f"stride_{p.lower()}" in takes)
    return LauncherABI(fields, launch, describe, strided, maps)
