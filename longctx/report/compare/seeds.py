"""Runs of one model with different seeds, compared as one (`longctx compare --replicates NAME=RUN,...`, which a
recipe's seed sweep passes): per length and over the lengths every run has, the mean over seeds with its interval
across seeds, the same for the sinks values (first-token attention, M-Act, gate score, perplexity), differences
between two such models paired seed by seed, and a verdict in words (`longctx.report.seeds` says how).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from longctx.core.errors import ref
from longctx.core.kinds import did_you_mean
from longctx.core.units import length_label
from longctx.report import stats
from longctx.report.compare.comparison import ComparedRun, ScoreTable
from longctx.report.compare.stats import paired_samples
from longctx.report.seeds import (
    METHOD_WORDS,
    T_ACROSS_SEEDS,
    SeedDifference,
    SeedInterval,
    across_seeds,
    paired_across_seeds,
)
from longctx.report.settings import CompareSettings
from longctx.report.sinks import SINK_VALUES, sink_values


@dataclass
class SeedGroup:
    """One model's runs of different seeds (in the order given: seed i of every group pairs with seed i)."""

    name: str
    runs: list[ComparedRun]
    per_length: dict[int, SeedInterval | None] = field(default_factory=dict)  # None: no interval (no samples)
    overall: SeedInterval | None = None  # over the lengths every run of the comparison has
    sinks: dict[str, SeedInterval] = field(default_factory=dict)  # SINK_VALUES key -> across seeds, where all have it

    def as_dict(self) -> dict[str, Any]:
        return {"runs": [r.name for r in self.runs],
                "per_length": {L: None if v is None else v.as_dict() for L, v in self.per_length.items()},
                "overall": None if self.overall is None else self.overall.as_dict(),
                "sinks": {k: v.as_dict() for k, v in self.sinks.items()}}


@dataclass
class GroupDifference:
    """A group − `against`, seed by seed: per length both have, Overall, and the sinks values both have."""

    against: str
    per_length: dict[int, SeedDifference | None] = field(default_factory=dict)
    overall: SeedDifference | None = None
    sinks: dict[str, SeedDifference] = field(default_factory=dict)
    # (the reference length, the longest length, the difference of the two groups' degradation (each seed's score at
    # the longest length minus its score at the reference) across seeds, its mean): None across seeds where the
    # per-seed differences do not vary (there is no pooled test of a degradation)
    degradation: tuple[int, int, SeedDifference | None, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        deg = self.degradation
        return {"against": self.against,
                "per_length": {L: None if d is None else d.as_dict() for L, d in self.per_length.items()},
                "overall": None if self.overall is None else self.overall.as_dict(),
                "sinks": {k: d.as_dict() for k, d in self.sinks.items()},
                "degradation": None if deg is None else {"from": deg[0], "to": deg[1], "mean": deg[3],
                                                         "across_seeds": None if deg[2] is None else deg[2].as_dict()}}


def seed_groups(s: CompareSettings, table: ScoreTable, tasks: list[str]) -> list[SeedGroup]:
    """The groups `s.replicates` names, each run named by its name or path; a SettingError for a run that is not
    one of the comparison's, a run in two groups, or groups of different sizes (they pair seed by seed)."""
    by_path = {os.path.realpath(r.path): r for r in table.runs}
    names = [r.name for r in table.runs]
    groups, seen = [], {}
    for group, items in s.replicates.items():
        runs = []
        for item in items:
            run = next((r for r in table.runs if r.name == item), None) or by_path.get(os.path.realpath(item))
            if run is None:
                raise s.error(f"{ref('replicates')} {group} names '{item}', which is not one of the runs "
                              f"({', '.join(names)}){did_you_mean(item, names)}")
            if run.name in seen:
                raise s.error(f"{ref('replicates')} puts the run '{run.name}' in both {seen[run.name]} and {group}")
            seen[run.name] = group
            runs.append(run)
        groups.append(SeedGroup(group, runs))
    sizes = {len(g.runs) for g in groups}
    if len(sizes) > 1:
        raise s.error(f"{ref('replicates')} gives groups of {' and '.join(map(str, sorted(sizes)))} runs; groups pair "
                      "seed by seed, so give each the same number")
    for g in groups:
        _fill(g, table, tasks)
    return groups


def _fill(g: SeedGroup, table: ScoreTable, tasks: list[str]) -> None:
    lengths = [L for L in table.lengths if all(L in r.per_length for r in g.runs)]
    sampled = bool(tasks) and all(r.samples is not None for r in g.runs)
    for L in lengths:
        pooled = (lambda L=L: [t for r in g.runs for t in r.sample_scores(tasks, L)]) if sampled else None
        g.per_length[L] = _score_interval([r.per_length[L] for r in g.runs], pooled)
    over = table.avg_over or lengths
    if over and all(L in lengths for L in over):
        pooled = (lambda: [t for r in g.runs for L in over for t in r.sample_scores(tasks, L)]) if sampled else None
        g.overall = _score_interval([_mean(r, over) for r in g.runs], pooled)
    for key in SINK_VALUES:
        values = [_sink_value(r, key) for r in g.runs]
        if all(v is not None for v in values):
            g.sinks[key] = _sink_interval(values)


def _mean(run: ComparedRun, lengths: list[int]) -> float:
    return sum(run.per_length[L] for L in lengths) / len(lengths)


def _sink_value(run: ComparedRun, key: str) -> float | None:
    return (sink_values(run.sinks) or {}).get(key)


def _score_interval(scores: list[float], pooled_groups: Callable[[], list[list[float]]] | None
                    ) -> SeedInterval | None:
    """`across_seeds` of RULER scores; where they do not vary, with the pooled interval of the samples
    (`pooled_groups()`: every seed's tasks as strata), or None without samples."""
    try:
        return across_seeds(scores)
    except ValueError:
        if pooled_groups is None:
            return None
        i = stats.interval(pooled_groups())
        return across_seeds(scores, (i.lo, i.hi))


def _sink_interval(values: list[float]) -> SeedInterval:
    """`across_seeds` of a sinks average (no samples behind it): where the seeds agree exactly, the point."""
    try:
        return across_seeds(values)
    except ValueError:
        return SeedInterval(values[0], values[0], values[0], len(values), 0.0, T_ACROSS_SEEDS)


def group_difference(a: SeedGroup, b: SeedGroup, table: ScoreTable, tasks: list[str]) -> GroupDifference:
    """a − b, seed i of a against seed i of b."""
    d = GroupDifference(b.name)
    for L in (L for L in a.per_length if L in b.per_length):
        d.per_length[L] = _score_difference([r.per_length[L] for r in a.runs], [r.per_length[L] for r in b.runs],
                                            lambda L=L: _pooled(a, b, [L], tasks))
    both = [L for L in a.per_length if L in b.per_length]
    ref, longest = table.reference, max(both, default=0)
    if ref in both and longest > ref:
        x = [r.per_length[longest] - r.per_length[ref] for r in a.runs]
        y = [r.per_length[longest] - r.per_length[ref] for r in b.runs]
        d.degradation = (ref, longest, _score_difference(x, y, lambda: None),
                         sum(p - q for p, q in zip(x, y)) / len(x))
    if a.overall is not None and b.overall is not None:
        over = table.avg_over or list(a.per_length)
        d.overall = _score_difference([_mean(r, over) for r in a.runs], [_mean(r, over) for r in b.runs],
                                      lambda: _pooled(a, b, over, tasks))
    for key in SINK_VALUES:
        if key in a.sinks and key in b.sinks:
            x, y = [_sink_value(r, key) for r in a.runs], [_sink_value(r, key) for r in b.runs]
            try:
                d.sinks[key] = paired_across_seeds(x, y)
            except ValueError:  # the same difference on every seed: a point, and no test
                gap = x[0] - y[0]
                d.sinks[key] = SeedDifference(gap, gap, gap, 1.0, len(x), T_ACROSS_SEEDS)
    return d


def _score_difference(a: list[float], b: list[float], pooled: Callable[[], tuple[float, float, float] | None]
                      ) -> SeedDifference | None:
    """`paired_across_seeds`; where the per-seed differences do not vary, with the pooled difference of the
    samples, or None without samples."""
    try:
        return paired_across_seeds(a, b)
    except ValueError:
        found = pooled()
        return None if found is None else paired_across_seeds(a, b, found)


def _pooled(a: SeedGroup, b: SeedGroup, lengths: list[int], tasks: list[str]) -> tuple[float, float, float] | None:
    """The difference of every seed's samples together (each seed and length a stratum): paired where every pair of
    runs answered the same prompts at every length, else unpaired; None without per-sample scores."""
    if not tasks or any(r.samples is None for r in (*a.runs, *b.runs)):
        return None
    xs, ys, paired = [], [], True
    for x, y in zip(a.runs, b.runs):
        pairs = paired_samples(x, y, lengths, tasks)[0]
        paired = paired and len(pairs) == len(lengths)
        xs += [pairs[L][0] for L in lengths if L in pairs]
        ys += [pairs[L][1] for L in lengths if L in pairs]
    if paired:
        d = stats.paired_difference(xs, ys)
    else:
        d = stats.unpaired_difference([x.sample_scores(tasks, L) for x in a.runs for L in lengths],
                                      [y.sample_scores(tasks, L) for y in b.runs for L in lengths])
    return d.lo, d.hi, d.p


# --- in words -------------------------------------------------------------------------------------------


def _pm(v: SeedInterval | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v.mean:.{digits}f} ± {(v.hi - v.lo) / 2:.{digits}f}"


def _diff(d: SeedDifference | None, digits: int = 2) -> str:
    if d is None:
        return "-"
    p = "<0.001" if d.p < 0.001 else f"={d.p:.2g}"
    cell = f"{_signed(d.mean, digits)} [{_signed(d.lo, digits)}, {_signed(d.hi, digits)}] p{p}"
    return cell if d.significant else cell + " ns"


def seeds_markdown(groups: list[SeedGroup], diffs: dict[str, GroupDifference], lengths: list[int],
                   baseline: str | None) -> list[str]:
    """The across-seed table, the paired differences vs the baseline's group, the legend and the verdict."""
    from longctx.report.tables import markdown_row

    shown = [L for L in lengths if any(L in g.per_length for g in groups)]
    sinks = [k for k in SINK_VALUES if any(k in g.sinks for g in groups)]
    k = len(groups[0].runs)
    columns = ["Model", *map(length_label, shown), "Overall", *[SINK_VALUES[s][0] for s in sinks]]
    lines = [f"### Across {k} seeds", "", markdown_row(columns), markdown_row(["---"] * len(columns))]
    for g in groups:
        lines.append(markdown_row([g.name, *[_pm(g.per_length.get(L)) for L in shown], _pm(g.overall),
                                   *[_pm(g.sinks.get(s), SINK_VALUES[s][1]) for s in sinks]]))
    methods = {v.method for g in groups for v in (*g.per_length.values(), g.overall, *g.sinks.values()) if v}
    lines += ["", f"Each cell: the mean over the {k} seeds ± half the width of its 95% interval: "
                  + "; ".join(METHOD_WORDS[m] for m in sorted(methods)) + "."]
    if diffs:
        columns = ["Model", *map(length_label, shown), "Overall", *[SINK_VALUES[s][0] for s in sinks]]
        lines += ["", f"### Across seeds: paired differences vs {baseline}", "", markdown_row(columns),
                  markdown_row(["---"] * len(columns))]
        for name, d in diffs.items():
            lines.append(markdown_row([name, *[_diff(d.per_length.get(L)) for L in shown], _diff(d.overall),
                                       *[_diff(d.sinks.get(s), SINK_VALUES[s][1]) for s in sinks]]))
        lines += ["", f"Model − {baseline}, seed i against seed i: the mean of the {k} per-seed differences [its 95% "
                      "interval] and the two-sided paired t-test p across seeds (where the per-seed differences do "
                      "not vary, the pooled difference of their samples); ns: not significant (the interval spans 0, "
                      "or p >= 0.05)."]
        lines += ["", *verdict(diffs, baseline, shown)]
    return lines


def verdict(diffs: dict[str, GroupDifference], baseline: str | None, lengths: list[int]) -> list[str]:
    """What the sweep supports, one sentence a model: its RULER difference overall and at the longest length, and
    its first-token attention, against the baseline's group."""
    out = []
    for name, d in diffs.items():
        seeds = next((x.seeds for x in (d.overall, *d.per_length.values(), *d.sinks.values()) if x is not None), 0)
        parts = []
        if d.overall is not None:
            parts.append(_claim(d.overall, "a higher RULER score overall", "a lower RULER score overall",
                                "a difference in RULER score overall"))
        longest = max((L for L in lengths if d.per_length.get(L) is not None), default=None)
        if longest is not None and len(lengths) > 1:
            parts.append(_claim(d.per_length[longest], f"a higher score at {length_label(longest)}",
                                f"a lower score at {length_label(longest)}",
                                f"a difference at {length_label(longest)}"))
        if d.degradation is not None:
            ref, longest, deg, gap = d.degradation
            span = f"from {length_label(ref)} to {length_label(longest)}"
            if deg is None:
                parts.append(f"its degradation {span} differs by {_signed(gap, 2)} on every seed: no test across seeds")
            else:
                parts.append(_claim(deg, f"that it degrades less {span}", f"that it degrades more {span}",
                                    f"a difference in degradation {span}"))
        if "first_token_attention" in d.sinks:
            parts.append(_claim(d.sinks["first_token_attention"], "more attention on the first token (a stronger sink)",
                                "less attention on the first token (a weaker sink)",
                                "a difference in first-token attention", digits=3))
        if parts:
            out.append(f"Verdict, {name} vs {baseline} over {seeds} seeds: " + "; ".join(parts) + ".")
    return out


def _signed(v: float, digits: int) -> str:
    return f"{round(v, digits) or 0.0:+.{digits}f}"  # `or 0.0`: no '-0.000'


def _claim(d: SeedDifference, higher: str, lower: str, neutral: str, digits: int = 2) -> str:
    shown = f"{_signed(d.mean, digits)} [{_signed(d.lo, digits)}, {_signed(d.hi, digits)}], p={d.p:.2g}"
    if d.significant:
        return f"the sweep supports {higher if d.mean > 0 else lower} ({shown})"
    why = "the interval spans 0" if d.lo <= 0 <= d.hi else "p >= 0.05"
    return f"it does not support {neutral} ({shown}: {why})"
