"""The report files of one RULER run directory: `scores.json` -> results.json, results.md, results.csv,
results.png. Reads files only; never runs a model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.files import write_atomic, write_json
from longctx.info.describe import sliding_note
from longctx.report import stats
from longctx.report.plots import plot_results
from longctx.report.results import RESULTS_FILE, Results, build_results, read_scores, to_json, with_intervals
from longctx.report.samples import scored_samples
from longctx.report.tables import summary_markdown, task_csv, task_markdown


@dataclass
class Report:
    """What writing a report made: the results it read, the files it wrote, its Markdown, notes (no plot)."""

    results: Results | dict
    files: list[Path] = field(default_factory=list)
    markdown: str = ""
    notes: list[str] = field(default_factory=list)


def write_report(run_dir: str | os.PathLike, plot: bool = True, intervals: bool = False) -> Report:
    """Turn `run_dir/scores.json` into results.json, results.md, results.csv and results.png. results.json and
    results.csv always carry the 95% intervals when the predictions are there to compute them from;
    `intervals` also shows them in results.md as `score ± half-width`."""
    run = Path(run_dir)
    results = build_results(read_scores(run))
    samples, why = scored_samples(run, results)
    results = with_intervals(results, samples)
    rep = Report(results)
    if why:
        rep.notes.append(f"no intervals: {why}")
    write_json(run / RESULTS_FILE, to_json(results))
    rep.markdown = summary_markdown([results], intervals) + "\n\n" + task_markdown(results, intervals)
    if intervals:
        rep.markdown += (f"\n\nScores are shown as score ± half the width of their {stats.INTERVAL_WORDS}."
                         if samples is not None else f"\n\nNote: no intervals: {why}.")
    window = sliding_note(results["model"]["name"], results["model"].get("sliding_window"), results["lengths"])
    if window:
        rep.markdown += f"\n\nNote: {window}."
    write_atomic(run / "results.md", rep.markdown + "\n")
    write_atomic(run / "results.csv", task_csv(results))
    rep.files += [run / RESULTS_FILE, run / "results.md", run / "results.csv"]
    if plot:
        try:
            plot_results(results, run / "results.png")
            rep.files.append(run / "results.png")
        except InputError as e:
            rep.notes.append(f"no plot: {e}")
    return rep

