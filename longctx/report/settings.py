"""The settings of `longctx compare`."""

from __future__ import annotations

from dataclasses import dataclass

from longctx.core.errors import ref
from longctx.core.kinds import Length, LocalPath, LocalPaths
from longctx.core.settings import REQUIRED, Settings, setting


@dataclass(frozen=True)
class CompareSettings(Settings):
    runs: list[str] = setting(REQUIRED, LocalPaths(), "RULER run directories to compare.", cli="argument")
    baseline: str | None = setting(None, LocalPath(directory=True),
                                   "A run every other run is compared against (its Avg.).")
    reference: int | None = setting(None, Length(), "Reference length of the degradation columns [default: the "
                                                    "longest length every run had before extension].")
    output: str | None = setting(None, LocalPath(directory=True),
                                 "Also write compare.md, compare.csv and compare.png here.", short="-o")
    sinks: list[str] = setting([], LocalPaths(), "sinks.json files (or folders holding one) to show beside the runs "
                                                 "they match by checkpoint fingerprint (repeatable).")

    def check(self) -> None:
        if not self.runs:
            raise self.error(f"give at least one run directory ({ref('runs')})")
