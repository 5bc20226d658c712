"""The settings of `longctx compare` and `longctx export`."""

from __future__ import annotations

from dataclasses import dataclass

from longctx.core.errors import ref
from longctx.core.kinds import Bool, Choice, Length, LocalPath, LocalPaths, NamedLists, Overrides
from longctx.core.settings import REQUIRED, Settings, setting

# compare's layouts: name -> what it shows (`longctx.report.compare.text.LAYOUT_ROWS` has a row builder for each)
LAYOUTS = {
    "default": "a row per run with Avg., degradation and differences",
    "table5": "the Gated Attention paper's Table 5 (a YaRN run's difference to its parent in brackets)",
    "table4": "the Gated Attention paper's Table 4 (gate score, M-Act, F-Attn and perplexity from each run's "
              "sinks.json, then its RULER Avg.)",
}
LAYOUT_HELP = "; ".join(f"{k}: {v}" for k, v in LAYOUTS.items()) + "."
FORMATS = ("lm-eval", "ruler")  # `longctx export` (longctx.report.external)


@dataclass(frozen=True)
class CompareSettings(Settings):
    runs: list[str] = setting(REQUIRED, LocalPaths(), "RULER runs to compare: longctx run directories, lm-eval "
                                                      "results files, folders of RULER summary.csv files.",
                              cli="argument")
    baseline: str | None = setting(None, LocalPath(directory=True),
                                   "A run every other run is compared against (its Avg.).")
    reference: int | None = setting(None, Length(), "Reference length of the degradation columns [default: the "
                                                    "longest length every run had before extension].")
    output: str | None = setting(None, LocalPath(directory=True),
                                 "Also write compare.md, compare.csv and compare.png here.", short="-o")
    sinks: list[str] = setting([], LocalPaths(), "sinks.json files (or folders holding one) to show beside the runs "
                                                 "they match by checkpoint fingerprint (repeatable).")
    layout: str = setting("default", Choice(tuple(LAYOUTS), "layout"), LAYOUT_HELP)
    intervals: bool = setting(False, Bool(), "Show each score as score ± the half-width of its 95% interval.",
                              flag="--intervals/--no-intervals")
    parents: dict = setting({}, Overrides(), "CHILD=PARENT: the run CHILD was extended from (repeatable; runs "
                                             "longctx made know theirs by checkpoint fingerprint).",
                            flag="--parent")
    replicates: dict = setting({}, NamedLists(), "NAME=RUN,RUN,...: runs of one model with different seeds, shown "
                                                 "together as NAME with intervals across seeds; two such models pair "
                                                 "seed by seed, in the order given (repeatable; runs by name or "
                                                 "path).", flag="--replicates")

    def check(self) -> None:
        if not self.runs:
            raise self.error(f"give at least one run directory ({ref('runs')})")


@dataclass(frozen=True)
class ExportSettings(Settings):
    run: str = setting(REQUIRED, LocalPath(directory=True), "A RULER run directory (holding results.json).",
                       cli="argument")
    format: str = setting(REQUIRED, Choice(FORMATS, "format"), "lm-eval: lm-eval's results JSON (0-1 scale); ruler: "
                                                               "NVIDIA RULER's summary.csv, one per length.")
    output: str = setting(REQUIRED, LocalPath(), "lm-eval: the JSON file to write; ruler: the folder of "
                                                 "<length>/summary.csv.", short="-o")
    overwrite: bool = setting(False, Bool(), "Replace an existing output.")
