"""`init` as a model's source: a freshly initialised checkpoint (`longctx init`)."""

from __future__ import annotations

from pathlib import Path

from longctx.core.settings import Settings
from longctx.init.checkpoint import init_checkpoint
from longctx.init.presets import PRESETS
from longctx.init.settings import TOKENIZER_CHOICES, InitSettings
from longctx.recipe.stage import RunContext, SourceStage, Step


class InitStage(SourceStage):
    name = "init"
    section = job = InitSettings

    def inputs(self, section: Settings) -> list[tuple[str, Path]]:
        # a tokenizer folder or Hub id (the named tokenizers are made on the spot)
        return [] if section.tokenizer in TOKENIZER_CHOICES else [("tokenizer", Path(section.tokenizer))]

    def step_inputs(self, section: Settings) -> list[Path]:
        return []  # the stage hash covers the tokenizer by its name (a setting), not by its files

    def trained_length(self, section: Settings) -> int | None:
        return {**PRESETS[section.preset], **section.config}.get("max_position_embeddings")

    def run(self, step: Step, ctx: RunContext) -> None:
        init_checkpoint(step.jobs[0])
