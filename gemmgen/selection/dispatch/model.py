"""The selection model: a stored kernel's time at any (M, N, K), fitted on the measurements.

A tile kernel's time is mostly its busiest SM's share of the work: waves of tiles (the kernel's
own schedule: whole waves, or a fractional last wave for stream-K) times the k tiles of one
tile, each taking what a BM x BN x BK step of the tensor cores takes, with a floor where the
operands and C cannot move through memory faster. That is the model's base (``_base``, in
seconds). What it misses -- how full the tiles are, how many SMs the busiest wave keeps busy, K
too short to fill the pipeline, packing of misaligned operands, stream-K's partial sums -- is
fitted:

    log t = log base + theta . x(kernel, shape) + u(kernel) + v(N, K, M) + r(kernel, N, K, M)

- ``theta``, one vector for all kernels, is fitted within kernels (each kernel's mean taken
  out), so that it learns how a kernel's time moves from shape to shape, not which kernels are fast;
- ``u(kernel)``, a kernel's calibration, and ``v``, a shape's effect (what every kernel measured
  there has beyond the base and theta: the shape's memory traffic, a drift its cuBLAS pairing
  missed), fitted together by median polish of the residuals; at a token count nothing was
  measured at, v is the layer's, interpolated in log M (fading out beyond them; 0 on a layer
  measured nowhere);
- ``r``, a layer's correction: where the kernel was measured at the same N and K, what is left of
  its residuals there, interpolated in log M (so a prediction at a measured shape is that
  measurement, and between two measured token counts it moves smoothly), fading out beyond them.

A kernel not measured on the layer borrows from its *similar* kernels (``_distance``: at most
NEIGHBOUR_DISTANCE parameters apart) measured on it within a doubling of the token count: one
measured elsewhere takes their median r; one measured nowhere their median u + r, else (none
near) u predicted from its parameters (a ridge fit over the calibrated kernels).

Times are in microseconds per product (a batched launch's divided by its count), normalized for drift: a
measurement taken next to cuBLAS's at the same shape counts as its ratio to that cuBLAS time
times cuBLAS's median time there (gemmgen.selection.best pairs the rows). Only fully timed rows count: a tuner's cut rows ("timed only
N runs": a slow candidate given up on) are left out. ``evaluate`` reports the median prediction error on held-out
measurements (`gemmgen model` prints it; a dispatcher's header points there); ``gemmgen.selection.dispatch.select``
uses ``predict_m`` for every token count a dispatcher serves.
"""

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from gemmgen.describe.arch import Arch
from gemmgen.describe.config import KernelConfig, make_config
from gemmgen.describe.dtypes import PRECISIONS
from gemmgen.describe.points import point_spec
from gemmgen.describe.problem import Shape, Variant
from gemmgen.errors import GemmgenError, InvalidPoint
from gemmgen.measure.outcome import CUT_PREFIX
from gemmgen.selection.best import paired_baselines, stored_rows

TENSOR_TFLOPS = {"fp16": 989.0, "bf16": 989.0, "tf32": 495.0, "fp32": 67.0, "e4m3": 1979.0, "e4m3e5m2": 1979.0,
                 "e5m2e4m3": 1979.0}  # dense peak, H100 SXM
MAX_EFFICIENCY = 0.82  # of that peak: the best kernels stored reach ~0.79 (bf16 128x256 at 8192^3)
HBM_BYTES_PER_S = 2.8e12  # what a device-to-device copy reaches on the H100 (anchors: ~3.0 TB/s counting both ways)
SM_BYTES_PER_S = 150e9  # what one SM streams from L2 when all do (64x128 tiles at 4096^3 need ~120 GB/s)
LAUNCH_S = 3e-6  # a launch and the pipeline's first fill
RIDGE = 1e-3
MIN_DOF_PER_FEATURE = 5  # repeated measurements (beyond one a kernel) per feature before theta is fitted
FOLDS = 5  # evaluate: each fifth of the measurements held out in turn (so each fit sees 80% of them)
SPLIT_SEED = 0  # evaluate: the shuffle that deals them into folds, fixed so that the figure is reproducible
NEIGHBOUR_DISTANCE = 2  # a kernel not measured on a layer borrows from kernels this close (_distance) measured on it
NEIGHBOUR_M = math.log(2.0)  # ... at a token count within a doubling of the one predicted
SHAPE_KERNELS = 3  # kernels measured at a shape before it has an effect of its own
POLISH_SWEEPS = 4  # median polish of kernel and shape effects: settled within a few sweeps
FADE = math.log(4.0)  # a layer's correction fades to nothing over this much log M beyond its measured range
FEATURES = ("log fill_m", "log fill_n", "log busy SMs", "log k tiles", "1/k tiles", "log waves", "1/waves",
            "packs", "log memory/compute", "memory-bound", "stream-K share")


@dataclass(frozen=True)
class Sample:
    """One fully timed measurement: ``kernel`` at ``shape``, ``us`` its drift-normalized time."""

    kernel: str
    shape: Shape
    us: float


def _bk(config: KernelConfig) -> int:
    return int(config.derived.get("BK") or config.params.get("BK") or 32)


def _base(config: KernelConfig, m: np.ndarray, n: int, k: int, sms: int) -> tuple[np.ndarray, np.ndarray]:
    """(base seconds, features) of ``config`` at token counts ``m`` (an array) and this N, K."""
    g = config.geometry
    m = np.asarray(m, dtype=np.float64)
    tm, tn = np.ceil(m / g.tile_m), math.ceil(n / g.tile_n)
    cl = max(1, g.cluster)
    split = max(1, g.split_k)
    bk = _bk(config)
    kt = max(1, math.ceil(k / bk / split))
    if g.persistent:
        units = np.ceil(tm / cl) * tn
        workers = max(1, sms // cl)
        full = np.floor(units / workers)
        tail = units - full * workers
        if g.stream_k and kt >= 8:  # HpWork::whole_units (hopper.cu.j2): a tail at most 3/4 full is shared by k
            shared = (tail > 0) & (4 * tail <= 3 * workers)
            waves = np.where(shared, units / workers, np.ceil(units / workers))
            sk_share = np.where(shared, np.where(2 * tail < workers, np.minimum(units, tail + workers), tail) / units, 0.0)
            busy = np.where(shared, float(sms), np.minimum(units, workers) * cl)
        else:
            waves, sk_share = np.ceil(units / workers), np.zeros_like(units)
            busy = np.minimum(units, workers) * cl
    else:
        blocks = tm * tn * split
        waves, sk_share = np.ceil(blocks / sms), np.zeros_like(blocks)
        busy = np.minimum(blocks, sms)
    esize = PRECISIONS[config.precision].bytes
    csize = PRECISIONS[config.variant.out].bytes
    step = 2.0 * g.tile_m * g.tile_n * bk / (TENSOR_TFLOPS.get(config.precision, 67.0) * 1e12 / sms)
    loads = (g.tile_m + g.tile_n / cl) * bk * esize / SM_BYTES_PER_S  # an SM's operand bytes of a k step
    compute = LAUNCH_S + waves * kt * max(step, loads)
    memory = LAUNCH_S + ((m * k + k * n) * esize + m * n * csize) / HBM_BYTES_PER_S
    a_rows, b_rows = (m if config.variant.a_transposed else k), (k if config.variant.b_transposed else n)
    vec = g.pack_vec or 0
    packs = (np.asarray(a_rows) % vec != 0) + float(b_rows % vec != 0) if vec else 0.0
    base = np.maximum(compute, memory)
    ratio = np.log(memory / compute)
    columns = (np.log(m / (tm * g.tile_m)), math.log(n / (tn * g.tile_n)), np.log(busy / sms), math.log(kt), 1.0 / kt,
               np.log(np.maximum(waves, 1e-3)), 1.0 / np.maximum(waves, 1e-3), packs, ratio, np.maximum(ratio, 0.0),
               sk_share)
    x = np.stack(np.broadcast_arrays(m, *columns)[1:], axis=-1)
    return base, x


def _kernel_features(config: KernelConfig) -> dict[str, float]:
    """What a kernel is, as numbers: its tile and block, and each parameter (log of a number, a
    one-hot of a word), for predicting the calibration of a kernel measured nowhere."""
    g = config.geometry
    out = {"1": 1.0, "log tile_m": math.log(g.tile_m), "log tile_n": math.log(g.tile_n),
           "log threads": math.log(g.threads), "cluster": float(g.cluster), "stream_k": float(g.stream_k),
           f"precision={config.precision}": 1.0}
    for name, value in config.params.items():
        if isinstance(value, int):
            out[f"log {name}"] = math.log(value) if value > 0 else 0.0
        else:
            out[f"{name}={value}"] = 1.0
    return out


def _traits(config: KernelConfig) -> frozenset:
    """What ``_distance`` compares of a kernel: its family, its parameters and its tile's dimensions
    (so a different tile counts twice, as its parameter and as the tile: it changes the waves and
    each tile's work, not only how a tile is run)."""
    g = config.geometry
    return frozenset({"family": config.family.name, **config.params, "tile_m": g.tile_m, "tile_n": g.tile_n}.items())


def _distance(a: frozenset, b: frozenset) -> int:
    """How many of two kernels' traits differ (of two kernels of one family: how many of their values)."""
    return len(a ^ b) // 2


def _two_way(resid: np.ndarray, kernels: list[str], shapes: list[tuple]) -> tuple[dict, dict]:
    """(u by kernel, v by shape): resid ~ u(kernel) + v(shape), fitted by median polish (a few
    sweeps of medians, robust to a kernel's odd measurement); v only for shapes at least
    SHAPE_KERNELS kernels were measured at, its median over them 0, so that where there is none u
    keeps the kernels' level. A kernel measured at one shape only cannot tell its u from the
    shape's v: its u keeps both (taking v out would carry to its other token counts what the
    kernels measured there share, a tile's fit to that M included, as if it were its own)."""
    by_k, by_s = defaultdict(list), defaultdict(list)
    for i, (k, s) in enumerate(zip(kernels, shapes)):
        by_k[k].append(i)
        by_s[s].append(i)
    anchored = {k for k, idx in by_k.items() if len({shapes[i] for i in idx}) > 1}
    by_s = {s: idx for s, idx in by_s.items() if len({kernels[i] for i in idx}) >= SHAPE_KERNELS}
    u_i, v_i = np.zeros(len(resid)), np.zeros(len(resid))
    u, v = {}, {}
    for _ in range(POLISH_SWEEPS):
        for k, idx in by_k.items():
            u[k] = float(np.median(resid[idx] - (v_i[idx] if k in anchored else 0.0)))
            u_i[idx] = u[k]
        for s, idx in by_s.items():
            v[s] = float(np.median(resid[idx] - u_i[idx]))
        mid = float(np.median(list(v.values()))) if v else 0.0
        for s in v:
            v[s] -= mid
        v_i = np.array([v.get(s, 0.0) for s in shapes])
    return u, v


def _merged(layers: dict) -> dict:
    """Each key's (log M, residual) points, one per log M (the median of its residuals), sorted."""
    merged = {}
    for key, points in layers.items():
        by_m = defaultdict(list)
        for lm, r in points:
            by_m[lm].append(r)
        merged[key] = sorted((lm, float(statistics.median(rs))) for lm, rs in by_m.items())
    return merged


def _fading(points: list | None, lm: np.ndarray) -> np.ndarray:
    """``points`` [(log M, r)], sorted, interpolated at ``lm``, fading to 0 over FADE beyond them."""
    if not points:
        return np.zeros_like(lm)
    xs, rs = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    inside = np.interp(lm, xs, rs)
    beyond = np.where(lm < xs[0], xs[0] - lm, np.where(lm > xs[-1], lm - xs[-1], 0.0))
    return inside * np.clip(1.0 - beyond / FADE, 0.0, 1.0)


@dataclass
class TimeModel:
    """A fitted model (see the module). ``configs``: every kernel it knows, by name."""

    sms: int
    theta: np.ndarray
    calibration: dict[str, float]  # kernel -> u
    prior: dict[str, float]  # kernel feature -> weight, for kernels without a calibration
    layers: dict[tuple[str, int, int], list[tuple[float, float]]]  # (kernel, N, K) -> [(log M, residual)], sorted
    configs: dict[str, KernelConfig] = field(default_factory=dict)
    samples: int = 0
    shapes: dict[tuple[int, int], list[tuple[float, float]]] = field(default_factory=dict)  # (N, K) -> [(log M, v)]

    @classmethod
    def fit(cls, samples: Sequence[Sample], configs: dict[str, KernelConfig], sms: int) -> "TimeModel":
        """Fit on ``samples`` (each kernel's config in ``configs``); ``sms``: the measuring GPU's SMs.
        Raises GemmgenError where there is nothing to fit."""
        rows = [(s, configs[s.kernel]) for s in samples if s.kernel in configs and s.us > 0]
        if not rows:
            raise GemmgenError("the selection model has no fully timed measurement to fit")
        logs, feats = [], []
        for s, c in rows:
            base, x = _base(c, np.array([s.shape.m]), s.shape.n, s.shape.k, sms)
            logs.append(math.log(s.us * 1e-6 / base[0]))
            feats.append(x[0])
        y, X = np.array(logs), np.array(feats)
        by_kernel = defaultdict(list)
        for i, (s, _) in enumerate(rows):
            by_kernel[s.kernel].append(i)
        Xc, yc = X.copy(), y.copy()
        for idx in by_kernel.values():  # within kernels: each kernel's means taken out
            Xc[idx] -= X[idx].mean(axis=0)
            yc[idx] -= y[idx].mean()
        # theta only where the kernels' repeated measurements can carry it: with a few, it would fit their noise
        dof = len(y) - len(by_kernel)
        theta = (np.linalg.solve(Xc.T @ Xc + RIDGE * len(y) * np.eye(X.shape[1]), Xc.T @ yc)
                 if dof >= MIN_DOF_PER_FEATURE * X.shape[1] else np.zeros(X.shape[1]))
        resid = y - X @ theta
        shape_of = [(s.shape.n, s.shape.k, math.log(s.shape.m)) for s, _ in rows]
        calibration, effect = _two_way(resid, [s.kernel for s, _ in rows], shape_of)
        names = sorted({f for k in calibration for f in _kernel_features(configs[k])})
        KX = np.array([[_kernel_features(configs[k]).get(f, 0.0) for f in names] for k in calibration])
        KY = np.array(list(calibration.values()))
        w = np.linalg.solve(KX.T @ KX + RIDGE * len(KY) * np.eye(len(names)), KX.T @ KY)
        shapes = defaultdict(list)
        for (n, k, lm), v in effect.items():
            shapes[n, k].append((lm, v))
        shapes = {key: sorted(points) for key, points in shapes.items()}
        layers = defaultdict(list)
        for i, (s, _) in enumerate(rows):  # r: what the prediction's u and v leave (v as predict_m reads it)
            n, k, lm = shape_of[i]
            rest = resid[i] - calibration[s.kernel] - _fading(shapes.get((n, k)), np.array([lm]))[0]
            layers[s.kernel, n, k].append((lm, rest))
        return cls(sms, theta, calibration, dict(zip(names, w.tolist())), _merged(layers), dict(configs), len(rows),
                   shapes)

    def _kernel(self, config: KernelConfig, n: int, k: int, lm: np.ndarray) -> tuple[np.ndarray, str]:
        """u + r of ``config`` on layer N x K at each of ``lm`` (see the module), and where it comes from."""
        own = self.layers.get((config.name, n, k))
        if own:
            return self.calibration[config.name] + _fading(own, lm), "measured at this layer"
        if config.name in self.calibration:  # measured elsewhere: similar kernels' correction here, where any
            similar = self._similar(config, n, k, lm, with_u=False)
            return self.calibration[config.name] + np.nan_to_num(similar), "measured on other layers only"
        similar = self._similar(config, n, k, lm, with_u=True)
        prior = sum(self.prior.get(f, 0.0) * v for f, v in _kernel_features(config).items())
        if np.isnan(similar).all():
            return np.full(lm.shape, prior), "predicted from its parameters"
        return np.where(np.isnan(similar), prior, similar), "predicted from similar kernels measured on this layer"

    @cached_property
    def _on_layer(self) -> dict[tuple[int, int], list[tuple[str, frozenset]]]:
        """(N, K) -> [(a kernel measured there, its _traits)]."""
        out = defaultdict(list)
        for name, n, k in self.layers:
            out[n, k].append((name, _traits(self.configs[name])))
        return out

    def _similar(self, config: KernelConfig, n: int, k: int, lm: np.ndarray, with_u: bool) -> np.ndarray:
        """The median, at each of ``lm``, of the layer corrections (``with_u``: plus the calibrations)
        of the kernels within NEIGHBOUR_DISTANCE of ``config`` measured on layer N x K within
        NEIGHBOUR_M of that token count; nan where there are none."""
        traits, name = _traits(config), config.name
        near = [o for o, theirs in self._on_layer.get((n, k), ())
                if o != name and _distance(traits, theirs) <= NEIGHBOUR_DISTANCE]
        values = np.full((len(near), len(lm)), np.nan)
        for i, o in enumerate(near):
            points = self.layers[o, n, k]
            xs = np.array([p[0] for p in points])
            close = np.abs(lm[:, None] - xs[None, :]).min(axis=1) <= NEIGHBOUR_M
            values[i, close] = (self.calibration[o] if with_u else 0.0) + _fading(points, lm[close])
        out = np.full(lm.shape, np.nan)
        seen = ~np.isnan(values).all(axis=0)
        if seen.any():
            out[seen] = np.nanmedian(values[:, seen], axis=0)
        return out

    def predict_m(self, config: KernelConfig, n: int, k: int, m: np.ndarray) -> np.ndarray:
        """Predicted microseconds of ``config`` at each token count of ``m`` (an array), N, K."""
        m = np.asarray(m, dtype=np.float64)
        lm = np.log(m)
        # the base from M itself: exp(log M) is M give or take an ulp, and one ulp over a multiple of
        # the tile counts a whole tile row more (at 768 of 4096 x 4096, 2 waves of 128 x 192 tiles for 1)
        base, x = _base(config, m, n, k, self.sms)
        kernel, _ = self._kernel(config, n, k, lm)
        # no kernel beats MAX_EFFICIENCY of the tensor cores' peak, whatever a calibration measured
        # where memory bound it would say of its compute
        ceiling = 2.0 * m * n * k / (MAX_EFFICIENCY * TENSOR_TFLOPS.get(config.precision, 67.0) * 1e6)
        return np.maximum(base * 1e6 * np.exp(x @ self.theta + kernel + _fading(self.shapes.get((n, k)), lm)), ceiling)

    def memory_bound(self, config: KernelConfig, n: int, k: int, m: np.ndarray) -> np.ndarray:
        """Whether the base is bound by memory rather than the kernel's compute at each of ``m``."""
        return _base(config, np.asarray(m, dtype=np.float64), n, k, self.sms)[1][:, FEATURES.index("memory-bound")] > 0

    def predict(self, config: KernelConfig, shape: Shape) -> float:
        return float(self.predict_m(config, shape.n, shape.k, np.array([shape.m]))[0])

    def basis(self, config: KernelConfig, n: int, k: int, m: int = 1) -> str:
        """Where a prediction for ``config`` at this N and K (and token count ``m``) comes from, in words."""
        points = self.layers.get((config.name, n, k))
        if points:
            ms = sorted(round(math.exp(p[0])) for p in points)
            return f"measured at this layer (M = {', '.join(map(str, ms[:6]))}{', ...' if len(ms) > 6 else ''})"
        return self._kernel(config, n, k, np.array([math.log(m)]))[1]


@dataclass(frozen=True)
class Evaluation:
    """Prediction error (|predicted / measured - 1|) on held-out measurements (see ``evaluate``);
    ``held_out`` 0 where there were too few to hold any out (``median`` and ``p90`` are then nan)."""

    held_out: int
    median: float
    p90: float
    by_basis: dict[str, tuple[int, float]]  # basis -> (count, median error)
    folds: int = FOLDS

    def text(self) -> str:
        if not self.held_out:
            return "no held-out error: too few measurements to hold any out"
        parts = ", ".join(f"{b}: {n} at {100 * e:.1f}%" for b, (n, e) in self.by_basis.items())
        return (f"median error {100 * self.median:.1f}% (90th percentile {100 * self.p90:.1f}%) on {self.held_out} "
                f"held-out (kernel, shape) pairs ({parts})")


def evaluate(samples: Sequence[Sample], configs: dict[str, KernelConfig], sms: int, *, folds: int = FOLDS,
             seed: int = SPLIT_SEED) -> Evaluation:
    """The model's error where it did not see the measurement: the (kernel, shape) pairs are
    shuffled (``seed``) and dealt into ``folds`` parts; each part is held out in turn -- every
    measurement of its pairs, so that the model never saw that kernel at that shape (it may have
    seen the kernel at other shapes, and other kernels at that shape) -- and the model fitted on
    the rest predicts each held-out pair, against the pair's median time. Every pair is predicted
    once; the basis of each prediction (TimeModel.basis, the layer's token counts dropped) breaks
    the error down. Deterministic for given samples, ``folds`` and ``seed``."""
    pairs = sorted({(s.kernel, s.shape) for s in samples if s.kernel in configs and s.us > 0})
    folds = min(folds, len(pairs))
    if folds < 2:
        return Evaluation(0, math.nan, math.nan, {}, folds)
    random.Random(seed).shuffle(pairs)
    truth = defaultdict(list)
    for s in samples:
        truth[s.kernel, s.shape].append(s.us)
    errors, by_basis = [], defaultdict(list)
    for part in range(folds):
        held = set(pairs[part::folds])
        try:
            model = TimeModel.fit([s for s in samples if (s.kernel, s.shape) not in held], configs, sms)
        except GemmgenError:  # nothing left to fit on (a handful of measurements, all of them held)
            continue
        for kernel, shape in sorted(held):
            config = configs[kernel]
            err = abs(model.predict(config, shape) / statistics.median(truth[kernel, shape]) - 1.0)
            errors.append(err)
            basis = model.basis(config, shape.n, shape.k, shape.m)
            by_basis["measured at this layer" if basis.startswith("measured at this layer") else basis].append(err)
    if not errors:
        return Evaluation(0, math.nan, math.nan, {}, folds)
    return Evaluation(len(errors), float(np.median(errors)), float(np.quantile(errors, 0.9)),
                      {b: (len(e), float(np.median(e))) for b, e in sorted(by_basis.items())}, folds)


def stored_samples(db, precision: str, arch: Arch, variant: Variant = Variant(), family: str | None = None,
                   device: str | None = None, batch_count: int | None = 1
                   ) -> tuple[list[Sample], dict[str, KernelConfig], int, str]:
    """The fully timed, verified measurements of ``precision`` and ``variant`` for ``arch`` (of
    ``family``, or any) of ``batch_count`` products per launch (None: any), from one device
    (``device``, or the one with the most), drift-normalized (see the module); with each kernel's
    config (kernels no longer buildable are left out), that device's SM count and name. Raises
    GemmgenError where there are none."""
    rows = stored_rows(db, precision=precision, status="ok", variant=variant, batch_count=batch_count)
    pairs = paired_baselines(rows)
    counts = defaultdict(int)
    for r, _, _ in pairs:
        if r.arch == arch.name and (family is None or r.family == family):
            counts[r.device] += 1
    if not counts:
        raise GemmgenError(f"no verified {precision} measurement of variant {variant.text} with a cuBLAS time beside it "
                           f"is stored for {arch.name}")
    device = device or max(counts, key=counts.get)
    samples, configs, sms = [], {}, 0
    for r, cublas_tflops, cublas_median in pairs:
        if r.device != device or r.arch != arch.name or (family and r.family != family) or r.message.startswith(CUT_PREFIX):
            continue
        if r.kernel not in configs:
            try:
                fam, prec, params = point_spec(r.kernel)
                configs[r.kernel] = make_config(fam, params, prec, arch)
            except (InvalidPoint, GemmgenError):
                configs[r.kernel] = None
        if configs[r.kernel] is None:
            continue
        sms = max(sms, r.sm_count)
        us = 2.0 * r.M * r.N * r.K / (r.tflops * 1e6)  # one product's (a batched launch's over its count)
        samples.append(Sample(r.kernel, Shape(r.M, r.N, r.K), us * cublas_tflops / cublas_median))
    if not samples:
        raise GemmgenError(f"no fully timed {precision} measurement of variant {variant.text} on {device}")
    return samples, {k: c for k, c in configs.items() if c is not None}, sms or 132, device

