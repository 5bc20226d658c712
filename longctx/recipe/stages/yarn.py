"""`yarn`: a static-YaRN copy of the checkpoint before it (`longctx yarn`), from the length it was trained at."""

from __future__ import annotations

from typing import Any

from longctx.core.settings import Settings
from longctx.recipe.stage import CheckpointStage, Lengths, RunContext, Step
from longctx.yarn.scaling import yarn_checkpoint
from longctx.yarn.settings import YarnSettings


class YarnStage(CheckpointStage):
    name = "yarn"
    section = job = YarnSettings

    def _original(self, section: Settings, before: Lengths) -> int | None:
        return section.original_max_position_embeddings or before.trained

    def lengths(self, section: Settings, before: Lengths) -> Lengths:
        original = self._original(section, before)
        return Lengths(before.trained, int(original * section.factor) if original is not None else None)

    def reach_reason(self, section: Settings, before: Lengths, after: Lengths) -> str:
        return f"yarn.factor {section.factor:g} on the {before.trained}-token trained length reaches {after.reach}"

    def job_changes(self, section: Settings, before: Lengths) -> dict[str, Any]:
        # the trained length is YaRN's original length unless the recipe says it
        changes: dict[str, Any] = {"overwrite": True}
        if section.original_max_position_embeddings is None and before.trained:
            changes["original_max_position_embeddings"] = before.trained
        return changes

    def run(self, step: Step, ctx: RunContext) -> None:
        yarn_checkpoint(step.jobs[0])
