"""Plots (matplotlib, imported only here and only when a plot is drawn): the one figure set-up and the one
atomic PNG writer every plot of longctx uses, and the score-vs-length plots of RULER runs."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.files import write_atomic
from longctx.core.units import length_label
from longctx.report.results import THRESHOLD, Results

# colour x marker: 40 distinct (colour, marker) pairs (lcm of 10 and 8), so lines stay apart in grey print too
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
BAND_ALPHA = 0.15

Series = tuple[str, list[int], list[float | None], dict]  # label, lengths, values, ax.plot style (+ "band")


def new_figure(ncols: int = 1, size: tuple[float, float] = (7, 4.5)):
    """(figure, axes) on the Agg backend; InputError when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("plots need matplotlib: pip install 'longctx[plot]'") from None
    return plt.subplots(1, ncols, figsize=size, dpi=110)


def save_figure(fig, out: str | os.PathLike) -> Path:
    """Write `fig` as a PNG to `out` atomically (never half a PNG) and release it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return write_atomic(out, buf.getvalue())


def _draw_band(ax, lengths: list[int], band: tuple[list, list], color) -> None:
    """The interval band of one line: filled between its lows and highs (gaps where either is None)."""
    lows, highs = band
    pts = [(L, lo, hi) for L, lo, hi in zip(lengths, lows, highs) if lo is not None and hi is not None]
    if not pts:
        return
    if len(pts) == 1:  # a band over one length has no width: a bar shows it
        ax.vlines([pts[0][0]], [pts[0][1]], [pts[0][2]], color=color, alpha=0.5, linewidth=4)
        return
    nan = float("nan")
    ax.fill_between(lengths, [nan if v is None else v for v in lows], [nan if v is None else v for v in highs],
                    color=color, alpha=BAND_ALPHA, linewidth=0)


def lines_figure(series: list[Series], title: str):
    """(figure, axes) of `plot_lines`, not saved."""
    labels = [s[0] for s in series] + [f"threshold {THRESHOLD}"]
    ncol = 4 if max(map(len, labels)) <= 18 else 2
    rows = math.ceil(len(labels) / ncol)
    fig, ax = new_figure(size=(7, 4.2 + 0.2 * rows))  # the legend below the axes grows the figure, not shrinks it
    import matplotlib

    colors = matplotlib.colormaps["tab10"].colors
    all_lengths = sorted({L for _, ls, _, _ in series for L in ls})
    for i, (label, ls, vs, style) in enumerate(series):
        style = dict(style)
        band = style.pop("band", None)
        style.setdefault("color", colors[i % len(colors)])
        style.setdefault("marker", MARKERS[i % len(MARKERS)])
        pts = [(L, v) for L, v in zip(ls, vs) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        if band is not None:
            _draw_band(ax, ls, band, style["color"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(all_lengths, [length_label(L) for L in all_lengths])
    ax.minorticks_off()
    ax.axhline(THRESHOLD, color="grey", linestyle="--", linewidth=1, label=labels[-1])
    # on the line itself too: a reader of a printed or cropped plot has no legend to look it up in
    ax.text(0.995, THRESHOLD + 0.8, f"threshold {THRESHOLD}", transform=ax.get_yaxis_transform(), ha="right",
            va="bottom", fontsize=7, color="dimgrey", zorder=5,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 1})
    ax.set_ylim(0, 100)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("RULER score")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=ncol, frameon=False)
    return fig, ax


def plot_lines(series: list[Series], title: str, out: Path) -> Path:
    """RULER score vs context length (log2 x-axis), one line per series, the 85.6 threshold dashed and labelled.
    A series' style may carry "band": (lows, highs), aligned with its lengths (None where absent): its interval,
    drawn as a translucent band in the line's colour."""
    fig, _ = lines_figure(series, title)
    return save_figure(fig, out)


def results_series(r: Results) -> list[Series]:
    """One thin line per task, the mean thick, with its interval band when `r` has intervals."""
    L = r["lengths"]
    series: list[Series] = [(t, L, [r["scores"][t].get(x) for x in L],
                             {"linewidth": 0.8, "alpha": 0.6, "markersize": 2}) for t in r["tasks"]]
    mean_style: dict = {"linewidth": 2.5, "color": "black", "marker": "o"}
    iv = r.get("intervals")
    if iv is not None:
        bounds = [iv["per_length"].get(x) for x in L]
        mean_style["band"] = ([None if b is None else b["lo"] for b in bounds],
                              [None if b is None else b["hi"] for b in bounds])
    series.append(("mean", L, [r["per_length"].get(x) for x in L], mean_style))
    return series


def plot_results(r: Results, out: str | os.PathLike) -> Path:
    """Score vs length (log2 x-axis): one thin line per task, the mean thick (its 95% interval a band when `r`
    has intervals), the 85.6 threshold dashed."""
    return plot_lines(results_series(r), f"RULER: {r['model'].get('name', '?')}", Path(out))
