"""The sections of a recipe, each a settings type: a stage's section is its verb's settings (minus what the
run supplies itself, such as checkpoint and output paths) plus the few keys only a recipe has, and comes from
its stage (`longctx.recipe.stages`); `launcher` is the recipe's own (`longctx.recipe.types`)."""

from __future__ import annotations

from longctx.core.settings import Settings
from longctx.recipe.stage import ComparisonStage, SourceStage
from longctx.recipe.stages import source_stages, stages

# A model given by path rather than made by a source stage.
CHECKPOINT_SOURCE = "checkpoint"


def stage_sections() -> dict[str, type[Settings]]:
    """Top-level recipe section -> its settings type: every stage's but the sources', in stage order."""
    return {name: s.section for name, s in stages().items() if not isinstance(s, SourceStage)}


def model_sections() -> dict[str, type[Settings]]:
    """A model's source section (`models.<model>.<source>`) -> its settings type."""
    return {name: s.section for name, s in source_stages().items()}


def model_stages() -> list[str]:
    """The stages a model goes through after its source (a recipe has at least one)."""
    return [name for name, s in stages().items() if not isinstance(s, (SourceStage, ComparisonStage))]


def sources() -> tuple[str, ...]:
    """What a model may name as its source."""
    return (*source_stages(), CHECKPOINT_SOURCE)
