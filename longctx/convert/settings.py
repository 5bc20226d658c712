"""The settings of `longctx convert` (and of a recipe's `models.<name>.convert`)."""

from __future__ import annotations

from dataclasses import dataclass

from longctx.convert.layouts import LAYOUTS
from longctx.core.kinds import Bool, CheckpointPath, Choice, LocalPath
from longctx.core.settings import REQUIRED, Settings, setting


@dataclass(frozen=True)
class ConvertSettings(Settings):
    source: str = setting(REQUIRED, CheckpointPath(), "What to convert: a checkpoint folder or Hub id (official), a "
                                                      "GGUF file or a folder holding one (gguf).", cli="argument")
    output: str | None = setting(None, LocalPath(directory=True), "Checkpoint directory to write.", cli="argument",
                                 recipe=False,
                                 cli_required=True)
    layout: str = setting("official", Choice(tuple(LAYOUTS), "source layout"),
                          "Layout of SOURCE: " + "; ".join(f"{k}: {v.words}" for k, v in LAYOUTS.items()) + ".",
                          flag="--from", key="from")
    overwrite: bool = setting(False, Bool(), "Replace OUT if it exists.", recipe=False)
