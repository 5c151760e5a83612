"""Which kernels a dispatcher holds, and which token counts of each layer each one serves.

A dispatcher serves layers: the (N, K) of the shapes it is asked for, each at every token count M
from 1 to ``max_m`` (8192, or the largest M asked, if larger); beyond, the kernel of the last
count. The selection model (gemmgen.selection.dispatch.model), fitted on the stored measurements of the
precision and variant, predicts each candidate kernel's time at every M of each layer: at a
measured shape that is the measurement (drift-normalized), between measured token counts the
kernel's own measurements on the layer interpolated, elsewhere the model. Candidates are the
kernels measured on the layer; for a layer nothing was measured on, the kernels measured on at
least two layers (whose calibration is not one shape's accident).

The choice is cautious: a measurement counts as it is, a prediction at a token count where the
kernel was not measured as its time times 1 + UNMEASURED + CAUTION per doubling of M away from
the kernel's nearest measurement on the layer (at most 3 doublings), and times 1 +
CAUTION_ELSEWHERE for a kernel not measured on the layer, and 1 + CAUTION_REGIME more where the
model's base is bound otherwise (memory or compute) than at every measurement of the kernel on the
layer (its calibration says nothing of the other regime); so a kernel measured at or near M keeps
a token count unless another is predicted clearly faster (the model's error grows away from the
measurements: gemmgen.selection.dispatch.model.evaluate).

FP8 candidates are held to the accuracy rule of gemmgen.selection.best (ERROR_BOUND times cuBLAS's
error): a kernel measured over the bound on a layer leaves it; a promoting kernel (``promote`` > 0:
torch's accuracy at any K) stays; one that accumulates in the tensor cores (whose error grows with
the length of K it sums there) stays on a layer it was measured within the bound on, and elsewhere
only where it was within the bound on a layer of K as deep or deeper. A stream-K kernel that
accumulates in the tensor cores sums a tile's whole K wherever the tile is not shared between
blocks, which depends on M, so a measurement where every tile was shared says nothing of other
token counts (on an H200: 1.34x cuBLAS's error at 16 tokens of K = 14336, 1.9x at 366): it stays
only on layers no deeper than the deepest K a whole-K kernel was within the bound at. Where that
leaves no candidate the layer keeps them all, and its header says so.

Kernels are shared where it costs little: a token count accepts any kernel predicted within
``share_within`` of the fastest candidate there, and kernels are taken greedily, each time the
one the most unserved (layer, M) accept, until every one is served or ``max_kernels`` are taken.
Each M then gets the fastest taken kernel, and the layer's table is the runs of equal choices.
"""

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from gemmgen.describe.arch import Arch
from gemmgen.describe.config import KernelConfig, make_config
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.points import point_spec
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import GemmgenError, InvalidPoint
from gemmgen.selection.best import ERROR_BOUND, error_ratios, stored_rows, wanted, within_error
from gemmgen.selection.dispatch.model import TimeModel, stored_samples

SHARE_WITHIN = 0.01  # a token count takes a kernel another uses if it is predicted within 1% of its fastest
MAX_KERNELS = 64  # kernels in one dispatcher at most (each is compiled into the file)
MAX_M = 8192  # token counts every layer's table covers (at least)
PREFILTER = 0.10  # candidates never within this of the fastest at any M are dropped before the cover
UNMEASURED = 0.02  # a kernel at a token count it was not measured at on the layer (the model's typical error there)
CAUTION = 0.02  # and more per doubling of M from its nearest measurement on the layer
CAUTION_ELSEWHERE = 0.10  # a kernel never measured on the layer
CAUTION_REGIME = 0.25  # a kernel where its base is bound otherwise than at all its measurements on the layer


@dataclass(frozen=True)
class Span:
    """Token counts ``m_lo``..``m_hi`` of a layer, served by kernel ``kernel`` (an index into
    DispatchPlan.kernels); ``us_lo``, ``us_hi`` its predicted times at the two ends; ``measured``
    the token counts in the span where it was measured on this layer."""

    m_lo: int
    m_hi: int
    kernel: int
    us_lo: float
    us_hi: float
    measured: tuple[int, ...]


@dataclass(frozen=True)
class Layer:
    """One N x K: its spans, in M order, covering 1..max_m; ``asked`` the token counts given for it."""

    n: int
    k: int
    spans: tuple[Span, ...]
    asked: tuple[int, ...]
    basis: str  # where its candidates came from, in words


@dataclass(frozen=True)
class DispatchPlan:
    precision: str
    arch: Arch
    kernels: tuple[KernelConfig, ...]
    layers: tuple[Layer, ...]
    devices: tuple[str, ...]  # the device the measurements came from
    variant: Variant = Variant()  # what every kernel computes (layouts, C's type, bias, activation)
    sm_count: int = 0  # SMs of that device
    max_m: int = MAX_M
    samples: int = 0  # the measurements the model was fitted on
    share_within: float = SHARE_WITHIN


def _candidates(measured_at: dict, n: int, k: int) -> tuple[list[str], str]:
    """The candidates of layer N x K (see the module) and where they came from, in words;
    ``measured_at``: (kernel, N, K) -> the token counts it was measured at there."""
    on_layer = sorted(name for name, n2, k2 in measured_at if (n2, k2) == (n, k))
    if on_layer:
        return on_layer, f"{len(on_layer)} kernels measured on this layer"
    layers = defaultdict(set)
    for name, n2, k2 in measured_at:
        layers[name].add((n2, k2))
    known = sorted(name for name, where in layers.items() if len(where) >= 2) or sorted(layers)
    return known, f"nothing measured on this layer: {len(known)} kernels measured on other layers, predicted"


def _worst_errors(db, precision: str, variant: Variant, batch_count: int | None) -> dict:
    """FP8: (kernel, N, K) -> its largest error on the layer as a multiple of cuBLAS's
    (gemmgen.selection.best.error_ratios over the stored rows); empty for the other precisions."""
    worst = defaultdict(float)
    if PRECISIONS[precision].fp8:
        rows = stored_rows(db, precision=precision, status="ok", variant=variant, batch_count=batch_count)
        for (name, _, n, k), ratio in error_ratios(rows).items():
            worst[name, n, k] = max(worst[name, n, k], ratio)
    return worst


def _accurate(names: list[str], worst: dict, configs: dict, precision: str, n: int, k: int) -> list[str]:
    """The FP8 candidates of layer N x K that keep to the accuracy rule (see the module), from
    ``worst`` (_worst_errors); all of ``names`` for the other precisions."""
    if not PRECISIONS[precision].fp8:
        return names

    def whole_k(name: str) -> bool:  # accumulates each tile's whole K in the tensor cores
        g = configs[name].geometry
        return not g.stream_k and g.split_k <= 1

    # the deepest K at which a kernel accumulating whole K in the tensor cores was within the bound
    deepest = max((k2 for (other, _, k2), ratio in worst.items()
                   if other in configs and configs[other].params.get("promote", 0) == 0 and whole_k(other)
                   and within_error(precision, ratio)), default=0)

    def keeps(name: str) -> bool:
        if (name, n, k) in worst and not within_error(precision, worst[name, n, k]):
            return False
        if configs[name].params.get("promote", 0) > 0:
            return True
        if not whole_k(name):  # shares k between blocks at some token counts only: held to whole K's record
            return k <= deepest
        if (name, n, k) in worst:
            return True
        return any(k2 >= k and within_error(precision, ratio) for (other, _, k2), ratio in worst.items()
                   if other == name)

    return [name for name in names if keeps(name)]


def accuracy_rule(db, precision: str, variant: Variant, arch: Arch, batch_count: int | None = None):
    """The FP8 accuracy rule (see the module) as a dispatcher's candidates are held to it, judged
    from every stored row of ``precision`` and ``variant`` (read once, here), for a caller that
    takes kernels measured at other shapes (the suite's nearest-shape fallback): a function
    ``(configs, n, k)`` giving the names of ``configs`` (name -> KernelConfig) that keep to it on a
    layer N x K; every name for the other precisions."""
    worst = _worst_errors(db, precision, variant, batch_count)
    known = {}
    for name, _, _ in worst:
        if name not in known:
            try:
                family, prec, params = point_spec(name)
                known[name] = make_config(family, params, prec, arch)
            except (InvalidPoint, GemmgenError):  # no longer buildable: no record of it
                continue

    def keeps(configs: dict, n: int, k: int) -> list[str]:
        return _accurate(list(configs), worst, {**known, **configs}, precision, n, k)

    return keeps


def _caution(measured: set[int], ms: np.ndarray) -> np.ndarray:
    """The factor a kernel's predicted times at ``ms`` count with (see the module)."""
    if not measured:
        return np.full(len(ms), 1.0 + CAUTION_ELSEWHERE)
    at = np.log(np.array(sorted(measured), dtype=np.float64))
    lm = np.log(ms.astype(np.float64))
    i = np.clip(np.searchsorted(at, lm), 1, max(1, len(at) - 1))
    near = np.minimum(np.abs(lm - at[i - 1]), np.abs(lm - at[np.minimum(i, len(at) - 1)]))
    return np.where(near == 0.0, 1.0, 1.0 + UNMEASURED + CAUTION * np.minimum(near / np.log(2.0), 3.0))


def _regime(model: TimeModel, config, n: int, k: int, measured: set[int], ms: np.ndarray) -> np.ndarray:
    """1 + CAUTION_REGIME where the kernel's base is bound otherwise (by memory, or by compute) than
    at every token count it was measured at on the layer: a kernel measured only while memory bound
    it tells nothing of its compute rate, and the model would carry its calibration across."""
    if not measured:
        return np.ones(len(ms))
    bound = model.memory_bound(config, n, k, ms)
    seen = set(model.memory_bound(config, n, k, np.array(sorted(measured))).tolist())
    return np.where(np.isin(bound, list(seen)), 1.0, 1.0 + CAUTION_REGIME)


def caution(model: TimeModel, config, n: int, k: int, measured: set[int], ms: np.ndarray) -> np.ndarray:
    """The factor a candidate's predicted times at ``ms`` count with (see the module): ``measured``
    the token counts it was measured at on layer N x K."""
    return _caution(measured, ms) * _regime(model, config, n, k, measured, ms)


def plan_dispatch(db, precision: str, arch: Arch, shapes: list[Shape], *, family: str | None = None,
                  share_within: float = SHARE_WITHIN, variant: Variant = Variant(),
                  batch_count: int | None = None, max_kernels: int = MAX_KERNELS) -> DispatchPlan:
    """The kernels and tables of a dispatcher for the layers (N, K) of ``shapes``, all of its
    kernels computing ``variant``, chosen by the selection model fitted on the stored measurements
    (of ``batch_count`` products per launch where given). Raises GemmgenError where nothing of
    the precision and variant is stored for ``arch``."""
    shapes = list(dict.fromkeys(shapes))
    if not shapes:
        raise GemmgenError("a dispatcher needs at least one shape")
    try:
        samples, configs, sms, device = stored_samples(db, precision, arch, variant, family, batch_count=batch_count)
    except GemmgenError:
        raise GemmgenError(f"no verified {wanted(precision, family, variant, batch_count)} stored for {arch.name} "
                           f"with a cuBLAS time beside it, at any shape; tune first (gemmgen tune --workload FILE) or "
                           "point --db at the results") from None
    model = TimeModel.fit(samples, configs, sms)
    max_m = max(MAX_M, max(s.m for s in shapes))
    ms = np.arange(1, max_m + 1)
    asked = defaultdict(list)
    for s in shapes:
        asked[s.n, s.k].append(s.m)
    found = defaultdict(set)
    for s in samples:
        found[s.kernel, s.shape.n, s.shape.k].add(s.shape.m)
    measured_at = dict(found)  # (kernel, N, K) -> token counts measured: only what was, however it is read
    worst = _worst_errors(db, precision, variant, batch_count)
    # per layer: candidate names, their predicted times (candidates x M), where they came from
    grids, bases = {}, {}
    for n, k in asked:
        names, basis = _candidates(measured_at, n, k)
        accurate = _accurate(names, worst, configs, precision, n, k)
        if len(accurate) < len(names):
            left = len(names) - len(accurate)
            basis += (f"; {left} over {ERROR_BOUND}x cuBLAS's error left out" if accurate else
                      f"; none within {ERROR_BOUND}x cuBLAS's error: all kept")
            names = accurate or names
        raw = np.stack([model.predict_m(configs[name], n, k, ms) for name in names])
        times = raw * np.stack([caution(model, configs[name], n, k, measured_at.get((name, n, k), set()), ms)
                                for name in names])
        keep = (times <= times.min(axis=0) * (1.0 + PREFILTER)).any(axis=1)
        grids[n, k] = ([name for name, kept in zip(names, keep) if kept], times[keep], raw[keep])
        bases[n, k] = basis
    # greedy cover of every (layer, M) by kernels within share_within of its fastest
    all_names = sorted({name for names, _, _ in grids.values() for name in names})
    index = {name: i for i, name in enumerate(all_names)}
    accepts = []  # per layer: kernels x M, over all_names
    for names, times, _ in grids.values():
        ok = np.zeros((len(all_names), len(ms)), dtype=bool)
        ok[[index[n] for n in names]] = times <= times.min(axis=0) * (1.0 + share_within)
        accepts.append(ok)
    unserved = [np.ones(len(ms), dtype=bool) for _ in accepts]
    chosen: list[str] = []
    while len(chosen) < max_kernels and any(u.any() for u in unserved):
        gain = sum((ok & u).sum(axis=1) for ok, u in zip(accepts, unserved))
        best = int(np.argmax(gain))
        if gain[best] == 0:
            break
        chosen.append(all_names[best])
        for ok, u in zip(accepts, unserved):
            u &= ~ok[best]
    layers = []
    for (n, k), (names, times, raw) in grids.items():
        mine = [i for i, name in enumerate(names) if name in chosen]
        if not mine:  # a cap reached before this layer got any: its fastest candidate overall
            mine = [int(np.argmin(times.sum(axis=1)))]
            chosen.append(names[mine[0]])
        pick = np.array(mine)[times[mine].argmin(axis=0)]
        spans, start = [], 0
        for end in list(np.nonzero(pick[1:] != pick[:-1])[0] + 1) + [len(ms)]:
            name = names[pick[start]]
            lo, hi = int(ms[start]), int(ms[end - 1])
            spans.append(Span(lo, hi, chosen.index(name), float(raw[pick[start], start]),
                              float(raw[pick[start], end - 1]),
                              tuple(sorted(m for m in measured_at.get((name, n, k), ()) if lo <= m <= hi))))
            start = end
        layers.append(Layer(n, k, tuple(spans), tuple(sorted(asked[n, k])), bases[n, k]))
    return DispatchPlan(precision, arch, tuple(configs[name] for name in chosen), tuple(layers), (device,), variant,
                        sms, max_m, len(samples), share_within)
