"""`pretrain` and `extend`: training a checkpoint at `seq_len` (`longctx extend`), in this process or under the
recipe's launcher over many."""

from __future__ import annotations

import dataclasses
import shlex

from longctx.core.settings import Settings
from longctx.extend.loop import extend
from longctx.extend.settings import ExtendSettings
from longctx.recipe.launch import launch_command, run_launched
from longctx.recipe.stage import CheckpointStage, Lengths, RunContext, Step


class TrainStage(CheckpointStage):
    section = job = ExtendSettings
    trains = True

    def lengths(self, section: Settings, before: Lengths) -> Lengths:
        return Lengths(section.seq_len, section.seq_len)

    def run(self, step: Step, ctx: RunContext) -> None:
        job = dataclasses.replace(step.jobs[0], resume=step.status == "resume")
        if ctx.recipe.launcher.num_processes > 1:
            shown, cmd = launch_command(ctx.recipe, job)
            ctx.log(f"$ {shlex.join(shown)}")
            run_launched(cmd, step.label)
            return

        extend(job)


class PretrainStage(TrainStage):
    name = "pretrain"


class ExtendStage(TrainStage):
    name = "extend"
