"""A recipe as read (`longctx.recipe.load`): its models, its stage sections and its launcher."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.core.errors import ref
from longctx.core.kinds import Choice, Int, Names, Seeds, Text
from longctx.core.settings import REQUIRED, Settings, setting


@dataclass
class Model:
    name: str
    source: str  # a source stage (init, convert) or checkpoint
    settings: Settings | None  # the source stage's section (None: a checkpoint given by path)
    checkpoint: Path | None = None  # the local checkpoint of `checkpoint:` models
    # The model's own stage sections, in stage order, where its entry skips a stage or sets keys of one
    # (`models.<name>.skip`, `models.<name>.<stage>`); None: the recipe's.
    stages: dict[str, Settings] | None = None


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


def model_recipe(recipe: Recipe, model: Model) -> Recipe:
    """The recipe as `model` goes through it: its own stage sections in place of the recipe's."""
    return recipe if model.stages is None else dataclasses.replace(recipe, stages=model.stages)


def seed_name(model: str, seed: int) -> str:
    """The name of a model's run of one seed of the recipe's sweep (its folders and tables use it)."""
    return f"{model}-seed{seed}"


@dataclass(frozen=True)
class SweepSettings(Settings):
    """Seeds as an axis: every model runs once per seed, from the first stage whose `seed` the sweep sets on; the
    stages before it run once and are shared."""

    seeds: list[int] = setting(REQUIRED, Seeds(), "The seeds; a model's run of seed S is the model 'NAME-seedS'.",
                               cli=None)
    stages: list[str] | None = setting(None, Names(), "The stages whose seed takes each value: init, pretrain, "
                                                      "extend, ruler, sinks [default: init and the training stages "
                                                      "of the recipe].", cli=None)


@dataclass
class Recipe:
    path: Path
    models: list[Model]
    stages: dict[str, Settings]  # stage -> its section, in stage order
    launcher: LauncherSettings
    description: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    sweep: SweepSettings | None = None
