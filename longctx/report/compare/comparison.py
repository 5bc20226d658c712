"""What `longctx compare` (`longctx.report.compare`) finds, as typed values: a row per run (`ComparedRun`) with its
table score and interval per length, the table's lengths (`ScoreTable`), the differences between runs with their
statistics (`RunDifference`), and the notes. `table` and `stats` compute them, `text`
renders them and `files` writes them (modules of this package)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from longctx.report import stats
from longctx.report.results import Results, mean
from longctx.report.samples import Cell
from longctx.sinks.schema import SinksResults

Bounds = dict[str, Any]  # {"se", "lo", "hi", "method"} of one score (`stats.Interval.as_dict`)
Samples = dict[str, dict[int, Cell]]  # task -> length -> a run's per-sample scores and prompt hashes


@dataclass
class ComparedRun:
    """One run of a comparison, and its row of the table."""

    name: str  # unique among the runs
    path: Path  # as given
    results: Results
    run_dir: Path | None  # its longctx run directory (per-sample files); None: another tool's results
    parent: str | None = None  # the name of the run it is the YaRN child of
    # length -> its table score, for each length it has (a score for every compared task), in its results' order
    per_length: dict[int, float] = field(default_factory=dict)
    # task -> length -> the samples its table score is over (fewer than its own where compare rescored it)
    used: dict[str, dict[int, int]] = field(default_factory=dict)
    rescored: set[int] = field(default_factory=set)  # lengths whose score is not its own (other tasks or samples)
    samples: Samples | None = None  # its per-sample scores, read only when intervals or differences need them
    no_samples: str | None = None  # why it has none
    intervals: dict[int, Bounds | None] | None = None  # length -> the 95% interval of its score; None: not computed
    sinks: SinksResults | None = None  # its checkpoint's `longctx sinks` results

    @property
    def lengths(self) -> list[int]:
        return list(self.per_length)

    def sample_scores(self, tasks: list[str], length: int) -> list[list[float]]:
        """Per task, the per-sample scores its table score at `length` is the mean of."""
        return [self.samples[t][length].scores[:self.used[t][length]] for t in tasks]


@dataclass
class ScoreTable:
    """The runs' rows and the table's lengths (every length any run has). Avg. is over the lengths every run has,
    a difference between two runs over the lengths both have."""

    runs: list[ComparedRun]
    lengths: list[int]
    avg_over: list[int] | None  # the lengths every run has (None: they share none)
    reference: int = 0  # the length the degradation columns are taken against

    def run(self, name: str) -> ComparedRun:
        return next(r for r in self.runs if r.name == name)

    def avg(self, run: ComparedRun) -> float | None:
        return mean([run.per_length[L] for L in (self.avg_over or run.lengths)])

    def both(self, x: ComparedRun, y: ComparedRun) -> list[int]:
        return [L for L in self.lengths if L in x.per_length and L in y.per_length]

    def mean_gap(self, x: ComparedRun, y: ComparedRun) -> float | None:
        """The mean per-length difference x − y over the lengths both have (None: they share none)."""
        return mean([x.per_length[L] - y.per_length[L] for L in self.both(x, y)])

    def delta(self, run: ComparedRun, length: int) -> float | None:
        """The run's score at `length` minus its score at the reference length."""
        if length not in run.per_length or self.reference not in run.per_length:
            return None
        return round(run.per_length[length] - run.per_length[self.reference], 2)


@dataclass(frozen=True)
class ReportedDifference:
    """A difference between two runs' scores as compare reports it: rounded as `stats.Difference.as_dict`. A point
    difference (no per-sample scores to pair) has no interval, test or pairs."""

    mean: float
    lo: float | None
    hi: float | None
    p: float | None  # None: no test (a point difference)
    pairs: int
    paired: bool
    significant: bool | None

    @classmethod
    def of(cls, d: stats.Difference) -> ReportedDifference:
        return cls(**d.as_dict())

    @classmethod
    def point(cls, value: float) -> ReportedDifference:
        return cls(round(value, 4), None, None, None, 0, False, None)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunDifference:
    """A run − `against`: per length both have, and Overall (over those lengths)."""

    against: str
    method: str | None  # "paired" | "unpaired" | "point"; None: the runs share no length
    per_length: dict[int, ReportedDifference] = field(default_factory=dict)
    overall: ReportedDifference | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"against": self.against, "method": self.method,
                "per_length": {L: d.as_dict() for L, d in self.per_length.items()},
                "overall": None if self.overall is None else self.overall.as_dict()}


@dataclass
class Comparison:
    """The comparison of RULER runs: what was found, then (set by `compare`) the rendered table and Markdown and
    the files written."""

    table: ScoreTable
    tasks: list[str]  # the tasks every run has ([]: the runs are compared on their per-length means)
    layout: str
    notes: list[str]
    baseline: str | None = None  # the run every other one is compared against
    against_baseline: dict[str, RunDifference] | None = None  # run name -> it − the baseline (None: no baseline)
    # with seed groups that hold the baseline: run name -> its seed's run of the baseline model (what
    # `against_baseline` and the Δ column compare it with); empty: every run is compared with `baseline`
    baseline_of: dict[str, str] = field(default_factory=dict)
    against_parent: dict[str, RunDifference] | None = None  # table5: run name -> it − its parent
    show_intervals: bool = False  # scores shown as `score ± half-width`
    seed_groups: list[Any] = field(default_factory=list)  # `seeds.SeedGroup`s (--replicates)
    seed_baseline: str | None = None  # the group holding the baseline run
    seed_differences: dict[str, Any] = field(default_factory=dict)  # group -> `seeds.GroupDifference`
    columns: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    markdown: str = ""
    files: list[Path] = field(default_factory=list)

    @property
    def runs(self) -> list[ComparedRun]:
        return self.table.runs

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.runs]

    @property
    def lengths(self) -> list[int]:
        return self.table.lengths

    @property
    def reference(self) -> int:
        return self.table.reference

    # The views below are what compare.json holds (there with decimal-string length keys).

    @property
    def per_length(self) -> dict[str, dict[int, float | None]]:
        """Run name -> length -> its table score (None: a length it does not have)."""
        return {r.name: {L: r.per_length.get(L) for L in self.lengths} for r in self.runs}

    @property
    def intervals(self) -> dict[str, dict[int, Bounds | None]]:
        """Run name -> length it has -> its score's interval; empty when intervals were not computed."""
        return {r.name: r.intervals for r in self.runs if r.intervals is not None}

    @property
    def differences(self) -> dict[str, dict[str, dict[str, Any]]]:
        """"baseline" (vs the baseline) or "parent" (table5) -> run name -> `RunDifference.as_dict()`."""
        found = {"baseline": self.against_baseline, "parent": self.against_parent}
        return {versus: {n: d.as_dict() for n, d in entries.items()}
                for versus, entries in found.items() if entries is not None}

    @property
    def parents(self) -> dict[str, str]:
        """Run name -> its parent's run name."""
        return {r.name: r.parent for r in self.runs if r.parent is not None}

    @property
    def sinks(self) -> dict[str, SinksResults]:
        """Run name -> its checkpoint's sinks.json, for the runs that have one."""
        return {r.name: r.sinks for r in self.runs if r.sinks is not None}
