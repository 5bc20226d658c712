"""`longctx compare RUN_DIR...`: one table over RULER runs (and their sinks), from result files only.

A row per run, a column per length any run has ('-' where a run lacks it), Avg. over the lengths every
run has, degradation vs a reference length, and the mean per-length difference vs the run's parent (when
it is the YaRN child of another run) and vs a baseline run. Runs are compared on the tasks they share
and, where sample counts differ, on the samples they share. When runs have `longctx sinks` results
(`<run_dir>/sinks.json`, or a sinks.json/directory in `sinks`, matched to a run by checkpoint
fingerprint), first-token attention, M-Act and gate-mean columns follow.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import check_output, make_output, write_atomic
from longctx.core.units import length_label
from longctx.report.results import Results, load_results, mean, per_length_means
from longctx.report.settings import CompareSettings
from longctx.report.tables import fmt, markdown_row

COMPARISON_KIND = "comparison"  # its `longctx.core.files` output marker


@dataclass
class Comparison:
    names: list[str]
    lengths: list[int]
    tasks: list[str]
    reference: int
    per_length: dict[str, dict[int, float | None]]
    columns: list[str]
    rows: list[list[str]]
    notes: list[str]
    markdown: str = ""
    files: list[Path] = field(default_factory=list)
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)  # run name -> its sinks.json (longctx sinks)


def _unique_names(runs: list[Results], dirs: list[Path]) -> list[str]:
    names = [r["model"].get("name") or d.name for r, d in zip(runs, dirs)]
    if len(set(names)) < len(names):
        names = [f"{n} ({d.name})" for n, d in zip(names, dirs)]
    if len(set(names)) < len(names):
        names = [str(d) for d in dirs]
    return names


def _shared_sample_scores(runs: list[Results], dirs: list[Path], names: list[str], tasks: list[str],
                          have: dict[str, list[int]], notes: list[str]) -> dict[str, dict[str, dict[int, Any]]]:
    """Per run, task scores by length; where runs scored a (task, length) on different sample counts,
    the larger runs are rescored on the first N samples (N = the smallest count) from their predictions,
    when those are the same samples (same references) as the smallest run's. Else the table notes it."""
    from longctx.eval.predictions import read_predictions
    from longctx.eval.scoring import score_predictions

    scores = {n: {t: dict(r["scores"][t]) for t in tasks} for n, r in zip(names, runs)}
    rescored, unequal = [], []
    for t in tasks:
        for L in sorted({L for ls in have.values() for L in ls}):
            members = [(n, r, d) for n, r, d in zip(names, runs, dirs) if L in have[n]]
            counts = {n: r["samples"][t][L] for n, r, _ in members}
            if len(set(counts.values())) < 2:
                continue
            n_min = min(counts.values())
            preds = {n: read_predictions(d / "pred" / str(L) / f"{t}.jsonl") for n, _, d in members}
            firsts = {n: [p.get(i) for i in range(n_min)] for n, p in preds.items()}
            refs = [[None if rec is None else rec["outputs"] for rec in f] for f in firsts.values()]
            if any(None in x for x in refs) or any(x != refs[0] for x in refs):
                unequal.append(f"{t} {length_label(L)} ({', '.join(f'{n}: {c}' for n, c in counts.items())})")
                continue
            for n, r, _ in members:
                if counts[n] > n_min:
                    f = firsts[n]
                    scores[n][t][L] = score_predictions([rec["pred"] for rec in f], [rec["outputs"] for rec in f],
                                                        r["metrics"][t]).score
            rescored.append(f"{t} {length_label(L)}: first {n_min}")
    if rescored:
        notes.append("sample counts differ; scored on the samples every run has: " + "; ".join(rescored))
    if unequal:
        notes.append("sample counts differ and the runs' predictions do not share their first samples, so these "
                     "cells are each run's own samples: " + "; ".join(unequal))
    return scores


@dataclass
class _Table:
    """Per-length means of every run, and the lengths averages and differences are taken over."""

    names: list[str]
    lengths: list[int]
    have: dict[str, list[int]]  # a run's lengths: those with a score for every shared task
    per_length: dict[str, dict[int, float | None]]
    avg_over: list[int] | None  # the lengths every run has (None: they share none)
    reference: int = 0

    def avg(self, n: str) -> float | None:
        return mean([self.per_length[n][L] for L in (self.avg_over or self.have[n])])

    def gap(self, n: str, other: str) -> str:
        """Mean per-length difference against another run, over the lengths both have."""
        pl, po = self.per_length[n], self.per_length[other]
        both = [L for L in self.lengths if pl[L] is not None and po[L] is not None]
        return f"{mean([pl[L] - po[L] for L in both]):+.2f}" if both else "-"

    def delta(self, n: str, L: int) -> float | None:
        pl = self.per_length[n]
        return None if pl[L] is None or pl[self.reference] is None else round(pl[L] - pl[self.reference], 2)


def _table(runs: list[Results], dirs: list[Path], names: list[str], tasks: list[str], notes: list[str]) -> _Table:
    # Columns are all lengths any run has (a parent evaluated up to its trained length sits beside its YaRN
    # child that goes further); averages and differences between runs use only the lengths both sides have.
    have = {n: [L for L in r["lengths"] if all(r["scores"][t].get(L) is not None for t in tasks)]
            for n, r in zip(names, runs)}
    lengths = sorted({L for ls in have.values() for L in ls})
    if not lengths:
        raise InputError("no run has a length with scores for every shared task; nothing to compare")
    shared = [L for L in lengths if all(L in ls for ls in have.values())]
    scores = _shared_sample_scores(runs, dirs, names, tasks, have, notes)
    per_length = {n: {L: (per_length_means(scores[n], [L], tasks)[L] if L in have[n] else None) for L in lengths}
                  for n in names}
    if shared and shared != lengths:
        notes.append(f"Avg. is over the lengths every run has ({', '.join(map(length_label, shared))}); "
                     "'-': a length the run does not have")
    elif not shared:
        notes.append("the runs share no length: Avg. is over each run's own lengths, not comparable across runs")
    return _Table(names, lengths, have, per_length, shared or None)


def _reference(table: _Table, runs: list[Results], reference: int | None) -> int:
    """The given reference length, else the longest length every run had before extension."""
    if reference is None:
        trained = [r["model"].get("trained_length") for r in runs]
        limit = min((t for t in trained if t), default=None)
        pool = table.avg_over or table.lengths
        below = [L for L in pool if limit is None or L <= limit]
        return max(below) if below else pool[0]
    if reference not in table.lengths:
        raise InputError(f"--reference {reference} is not a length any run has with every shared task "
                         f"(lengths: {', '.join(map(str, table.lengths))})")
    return reference


def _rows(table: _Table, runs: list[Results], base_name: str | None) -> tuple[list[str], list[list[str]]]:
    later = [L for L in table.lengths if L > table.reference]
    columns = ["Run", *map(length_label, table.lengths), "Avg.",
               *[f"Δ{length_label(L)} vs {length_label(table.reference)}" for L in later]]
    by_fp = {r["model"].get("fingerprint"): n for n, r in zip(table.names, runs)}
    parents = {n: by_fp.get(r["model"].get("parent_fingerprint")) for n, r in zip(table.names, runs)}
    if any(parents.values()):
        columns.append("Δ vs parent")
    if base_name is not None:
        columns.append(f"Δ vs {base_name}")
    rows = []
    for n in table.names:
        row = [n, *[fmt(table.per_length[n][L]) for L in table.lengths], fmt(table.avg(n)),
               *["-" if table.delta(n, L) is None else f"{table.delta(n, L):+.2f}" for L in later]]
        if any(parents.values()):
            p = parents[n]
            row.append(f"{table.gap(n, p)} ({p})" if p else "")
        if base_name is not None:
            row.append(table.gap(n, base_name))
        rows.append(row)
    return columns, rows


def _write(cmp: Comparison, table: _Table, out: Path) -> None:
    """compare.md, compare.csv, compare.png (and compare-sinks.png) in `out`."""
    from longctx.report.plots import plot_lines
    from longctx.report.sinks import plot_sinks

    make_output(out, COMPARISON_KIND)
    write_atomic(out / "compare.md", cmp.markdown + "\n")
    later = [L for L in table.lengths if L > table.reference]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    sink_keys = ["first_token_attention", "m_act", "gate_mean"] if cmp.sinks else []
    w.writerow(["run", *table.lengths, "avg", *[f"delta_{L}_vs_{table.reference}" for L in later], *sink_keys])
    for n in table.names:
        pl = table.per_length[n]
        averages = cmp.sinks[n]["averages"] if n in cmp.sinks else {}
        w.writerow([n, *["" if pl[L] is None else pl[L] for L in table.lengths], table.avg(n),
                    *["" if table.delta(n, L) is None else table.delta(n, L) for L in later],
                    *["" if averages.get(k) is None else averages[k] for k in sink_keys]])
    write_atomic(out / "compare.csv", buf.getvalue())
    cmp.files += [out / "compare.md", out / "compare.csv"]
    try:
        cmp.files.append(plot_lines([(n, table.lengths, [table.per_length[n][L] for L in table.lengths], {})
                                     for n in table.names], f"RULER ({len(cmp.tasks)} tasks)", out / "compare.png"))
        if cmp.sinks:
            cmp.files.append(plot_sinks(list(cmp.sinks.values()), out / "compare-sinks.png", list(cmp.sinks)))
    except InputError as e:
        cmp.notes.append(f"no plot: {e}")


def compare(s: CompareSettings) -> Comparison:
    """The comparison of `s.runs` (see the module docstring), written to `s.output` when given."""
    from longctx.checkpoint.describe import sliding_note
    from longctx.report.sinks import COMPARE_COLUMNS, compare_cells, sinks_for_runs

    dirs = [Path(d) for d in s.runs]
    if s.baseline is not None and Path(s.baseline) not in dirs:
        dirs.append(Path(s.baseline))
    if s.output is not None:
        check_output(Path(s.output), COMPARISON_KIND, inputs=[("run", d) for d in dirs])
    runs = [load_results(d) for d in dirs]
    names = _unique_names(runs, dirs)
    notes: list[str] = []
    tasks = [t for t in runs[0]["tasks"] if all(t in r["tasks"] for r in runs)]
    if not tasks:
        raise InputError("these runs share no task; nothing to compare")
    all_tasks = sorted({t for r in runs for t in r["tasks"]})
    if len(all_tasks) != len(tasks):
        notes.append(f"compared on the {len(tasks)} tasks every run has ({', '.join(tasks)}); "
                     f"left out: {', '.join(t for t in all_tasks if t not in tasks)}")
    table = _table(runs, dirs, names, tasks, notes)
    notes += [n for run, name in zip(runs, names)
              if (n := sliding_note(name, run["model"].get("sliding_window"), run["lengths"]))]
    table.reference = _reference(table, runs, s.reference)
    base_name = names[dirs.index(Path(s.baseline))] if s.baseline is not None else None
    columns, rows = _rows(table, runs, base_name)
    sink_docs, sink_notes = sinks_for_runs(runs, dirs, s.sinks)
    notes += sink_notes
    if any(sink_docs):
        columns += COMPARE_COLUMNS
        for row, doc in zip(rows, sink_docs):
            row += compare_cells(doc)
    cmp = Comparison(names, table.lengths, tasks, table.reference, table.per_length, columns, rows, notes,
                     sinks={n: d for n, d in zip(names, sink_docs) if d is not None})
    ref = length_label(table.reference)
    lines = [markdown_row(columns), markdown_row(["---"] * len(columns)), *map(markdown_row, rows), "",
             f"Scores: mean of {len(tasks)} RULER tasks per length; ΔL vs {ref}: the run's score at L minus its score "
             f"at the reference length {ref}; Δ vs another run: the mean per-length difference over the lengths "
             "both have."]
    if cmp.sinks:
        lines.append("First-token attn, M-Act, Gate mean: 'longctx sinks' averages over layers (from sinks.json).")
    lines += [f"Note: {x}" for x in notes]
    cmp.markdown = "\n".join(lines)
    if s.output is not None:
        _write(cmp, table, Path(s.output))
    return cmp
