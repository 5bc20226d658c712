"""The sections of a recipe, each a settings type: a stage's section is its verb's settings (minus what the
run supplies itself, such as checkpoint and output paths), plus the few keys only a recipe has."""

from __future__ import annotations

from dataclasses import dataclass

from longctx.convert.settings import ConvertSettings
from longctx.core.errors import ref
from longctx.core.kinds import Bool, Choice, Int, Length, Names, Text
from longctx.core.settings import Settings, setting
from longctx.eval.settings import RulerRunSettings
from longctx.extend.settings import ExtendSettings
from longctx.init.settings import InitSettings
from longctx.report.settings import LAYOUTS
from longctx.sinks.settings import SinksSettings
from longctx.yarn.settings import YarnSettings

CHECKPOINT_STAGES = ("pretrain", "extend", "yarn")
TRAIN_STAGES = ("pretrain", "extend")
MODEL_STAGES = ("pretrain", "extend", "yarn", "ruler", "sinks")
SOURCES = ("init", "convert", "checkpoint")
_WHICH = ("which checkpoints to evaluate: model (the source), pretrain, extend, yarn [default: the last "
          "checkpoint stage's]")


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


@dataclass(frozen=True)
class RulerStage(RulerRunSettings):
    checkpoints: list[str] | None = setting(None, Names(), _WHICH, cli=None)


@dataclass(frozen=True)
class SinksStage(SinksSettings):
    checkpoints: list[str] | None = setting(None, Names(), _WHICH + " [default: those ruler evaluates]", cli=None)


@dataclass(frozen=True)
class CompareStage(Settings):
    reference: int | None = setting(None, Length(), "Degradation columns against this length [default: the longest "
                                                    "pre-extension length].", cli=None)
    baseline: str | None = setting(None, Text(), "Model whose last run every other run is compared with.", cli=None)
    layout: str = setting("default", Choice(LAYOUTS, "layout"), "default or table5 (the paper's Table 5).", cli=None)
    intervals: bool = setting(False, Bool(), "Scores as score ± the half-width of their 95% interval.", cli=None)


STAGE_SECTIONS: dict[str, type[Settings]] = {"pretrain": ExtendSettings, "extend": ExtendSettings,
                                             "yarn": YarnSettings, "ruler": RulerStage, "sinks": SinksStage,
                                             "compare": CompareStage}
MODEL_SECTIONS: dict[str, type[Settings]] = {"init": InitSettings, "convert": ConvertSettings}
