"""A recipe as read (`longctx.recipe.load`): its models, its stage sections and its launcher."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.core.errors import ref
from longctx.core.kinds import Choice, Int, Text
from longctx.core.settings import Settings, setting


@dataclass
class Model:
    name: str
    source: str  # a source stage (init, convert) or checkpoint
    settings: Settings | None  # the source stage's section (None: a checkpoint given by path)
    checkpoint: Path | None = None  # the local checkpoint of `checkpoint:` models


@dataclass(frozen=True)
class LauncherSettings(Settings):
    """How pretrain/extend run: in this process, or as `accelerate launch` / `torchrun` over N processes."""

    launcher: str = setting("accelerate", Choice(("accelerate", "torchrun"), "launcher"), "The launcher.", cli=None)
    num_processes: int = setting(1, Int(minimum=1), "Processes (GPUs) over all machines.", cli=None)
    num_machines: int = setting(1, Int(minimum=1), "Machines.", cli=None)
    machine_rank: int | None = setting(None, Int(minimum=0), "This machine's rank [default: $MACHINE_RANK or 0].",
                                       cli=None)
    main_process_ip: str | None = setting(None, Text(), "Machine rank 0's address.", cli=None)
    main_process_port: int = setting(29500, Int(minimum=1), "Rendezvous port.", cli=None)

    def check(self) -> None:
        if self.num_processes % self.num_machines:
            raise self.error(f"{ref('num_processes')} ({self.num_processes}) must be a multiple of num_machines")
        if self.num_machines > 1 and not self.main_process_ip:
            raise self.error(f"{ref('main_process_ip')} is required with num_machines > 1 (machine rank 0's address)")


@dataclass
class Recipe:
    path: Path
    models: list[Model]
    stages: dict[str, Settings]  # stage -> its section, in stage order
    launcher: LauncherSettings
    description: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
