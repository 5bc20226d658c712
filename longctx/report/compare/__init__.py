"""`longctx compare RUN_DIR...`: one table over RULER runs (and their sinks), from result files only.

Default layout: a row per run, a column per length any run has ('-' where a run lacks it), Avg. over the
lengths every run has, degradation vs a reference length, and the mean per-length difference vs the run's
parent (when it is the YaRN child of another run) and vs a baseline run. `--layout table5`: the Gated
Attention paper's Table 5, a row per run and a column per length ('–' where absent), a YaRN run's cells as
`score (score - parent's score)`. `--layout table4`: the paper's Table 4, a row per run with the gate score,
M-Act, first-token attention and perplexity of its sinks results and its RULER Avg. A run's parent is the run
whose checkpoint fingerprint is its `parent_fingerprint`, or the one `--parent CHILD=PARENT` names.

Runs are compared on the tasks they share and, where sample counts differ, on the samples they share. With
`--baseline` (and in the table5 layout, each YaRN run vs its parent) the differences come with statistics
(`longctx.report.stats`): where both runs answered the same prompts (per-sample prompt hashes equal at the
same sample number, checked, never assumed) a paired difference (interval and sign-flip p);
where the prompts differ the unpaired difference (interval and permutation p); without per-sample predictions the point
difference only. `--intervals` shows scores as `score ± half-width` of their 95% interval: the run's own
when the table shows its own score, recomputed from its predictions when compare rescored it on shared
tasks or samples. When runs have `longctx sinks` results (`<run_dir>/sinks.json`, or a sinks.json/directory
in `sinks`, matched to a run by checkpoint fingerprint), first-token attention, M-Act and gate-mean columns
follow.

`--replicates NAME=RUN,...` (a recipe's seed sweep passes it) names runs of one model with different seeds: a
section "Across k seeds" shows each such model's mean over seeds with an interval across seeds, per length,
overall and for its sinks values, and, when the baseline run is in one of them, the other models' differences to
it paired seed by seed, with a verdict in words (`longctx.report.compare.seeds`).

With `-o`, compare.md, compare.csv, compare.json (`COMPARE_FORMAT`: runs, per-length scores, intervals,
differences and `stats.METHOD`) and compare.png are written.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.files import check_output
from longctx.info.describe import sliding_note
from longctx.report.compare.comparison import ComparedRun, Comparison
from longctx.report.compare.files import COMPARE_FORMAT, COMPARISON_KIND, write_comparison
from longctx.report.compare.seeds import SeedGroup, group_difference, seed_groups
from longctx.report.compare.stats import add_intervals, difference, read_samples
from longctx.report.compare.table import link_parents, load_runs, reference_length, score_table, shared_tasks
from longctx.report.compare.text import markdown, table_cells
from longctx.report.settings import CompareSettings
from longctx.report.sinks import sinks_for_runs

__all__ = ["COMPARE_FORMAT", "COMPARISON_KIND", "Comparison", "compare"]


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
        cmp = _comparison(s, dirs, base)
        cmp.columns, cmp.rows = table_cells(cmp)
        cmp.markdown = markdown(cmp)
        if s.output is not None:
            write_comparison(cmp, Path(s.output))
        return cmp


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


def _comparison(s: CompareSettings, dirs: list[Path], baseline: Path | None) -> Comparison:
    """What `compare` finds over its runs (`dirs`, the baseline among them, checked): the table, then the
    statistics its output needs, then the sinks results of the runs' checkpoints."""
    runs = load_runs(dirs)
    link_parents(s, runs)
    notes: list[str] = []
    tasks = shared_tasks(runs, notes)
    table5 = s.layout == "table5"
    table = score_table(runs, tasks, notes, averages=not table5)
    notes += [n for r in runs if (n := sliding_note(r.name, r.results["model"].get("sliding_window"),
                                                    r.results["lengths"]))]
    table.reference = reference_length(table, s.reference)
    base = runs[dirs.index(baseline)] if baseline is not None else None
    cmp = Comparison(table, tasks, s.layout, notes, baseline=base.name if base else None, show_intervals=s.intervals)
    linked = table5 and bool(cmp.parents)
    # per-sample scores only where intervals or differences need them (reading predictions costs time)
    if s.intervals or s.output is not None or base is not None or linked or s.replicates:
        read_samples(runs, tasks)
    if s.intervals or s.output is not None:
        add_intervals(table, tasks, notes if s.intervals else None)
    if linked:
        cmp.against_parent = {r.name: difference(r, table.run(r.parent), table, tasks, notes)
                              for r in runs if r.parent is not None}
    sinks, sink_notes = sinks_for_runs([r.results for r in runs], dirs, s.sinks)
    notes += sink_notes
    for r, doc in zip(runs, sinks):
        r.sinks = doc
    held = None
    if s.replicates:
        cmp.seed_groups = seed_groups(s, table, tasks)
        held = next((g for g in cmp.seed_groups if base in g.runs), None) if base is not None else None
        if held is not None:
            cmp.seed_baseline = held.name
            cmp.seed_differences = {g.name: group_difference(g, held, table, tasks) for g in cmp.seed_groups
                                    if g is not held}
    if base is not None:
        partners = _baseline_partners(runs, base, cmp.seed_groups, held)
        cmp.baseline_of = {n: p.name for n, p in partners.items()} if held is not None else {}
        cmp.against_baseline = {r.name: difference(r, partners[r.name], table, tasks, notes) for r in runs
                                if partners[r.name] is not r}
    return cmp


def _baseline_partners(runs: list[ComparedRun], base: ComparedRun, groups: list[SeedGroup],
                       held: SeedGroup | None) -> dict[str, ComparedRun]:
    """Run name -> the baseline run it is compared with: `base`, or with seed groups that hold it, the run of the
    same seed in the baseline's group (seed i against seed i, as the section across seeds pairs them; each of the
    baseline's own runs is its seed's baseline)."""
    partners = {r.name: base for r in runs}
    if held is not None:
        for g in groups:
            for i, r in enumerate(g.runs):
                partners[r.name] = held.runs[i]
    return partners
