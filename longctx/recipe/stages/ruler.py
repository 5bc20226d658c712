"""`ruler`: RULER runs of a model's checkpoints (`longctx ruler run`), each at the lengths it can reach."""

from __future__ import annotations

import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import RULER_RUN_KIND
from longctx.core.kinds import Int, Names
from longctx.core.settings import Settings, setting
from longctx.eval.runner import run_ruler
from longctx.eval.settings import RulerRunSettings
from longctx.recipe.load import model_lengths
from longctx.recipe.stage import (
    EvaluationStage,
    Lengths,
    RunContext,
    Step,
    section_record,
)
from longctx.recipe.stages import stage, stage_names
from longctx.recipe.types import Recipe, model_recipe

WHICH = ("which checkpoints to evaluate: model (the source), pretrain, extend, yarn [default: the last "
         "checkpoint stage's]")


@dataclass(frozen=True)
class RulerSection(RulerRunSettings):
    checkpoints: list[str] | None = setting(None, Names(), WHICH, cli=None)
    shards: int = setting(1, Int(minimum=1), "Predict each run as this many shards at once (each a `longctx ruler "
                                             "run` of one shard, in its own process with its share of the GPUs), "
                                             "then put them together (`longctx ruler merge`).", cli=None)


class RulerStage(EvaluationStage):
    name = "ruler"
    section = RulerSection
    job = RulerRunSettings
    output_kind = RULER_RUN_KIND

    def check(self, recipe: Recipe) -> None:
        """Every model's last checkpoint reaches the longest length."""
        for m in recipe.models:
            own = model_recipe(recipe, m).stages
            if self.name not in own:
                continue
            longest = own[self.name].lengths[-1]
            chain = model_lengths(recipe, m)
            last, lengths = list(chain.items())[-1]
            if lengths.reach is None or longest <= lengths.reach:
                continue
            before = list(chain.values())[-2] if len(chain) > 1 else lengths
            how = stage(last).reach_reason(own[last], before, lengths) if last in stage_names() else None
            if how is None:
                how = f"{m.name} is trained at {lengths.trained} tokens and there is no yarn stage"
            raise InputError(f"{recipe.path}: ruler.lengths go up to {longest} but {how}; the largest reachable "
                             f"length is {lengths.reach} (lower the lengths or raise the factor)")

    def job_changes(self, section: Settings, checkpoint_stage: str, lengths: Lengths, recipe: Recipe,
                    model: str) -> dict[str, Any]:
        reach = lengths.reach
        within = [L for L in section.lengths if reach is None or L <= reach]
        if not within:
            raise InputError(f"{recipe.path}: ruler.lengths: none is within what the {checkpoint_stage} checkpoint "
                             f"of {model} can do; add shorter lengths or drop {checkpoint_stage} from "
                             "ruler.checkpoints")
        return {"lengths": within}

    def record(self, section: Settings, changes: dict[str, dict[str, Any]]) -> dict[str, Any]:
        # one shard (the default) is no key: a recipe's stages made before shards existed stay done
        record = {k: v for k, v in section_record(section).items()
                  if k != "checkpoints" and not (k == "shards" and v == 1)}
        record["lengths"] = {c: change["lengths"] for c, change in changes.items()}
        return record

    def run(self, step: Step, ctx: RunContext) -> None:
        from longctx.report.run import write_report

        for job in step.jobs:
            ctx.log(f"ruler {Path(job.output).name}")
            job = dataclasses.replace(job, name=job.name or Path(job.output).name)
            if step.settings.get("shards", 1) > 1:
                _run_shards(job, step.settings["shards"], ctx)
            else:
                run_ruler(job, log=ctx.log)
            ctx.log(write_report(job.output, plot=job.plot, intervals=job.intervals).markdown.split("\n\n")[0])


def _run_shards(job: RulerRunSettings, count: int, ctx: RunContext) -> None:
    """`job` as `count` shards predicted at once, each a `longctx ruler run ... --shard I/N` process bound to this
    one with its share of the GPUs or cores, then merged into `job.output`."""
    from longctx.eval.settings import MergeSettings
    from longctx.eval.shards import merge_run
    from longctx.eval.vllm_replicas import share_environment
    from longctx.recipe.launch import run_launched

    def one(index: int) -> None:
        shard = dataclasses.replace(job, shard=f"{index}/{count}")
        env = share_environment(index - 1, count, job.tensor_parallel_size or 1)
        run_launched([sys.executable, "-m", "longctx", "ruler", "run", *shard.to_args()],
                     f"ruler shard {index}/{count} of {job.name}", env=env)

    with ThreadPoolExecutor(count) as pool:
        for done in [pool.submit(one, i) for i in range(1, count + 1)]:
            done.result()
    merge_run(MergeSettings(run_dir=job.output), lambda folder: None, log=ctx.log)  # the stage then reports
