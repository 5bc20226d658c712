"""Plots (matplotlib, imported only here and only when a plot is drawn): the one figure set-up and the one
atomic PNG writer every plot of longctx uses, and the score-vs-length plots of RULER runs."""

from __future__ import annotations

import io
import os
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.files import write_atomic
from longctx.core.units import length_label
from longctx.report.results import THRESHOLD, Results


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


def plot_lines(series: list[tuple[str, list[int], list[float | None], dict]], title: str, out: Path) -> Path:
    """RULER score vs context length (log2 x-axis), one line per series, the 85.6 threshold dashed."""
    fig, ax = new_figure()
    all_lengths = sorted({L for _, ls, _, _ in series for L in ls})
    for label, ls, vs, style in series:
        pts = [(L, v) for L, v in zip(ls, vs) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **style)
    ax.set_xscale("log", base=2)
    ax.set_xticks(all_lengths, [length_label(L) for L in all_lengths])
    ax.minorticks_off()
    ax.axhline(THRESHOLD, color="grey", linestyle="--", linewidth=1, label=f"threshold {THRESHOLD}")
    ax.set_ylim(0, 100)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("RULER score")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    return save_figure(fig, out)


def plot_results(r: Results, out: str | os.PathLike) -> Path:
    """Score vs length (log2 x-axis): one thin line per task, the mean thick, the 85.6 threshold dashed."""
    L = r["lengths"]
    series = [(t, L, [r["scores"][t].get(x) for x in L], {"linewidth": 0.8, "alpha": 0.6, "markersize": 2})
              for t in r["tasks"]]
    series.append(("mean", L, [r["per_length"].get(x) for x in L], {"linewidth": 2.5, "color": "black"}))
    return plot_lines(series, f"RULER: {r['model'].get('name', '?')}", Path(out))
