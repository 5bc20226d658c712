"""The statistics of a comparison (`longctx.report.stats` over the runs' per-sample scores): the interval of each
score the table shows, and the difference between two runs, paired where they answered the same prompts."""

from __future__ import annotations

from longctx.core.units import length_label
from longctx.report import stats
from longctx.report.compare.comparison import (
    Bounds,
    ComparedRun,
    ReportedDifference,
    RunDifference,
    Samples,
    ScoreTable,
)
from longctx.report.samples import scored_samples

# Per length, the two runs' per-sample scores (per task) of the samples they answered on the same prompts
Pairs = dict[int, tuple[list[list[float]], list[list[float]]]]


def read_samples(runs: list[ComparedRun], tasks: list[str]) -> None:
    """Each run's per-sample scores and prompt hashes, or why it has none."""
    for r in runs:
        r.samples, r.no_samples = _run_samples(r, tasks)


def _run_samples(run: ComparedRun, tasks: list[str]) -> tuple[Samples | None, str | None]:
    if run.run_dir is None:
        return None, f"results from {run.results['model'].get('source', 'another tool')} hold no per-sample scores"
    if not tasks:
        return None, "the runs are compared on per-length means only"
    return scored_samples(run.run_dir, run.results)


def add_intervals(table: ScoreTable, tasks: list[str], notes: list[str] | None) -> None:
    """Per run and length the interval of the score the table shows: the run's own where that is its own score
    and names its method, else recomputed from its per-sample scores. `notes`: say where there is none."""
    missing: list[str] = []
    for r in table.runs:
        stored = (r.results.get("intervals") or {}).get("per_length") or {}
        stored = {int(L): b for L, b in stored.items()}
        r.intervals = {L: _interval(r, L, tasks, stored) for L in r.lengths}
        gaps = [L for L, b in r.intervals.items() if b is None]
        if gaps:
            missing.append(f"{r.name} at {', '.join(map(length_label, gaps))} ({r.no_samples})")
    if notes is not None and missing:
        notes.append("no interval for " + "; ".join(missing))


def _interval(run: ComparedRun, length: int, tasks: list[str], stored: dict[int, Bounds | None]) -> Bounds | None:
    # a results.json written before intervals named their method holds percentile bootstraps that may be points
    if length not in run.rescored and stored.get(length) is not None and "method" in stored[length]:
        return stored[length]
    if run.samples is None:
        return None
    shown = run.per_length[length]
    d = stats.interval(run.sample_scores(tasks, length)).as_dict()
    # the table shows the rounded mean: the interval holds it too
    return {**d, "lo": min(d["lo"], shown), "hi": max(d["hi"], shown)}


def difference(x: ComparedRun, y: ComparedRun, table: ScoreTable, tasks: list[str],
               notes: list[str]) -> RunDifference:
    """Run `x` − run `y` per length they both have and over all of them: paired where both answered the same
    prompts, else unpaired; point differences without per-sample scores. `notes` say which."""
    both = table.both(x, y)
    if not both:
        notes.append(f"{x.name} and {y.name} share no length: no difference")
        return RunDifference(y.name, None)
    if x.samples is None or y.samples is None:
        return _point_difference(x, y, both, notes)
    paired, differ, partial = paired_samples(x, y, both, tasks)
    own = {L: (x.sample_scores(tasks, L), y.sample_scores(tasks, L)) for L in both}
    per_length = {L: ReportedDifference.of(stats.paired_difference([paired[L][0]], [paired[L][1]]) if L in paired
                                           else stats.unpaired_difference([own[L][0]], [own[L][1]]))
                  for L in both}
    if len(paired) == len(both):
        overall = stats.paired_difference([paired[L][0] for L in both], [paired[L][1] for L in both])
    else:
        overall = stats.unpaired_difference([own[L][0] for L in both], [own[L][1] for L in both])
    if differ:
        notes.append(f"{x.name} vs {y.name}: different prompts at {', '.join(differ)}, so those lengths (and "
                     "Overall) are unpaired differences: the difference of the scores, its interval from the two runs' "
                     "own, and a permutation test of each task's samples reassigned between the runs")
    if partial:
        notes.append(f"{x.name} vs {y.name}: paired on the samples with the same prompt only (their mean difference "
                     f"is not the table's): {'; '.join(partial)}")
    return RunDifference(y.name, "paired" if overall.paired else "unpaired", per_length,
                         ReportedDifference.of(overall))


def _point_difference(x: ComparedRun, y: ComparedRun, both: list[int], notes: list[str]) -> RunDifference:
    """The differences of the table's scores alone, when a run has no per-sample scores."""
    gaps = {L: x.per_length[L] - y.per_length[L] for L in both}
    lacking = "; ".join(f"{r.name}: {r.no_samples}" for r in (x, y) if r.samples is None)
    notes.append(f"{x.name} vs {y.name}: point differences only, no interval or test ({lacking})")
    return RunDifference(y.name, "point", {L: ReportedDifference.point(v) for L, v in gaps.items()},
                         ReportedDifference.point(sum(gaps.values()) / len(gaps)))


def paired_samples(x: ComparedRun, y: ComparedRun, both: list[int], tasks: list[str]
                   ) -> tuple[Pairs, list[str], list[str]]:
    """The lengths where, in every task, some samples of the two runs share their prompt, with those samples'
    scores; and the cells ("task length") where none does, and those paired on only some of their samples."""
    paired: Pairs = {}
    differ, partial = [], []
    for L in both:
        ax, by, same = [], [], True
        for t in tasks:
            cx, cy = x.samples[t][L], y.samples[t][L]
            n = min(x.used[t][L], y.used[t][L])
            idx = [i for i in range(n) if cx.prompts[i] == cy.prompts[i]]
            if not idx:
                same = False
                differ.append(f"{t} {length_label(L)}")
            elif len(idx) < max(x.used[t][L], y.used[t][L]):
                partial.append(f"{t} {length_label(L)}: {len(idx)} of {n}")
            ax.append([cx.scores[i] for i in idx])
            by.append([cy.scores[i] for i in idx])
        if same:
            paired[L] = (ax, by)
    return paired, differ, partial
