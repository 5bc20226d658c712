"""`compare`: every model's RULER runs side by side (`longctx compare`), with the training losses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.kinds import Bool, Choice, Length, Text, did_you_mean
from longctx.core.settings import Settings, setting
from longctx.recipe.stage import ComparisonStage, RunContext, Step
from longctx.recipe.stages import stage
from longctx.recipe.types import Recipe, seed_name
from longctx.report.compare import compare
from longctx.report.compare.files import COMPARISON_KIND
from longctx.report.loss import training_curves
from longctx.report.settings import LAYOUT_HELP, LAYOUTS, CompareSettings


@dataclass(frozen=True)
class CompareSection(Settings):
    reference: int | None = setting(None, Length(), "Degradation columns against this length [default: the longest "
                                                    "pre-extension length].", cli=None)
    baseline: str | None = setting(None, Text(), "Model whose last run every other run is compared with.", cli=None)
    layout: str = setting("default", Choice(tuple(LAYOUTS), "layout"), LAYOUT_HELP, cli=None)
    intervals: bool = setting(False, Bool(), "Scores as score ± the half-width of their 95% interval.", cli=None)


class CompareStage(ComparisonStage):
    name = "compare"
    section = CompareSection
    job = CompareSettings
    compares = "ruler"
    unshown = ("train_logs", "replicates")  # paths of the run's own training logs and of its seeds' runs
    output_kind = COMPARISON_KIND

    def check_section(self, section: Settings, models: list[str], file: str) -> None:
        b = section.baseline
        if b is not None and b not in models:
            raise InputError(f"{file}: compare.baseline '{b}' is not a model of this recipe ({', '.join(models)})"
                             f"{did_you_mean(b, models)}")

    def check(self, recipe: Recipe) -> None:
        file, st = str(recipe.path), recipe.stages
        if self.compares not in st:
            raise InputError(f"{file}: compare needs a ruler stage (it compares RULER runs)")
        ref = st[self.name].reference
        if ref is not None and ref not in st[self.compares].lengths:
            raise InputError(f"{file}: compare.reference {ref} is not one of ruler.lengths")

    def step(self, recipe: Recipe, section: Settings, steps: list[Step], folder: Path) -> Step:
        runs: dict[str, list[Path]] = {}
        replicates: dict[str, list[str]] = {}  # with a seed sweep: "<model>-<checkpoint stage>" -> a run per seed
        for s in steps:
            if s.stage == self.compares:
                runs[s.model] = s.outputs
                if s.group is not None:
                    for c, out in zip(s.settings["checkpoints"], s.outputs):
                        replicates.setdefault(f"{s.group}-{c}", []).append(str(out))
        every = [r for rs in runs.values() for r in rs]
        baseline = None
        if section.baseline:  # a swept model's runs are its seeds': the first seed's stands for its group
            name = section.baseline if section.baseline in runs else seed_name(section.baseline, recipe.sweep.seeds[0])
            baseline = str(runs[name][-1])
        train_logs = [str(s.outputs[0]) for s in steps if stage(s.stage).trains]
        job = CompareSettings(runs=[str(r) for r in every], baseline=baseline, reference=section.reference,
                              output=str(folder), layout=section.layout, intervals=section.intervals,
                              replicates=replicates)
        settings = {"reference": section.reference, "baseline": baseline, "train_logs": train_logs,
                    "layout": section.layout, "intervals": section.intervals, "replicates": replicates}
        # the loss table reads the training logs: their fingerprints are in the stage hash too
        return Step(None, self.name, folder, settings, every, [folder], [job], hashed=[Path(p) for p in train_logs])

    def text(self, step: Step) -> str:
        """What a run ends by printing: the comparison table, and the training losses when there was training."""
        folder = step.outputs[0]
        text = (folder / "compare.md").read_text(encoding="utf-8").rstrip()
        if (folder / "loss.md").is_file():
            text += "\n\nTraining loss:\n\n" + (folder / "loss.md").read_text(encoding="utf-8").rstrip()
        return text

    def run(self, step: Step, ctx: RunContext) -> str:
        compare(step.jobs[0])
        for note in training_curves([Path(p) for p in step.settings["train_logs"]], step.outputs[0])[2]:
            ctx.log(f"note: {note}")
        return self.text(step)
