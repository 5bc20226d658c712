"""The files of a comparison (`longctx compare -o OUT`): compare.md, compare.csv, compare.json (`COMPARE_FORMAT`)
and compare.png (and compare-sinks.png when runs have sinks results)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import make_output, write_atomic, write_json
from longctx.report import stats
from longctx.report.compare.comparison import Comparison
from longctx.report.compare.seeds import verdict
from longctx.report.plots import Series, plot_lines
from longctx.report.sinks import SINK_VALUES, plot_sinks, sink_values

COMPARISON_KIND = "comparison"  # its `longctx.core.files` output marker

COMPARE_FORMAT = "longctx-compare/1"


def comparison_json(cmp: Comparison) -> dict[str, Any]:
    """compare.json: length keys are decimal strings, as in results.json."""

    def by_length(d: dict[int, Any]) -> dict[str, Any]:
        return {str(L): v for L, v in d.items()}

    intervals = cmp.intervals
    return {
        "format": COMPARE_FORMAT, "layout": cmp.layout, "tasks": cmp.tasks, "lengths": cmp.lengths,
        "reference": cmp.reference, "baseline": cmp.baseline,
        "runs": [{"name": r.name, "run_dir": str(r.path), "fingerprint": r.results["model"].get("fingerprint"),
                  "parent": r.parent, "sinks": sink_values(r.sinks)} for r in cmp.runs],
        "per_length": {n: by_length(scores) for n, scores in cmp.per_length.items()},
        "avg": {r.name: cmp.table.avg(r) for r in cmp.runs},
        "intervals": {n: by_length(intervals[n]) if any(b is not None for b in intervals[n].values()) else None
                      for n in cmp.names},
        "differences": {versus: {n: {**e, "per_length": by_length(e["per_length"])} for n, e in entries.items()}
                        for versus, entries in cmp.differences.items()},
        "method": stats.METHOD, "notes": cmp.notes,
        "seeds": None if not cmp.seed_groups else {
            "groups": {g.name: _length_keys(g.as_dict()) for g in cmp.seed_groups},
            "baseline": cmp.seed_baseline,
            "differences": {n: _length_keys(d.as_dict()) for n, d in cmp.seed_differences.items()},
            "verdict": verdict(cmp.seed_differences, cmp.seed_baseline, cmp.lengths)},
    }


def _length_keys(d: dict[str, Any]) -> dict[str, Any]:
    """`d` with its per_length keys as decimal strings (as in results.json)."""
    return {**d, "per_length": {str(L): v for L, v in d["per_length"].items()}}


def comparison_csv(cmp: Comparison) -> str:
    """compare.csv: a row per run, its score per length, avg, the degradation columns and the sinks averages."""
    table = cmp.table
    later = [L for L in table.lengths if L > table.reference]
    sink_keys = list(SINK_VALUES) if cmp.sinks else []
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["run", *table.lengths, "avg", *[f"delta_{L}_vs_{table.reference}" for L in later], *sink_keys])
    for r in table.runs:
        values = sink_values(r.sinks) or {}
        w.writerow([r.name, *["" if L not in r.per_length else r.per_length[L] for L in table.lengths], table.avg(r),
                    *["" if table.delta(r, L) is None else table.delta(r, L) for L in later],
                    *["" if values.get(k) is None else values[k] for k in sink_keys]])
    return buf.getvalue()


def _plot_series(cmp: Comparison) -> list[Series]:
    """A line per run, with the band of its intervals where it has them."""
    series = []
    for r in cmp.runs:
        style: dict[str, Any] = {}
        bounds = [(r.intervals or {}).get(L) for L in cmp.lengths]
        if any(b is not None for b in bounds):
            style["band"] = ([None if b is None else b["lo"] for b in bounds],
                             [None if b is None else b["hi"] for b in bounds])
        series.append((r.name, cmp.lengths, [r.per_length.get(L) for L in cmp.lengths], style))
    return series


def write_comparison(cmp: Comparison, out: Path) -> None:
    """compare.md, compare.csv, compare.json, compare.png (and compare-sinks.png) in `out`, added to `cmp.files`.
    A plot that cannot be drawn is a note (after compare.json is written)."""
    make_output(out, COMPARISON_KIND)
    write_atomic(out / "compare.md", cmp.markdown + "\n")
    write_atomic(out / "compare.csv", comparison_csv(cmp))
    write_json(out / "compare.json", comparison_json(cmp))
    cmp.files += [out / "compare.md", out / "compare.csv", out / "compare.json"]
    try:
        cmp.files.append(plot_lines(_plot_series(cmp), f"RULER ({len(cmp.tasks)} tasks)", out / "compare.png"))
        if cmp.sinks:
            cmp.files.append(plot_sinks(list(cmp.sinks.values()), out / "compare-sinks.png", list(cmp.sinks)))
    except InputError as e:
        cmp.notes.append(f"no plot: {e}")
