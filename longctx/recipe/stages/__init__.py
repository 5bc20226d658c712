"""The recipe stages, in the order they run: a stage is a module here and one line of `STAGES` (its recipe key
-> "module:class" of its `longctx.recipe.stage.Stage`). Source stages come first, then checkpoint stages in the
order they are applied, evaluation stages, and comparisons."""

from __future__ import annotations

import importlib

from longctx.recipe.stage import (
    CheckpointStage,
    ComparisonStage,
    EvaluationStage,
    SourceStage,
    Stage,
)

STAGES = {
    "init": "longctx.recipe.stages.init:InitStage",
    "convert": "longctx.recipe.stages.convert:ConvertStage",
    "pretrain": "longctx.recipe.stages.train:PretrainStage",
    "extend": "longctx.recipe.stages.train:ExtendStage",
    "yarn": "longctx.recipe.stages.yarn:YarnStage",
    "ruler": "longctx.recipe.stages.ruler:RulerStage",
    "sinks": "longctx.recipe.stages.sinks:SinksStage",
    "compare": "longctx.recipe.stages.compare:CompareStage",
}


def _load(name: str, target: str) -> Stage:
    module, _, attr = target.partition(":")
    stage = getattr(importlib.import_module(module), attr)()
    if stage.name != name:
        raise ValueError(f"stage {target} is named {stage.name!r}, registered as {name!r}")
    return stage


def stages(kind: type[Stage] = Stage) -> dict[str, Stage]:
    """name -> stage of every registered stage of `kind`, in registry order."""
    return {name: stage for name, stage in ((n, _load(n, t)) for n, t in STAGES.items()) if isinstance(stage, kind)}


def stage(name: str) -> Stage:
    return _load(name, STAGES[name])


def stage_names() -> list[str]:
    """Every registered stage's name, in registry order."""
    return list(STAGES)


def source_stages() -> dict[str, SourceStage]:
    return stages(SourceStage)


def checkpoint_stages() -> dict[str, CheckpointStage]:
    return stages(CheckpointStage)


def evaluation_stages() -> dict[str, EvaluationStage]:
    return stages(EvaluationStage)


def comparison_stages() -> dict[str, ComparisonStage]:
    return stages(ComparisonStage)
