"""The interface of a recipe stage. A stage is one module of `longctx.recipe.stages` and one line of its registry
(`STAGES`); the recipe's sections, the plan, `longctx run --from`, the stage fingerprints and the messages that
name a stage's keys all derive from it.

There are four kinds, by what a stage takes and makes; the plan treats every stage of a kind alike:
- `SourceStage` makes a model's first checkpoint from its `models.<model>.<stage>` section (init, convert);
- `CheckpointStage` makes a checkpoint from the one before it, in registry order (pretrain, extend, yarn);
- `EvaluationStage` measures checkpoints of a model, one output folder each (ruler, sinks);
- `ComparisonStage` reads every model's outputs of an evaluation stage into one folder (compare).
Each stage names its section's settings type (`section`) and the verb settings a job of it runs (`job`), says
what its stage hash covers (`record`), what it reads (`Step.inputs`) and writes (`Step.outputs`), and runs its
jobs (`run`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from longctx.checkpoint.hub import cached_file, parse_hub_id
from longctx.core.files import CHECKPOINT_KIND
from longctx.core.parse import loads
from longctx.core.settings import Settings
from longctx.recipe.types import Model, Recipe
from longctx.rope.config import read_rope


@dataclass
class Step:
    """One stage of one model (or of every model: a comparison), as the plan makes it and the run decides it."""

    model: str | None  # None: a comparison (across models)
    stage: str
    dir: Path  # the stage directory, holding stage.json
    settings: dict[str, Any]  # what the stage hash covers (besides the inputs)
    inputs: list[Path]
    outputs: list[Path]
    jobs: list[Settings] = field(default_factory=list)  # the verb settings the stage runs, one per output
    status: str = ""  # run | resume | skip
    reason: str = ""
    launch: list[str] | None = None  # multi-process training: the command line shown (and run)
    hashed: list[Path] = field(default_factory=list)  # more inputs the hash covers, read only if present
    group: str | None = None  # with a seed sweep: the recipe's model whose seed this step runs
    seed: int | None = None

    @property
    def label(self) -> str:
        return f"{self.stage} for {self.model}" if self.model else self.stage


@dataclass(frozen=True)
class Lengths:
    """What a checkpoint can do, as far as it is known before anything runs: the length it was trained at
    (YaRN's original length) and the longest sequence it can be evaluated at."""

    trained: int | None
    reach: int | None


@dataclass(frozen=True)
class RunContext:
    """What a stage's `run` gets besides its step (which says whether it resumes): the recipe (its launcher) and
    where to say a line."""

    recipe: Recipe
    log: Callable[[str], None]


def section_record(s: Settings) -> dict[str, Any]:
    """The settings a recipe section holds (without the paths the plan supplies), as the stage's marker records
    them and its hash covers: a value that may hold a secret (a URL) redacted."""
    return {f.name: spec.kind.recorded(getattr(s, f.name)) for f, spec in s.specs() if spec.recipe}


def as_job(section: Settings, cls: type[Settings], **changes: Any) -> Settings:
    """`section` (a recipe section, possibly with recipe-only keys) as the verb settings `cls` with `changes`."""
    names = {f.name for f, _ in cls.specs()}
    values = {f.name: getattr(section, f.name) for f, spec in section.specs() if spec.recipe and f.name in names}
    return cls(**{**values, **changes})


def checkpoint_trained_length(spec: str) -> int | None:
    """The length the checkpoint `spec` (a folder, or a Hub id in the local cache) was trained at, read from its
    config.json; None when that is not there yet (a Hub checkpoint not downloaded) or not readable."""

    cfg_path = cached_file(spec, "config.json") if parse_hub_id(spec) else Path(spec) / "config.json"
    if cfg_path is None:
        return None
    try:
        return read_rope(loads(cfg_path.read_text(encoding="utf-8"))).trained_length
    except (OSError, ValueError, AttributeError):
        return None


class Stage:
    """What every stage has. `name` is its recipe key (and the folder of its outputs), `section` its section's
    settings type, `job` the verb settings one job runs."""

    name: ClassVar[str]
    section: ClassVar[type[Settings]]
    job: ClassVar[type[Settings]]
    # a training stage: runs under the recipe's launcher (multi-process training) and writes a training log
    trains: ClassVar[bool] = False
    # keys of its step settings (what its hash covers) that `--dry-run` does not show
    unshown: ClassVar[tuple[str, ...]] = ()
    # the kind of folder its outputs are (`longctx.core.files` output markers), which its verb marks them with
    output_kind: ClassVar[str | None] = None

    def where(self, model: str | None) -> str:
        """The recipe key path of this stage's section (messages name its keys under it)."""
        return self.name

    def check(self, recipe: Recipe) -> None:
        """Checks across the recipe's sections, once every section is read (InputError naming the file and key)."""

    def run(self, step: Step, ctx: RunContext) -> str | None:
        """Run the step's jobs; a comparison returns the text `longctx run` ends by printing."""
        raise NotImplementedError


class SourceStage(Stage):
    """Makes a model's first checkpoint from its `models.<model>.<stage>` section."""

    output_kind = CHECKPOINT_KIND

    def where(self, model: str | None) -> str:
        return f"models.{model}.{self.name}"

    def check_model(self, section: Settings, file: str, where: str) -> None:
        """Checks of the model's section that need more than its settings (a source that must exist)."""

    def inputs(self, section: Settings) -> list[tuple[str, Path]]:
        """(key under the section, path) of what the source reads from outside the run."""
        return []

    def step_inputs(self, section: Settings) -> list[Path]:
        """The inputs whose fingerprints the stage hash covers [default: every one of `inputs`]."""
        return [path for _, path in self.inputs(section)]

    def trained_length(self, section: Settings) -> int | None:
        """The length the checkpoint it makes is trained at, when it can be known before anything runs."""
        return None

    def step(self, model: Model, checkpoint: Path) -> Step:
        inputs = self.step_inputs(model.settings)
        job = dataclasses.replace(model.settings, output=str(checkpoint), overwrite=True)
        return Step(model.name, self.name, checkpoint.parent, section_record(model.settings), inputs, [checkpoint],
                    [job])


class CheckpointStage(Stage):
    """Makes a checkpoint from the one before it (the model's source or the previous checkpoint stage)."""

    output_kind = CHECKPOINT_KIND

    def lengths(self, section: Settings, before: Lengths) -> Lengths:
        """What the checkpoint it makes can do, from what its input can."""
        raise NotImplementedError

    def reach_reason(self, section: Settings, before: Lengths, after: Lengths) -> str | None:
        """How the stage sets its checkpoint's reach, for a message that it is too short ('yarn.factor 4 on the
        1024-token trained length reaches 4096'); None: by training at it."""
        return None

    def job_changes(self, section: Settings, before: Lengths) -> dict[str, Any]:
        """Settings of the job beyond the section, its input checkpoint and its output."""
        return {}

    def step(self, recipe: Recipe, model: str, section: Settings, checkpoint: Path, output: Path,
             before: Lengths) -> Step:
        changes = {"checkpoint": str(checkpoint), "output": str(output), **self.job_changes(section, before)}
        job = dataclasses.replace(section, **changes)
        return Step(model, self.name, output.parent, section_record(job), [checkpoint], [output], [job])


class EvaluationStage(Stage):
    """Measures checkpoints of a model (its section's `checkpoints` names which), one output folder each."""

    def job_changes(self, section: Settings, checkpoint_stage: str, lengths: Lengths, recipe: Recipe,
                    model: str) -> dict[str, Any]:
        """Settings of the job of one evaluated checkpoint beyond its checkpoint and output."""
        return {}

    def record(self, section: Settings, changes: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """What the stage hash covers, from the section and each evaluated checkpoint's job changes."""
        return {k: v for k, v in section_record(section).items() if k != "checkpoints"}

    def step(self, recipe: Recipe, model: str, section: Settings, checkpoints: dict[str, Path],
             lengths: dict[str, Lengths], which: list[str], folder: Path) -> Step:
        outputs = [folder / f"{model}-{c}" for c in which]
        changes = {c: {"checkpoint": str(checkpoints[c]), "output": str(out),
                       **self.job_changes(section, c, lengths[c], recipe, model)} for c, out in zip(which, outputs)}
        jobs = [as_job(section, self.job, **changes[c]) for c in which]
        return Step(model, self.name, folder, {**self.record(section, changes), "checkpoints": which},
                    [checkpoints[c] for c in which], outputs, jobs)


class ComparisonStage(Stage):
    """Reads every model's outputs of the evaluation stage `compares` into one folder; it runs again whenever any
    stage before it did."""

    compares: ClassVar[str]

    def check_section(self, section: Settings, models: list[str], file: str) -> None:
        """Checks of its section against the recipe's model names, before the other sections are read."""

    def step(self, recipe: Recipe, section: Settings, steps: list[Step], folder: Path) -> Step:
        raise NotImplementedError

    def text(self, step: Step) -> str:
        """What `longctx run` ends by printing, from the comparison's files."""
        raise NotImplementedError
