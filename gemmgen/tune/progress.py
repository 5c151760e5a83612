"""What a tune shows while it runs, from the events its tuners send (tune.loop): notes (the cuBLAS
baseline, the first compiles, the final re-timing) and one event per finished trial.

On a terminal: a live bar per GPU (tqdm) with trials done / total, trials per minute, the best
TFLOP/s and its % of cuBLAS, and the time left. Elsewhere (a log, CI): one line per trial.
Everything goes to stderr, so stdout keeps the report alone.
"""

import sys
import time


class Progress:
    """Call it with each event; close() at the end. ``total``: the trials asked for."""

    def __init__(self, total: int, devices: list[str], stream=None, live: bool | None = None):
        self.total, self.stream = total, stream or sys.stderr
        self.start = time.monotonic()
        self._done: dict[str, int] = {d: 0 for d in devices}
        self._bars: dict = {}
        if live is None:
            live = self.stream.isatty()
        if live:
            try:
                from tqdm import tqdm
            except ImportError:
                live = False
            else:
                for i, device in enumerate(devices):
                    self._bars[device] = tqdm(total=total, position=i, desc=device or "trials", unit="trial",
                                              file=self.stream, dynamic_ncols=True, leave=True)

    def __call__(self, event: dict) -> None:
        device = event.get("device", "")
        if event["event"] == "note":
            self._write(f"gemmgen tune{f' [{device}]' if device else ''}: {event['text']}")
            return
        self._done[device] = self._done.get(device, 0) + 1
        done = sum(self._done.values())
        minutes = (time.monotonic() - self.start) / 60.0
        rate = done / minutes if minutes > 0 else 0.0
        best = event["best_tflops"]
        best_text = "-" if best is None else f"{best:.2f} TFLOP/s"
        if best is not None and event["base_tflops"]:
            best_text += f" ({100 * best / event['base_tflops']:.0f}% of cuBLAS)"
        if device in self._bars:
            bar = self._bars[device]
            bar.update(1)
            bar.set_postfix_str(f"{rate:.1f} trials/min, best {best_text}", refresh=True)
            return
        this = f"{event['tflops']:.2f} TFLOP/s" if event["tflops"] else event["status"]
        notes = " (stored)" if event["stored"] else ("" if event["full"] else " (timed a few runs: slower than the best)")
        left = (self.total - done) / rate if rate > 0 and self.total > done else 0.0
        self._write(f"[{done}/{self.total}]{f' {device}' if device else ''} {event['name']}: {this}{notes} | best "
                    f"{best_text} | {rate:.1f} trials/min | about {left:.1f} min left")

    def _write(self, line: str) -> None:
        if self._bars:
            next(iter(self._bars.values())).write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
