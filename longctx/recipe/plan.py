"""The plan of a recipe: every stage of every model, then the comparisons, each with its directory, its settings
(what its stage hash covers), its inputs and outputs, and the verb settings it runs.

Each stage writes into `<out>/<model>/<stage>/` (a comparison: `<out>/<stage>/`). Checkpoints are
`<stage dir>/<model>-<stage>/` and evaluations (RULER, sinks) `<stage dir>/<model>-<evaluated stage>/`, so
tables name them well. How each stage makes its step is the stage's (`longctx.recipe.stages`); the plan treats
every stage of a kind alike.
"""

from __future__ import annotations

from pathlib import Path

from longctx.checkpoint.hub import parse_hub_id
from longctx.core.errors import InputError
from longctx.core.kinds import Source, Specs
from longctx.recipe.launch import launch_command
from longctx.recipe.load import last_checkpoint_stage, model_lengths
from longctx.recipe.stage import Lengths, Step, as_job, section_record
from longctx.recipe.stages import (
    checkpoint_stages,
    comparison_stages,
    evaluation_stages,
    source_stages,
)
from longctx.recipe.types import Model, Recipe

__all__ = ["Step", "as_job", "plan", "recipe_data", "recipe_inputs", "section_record"]


def _checkpoint_steps(recipe: Recipe, m: Model, mdir: Path, ckpts: dict[str, Path],
                      lengths: dict[str, Lengths]) -> list[Step]:
    steps = []
    if m.source in source_stages():
        steps.append(source_stages()[m.source].step(m, ckpts["model"]))
    prev, before = ckpts["model"], lengths["model"]
    for name, stage in checkpoint_stages().items():
        if name not in recipe.stages:
            continue
        ckpts[name] = mdir / name / f"{m.name}-{name}"
        step = stage.step(recipe, m.name, recipe.stages[name], prev, ckpts[name], before)
        if stage.trains and recipe.launcher.num_processes > 1:
            step.launch = launch_command(recipe, step.jobs[0])[0]
        steps.append(step)
        prev, before = ckpts[name], lengths[name]
    return steps


def _evaluation_steps(recipe: Recipe, m: Model, mdir: Path, ckpts: dict[str, Path],
                      lengths: dict[str, Lengths]) -> list[Step]:
    """The model's evaluation stages; those after the first evaluate its checkpoints unless they name theirs."""
    steps: list[Step] = []
    evaluated = [last_checkpoint_stage(recipe)]
    for name, stage in evaluation_stages().items():
        if name not in recipe.stages:
            continue
        section = recipe.stages[name]
        which = section.checkpoints or evaluated
        if not steps:
            evaluated = which
        steps.append(stage.step(recipe, m.name, section, ckpts, lengths, which, mdir / name))
    return steps


def recipe_inputs(recipe: Recipe) -> list[tuple[str, Path]]:
    """(recipe key, path) of the files a recipe takes from outside its run."""
    found = []
    for m in recipe.models:
        where = f"models.{m.name}"
        if m.source in source_stages():
            found += [(f"{where}.{m.source}.{key}", path) for key, path in source_stages()[m.source].inputs(m.settings)]
        else:
            found.append((f"{where}.{m.source}", m.checkpoint))
    return found


def recipe_data(recipe: Recipe) -> list[tuple[str, str]]:
    """(recipe key, spec) of the data a recipe's stages read (the settings of a data kind: training data, sinks
    text, RULER sources)."""
    found = []
    for stage, section in recipe.stages.items():
        for f, spec in section.specs():
            if isinstance(spec.kind, (Source, Specs)):
                value = getattr(section, f.name)
                found += [(f"{stage}.{f.name}", v) for v in (value if isinstance(value, list) else [value]) if v]
    return found


def _check_inputs_outside(recipe: Recipe, out: Path) -> None:
    """A stage that runs again first removes its folder: an input inside the run's output would go with it."""
    root = out.resolve()
    for key, path in recipe_inputs(recipe):
        if parse_hub_id(str(path)) is None and path.resolve().is_relative_to(root):
            raise InputError(f"{recipe.path}: {key} '{path}' lies inside this run's output folder '{out}', whose "
                             "stage folders a rerun replaces; move it out of there or choose another -o")


def plan(recipe: Recipe, out: Path) -> list[Step]:
    """Every stage of every model, then the comparisons; InputError when an input lies inside `out`."""
    _check_inputs_outside(recipe, out)
    steps: list[Step] = []
    for m in recipe.models:
        mdir = out / m.name
        ckpts = {"model": m.checkpoint if m.source not in source_stages() else mdir / m.source / f"{m.name}-{m.source}"}
        lengths = model_lengths(recipe, m)
        steps += _checkpoint_steps(recipe, m, mdir, ckpts, lengths)
        steps += _evaluation_steps(recipe, m, mdir, ckpts, lengths)
    for name, stage in comparison_stages().items():
        if name in recipe.stages:
            steps.append(stage.step(recipe, recipe.stages[name], list(steps), out / name))
    return steps
