"""`longctx compare RUN_DIR...`: one table over RULER runs (and their sinks), from result files only.

Default layout: a row per run, a column per length any run has ('-' where a run lacks it), Avg. over the
lengths every run has, degradation vs a reference length, and the mean per-length difference vs the run's
parent (when it is the YaRN child of another run) and vs a baseline run. `--layout table5`: the Gated
Attention paper's Table 5, a row per run and a column per length ('–' where absent), a YaRN run's cells as
`score (score - parent's score)`. A run's parent is the run whose checkpoint fingerprint is its
`parent_fingerprint`, or the one `--parent CHILD=PARENT` names.

Runs are compared on the tasks they share and, where sample counts differ, on the samples they share. With
`--baseline` (and in the table5 layout, each YaRN run vs its parent) the differences come with statistics
(`longctx.report.stats`): where both runs answered the same prompts (per-sample prompt hashes equal at the
same sample number, checked, never assumed) a paired difference (paired-bootstrap interval, sign-flip p);
where the prompts differ the unpaired difference of the scores; without per-sample predictions the point
difference only. `--intervals` shows scores as `score ± half-width` of their 95% interval: the run's own
when the table shows its own score, recomputed from its predictions when compare rescored it on shared
tasks or samples. When runs have `longctx sinks` results (`<run_dir>/sinks.json`, or a sinks.json/directory
in `sinks`, matched to a run by checkpoint fingerprint), first-token attention, M-Act and gate-mean columns
follow.

With `-o`, compare.md, compare.csv, compare.json (`COMPARE_FORMAT`: runs, per-length scores, intervals,
differences and `stats.METHOD`) and compare.png are written.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError, ref
from longctx.core.files import check_output, make_output, write_atomic, write_json
from longctx.core.kinds import did_you_mean
from longctx.core.units import length_label
from longctx.report import stats
from longctx.report.external import load_run
from longctx.report.results import Results, mean, per_length_means
from longctx.report.samples import sample_answers
from longctx.report.settings import CompareSettings
from longctx.report.tables import fmt, fmt_pm, markdown_row

COMPARISON_KIND = "comparison"  # its `longctx.core.files` output marker
COMPARE_FORMAT = "longctx-compare/1"
ABSENT = {"default": "-", "table5": "–"}  # a cell of a length the run does not have

Bounds = dict[str, float]  # {"se", "lo", "hi"} of one score (`stats.Interval.as_dict`)


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
    layout: str = "default"
    parents: dict[str, str] = field(default_factory=dict)  # run name -> its parent's run name
    # run name -> length -> the 95% interval of its per-length score as the table shows it (None: none)
    intervals: dict[str, dict[int, Bounds | None]] = field(default_factory=dict)
    # "baseline" (vs --baseline) or "parent" (table5: a YaRN run vs its parent) -> run name -> {"against": name,
    # "method": "paired" | "unpaired" | "point", "per_length": {L: diff}, "overall": diff | None}, a diff being
    # `stats.Difference.as_dict()` (a point difference: lo, hi, p and significant None, pairs 0)
    differences: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)


def _unique_names(runs: list[Results], dirs: list[Path]) -> list[str]:
    names = [r["model"].get("name") or d.name for r, d in zip(runs, dirs)]
    if len(set(names)) < len(names):
        names = [f"{n} ({d.name})" for n, d in zip(names, dirs)]
    if len(set(names)) < len(names):
        names = [str(d) for d in dirs]
    return names


Counts = dict[str, dict[str, dict[int, int]]]  # run -> task -> length -> samples its table score is over


def _shared_sample_scores(runs: list[Results], dirs: list[Path], names: list[str], tasks: list[str],
                          have: dict[str, list[int]], notes: list[str]
                          ) -> tuple[dict[str, dict[str, dict[int, Any]]], Counts]:
    """Per run, task scores by length; where runs scored a (task, length) on different sample counts,
    the larger runs are rescored on the first N samples (N = the smallest count) from their predictions,
    when those are the same samples (same references) as the smallest run's. Else the table notes it.
    Also the number of samples each score is over."""
    from longctx.eval.scoring import score_predictions

    scores = {n: {t: dict(r["scores"][t]) for t in tasks} for n, r in zip(names, runs)}
    used = {n: {t: {L: c for L, c in r["samples"][t].items() if c} for t in tasks} for n, r in zip(names, runs)}
    rescored, unequal = [], []
    for t in tasks:
        for L in sorted({L for ls in have.values() for L in ls}):
            members = [(n, r, d) for n, r, d in zip(names, runs, dirs) if L in have[n]]
            counts = {n: r["samples"][t][L] for n, r, _ in members}
            if len(set(counts.values())) < 2 or None in counts.values():  # None: another tool's, counts unknown
                continue
            n_min = min(counts.values())
            # the first samples with references from each run's task file (never from its prediction lines)
            answers = {n: sample_answers(d, t, L, n_min) for n, _, d in members}
            firsts = list(answers.values())
            if any(a is None for a in firsts) or any(a.prompts != firsts[0].prompts for a in firsts):
                unequal.append(f"{t} {length_label(L)} ({', '.join(f'{n}: {c}' for n, c in counts.items())})")
                continue
            for n, r, _ in members:
                if counts[n] > n_min:
                    a = answers[n]
                    scores[n][t][L] = score_predictions(a.preds, a.refs, r["metrics"][t]).score
                    used[n][t][L] = n_min
            rescored.append(f"{t} {length_label(L)}: first {n_min}")
    if rescored:
        notes.append("sample counts differ; scored on the samples every run has: " + "; ".join(rescored))
    if unequal:
        notes.append("sample counts differ and the runs' predictions do not share their first samples, so these "
                     "cells are each run's own samples: " + "; ".join(unequal))
    return scores, used


@dataclass
class _Table:
    """Per-length means of every run, and the lengths averages and differences are taken over."""

    names: list[str]
    lengths: list[int]
    have: dict[str, list[int]]  # a run's lengths: those with a score for every shared task
    per_length: dict[str, dict[int, float | None]]
    avg_over: list[int] | None  # the lengths every run has (None: they share none)
    used: Counts
    rescaled: dict[str, set[int]]  # a run's lengths whose table score is not its own (other tasks or samples)
    reference: int = 0

    def avg(self, n: str) -> float | None:
        return mean([self.per_length[n][L] for L in (self.avg_over or self.have[n])])

    def both(self, n: str, other: str) -> list[int]:
        return [L for L in self.lengths if L in self.have[n] and L in self.have[other]]

    def gap(self, n: str, other: str) -> str:
        """Mean per-length difference against another run, over the lengths both have."""
        pl, po = self.per_length[n], self.per_length[other]
        both = self.both(n, other)
        return f"{mean([pl[L] - po[L] for L in both]):+.2f}" if both else "-"

    def delta(self, n: str, L: int) -> float | None:
        pl = self.per_length[n]
        return None if pl[L] is None or pl[self.reference] is None else round(pl[L] - pl[self.reference], 2)


def _table(runs: list[Results], dirs: list[Path], names: list[str], tasks: list[str], notes: list[str],
           averages: bool) -> _Table:
    # Columns are all lengths any run has (a parent evaluated up to its trained length sits beside its YaRN
    # child that goes further); averages and differences between runs use only the lengths both sides have.
    if not tasks:  # a run gives per-length means only: every run is shown with its own
        return _means_table(runs, names, notes, averages)
    have = {n: [L for L in r["lengths"] if all(r["scores"][t].get(L) is not None for t in tasks)]
            for n, r in zip(names, runs)}
    lengths = sorted({L for ls in have.values() for L in ls})
    if not lengths:
        raise InputError("no run has a length with scores for every shared task; nothing to compare")
    shared = [L for L in lengths if all(L in ls for ls in have.values())]
    scores, used = _shared_sample_scores(runs, dirs, names, tasks, have, notes)
    per_length = {n: {L: (per_length_means(scores[n], [L], tasks)[L] if L in have[n] else None) for L in lengths}
                  for n in names}
    rescaled = {n: {L for L in have[n]
                    if {t for t in r["tasks"] if r["scores"][t].get(L) is not None} != set(tasks)
                    or any(used[n][t].get(L) != r["samples"][t][L] for t in tasks)}
                for n, r in zip(names, runs)}
    if averages and shared and shared != lengths:
        notes.append(f"Avg. is over the lengths every run has ({', '.join(map(length_label, shared))}); "
                     "'-': a length the run does not have")
    elif averages and not shared:
        notes.append("the runs share no length: Avg. is over each run's own lengths, not comparable across runs")
    return _Table(names, lengths, have, per_length, shared or None, used, rescaled)


def _means_table(runs: list[Results], names: list[str], notes: list[str], averages: bool) -> _Table:
    """The table of runs compared on their own per-length means (one of them gives nothing else)."""
    have = {n: [L for L in r["lengths"] if r["per_length"].get(L) is not None] for n, r in zip(names, runs)}
    lengths = sorted({L for ls in have.values() for L in ls})
    if not lengths:
        raise InputError("no run has a per-length score; nothing to compare")
    shared = [L for L in lengths if all(L in ls for ls in have.values())]
    per_length = {n: {L: r["per_length"][L] if L in have[n] else None for L in lengths} for n, r in zip(names, runs)}
    if averages and shared and shared != lengths:
        notes.append(f"Avg. is over the lengths every run has ({', '.join(map(length_label, shared))}); "
                     "'-': a length the run does not have")
    return _Table(names, lengths, have, per_length, shared or None, {n: {} for n in names},
                  {n: set() for n in names})


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


def _parents(s: CompareSettings, runs: list[Results], names: list[str]) -> dict[str, str]:
    """Run name -> its parent's run name: by checkpoint fingerprint, then as `--parent` says."""
    by_fp = {r["model"]["fingerprint"]: n for n, r in zip(names, runs) if r["model"].get("fingerprint")}
    out = {n: by_fp[r["model"]["parent_fingerprint"]] for n, r in zip(names, runs)
           if r["model"].get("parent_fingerprint") in by_fp and by_fp[r["model"]["parent_fingerprint"]] != n}
    for child, parent in s.parents.items():
        # KEY=VALUE values are read as JSON, so a run named like a number arrives as one
        child, parent = str(child), parent if isinstance(parent, str) else str(parent)
        for x in (child, parent):
            if x not in names:
                raise s.error(f"{ref('parents')} names '{x}', which is not one of the runs "
                              f"({', '.join(names)}){did_you_mean(x, names)}")
        if child == parent:
            raise s.error(f"{ref('parents')} makes '{child}' its own parent")
        out[child] = parent
    return {n: out[n] for n in names if n in out}


Samples = dict[str, dict[int, Any]]  # task -> length -> `samples.Cell`


def _run_samples(run_dir: Path | None, results: Results, tasks: list[str]) -> tuple[Samples | None, str | None]:
    """The run's per-sample scores and prompt hashes, or (None, why not)."""
    from longctx.report.samples import scored_samples

    if run_dir is None:
        return None, f"results from {results['model'].get('source', 'another tool')} hold no per-sample scores"
    if not tasks:
        return None, "the runs are compared on per-length means only"
    return scored_samples(run_dir, results)


def _cell_scores(samples: Samples, table: _Table, n: str, tasks: list[str], L: int) -> list[list[float]]:
    """Per task, the per-sample scores run `n`'s table score at `L` is the mean of."""
    return [samples[t][L].scores[:table.used[n][t][L]] for t in tasks]


def _intervals(table: _Table, runs: list[Results], tasks: list[str], samples: dict[str, Samples | None],
               why: dict[str, str | None], notes: list[str] | None) -> dict[str, dict[int, Bounds | None]]:
    """Per run and length the interval of the score the table shows: the run's own where that is its own score,
    else (compare rescored it) recomputed from its per-sample scores. `notes`: say where there is none."""
    out: dict[str, dict[int, Bounds | None]] = {}
    missing: list[str] = []
    for n, r in zip(table.names, runs):
        stored = (r.get("intervals") or {}).get("per_length") or {}
        stored = {int(L): b for L, b in stored.items()}
        out[n] = {}
        for L in table.have[n]:
            shown = table.per_length[n][L]
            if L not in table.rescaled[n] and stored.get(L) is not None:
                out[n][L] = stored[L]
            elif samples[n] is not None:
                d = stats.interval(_cell_scores(samples[n], table, n, tasks, L)).as_dict()
                # the table shows the rounded mean: the interval holds it too
                out[n][L] = {**d, "lo": min(d["lo"], shown), "hi": max(d["hi"], shown)}
            else:
                out[n][L] = None
        gaps = [L for L, b in out[n].items() if b is None]
        if gaps:
            missing.append(f"{n} at {', '.join(map(length_label, gaps))} ({why[n]})")
    if notes is not None and missing:
        notes.append("no interval for " + "; ".join(missing))
    return out


def _point(value: float) -> dict[str, Any]:
    return {"mean": round(value, 4), "lo": None, "hi": None, "p": None, "pairs": 0, "paired": False,
            "significant": None}


def _difference(x: str, y: str, table: _Table, tasks: list[str], samples: dict[str, Samples | None],
                why: dict[str, str | None], notes: list[str]) -> dict[str, Any]:
    """Run `x` - run `y`: per length they both have and over all of them (see the module docstring)."""
    both = table.both(x, y)
    entry: dict[str, Any] = {"against": y, "method": None, "per_length": {}, "overall": None}
    if not both:
        notes.append(f"{x} and {y} share no length: no difference")
        return entry
    sx, sy = samples[x], samples[y]
    if sx is None or sy is None:
        pl = {L: table.per_length[x][L] - table.per_length[y][L] for L in both}
        entry.update(method="point", per_length={L: _point(v) for L, v in pl.items()},
                     overall=_point(sum(pl.values()) / len(pl)))
        lacking = "; ".join(f"{n}: {why[n]}" for n, smp in ((x, sx), (y, sy)) if smp is None)
        notes.append(f"{x} vs {y}: point differences only, no interval or test ({lacking})")
        return entry
    paired: dict[int, tuple[list[list[float]], list[list[float]]]] = {}
    differ, partial = [], []
    for L in both:
        ax, by, same = [], [], True
        for t in tasks:
            cx, cy = sx[t][L], sy[t][L]
            n = min(table.used[x][t][L], table.used[y][t][L])
            idx = [i for i in range(n) if cx.prompts[i] == cy.prompts[i]]
            if not idx:
                same = False
                differ.append(f"{t} {length_label(L)}")
            elif len(idx) < max(table.used[x][t][L], table.used[y][t][L]):
                partial.append(f"{t} {length_label(L)}: {len(idx)} of {n}")
            ax.append([cx.scores[i] for i in idx])
            by.append([cy.scores[i] for i in idx])
        if same:
            paired[L] = (ax, by)
    own = {L: (_cell_scores(sx, table, x, tasks, L), _cell_scores(sy, table, y, tasks, L)) for L in both}
    for L in both:
        d = (stats.paired_difference([paired[L][0]], [paired[L][1]]) if L in paired
             else stats.unpaired_difference([own[L][0]], [own[L][1]]))
        entry["per_length"][L] = d.as_dict()
    if len(paired) == len(both):
        overall = stats.paired_difference([paired[L][0] for L in both], [paired[L][1] for L in both])
    else:
        overall = stats.unpaired_difference([own[L][0] for L in both], [own[L][1] for L in both])
    entry.update(method="paired" if overall.paired else "unpaired", overall=overall.as_dict())
    if differ:
        notes.append(f"{x} vs {y}: different prompts at {', '.join(differ)}, so those lengths (and Overall) are "
                     "unpaired differences: the difference of the scores, its interval from independent "
                     "bootstraps of each run, no test")
    if partial:
        notes.append(f"{x} vs {y}: paired on the samples with the same prompt only (their mean difference is not "
                     f"the table's): {'; '.join(partial)}")
    return entry


def _signed(v: float) -> str:
    return f"{round(v, 2) or 0.0:+.2f}"  # `or 0.0`: no '-0.00'


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"={p:.2g}"


def _diff_cell(d: dict[str, Any] | None, absent: str) -> str:
    """`+3.10 [+0.52, +5.70] p=0.02`, ' ns' when the interval spans 0, 'unpaired' instead of p without a test;
    a point difference alone."""
    if d is None:
        return absent
    if d["lo"] is None:
        return _signed(d["mean"])
    cell = f"{_signed(d['mean'])} [{_signed(d['lo'])}, {_signed(d['hi'])}]"
    cell += f" p{_p(d['p'])}" if d["p"] is not None else " unpaired"
    return cell if d["significant"] else cell + " ns"


def _difference_section(title: str, entries: dict[str, dict[str, Any]], lengths: list[int], absent: str,
                        against: str | None) -> list[str]:
    """`### <title>`, a row per run (and its parent when `against` is None), a column per length + Overall."""
    shown = [L for L in lengths if any(L in e["per_length"] for e in entries.values())]
    columns = ["Run", *([] if against else ["Parent"]), *map(length_label, shown), "Overall"]
    lines = [f"### {title}", "", markdown_row(columns), markdown_row(["---"] * len(columns))]
    for n, e in entries.items():
        lines.append(markdown_row([n, *([] if against else [e["against"]]),
                                   *[_diff_cell(e["per_length"].get(L), absent) for L in shown],
                                   _diff_cell(e["overall"], absent)]))
    methods = {e["method"] for e in entries.values()}
    other = against or "its parent"
    legend = (f"Run − {other} per length, and Overall over the lengths both have (the mean of the per-length "
              "differences)")
    if "paired" in methods or "unpaired" in methods:
        legend += (": the mean per-sample difference on the same prompts [its 95% paired-bootstrap interval] and the "
                   "two-sided sign-flip permutation p; ns: not significant (the interval spans 0, or p >= 0.05)")
    if "unpaired" in methods:
        legend += ("; unpaired: the runs answered different prompts, so the difference of their scores with an "
                   "interval from independent bootstraps, no test")
    if "point" in methods:
        legend += "; a number alone: a point difference (no per-sample predictions to pair)"
    return [*lines, "", legend + "."]


def _score(table: _Table, intervals: dict[str, dict[int, Bounds | None]] | None, n: str, L: int) -> str:
    v = table.per_length[n][L]
    return fmt_pm(v, intervals[n].get(L)) if intervals is not None else fmt(v)


def _rows(table: _Table, runs: list[Results], base_name: str | None, parents: dict[str, str],
          intervals: dict[str, dict[int, Bounds | None]] | None) -> tuple[list[str], list[list[str]]]:
    later = [L for L in table.lengths if L > table.reference]
    columns = ["Run", *map(length_label, table.lengths), "Avg.",
               *[f"Δ{length_label(L)} vs {length_label(table.reference)}" for L in later]]
    if parents:
        columns.append("Δ vs parent")
    if base_name is not None:
        columns.append(f"Δ vs {base_name}")
    rows = []
    for n in table.names:
        row = [n, *[_score(table, intervals, n, L) for L in table.lengths], fmt(table.avg(n)),
               *["-" if table.delta(n, L) is None else f"{table.delta(n, L):+.2f}" for L in later]]
        if parents:
            p = parents.get(n)
            row.append(f"{table.gap(n, p)} ({p})" if p else "")
        if base_name is not None:
            row.append(table.gap(n, base_name))
        rows.append(row)
    return columns, rows


def _table5_rows(table: _Table, parents: dict[str, str], intervals: dict[str, dict[int, Bounds | None]] | None
                 ) -> tuple[list[str], list[list[str]]]:
    """The paper's Table 5: a row per run, a column per length, a YaRN run's cell `score (score - parent's)`."""
    columns = ["Run", *map(length_label, table.lengths)]
    rows = []
    for n in table.names:
        p, row = parents.get(n), [n]
        for L in table.lengths:
            v = table.per_length[n][L]
            if v is None:
                row.append(ABSENT["table5"])
                continue
            cell = _score(table, intervals, n, L)
            base = table.per_length[p][L] if p else None
            row.append(cell if base is None else f"{cell} ({_signed(v - base)})")
        rows.append(row)
    return columns, rows


def _json(cmp: Comparison, table: _Table, dirs: list[Path], runs: list[Results], base_name: str | None,
          intervals: dict[str, dict[int, Bounds | None]]) -> dict[str, Any]:
    """compare.json: length keys are decimal strings, as in results.json."""

    def by_length(d: dict[int, Any]) -> dict[str, Any]:
        return {str(L): v for L, v in d.items()}

    return {
        "format": COMPARE_FORMAT, "layout": cmp.layout, "tasks": cmp.tasks, "lengths": cmp.lengths,
        "reference": cmp.reference, "baseline": base_name,
        "runs": [{"name": n, "run_dir": str(d), "fingerprint": r["model"].get("fingerprint"),
                  "parent": cmp.parents.get(n)} for n, d, r in zip(cmp.names, dirs, runs)],
        "per_length": {n: by_length(cmp.per_length[n]) for n in cmp.names},
        "avg": {n: table.avg(n) for n in cmp.names},
        "intervals": {n: by_length(intervals[n]) if any(b is not None for b in intervals[n].values()) else None
                      for n in cmp.names},
        "differences": {rel: {n: {**e, "per_length": by_length(e["per_length"])} for n, e in entries.items()}
                        for rel, entries in cmp.differences.items()},
        "method": stats.METHOD, "notes": cmp.notes,
    }


def _write(cmp: Comparison, table: _Table, out: Path, doc: dict[str, Any]) -> None:
    """compare.md, compare.csv, compare.json, compare.png (and compare-sinks.png) in `out`."""
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
    write_json(out / "compare.json", doc)
    cmp.files += [out / "compare.md", out / "compare.csv", out / "compare.json"]
    series = []
    for n in table.names:
        style: dict[str, Any] = {}
        bounds = [cmp.intervals.get(n, {}).get(L) for L in table.lengths]
        if any(b is not None for b in bounds):
            style["band"] = ([None if b is None else b["lo"] for b in bounds],
                             [None if b is None else b["hi"] for b in bounds])
        series.append((n, table.lengths, [table.per_length[n][L] for L in table.lengths], style))
    try:
        cmp.files.append(plot_lines(series, f"RULER ({len(cmp.tasks)} tasks)", out / "compare.png"))
        if cmp.sinks:
            cmp.files.append(plot_sinks(list(cmp.sinks.values()), out / "compare-sinks.png", list(cmp.sinks)))
    except InputError as e:
        cmp.notes.append(f"no plot: {e}")


def compare(s: CompareSettings) -> Comparison:
    """The comparison of `s.runs` (see the module docstring), written to `s.output` when given (locked from its
    check until it is written). A run given twice (the same folder or file, by its real path) is refused."""
    dirs = [Path(d) for d in s.runs]
    base = None
    if s.baseline is not None:  # a run of its own, unless it is one of the runs
        base = _same_as(Path(s.baseline), dirs)
        if base is None:
            base = Path(s.baseline)
            dirs.append(base)
    _check_distinct(dirs)
    with contextlib.ExitStack() as held:
        if s.output is not None:
            inputs = [*(("run", d) for d in dirs), *(("sinks file", Path(p)) for p in s.sinks)]
            held.enter_context(check_output(Path(s.output), COMPARISON_KIND, inputs=inputs))
        return _compare(s, dirs, base)


def _same_as(run: Path, others: list[Path]) -> Path | None:
    """The first of `others` that is `run` under another name (the same folder or file)."""
    return next((o for o in others if os.path.realpath(o) == os.path.realpath(run)), None)


def _check_distinct(dirs: list[Path]) -> None:
    """InputError when a run is given twice: the same folder or file under two names (its real path). A copy of
    a run is a run of its own (comparing one with its copy gives zero differences, which is how the statistics
    are checked)."""
    for i, d in enumerate(dirs):
        same = _same_as(d, dirs[:i])
        if same is not None:
            raise InputError(f"'{d}' is the run '{same}' again (the same {'file' if d.is_file() else 'folder'}); "
                             "give each run once")


def _compare(s: CompareSettings, dirs: list[Path], baseline: Path | None) -> Comparison:
    """`compare`, its runs (`dirs`, the baseline among them) checked and its output (when given) locked."""
    from longctx.checkpoint.describe import sliding_note
    from longctx.report.sinks import COMPARE_COLUMNS, compare_cells, sinks_for_runs

    loaded = [load_run(d) for d in dirs]
    runs, run_dirs = [r for r, _ in loaded], [d for _, d in loaded]
    names = _unique_names(runs, dirs)
    table5 = s.layout == "table5"
    parents = _parents(s, runs, names)
    notes: list[str] = []
    means_only = [n for n, r in zip(names, runs) if not r["tasks"]]
    tasks = [] if means_only else [t for t in runs[0]["tasks"] if all(t in r["tasks"] for r in runs)]
    if means_only:
        notes.append(f"{', '.join(means_only)} give{'s' if len(means_only) == 1 else ''} per-length means only, so "
                     "every run is shown with its own per-length means (over its own tasks)")
    elif not tasks:
        raise InputError("these runs share no task; nothing to compare")
    all_tasks = sorted({t for r in runs for t in r["tasks"]})
    if tasks and len(all_tasks) != len(tasks):
        notes.append(f"compared on the {len(tasks)} task{'s' if len(tasks) > 1 else ''} every run has "
                     f"({', '.join(tasks)}); "
                     f"left out: {', '.join(t for t in all_tasks if t not in tasks)}")
    table = _table(runs, dirs, names, tasks, notes, averages=not table5)
    notes += [n for run, name in zip(runs, names)
              if (n := sliding_note(name, run["model"].get("sliding_window"), run["lengths"]))]
    table.reference = _reference(table, runs, s.reference)
    base_name = names[dirs.index(baseline)] if baseline is not None else None

    # per-sample scores only where intervals or differences need them (reading predictions costs time)
    wanted = s.intervals or s.output is not None or base_name is not None or (table5 and bool(parents))
    found = {n: _run_samples(d, r, tasks) if wanted else (None, None) for n, d, r in zip(names, run_dirs, runs)}
    samples, why = {n: f[0] for n, f in found.items()}, {n: f[1] for n, f in found.items()}
    intervals = (_intervals(table, runs, tasks, samples, why, notes if s.intervals else None)
                 if s.intervals or s.output is not None else {})
    differences: dict[str, dict[str, dict[str, Any]]] = {}
    if base_name is not None:
        differences["baseline"] = {n: _difference(n, base_name, table, tasks, samples, why, notes)
                                   for n in names if n != base_name}
    if table5 and parents:
        differences["parent"] = {n: _difference(n, p, table, tasks, samples, why, notes) for n, p in parents.items()}

    shown = intervals if s.intervals else None
    columns, rows = _table5_rows(table, parents, shown) if table5 else _rows(table, runs, base_name, parents, shown)
    sink_docs, sink_notes = sinks_for_runs(runs, dirs, s.sinks)
    notes += sink_notes
    if any(sink_docs):
        columns += COMPARE_COLUMNS
        for row, doc in zip(rows, sink_docs):
            row += compare_cells(doc)
    cmp = Comparison(names, table.lengths, tasks, table.reference, table.per_length, columns, rows, notes,
                     sinks={n: d for n, d in zip(names, sink_docs) if d is not None}, layout=s.layout,
                     parents=parents, intervals=intervals, differences=differences)
    ref_label = length_label(table.reference)
    lines = [markdown_row(columns), markdown_row(["---"] * len(columns)), *map(markdown_row, rows), ""]
    task_words = (f"{len(tasks)} RULER task{'s' if len(tasks) > 1 else ''}" if tasks else
                  "each run's RULER tasks")
    if table5:
        children = ", ".join(f"{c}: parent {p}" for c, p in parents.items())
        lines.append(f"Scores: mean of {task_words} per length" + (
            f"; in brackets, a YaRN run's score minus its parent's at that length ({children})" if parents else "")
            + f"; '{ABSENT['table5']}': a length the run does not have.")
    else:
        lines.append(f"Scores: mean of {task_words} per length; ΔL vs {ref_label}: the run's score at L minus its "
                     f"score at the reference length {ref_label}; Δ vs another run: the mean per-length difference "
                     "over the lengths both have.")
    if s.intervals:
        lines.append("±: half the width of the score's 95% interval (percentile bootstrap over samples, resampled "
                     "within each task).")
    if cmp.sinks:
        lines.append("First-token attn, M-Act, Gate mean: 'longctx sinks' averages over layers (from sinks.json).")
    absent = ABSENT[s.layout]
    if base_name is not None and differences["baseline"]:
        lines += ["", *_difference_section(f"Paired differences vs {base_name}", differences["baseline"],
                                           table.lengths, absent, base_name)]
    if "parent" in differences:
        lines += ["", *_difference_section("Paired differences vs parent", differences["parent"], table.lengths,
                                           absent, None)]
    if notes:
        lines += ["", *[f"Note: {x}" for x in notes]]
    cmp.markdown = "\n".join(lines)
    if s.output is not None:
        _write(cmp, table, Path(s.output), _json(cmp, table, dirs, runs, base_name, intervals))
    return cmp
