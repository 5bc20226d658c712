"""`convert` as a model's source: a released checkpoint in the gated-attention family (`longctx convert`)."""

from __future__ import annotations

from pathlib import Path

from longctx.checkpoint.hub import parse_hub_id
from longctx.convert.layouts import LAYOUTS, convert_checkpoint
from longctx.convert.settings import ConvertSettings
from longctx.core.errors import InputError
from longctx.core.settings import Settings
from longctx.recipe.stage import (
    RunContext,
    SourceStage,
    Step,
    checkpoint_trained_length,
)


class ConvertStage(SourceStage):
    name = "convert"
    section = job = ConvertSettings

    def check_model(self, section: Settings, file: str, where: str) -> None:
        if not Path(section.source).exists() and parse_hub_id(section.source) is None:
            raise InputError(f"{file}: {where}.source '{section.source}' does not exist: model path missing (the "
                             "released checkpoint's local folder, or the GGUF file)")

    def inputs(self, section: Settings) -> list[tuple[str, Path]]:
        return [("source", Path(section.source))]

    def trained_length(self, section: Settings) -> int | None:
        own = getattr(LAYOUTS[section.layout].load(), "trained_length", None)  # a source that is no checkpoint
        return own(section.source) if own else checkpoint_trained_length(section.source)

    def run(self, step: Step, ctx: RunContext) -> None:
        convert_checkpoint(step.jobs[0])
