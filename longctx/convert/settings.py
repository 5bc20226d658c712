"""The settings of `longctx convert` (and of a recipe's `models.<name>.convert`)."""

from __future__ import annotations

from dataclasses import dataclass

from longctx.core.kinds import Bool, CheckpointPath, Choice, LocalPath
from longctx.core.settings import REQUIRED, Settings, setting

LAYOUTS = ("official",)


@dataclass(frozen=True)
class ConvertSettings(Settings):
    source: str = setting(REQUIRED, CheckpointPath(), "Checkpoint to convert (the released folder or its Hub id).",
                          cli="argument")
    output: str | None = setting(None, LocalPath(directory=True), "Checkpoint directory to write.", cli="argument",
                                 recipe=False,
                                 cli_required=True)
    layout: str = setting("official", Choice(LAYOUTS, "source layout"),
                          "Layout of SRC: official (the paper's released checkpoints).", flag="--from", key="from")
    overwrite: bool = setting(False, Bool(), "Replace OUT if it exists.", recipe=False)
