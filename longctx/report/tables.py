"""Tables of RULER results: Markdown in RULER's README layout, and CSV.

results.csv starts with the score table (`task,metric,<length>...`: a row per task, then `mean`); when the run
has intervals, rows `<task> se`, then `<task> lo`, then `<task> hi` follow (each block a row per task, then
`mean se` / `mean lo` / `mean hi`), with the lengths' columns and the task's metric. A reader of the first
rows sees the table it always did; task names hold no space, so in pandas

    df = pd.read_csv("results.csv")
    df[["task", "stat"]] = df["task"].str.split(" ", n=1, expand=True)
    t = df.fillna({"stat": "score"}).set_index(["stat", "task"])  # t.loc["lo"], t.xs("vt", level="task")
"""

from __future__ import annotations

import csv
import io

from longctx.core.units import length_label
from longctx.report.results import Results

STATISTICS = ("se", "lo", "hi")  # the rows results.csv adds per task and for the mean


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def fmt_pm(v: float | None, bounds: dict[str, float] | None) -> str:
    """`v ± half-width` of its interval `bounds` ({"lo", "hi", ...}), 2 decimals; `fmt(v)` without one."""
    if v is None or bounds is None:
        return fmt(v)
    return f"{v:.2f} ± {(bounds['hi'] - bounds['lo']) / 2:.2f}"


def _task_bounds(r: Results, t: str, L: int) -> dict[str, float] | None:
    iv = r.get("intervals")
    return None if iv is None else iv["scores"].get(t, {}).get(L)


def _length_bounds(r: Results, L: int) -> dict[str, float] | None:
    iv = r.get("intervals")
    return None if iv is None else iv["per_length"].get(L)


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def summary_markdown(runs: list[Results], intervals: bool = False) -> str:
    """RULER README layout: Models | Claimed Length | Effective Length | lengths... | Avg. | wAvg. (inc) |
    wAvg. (dec). With `intervals`, each length's mean as `mean ± half-width` where the run has intervals."""
    lengths = sorted({L for r in runs for L in r["lengths"]})
    head = ["Models", "Claimed Length", "Effective Length", *map(length_label, lengths),
            "Avg.", "wAvg. (inc)", "wAvg. (dec)"]
    lines = [markdown_row(head), markdown_row(["---"] * len(head))]
    for r in runs:
        claimed = r["model"].get("context_length")
        eff = r["effective_length"]
        cells = [fmt_pm(r["per_length"].get(L), _length_bounds(r, L) if intervals else None) for L in lengths]
        lines.append(markdown_row([
            r["model"].get("name", "?"), length_label(claimed) if claimed else "-",
            f"<{length_label(min(r['lengths']))}" if eff is None else length_label(eff),
            *cells, fmt(r["avg"]), fmt(r["wavg_inc"]), fmt(r["wavg_dec"])]))
    return "\n".join(lines)


def task_markdown(r: Results, intervals: bool = False) -> str:
    """One row per task (its metric, a score per length), then the per-length mean; then, when any prediction
    is empty (a model that ends its answer at once: RULER's "nulls"), how many of the samples were. With
    `intervals`, scores as `score ± half-width` where the run has intervals."""
    lengths = r["lengths"]
    head = ["Task", "Metric", *map(length_label, lengths)]
    lines = [markdown_row(head), markdown_row(["---"] * len(head))]
    for t in r["tasks"]:
        cells = [fmt_pm(r["scores"][t].get(L), _task_bounds(r, t, L) if intervals else None) for L in lengths]
        lines.append(markdown_row([t, r["metrics"].get(t, "-"), *cells]))
    means = [fmt_pm(r["per_length"].get(L), _length_bounds(r, L) if intervals else None) for L in lengths]
    lines.append(markdown_row(["**mean**", "", *means]))
    null_cells = [sum(r["nulls"][t].get(L) or 0 for t in r["tasks"]) for L in lengths]
    if any(null_cells):
        totals = [sum(r["samples"][t].get(L) or 0 for t in r["tasks"]) for L in lengths]
        lines.append(markdown_row(["empty predictions", "", *[f"{n} of {m}" for n, m in zip(null_cells, totals)]]))
    return "\n".join(lines)


def _cell(v: float | None) -> float | str:
    return "" if v is None else v


def task_csv(r: Results) -> str:
    """The score table, then (when the run has intervals) its se, lo and hi rows: see the module docstring."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    lengths = r["lengths"]
    w.writerow(["task", "metric", *lengths])
    for t in r["tasks"]:
        w.writerow([t, r["metrics"].get(t, ""), *[_cell(r["scores"][t].get(L)) for L in lengths]])
    w.writerow(["mean", "", *[_cell(r["per_length"].get(L)) for L in lengths]])
    if r.get("intervals") is not None:
        for stat in STATISTICS:
            for t in r["tasks"]:
                w.writerow([f"{t} {stat}", r["metrics"].get(t, ""),
                            *[_cell((_task_bounds(r, t, L) or {}).get(stat)) for L in lengths]])
            w.writerow([f"mean {stat}", "", *[_cell((_length_bounds(r, L) or {}).get(stat)) for L in lengths]])
    return buf.getvalue()
