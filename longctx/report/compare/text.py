"""A comparison in words: the table's cells in either layout, the legends that say what the numbers are, the
sections of differences between runs with their statistics, and the notes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from longctx.core.units import length_label
from longctx.report import stats
from longctx.report.compare.comparison import ComparedRun, Comparison, ReportedDifference, RunDifference
from longctx.report.compare.seeds import seeds_markdown
from longctx.report.settings import LAYOUTS
from longctx.report.sinks import COMPARE_COLUMNS, TABLE4_COLUMNS, Table4Row, compare_cells, table4_cells
from longctx.report.tables import fmt, fmt_pm, markdown_row


def table_cells(cmp: Comparison) -> tuple[list[str], list[list[str]]]:
    """The table's columns and a row of cells per run, then the sink columns when a run has sinks results (and
    the layout has not shown them already)."""
    columns, rows = LAYOUT[cmp.layout].rows(cmp)
    if not LAYOUT[cmp.layout].shows_sinks and any(r.sinks for r in cmp.runs):
        columns += COMPARE_COLUMNS
        for row, run in zip(rows, cmp.runs):
            row += compare_cells(run.sinks)
    return columns, rows


def markdown(cmp: Comparison) -> str:
    """The table (`cmp.columns`, `cmp.rows`), its legend, the sections of differences and the notes."""
    lines = [markdown_row(cmp.columns), markdown_row(["---"] * len(cmp.columns)), *map(markdown_row, cmp.rows), "",
             *_legend(cmp)]
    absent = LAYOUT[cmp.layout].absent
    if cmp.against_baseline and cmp.baseline_of:
        lines += ["", *_difference_section(f"Paired differences vs {cmp.seed_baseline}, seed by seed",
                                           cmp.against_baseline, cmp.lengths, absent,
                                           f"its seed's run of {cmp.seed_baseline}", partner="Baseline")]
    elif cmp.against_baseline:
        lines += ["", *_difference_section(f"Paired differences vs {cmp.baseline}", cmp.against_baseline,
                                           cmp.lengths, absent, cmp.baseline)]
    if cmp.against_parent is not None:
        lines += ["", *_difference_section("Paired differences vs parent", cmp.against_parent, cmp.lengths, absent,
                                           "its parent", partner="Parent")]
    if cmp.seed_groups:
        lines += ["", *seeds_markdown(cmp.seed_groups, cmp.seed_differences, cmp.lengths, cmp.seed_baseline)]
    if cmp.notes:
        lines += ["", *[f"Note: {x}" for x in cmp.notes]]
    return "\n".join(lines)


def _score(cmp: Comparison, run: ComparedRun, length: int) -> str:
    v = run.per_length.get(length)
    return fmt_pm(v, (run.intervals or {}).get(length)) if cmp.show_intervals else fmt(v)


def _signed(v: float) -> str:
    return f"{round(v, 2) or 0.0:+.2f}"  # `or 0.0`: no '-0.00'


def _gap(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _default_rows(cmp: Comparison) -> tuple[list[str], list[list[str]]]:
    """A row per run: its score per length, Avg., the degradation columns and the mean differences to its parent
    and to the baseline."""
    table = cmp.table
    later = [L for L in table.lengths if L > table.reference]
    columns = ["Run", *map(length_label, table.lengths), "Avg.",
               *[f"Δ{length_label(L)} vs {length_label(table.reference)}" for L in later]]
    if cmp.parents:
        columns.append("Δ vs parent")
    if cmp.baseline is not None:
        columns.append(f"Δ vs {cmp.seed_baseline} (same seed)" if cmp.baseline_of else f"Δ vs {cmp.baseline}")
    rows = []
    for run in table.runs:
        row = [run.name, *[_score(cmp, run, L) for L in table.lengths], fmt(table.avg(run)),
               *[_gap(table.delta(run, L)) for L in later]]
        if cmp.parents:
            row.append(f"{_gap(table.mean_gap(run, table.run(run.parent)))} ({run.parent})" if run.parent else "")
        if cmp.baseline is not None:
            row.append(_gap(table.mean_gap(run, table.run(cmp.baseline_of.get(run.name, cmp.baseline)))))
        rows.append(row)
    return columns, rows


def _table5_rows(cmp: Comparison) -> tuple[list[str], list[list[str]]]:
    """The paper's Table 5: a row per run, a column per length, a YaRN run's cell `score (score - parent's)`."""
    columns = ["Run", *map(length_label, cmp.lengths)]
    rows = []
    for run in cmp.runs:
        parent = cmp.table.run(run.parent) if run.parent else None
        row = [run.name]
        for L in cmp.lengths:
            v = run.per_length.get(L)
            if v is None:
                row.append(LAYOUT["table5"].absent)
                continue
            cell = _score(cmp, run, L)
            base = parent.per_length.get(L) if parent else None
            row.append(cell if base is None else f"{cell} ({_signed(v - base)})")
        rows.append(row)
    return columns, rows


def _table4_rows(cmp: Comparison) -> tuple[list[str], list[list[str]]]:
    """The paper's Table 4: a row per run, its sinks.json's averages over layers and perplexity, and its RULER
    Avg. (over the lengths every run has)."""
    rows = []
    for run in cmp.runs:
        avg = cmp.table.avg(run)
        row = Table4Row.of(run.name, run.sinks, avg) if run.sinks else Table4Row(run.name, None, None, None, None, avg)
        rows.append(table4_cells(row, LAYOUT["table4"].absent))
    return list(TABLE4_COLUMNS), rows


def _table4_legend(cmp: Comparison, task_words: str) -> str:
    return ("The Gated Attention paper's Table 4 layout: Gate score (mean over layers of the gate scores as applied), "
            "M-Act and F-Attn (first-token attention), means over layers, and PPL (the perplexity of the measured "
            f"windows) from each run's 'longctx sinks' results; RULER avg.: the mean of {task_words} over the lengths "
            f"every run has; '{LAYOUT['table4'].absent}': not measured, or no gate scores.")


def _table5_legend(cmp: Comparison, task_words: str) -> str:
    children = ", ".join(f"{c}: parent {p}" for c, p in cmp.parents.items())
    return (f"Scores: mean of {task_words} per length" + (
        f"; in brackets, a YaRN run's score minus its parent's at that length ({children})" if cmp.parents else "")
        + f"; '{LAYOUT['table5'].absent}': a length the run does not have.")


def _default_legend(cmp: Comparison, task_words: str) -> str:
    ref_label = length_label(cmp.reference)
    return (f"Scores: mean of {task_words} per length; ΔL vs {ref_label}: the run's score at L minus its score at "
            f"the reference length {ref_label}; Δ vs another run: the mean per-length difference over the lengths "
            "both have.")


@dataclass(frozen=True)
class Layout:
    """How compare's table is laid out: its columns and rows, the legend's first line, the cell of a value a run
    does not have, and whether its own columns hold the sinks values."""

    rows: Callable[[Comparison], tuple[list[str], list[list[str]]]]
    legend: Callable[[Comparison, str], str]
    absent: str
    shows_sinks: bool = False


# compare's layouts (`longctx.report.settings.LAYOUTS` says in words what each shows)
LAYOUT = {"default": Layout(_default_rows, _default_legend, "-"),
          "table5": Layout(_table5_rows, _table5_legend, "–"),
          "table4": Layout(_table4_rows, _table4_legend, "–", shows_sinks=True)}
assert set(LAYOUT) == set(LAYOUTS), "every layout of the settings needs its Layout here"


def _legend(cmp: Comparison) -> list[str]:
    """What the table's scores and columns are."""
    tasks = cmp.tasks
    task_words = f"{len(tasks)} RULER task{'s' if len(tasks) > 1 else ''}" if tasks else "each run's RULER tasks"
    lines = [LAYOUT[cmp.layout].legend(cmp, task_words)]
    if cmp.show_intervals:
        lines.append(f"±: half the width of the score's {stats.INTERVAL_WORDS}.")
    if cmp.sinks and not LAYOUT[cmp.layout].shows_sinks:
        lines.append("First-token attn, M-Act, Gate mean: 'longctx sinks' averages over layers (from sinks.json).")
    return lines


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"={p:.2g}"


def _diff_cell(d: ReportedDifference | None, absent: str) -> str:
    """`+3.10 [+0.52, +5.70] p=0.02`, ' unpaired' after p for runs on different prompts, ' ns' when not
    significant; a point difference alone."""
    if d is None:
        return absent
    if d.lo is None or d.hi is None:
        return _signed(d.mean)
    cell = f"{_signed(d.mean)} [{_signed(d.lo)}, {_signed(d.hi)}]"
    cell += f" p{_p(d.p)}" + ("" if d.paired else " unpaired")
    return cell if d.significant else cell + " ns"


def _difference_section(title: str, entries: dict[str, RunDifference], lengths: list[int], absent: str,
                        against: str, partner: str | None = None) -> list[str]:
    """`### <title>`, a row per run (and, under the column `partner`, the run it is compared with, where that
    differs by row: its parent, or its seed's baseline run), a column per length + Overall, and the legend of the
    cells (`against`: what every run is compared with, in words)."""
    shown = [L for L in lengths if any(L in e.per_length for e in entries.values())]
    columns = ["Run", *([partner] if partner else []), *map(length_label, shown), "Overall"]
    lines = [f"### {title}", "", markdown_row(columns), markdown_row(["---"] * len(columns))]
    for n, e in entries.items():
        lines.append(markdown_row([n, *([e.against] if partner else []),
                                   *[_diff_cell(e.per_length.get(L), absent) for L in shown],
                                   _diff_cell(e.overall, absent)]))
    return [*lines, "", _difference_legend({e.method for e in entries.values()}, against)]


def _difference_legend(methods: set[str | None], against: str) -> str:
    legend = (f"Run − {against} per length, and Overall over the lengths both have (the mean of the "
              "per-length differences)")
    if "paired" in methods:
        legend += (": the mean per-sample difference on the same prompts [its 95% interval: MOVER from the runs' "
                   "intervals with their correlation, or a paired bootstrap where a run's interval is one] and the "
                   "two-sided sign-flip permutation p")
    if "unpaired" in methods:
        legend += ("; unpaired: the runs answered different prompts, so the difference of their scores [its 95% "
                   "interval: MOVER from the runs' intervals, or independent bootstraps where a run's interval is "
                   "one] and the two-sided permutation p of each task's samples reassigned between the runs (exact "
                   "on 0/1 scores)")
    if methods & {"paired", "unpaired"}:
        legend += "; ns: not significant (the interval spans 0, or p >= 0.05)"
    if "point" in methods:
        legend += "; a number alone: a point difference (no per-sample predictions to pair)"
    return legend + "."
