"""`sinks`: attention sinks, massive activations and gate scores of a model's checkpoints (`longctx sinks`)."""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from longctx.core.kinds import Names
from longctx.core.settings import setting
from longctx.recipe.markers import record_files
from longctx.recipe.stage import EvaluationStage, RunContext, Step
from longctx.recipe.stages.ruler import WHICH
from longctx.sinks.measure import measure_sinks
from longctx.sinks.schema import SINKS_KIND
from longctx.sinks.settings import SinksSettings


@dataclass(frozen=True)
class SinksSection(SinksSettings):
    checkpoints: list[str] | None = setting(None, Names(), WHICH + " [default: those ruler evaluates]", cli=None)


class SinksStage(EvaluationStage):
    name = "sinks"
    section = SinksSection
    job = SinksSettings
    output_kind = SINKS_KIND
    # each measurement is also filed in the RULER run of the same checkpoint, which `longctx compare` then shows
    beside = "ruler"

    def run(self, step: Step, ctx: RunContext) -> None:
        from longctx.report.sinks import write_sinks_report

        ruler_dir = step.dir.parent / self.beside
        for job in step.jobs:
            outcome = measure_sinks(dataclasses.replace(job, name=job.name or Path(job.output).name), log=ctx.log)
            ctx.log(write_sinks_report(job.output, plot=job.plot).markdown.split("\n\n")[0])
            run_dir = ruler_dir / Path(job.output).name
            if (run_dir / "results.json").is_file():
                shutil.copy2(outcome.file, run_dir / "sinks.json")
                record_files(ruler_dir)
