"""Drawing each kind of picture from its plain data (history.History, suite.SuiteGrid,
ladder.Ladder, importance.Importances). Every function takes matplotlib.pyplot and the data and
returns the figure, unsaved.

Each picture must read in greyscale: series differ by marker, line style or hatching as well as
by shade, the heatmap's colour map (cividis) darkens monotonically, and numbers are written on
the cells and bars.
"""

import math

from gemmgen.plot.history import History
from gemmgen.plot.importance import Importances
from gemmgen.plot.ladder import Ladder
from gemmgen.plot.suite import SuiteGrid

HEATMAP = "cividis"
# Fill shade and hatch of each ladder series in order; cuBLAS is drawn black apart from these.
_BAR_STYLES = [("0.95", ""), ("0.8", "..."), ("0.65", "\\\\"), ("0.5", "xx"), ("0.35", "--"), ("0.2", "oo")]
_CUBLAS_HATCHES = ["", "//", "++"]


def history(pyplot, data: History):
    """TFLOP/s of each trial in the order the trials finished (open circles), the best so far (a
    solid step line), the cuBLAS TFLOP/s of the tune (dashed) and failed trials (crosses along the
    bottom). The order, not the clock, is the x axis: a study resumed hours later has no gap."""
    fig, ax = pyplot.subplots(figsize=(9, 5))
    order = range(1, len(data.trials) + 1)
    ok = [(i, t) for i, t in zip(order, data.trials) if t.tflops is not None]
    ax.plot([i for i, _ in ok], [t.tflops for _, t in ok], linestyle="none", marker="o", markersize=4,
            markerfacecolor="none", markeredgecolor="0.45", label=f"trial ({len(ok)})")
    steps = [(i, b) for i, b in zip(order, data.best_so_far) if b is not None]
    if steps:
        ax.step([i for i, _ in steps], [b for _, b in steps], where="post", color="black", linewidth=2,
                label=f"best so far ({data.best:.1f})")
    if data.cublas_tflops:
        ax.axhline(data.cublas_tflops, color="black", linestyle="--", linewidth=1.2,
                   label=f"cuBLAS ({data.cublas_tflops:.1f})")
    failed = [i for i, t in zip(order, data.trials) if t.tflops is None]
    if failed:
        ax.plot(failed, [0.02] * len(failed), transform=ax.get_xaxis_transform(), linestyle="none", marker="x",
                markersize=6, color="black", label=f"failed ({len(failed)})")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("trials finished")
    ax.set_ylabel("TFLOP/s (geometric mean over the study's shapes)")
    note = f"{len(data.trials)} trials, {data.failures} failed"
    if data.infeasible:
        note += f", {data.infeasible} broke a constraint (not measured)"
    ax.set_title(f"{data.study}\n{note}")
    ax.legend(loc="lower right")
    return fig


def suite(pyplot, data: SuiteGrid):
    """A shape x precision grid of ratios to cuBLAS, each written in its cell (bold where the
    kernel is at least as fast as cuBLAS; "-" where nothing is stored), with the geometric mean
    of each precision under its name."""
    from matplotlib.colors import LogNorm

    grid = [[data.ratio(s, p) for p in data.precisions] for s in data.shapes]
    values = [v for row in grid for v in row if v is not None]
    # 1.0 in the middle of the scale, as far as the worst ratio is below it; the few far above
    # (odd shapes where cuBLAS is slow) saturate, their numbers say how far.
    low = min(values + [1.0])
    high = max(values + [1.0])
    top = max(min(high, 1.0 / low), 1.01)
    norm = LogNorm(vmin=min(low, 0.99), vmax=top)
    cmap = pyplot.get_cmap(HEATMAP)
    fig, ax = pyplot.subplots(figsize=(8.5, 0.55 * len(data.shapes) + 2))
    image = ax.imshow([[v if v is not None else float("nan") for v in row] for row in grid], cmap=cmap,
                      norm=norm, aspect="auto")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if value is None:
                ax.text(j, i, "-", ha="center", va="center", color="black")
                continue
            r, g, b, _ = cmap(norm(min(value, top)))
            ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color=ink,
                    fontweight="bold" if value >= 1.0 else "normal")
    ax.set_xticks(range(len(data.precisions)),
                  [p + (f"\n(geomean {g:.3f})" if (g := data.geomeans.get(p)) else "") for p in data.precisions])
    ax.set_yticks(range(len(data.shapes)), [str(s) for s in data.shapes])
    ax.tick_params(axis="x", top=True, labeltop=True, bottom=False, labelbottom=False)
    ax.grid(False)
    ax.set_ylabel("shape (M x N x K)")
    ax.set_title(f"suite on {data.arch}: cuBLAS's time / the kernel's (> 1: faster; bold: >= 1)", pad=12)
    bar = fig.colorbar(image, ax=ax, label="ratio to cuBLAS", extend="max" if high > top else "neither")
    bar.ax.minorticks_off()
    ticks = [t / 20 for t in range(math.ceil(20 * norm.vmin), math.floor(20 * norm.vmax) + 1)]
    bar.set_ticks(ticks, labels=[f"{t:.2f}" for t in ticks])
    return fig


def ladder(pyplot, data: Ladder):
    """Grouped bars per shape, one per series (shade and hatch apart), on a log TFLOP/s scale;
    the named points stored nowhere are listed under the axes."""
    fig, ax = pyplot.subplots(figsize=(max(8, 1.1 * len(data.shapes) + 2), 5))
    labels = list(data.series)
    width = 0.8 / len(labels)
    points = [l for l in labels if not l.startswith("cuBLAS")]
    for i, label in enumerate(labels):
        found = data.series[label]
        xs = [x + (i - (len(labels) - 1) / 2) * width for x, s in enumerate(data.shapes) if s in found]
        ys = [found[s].tflops for s in data.shapes if s in found]
        if label.startswith("cuBLAS"):
            hatch = _CUBLAS_HATCHES[(i - len(points)) % len(_CUBLAS_HATCHES)]
            ax.bar(xs, ys, width, color="0.1", edgecolor="white", hatch=hatch, label=label)
        else:
            shade, hatch = _BAR_STYLES[i % len(_BAR_STYLES)]
            ax.bar(xs, ys, width, color=shade, edgecolor="black", hatch=hatch, label=label)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(range(len(data.shapes)), [str(s) for s in data.shapes], rotation=30, ha="right")
    xlabel = "shape (M x N x K)"
    if data.missing:
        xlabel += (f"\nnot stored, so not drawn: {', '.join(data.missing)} "
                   f"(`gemmgen bench {' '.join(data.missing)}` measures them)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TFLOP/s (highest stored, log scale)")
    ax.set_title(f"the named points and cuBLAS on {data.arch}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def importance(pyplot, data: Importances):
    """Horizontal bars of each parameter's importance, most important on top, each written at
    its bar's end."""
    names = [name for name, _ in data.importances][::-1]
    values = [value for _, value in data.importances][::-1]
    fig, ax = pyplot.subplots(figsize=(7, 0.4 * len(names) + 1.5))
    ax.barh(names, values, color="0.55", edgecolor="black")
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:.3f}", va="center")
    ax.set_xlim(0, max(values) * 1.2 if max(values) > 0 else 1)
    ax.set_xlabel(f"importance ({data.evaluator}, Optuna; sums to 1)")
    ax.set_title(f"{data.study}\nparameter importances over {data.trials} complete trials")
    return fig
