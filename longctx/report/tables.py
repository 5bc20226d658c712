"""Tables of RULER results: Markdown in RULER's README layout, and CSV."""

from __future__ import annotations

import csv
import io

from longctx.core.units import length_label
from longctx.report.results import Results

def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def summary_markdown(runs: list[Results]) -> str:
    """RULER README layout: Models | Claimed Length | Effective Length | lengths... | Avg. | wAvg. (inc) |
    wAvg. (dec)."""
    lengths = sorted({L for r in runs for L in r["lengths"]})
    head = ["Models", "Claimed Length", "Effective Length", *map(length_label, lengths),
            "Avg.", "wAvg. (inc)", "wAvg. (dec)"]
    lines = [markdown_row(head), markdown_row(["---"] * len(head))]
    for r in runs:
        claimed = r["model"].get("context_length")
        eff = r["effective_length"]
        lines.append(markdown_row([
            r["model"].get("name", "?"), length_label(claimed) if claimed else "-",
            f"<{length_label(min(r['lengths']))}" if eff is None else length_label(eff),
            *[fmt(r["per_length"].get(L)) for L in lengths], fmt(r["avg"]), fmt(r["wavg_inc"]),
            fmt(r["wavg_dec"])]))
    return "\n".join(lines)


def task_markdown(r: Results) -> str:
    """One row per task (its metric, a score per length), then the per-length mean; nulls when any."""
    lengths = r["lengths"]
    head = ["Task", "Metric", *map(length_label, lengths)]
    lines = [markdown_row(head), markdown_row(["---"] * len(head))]
    for t in r["tasks"]:
        lines.append(markdown_row([t, r["metrics"].get(t, "-"), *[fmt(r["scores"][t].get(L)) for L in lengths]]))
    lines.append(markdown_row(["**mean**", "", *[fmt(r["per_length"].get(L)) for L in lengths]]))
    null_cells = [sum(r["nulls"][t].get(L) or 0 for t in r["tasks"]) for L in lengths]
    if any(null_cells):
        totals = [sum(r["samples"][t].get(L) or 0 for t in r["tasks"]) for L in lengths]
        lines.append(markdown_row(["nulls", "", *[f"{n}/{m}" for n, m in zip(null_cells, totals)]]))
    return "\n".join(lines)


def task_csv(r: Results) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["task", "metric", *r["lengths"]])
    for t in r["tasks"]:
        w.writerow([t, r["metrics"].get(t, ""), *["" if r["scores"][t].get(L) is None else r["scores"][t][L]
                                                   for L in r["lengths"]]])
    w.writerow(["mean", "", *["" if r["per_length"].get(L) is None else r["per_length"][L] for L in r["lengths"]]])
    return buf.getvalue()
