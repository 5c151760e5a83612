"""The timing the benchmark scripts share (imported as `alternate` when a script in this folder
runs): calls timed in alternation, each after its own poison and an L2 flush (a read of 2x L2),
one call between two CUDA events, median after warm-up. Needs torch and a GPU."""
import numpy as np
import torch

# What L2 holds when a timed call starts (C poisoned in every state; Alternate.prepare):
#   clean        C poisoned, then L2 flushed: what gemmgen bench times
#   C dirty      L2 flushed, then C poisoned: the poison dirty in L2
#   other dirty  C poisoned, L2 flushed, then 96 MB written: another op's output dirty in L2
#   A written    C poisoned, L2 flushed, then A rewritten in place (the entry's third callable):
#                the input the op before has just written, as in a model
L2_STATES = ("clean", "C dirty", "other dirty", "A written")
OTHER_OUTPUT_BYTES = 96 << 20


class Alternate:
    """``timed(fns)`` / ``timed_async(fns)`` for fns = [(poison, call), ...] (with ``l2="A
    written"``, [(poison, call, rewrite_a), ...]): one median (ms) per call. ``l2``: one of
    L2_STATES, what L2 holds when each call starts; an attribute, so one clock can time several."""

    def __init__(self, device: torch.device, l2: str = "clean"):
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        self.flush_buf = torch.zeros(2 * l2_bytes // 4, dtype=torch.float32, device=device)
        self.device = device
        self.l2 = l2
        self._other = None

    def prepare(self, entry) -> None:
        """Queue what comes before the timed call of ``entry`` (poison, call[, rewrite_a]): its
        poison, the flush, and what the state ``self.l2`` writes after them. Raises ValueError
        for a state not in L2_STATES, or "A written" without the entry's rewrite_a."""
        if self.l2 not in L2_STATES:
            raise ValueError(f"L2 state {self.l2!r}: one of {', '.join(L2_STATES)}")
        if self.l2 == "C dirty":
            self.flush_buf.sum()
            entry[0]()
            return
        # C poisoned first, then L2 flushed, as gemmgen bench does: the flush writes the
        # poison's dirty lines back before the timed call, so that call does not pay for
        # them (they cost gemmgen's kernels up to 25% at some shapes, cuBLAS's 5% at most).
        entry[0]()
        self.flush_buf.sum()
        if self.l2 == "other dirty":
            if self._other is None:
                self._other = torch.empty(OTHER_OUTPUT_BYTES, dtype=torch.uint8, device=self.device)
            self._other.fill_(3)
        elif self.l2 == "A written":
            if len(entry) < 3:
                raise ValueError("L2 state 'A written' needs (poison, call, rewrite_a) entries")
            entry[2]()

    def timed(self, fns, rounds=40, warmup=3, hide_us=0.0):
        """Each call waited for: the time from its start event to its stop event. With
        ``hide_us``, see timed_gpu."""
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = int(hide_us * self._sleep_cycles_per_us()) if hide_us else 0
        times = [[] for _ in fns]
        order = list(range(len(fns)))
        for r in range(warmup + rounds):
            for i in order:
                self.prepare(fns[i])
                if cycles:
                    torch.cuda._sleep(cycles)
                start.record()
                fns[i][1]()
                stop.record()
                stop.synchronize()
                if r >= warmup:
                    times[i].append(start.elapsed_time(stop))
            order.reverse()
        return [float(np.median(t)) for t in times]

    def timed_gpu(self, fns, rounds=40, warmup=3, hide_us=300.0):
        """Each call's GPU time with the host's latency hidden: after prepare (poison, flush), the
        GPU spins for ``hide_us`` (torch.cuda._sleep, no memory traffic) before the start event,
        so the call's host work is done before the GPU reaches it -- what the call costs the
        GPU when the host runs ahead (as in a model, or a CUDA graph), measured on eager
        launches. The host's own time per call is measured apart (host_us)."""
        return self.timed(fns, rounds, warmup, hide_us)

    def _sleep_cycles_per_us(self) -> float:
        """torch.cuda._sleep's cycles per microsecond on this GPU, timed once."""
        if not hasattr(self, "_cycles_per_us"):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)
            start.record(); torch.cuda._sleep(2_000_000); stop.record(); stop.synchronize()
            self._cycles_per_us = 2_000_000 / (start.elapsed_time(stop) * 1e3)
        return self._cycles_per_us

    @staticmethod
    def host_us(fn, calls=400, warmup=20):
        """Host time of one call (microseconds), from ``calls`` calls queued back to back."""
        import time
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        return elapsed / calls * 1e6

    def timed_async(self, fns, rounds=40, warmup=3):
        """As triton.testing.do_bench: the host queues every round without waiting, so a call's
        host work overlaps the GPU's (the flush before it); events read once at the end."""
        for _ in range(warmup):
            for entry in fns:
                self.prepare(entry); entry[1]()
        torch.cuda.synchronize()
        ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rounds)]
              for _ in fns]
        order = list(range(len(fns)))
        for r in range(rounds):
            for i in order:
                self.prepare(fns[i])
                ev[i][r][0].record()
                fns[i][1]()
                ev[i][r][1].record()
            order.reverse()
        torch.cuda.synchronize()
        return [float(np.median([s.elapsed_time(e) for s, e in row])) for row in ev]


def checked_plans(kernels, s, a, w, c, stream, scales, check):
    """Each (name, gemmgen.measure.launcher.Launcher) of ``kernels`` launched once at shape ``s``
    (a, w: FP8 A and B stored N x K; C poisoned with NaN first; ``scales``: the scale pointers),
    its C judged by ``check`` (a wrong result stops the benchmark), then planned for timing.
    Returns (names, fns, errors, plans): fns as Alternate.timed takes them, C poisoned before
    each call; close the plans once timed."""
    names, fns, errors, plans = [], [], [], []
    for name, launcher in kernels:
        c.fill_(float("nan"))
        launcher.launch(s.m, s.n, s.k, 1.0, a.data_ptr(), w.data_ptr(), 0.0, c.data_ptr(), stream, scales=scales)
        torch.cuda.synchronize()
        v = check(c)
        assert v.ok, f"{name} at {s}: {v.message}"
        plan = launcher.plan(s.m, s.n, s.k, 1.0, a.data_ptr(), w.data_ptr(), 0.0, c.data_ptr(), stream, scales=scales)
        plans.append(plan)
        fns.append((lambda: c.fill_(float("nan")), plan.run))
        names.append(name)
        errors.append(v.rel_error)
    return names, fns, errors, plans


def device_verdict(c: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, precision: str, k: int, out: str,
                   act: str = "none"):
    """gemmgen.measure.verify.compare's verdict on C against ref and scale (float64 tensors, M x N),
    with the sums of verify.host_stats taken on the GPU (a product of 10^8 elements takes seconds
    on the host); the judging is verify.judge's."""
    from gemmgen.describe import tolerance
    from gemmgen.measure import verify

    c64 = c.double()
    finite = torch.isfinite(c64)
    err = (torch.where(finite, c64, 0.0) - ref).abs()
    bound = tolerance.elementwise_tolerance(precision, k, out, act) * scale
    over = finite & (err > bound)
    ratios = torch.where(bound > 0, err / bound, torch.where(err > 0, torch.inf, 0.0))
    first = torch.argwhere(~finite | over)
    first_bad = None
    if len(first):
        i, j = (int(v) for v in first[0])
        first_bad = (i, j, float(c64[i, j]), float(ref[i, j]))
    stats = verify.Stats(float((err[finite] ** 2).sum()), float((ref[finite] ** 2).sum()),
                         float((scale[finite] ** 2).sum()), int(over.sum()), int((~finite).sum()),
                         float(torch.where(finite, ratios, 0.0).max()), first_bad)
    return verify.judge(stats, precision, k, out, act)
