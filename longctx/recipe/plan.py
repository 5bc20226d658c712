"""The plan of a recipe: every stage of every model, then the comparisons, each with its directory, its settings
(what its stage hash covers), its inputs and outputs, and the verb settings it runs.

Each stage writes into `<out>/<model>/<stage>/` (a comparison: `<out>/<stage>/`). Checkpoints are
`<stage dir>/<model>-<stage>/` and evaluations (RULER, sinks) `<stage dir>/<model>-<evaluated stage>/`, so
tables name them well. With a seed sweep, a model's stages from the first swept one on run once per seed as
the model `<model>-seed<S>` (`seed_name`); the stages before it run once. How each stage makes its step is the
stage's (`longctx.recipe.stages`); the plan treats every stage of a kind alike.
"""

from __future__ import annotations

import dataclasses
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
from longctx.recipe.types import Model, Recipe, model_recipe, seed_name

__all__ = ["Step", "as_job", "plan", "recipe_data", "recipe_inputs", "section_record"]


def _pipeline(recipe: Recipe, m: Model) -> list[str]:
    """The stages `m` goes through, in order: its source stage (none for a checkpoint), the recipe's checkpoint
    stages, then its evaluation stages."""
    own = [m.source] if m.source in source_stages() else []
    return own + [n for n in (*checkpoint_stages(), *evaluation_stages()) if n in recipe.stages]


def _steps(recipe: Recipe, m: Model, mdir: Path, ckpts: dict[str, Path], lengths: dict[str, Lengths],
           names: list[str]) -> list[Step]:
    """The steps of the stages `names` of `m` (a part of its pipeline, in order) into `mdir`; `ckpts` holds the
    checkpoints made before them ("model" first) and gets theirs."""
    steps = []
    if m.source in names:
        steps.append(source_stages()[m.source].step(m, ckpts["model"]))
    for name, stage in checkpoint_stages().items():
        if name not in names:
            continue
        prev_name = list(ckpts)[-1]
        ckpts[name] = mdir / name / f"{m.name}-{name}"
        step = stage.step(recipe, m.name, recipe.stages[name], ckpts[prev_name], ckpts[name], lengths[prev_name])
        if stage.trains and recipe.launcher.num_processes > 1:
            step.launch = launch_command(recipe, step.jobs[0])[0]
        steps.append(step)
    evaluated = [last_checkpoint_stage(recipe)]
    first = True
    for name, stage in evaluation_stages().items():
        if name not in recipe.stages:
            continue
        section = recipe.stages[name]
        which = section.checkpoints or evaluated
        if first:  # those after the first evaluate its checkpoints unless they name theirs
            evaluated, first = which, False
        if name in names:
            steps.append(stage.step(recipe, m.name, section, ckpts, lengths, which, mdir / name))
    return steps


def _seeded(recipe: Recipe, m: Model, seed: int) -> tuple[Recipe, Model]:
    """The recipe and model of one seed of the sweep: every swept stage's `seed` set to it, the model renamed."""
    swept = recipe.sweep.stages
    stages_ = {n: dataclasses.replace(s, seed=seed) if n in swept else s for n, s in recipe.stages.items()}
    settings = dataclasses.replace(m.settings, seed=seed) if m.source in swept else m.settings
    return (dataclasses.replace(recipe, stages=stages_),
            dataclasses.replace(m, name=seed_name(m.name, seed), settings=settings))


def _model_steps(recipe: Recipe, m: Model, out: Path) -> list[Step]:
    """Every stage of `m`; with a sweep, those from the first swept stage on once per seed (into
    `<out>/<model>-seed<S>/`, each step's `group` the model and `seed` its seed), those before it once."""
    recipe = model_recipe(recipe, m)
    mdir = out / m.name
    ckpts = {"model": m.checkpoint if m.source not in source_stages() else mdir / m.source / f"{m.name}-{m.source}"}
    lengths = model_lengths(recipe, m)
    order = _pipeline(recipe, m)
    fork = next((i for i, n in enumerate(order) if recipe.sweep and n in recipe.sweep.stages), None)
    if fork is None:
        return _steps(recipe, m, mdir, ckpts, lengths, order)
    steps = _steps(recipe, m, mdir, ckpts, lengths, order[:fork])
    for seed in recipe.sweep.seeds:
        seeded_recipe, seeded = _seeded(recipe, m, seed)
        own = dict(ckpts)
        if m.source in order[fork:]:
            own["model"] = out / seeded.name / m.source / f"{seeded.name}-{m.source}"
        for step in _steps(seeded_recipe, seeded, out / seeded.name, own, lengths, order[fork:]):
            step.group, step.seed = m.name, seed
            steps.append(step)
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
    found: list[tuple[str, str]] = []
    views = [("", recipe.stages)] + [(f"models.{m.name}.", m.stages) for m in recipe.models if m.stages is not None]
    for prefix, sections in views:
        for stage, section in sections.items():
            if prefix and section is recipe.stages.get(stage):
                continue  # the recipe's own section, listed once
            for f, spec in section.specs():
                if isinstance(spec.kind, (Source, Specs)):
                    value = getattr(section, f.name)
                    found += [(f"{prefix}{stage}.{f.name}", v) for v in (value if isinstance(value, list) else [value])
                              if v]
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
        steps += _model_steps(recipe, m, out)
    for name, stage in comparison_stages().items():
        if name in recipe.stages:
            steps.append(stage.step(recipe, recipe.stages[name], list(steps), out / name))
    return steps
