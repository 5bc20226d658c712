"""The runs of a comparison and their score table: names, parents, the tasks they share, each run's score per
length (rescored on the samples every run has where sample counts differ) and the reference length."""

from __future__ import annotations

from pathlib import Path

from longctx.core.errors import InputError, SettingError, ref
from longctx.core.kinds import did_you_mean
from longctx.core.units import length_label
from longctx.eval.scoring import score_predictions
from longctx.report.compare.comparison import ComparedRun, ScoreTable
from longctx.report.external import load_run
from longctx.report.results import per_length_means
from longctx.report.samples import sample_answers
from longctx.report.settings import CompareSettings


def load_runs(dirs: list[Path]) -> list[ComparedRun]:
    """Each run given, named by its model, else also by its folder, else by its path: names are unique."""
    loaded = [load_run(d) for d in dirs]
    names = [r["model"].get("name") or d.name for (r, _), d in zip(loaded, dirs)]
    if len(set(names)) < len(names):
        names = [f"{n} ({d.name})" for n, d in zip(names, dirs)]
    if len(set(names)) < len(names):
        names = [str(d) for d in dirs]
    return [ComparedRun(n, d, r, run_dir) for n, d, (r, run_dir) in zip(names, dirs, loaded)]


def link_parents(s: CompareSettings, runs: list[ComparedRun]) -> None:
    """Each run's parent: the run whose checkpoint fingerprint is its parent fingerprint, or as `--parent` says."""
    names = [r.name for r in runs]
    by_fp = {r.results["model"]["fingerprint"]: r.name for r in runs if r.results["model"].get("fingerprint")}
    found = {r.name: by_fp[fp] for r in runs
             if (fp := r.results["model"].get("parent_fingerprint")) in by_fp and by_fp[fp] != r.name}
    for child, parent in s.parents.items():
        # KEY=VALUE values are read as JSON, so a run named like a number arrives as one
        child, parent = str(child), parent if isinstance(parent, str) else str(parent)
        for x in (child, parent):
            if x not in names:
                raise s.error(f"{ref('parents')} names '{x}', which is not one of the runs "
                              f"({', '.join(names)}){did_you_mean(x, names)}")
        if child == parent:
            raise s.error(f"{ref('parents')} makes '{child}' its own parent")
        found[child] = parent
    for r in runs:
        r.parent = found.get(r.name)


def shared_tasks(runs: list[ComparedRun], notes: list[str]) -> list[str]:
    """The tasks every run has; none when a run gives per-length means only (then every run is shown with its own
    means). InputError when the runs share no task."""
    means_only = [r.name for r in runs if not r.results["tasks"]]
    tasks = [] if means_only else [t for t in runs[0].results["tasks"] if all(t in r.results["tasks"] for r in runs)]
    if means_only:
        notes.append(f"{', '.join(means_only)} give{'s' if len(means_only) == 1 else ''} per-length means only, so "
                     "every run is shown with its own per-length means (over its own tasks)")
    elif not tasks:
        raise InputError("these runs share no task; nothing to compare")
    all_tasks = sorted({t for r in runs for t in r.results["tasks"]})
    if tasks and len(all_tasks) != len(tasks):
        notes.append(f"compared on the {len(tasks)} task{'s' if len(tasks) > 1 else ''} every run has "
                     f"({', '.join(tasks)}); "
                     f"left out: {', '.join(t for t in all_tasks if t not in tasks)}")
    return tasks


def score_table(runs: list[ComparedRun], tasks: list[str], notes: list[str], averages: bool) -> ScoreTable:
    """Each run's score per length it has (a score for every task in `tasks`), the mean over those tasks. The
    columns are all lengths any run has (a parent evaluated up to its trained length sits beside its YaRN child
    that goes further); averages and differences between runs use only the lengths both sides have."""
    if not tasks:  # a run gives per-length means only: every run is shown with its own
        return _means_table(runs, notes, averages)
    have = {r.name: [L for L in r.results["lengths"] if all(r.results["scores"][t].get(L) is not None for t in tasks)]
            for r in runs}
    lengths, shared = _lengths(have, "no run has a length with scores for every shared task; nothing to compare")
    scores = _shared_sample_scores(runs, tasks, lengths, have, notes)
    for r in runs:
        r.per_length = {L: per_length_means(scores[r.name], [L], tasks)[L] for L in have[r.name]}
        r.rescored = {L for L in have[r.name]
                      if {t for t in r.results["tasks"] if r.results["scores"][t].get(L) is not None} != set(tasks)
                      or any(r.used[t].get(L) != r.results["samples"][t][L] for t in tasks)}
    if averages:
        _note_averaged_lengths(lengths, shared, notes)
        if not shared:
            notes.append("the runs share no length: Avg. is over each run's own lengths, not comparable across runs")
    return ScoreTable(runs, lengths, shared or None)


def _means_table(runs: list[ComparedRun], notes: list[str], averages: bool) -> ScoreTable:
    """The table of runs compared on their own per-length means (one of them gives nothing else)."""
    have = {r.name: [L for L in r.results["lengths"] if r.results["per_length"].get(L) is not None] for r in runs}
    lengths, shared = _lengths(have, "no run has a per-length score; nothing to compare")
    for r in runs:
        r.per_length = {L: r.results["per_length"][L] for L in have[r.name]}
    if averages:
        _note_averaged_lengths(lengths, shared, notes)
    return ScoreTable(runs, lengths, shared or None)


def _lengths(have: dict[str, list[int]], nothing: str) -> tuple[list[int], list[int]]:
    """The lengths any run has and those every run has; InputError `nothing` when no run has one."""
    lengths = sorted({L for ls in have.values() for L in ls})
    if not lengths:
        raise InputError(nothing)
    return lengths, [L for L in lengths if all(L in ls for ls in have.values())]


def _note_averaged_lengths(lengths: list[int], shared: list[int], notes: list[str]) -> None:
    if shared and shared != lengths:
        notes.append(f"Avg. is over the lengths every run has ({', '.join(map(length_label, shared))}); "
                     "'-': a length the run does not have")


def _shared_sample_scores(runs: list[ComparedRun], tasks: list[str], lengths: list[int],
                          have: dict[str, list[int]], notes: list[str]) -> dict[str, dict[str, dict[int, float]]]:
    """Per run, task scores by length; where runs scored a (task, length) on different sample counts, the larger
    runs are rescored on the first N samples (N = the smallest count) from their predictions, when those are the
    same samples (same references) as the smallest run's. Else the table notes it. Sets each run's `used`."""
    scores = {r.name: {t: dict(r.results["scores"][t]) for t in tasks} for r in runs}
    for r in runs:
        r.used = {t: {L: c for L, c in r.results["samples"][t].items() if c} for t in tasks}
    rescored, unequal = [], []
    for t in tasks:
        for L in lengths:
            members = [r for r in runs if L in have[r.name]]
            counts = {r.name: r.results["samples"][t][L] for r in members}
            if len(set(counts.values())) < 2 or None in counts.values():  # None: another tool's, counts unknown
                continue
            n_min = min(counts.values())
            # the first samples with references from each run's task file (never from its prediction lines)
            answers = {r.name: sample_answers(r.path, t, L, n_min) for r in members}
            firsts = list(answers.values())
            if any(a is None for a in firsts) or any(a.prompts != firsts[0].prompts for a in firsts):
                unequal.append(f"{t} {length_label(L)} ({', '.join(f'{n}: {c}' for n, c in counts.items())})")
                continue
            for r in members:
                if counts[r.name] > n_min:
                    a = answers[r.name]
                    scores[r.name][t][L] = score_predictions(a.preds, a.refs, r.results["metrics"][t]).score
                    r.used[t][L] = n_min
            rescored.append(f"{t} {length_label(L)}: first {n_min}")
    if rescored:
        notes.append("sample counts differ; scored on the samples every run has: " + "; ".join(rescored))
    if unequal:
        notes.append("sample counts differ and the runs' predictions do not share their first samples, so these "
                     "cells are each run's own samples: " + "; ".join(unequal))
    return scores


def reference_length(table: ScoreTable, given: int | None) -> int:
    """The given reference length, else the longest length every run had before extension."""
    if given is None:
        trained = [r.results["model"].get("trained_length") for r in table.runs]
        limit = min((t for t in trained if t), default=None)
        pool = table.avg_over or table.lengths
        below = [L for L in pool if limit is None or L <= limit]
        return max(below) if below else pool[0]
    if given not in table.lengths:
        raise SettingError(f"{ref('reference')} {given} is not a length any run has with every shared task "
                           f"(lengths: {', '.join(map(str, table.lengths))})", CompareSettings)
    return given
