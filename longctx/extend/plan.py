"""The resolved numbers of an `extend` run: steps, accumulation, tokens per step, the lr schedule.

Every optimizer step sees `sequences_per_step` packed sequences (`tokens_per_step` rounded to whole
sequences across data-parallel ranks): rank r of W data-parallel ranks, micro-batch b, accumulation a,
reads for step s the dataset indices `s*W*a*b + (micro*W + r)*b + j`, so the data cursor is just
`step * sequences_per_step`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from longctx.core.errors import SettingError, ref
from longctx.extend.settings import ExtendSettings

# ProLong (Gao et al. 2024, §3) and Xiong et al. 2023 train long-context extension with 4M tokens per step.
DEFAULT_TOKENS_PER_STEP = 4 * 1024 * 1024
MIN_STEPS_WHEN_CAPPED = 20  # the default tokens per step is lowered so that a short --tokens run has this many steps


@dataclass(frozen=True)
class Plan:
    """The resolved numbers of a run (printed before training, recorded in the output)."""

    world_size: int
    dp_size: int  # data-parallel ranks: world_size / cp_size
    micro_batch_size: int
    accumulation: int
    sequences_per_step: int
    tokens_per_step: int
    steps: int
    total_tokens: int
    warmup_steps: int


def check_parallelism(cp_size: int, world_size: int, seq_len: int, cuda: bool) -> None:
    """SettingError for a context-parallel layout that cannot run."""
    def fail(text: str) -> SettingError:
        return SettingError(text, ExtendSettings)

    if cp_size == 1:
        return
    if world_size % cp_size:
        raise fail(f"{ref('cp_size')} {cp_size} does not divide the world size {world_size} (processes launched); "
                   f"launch a multiple of {cp_size} processes or change {ref('cp_size')}")
    if seq_len % (2 * cp_size):
        raise fail(f"{ref('seq_len')} {seq_len} is not divisible by 2 x {ref('cp_size')} = {2 * cp_size} (context "
                   "parallelism splits each sequence into 2 x cp_size load-balanced chunks)")
    if not cuda:
        raise fail(f"{ref('cp_size')} {cp_size} needs CUDA GPUs (torch context parallelism runs SDPA's "
                   f"flash/efficient kernels); on CPU use {ref('cp_size')} 1")


def resolve_plan(s: ExtendSettings, world_size: int) -> Plan:
    """Steps, accumulation and tokens per step for `s` on `world_size` processes."""
    dp = world_size // s.cp_size
    per_pass = dp * s.micro_batch_size  # sequences one micro-step reads across ranks
    want = s.tokens_per_step
    if want is None:
        want = DEFAULT_TOKENS_PER_STEP
        if s.tokens is not None:
            want = min(want, s.tokens // MIN_STEPS_WHEN_CAPPED)
    accumulation = max(1, round(want / (s.seq_len * per_pass)))
    sequences = accumulation * per_pass
    tokens_per_step = sequences * s.seq_len
    steps = s.steps if s.steps is not None else max(1, math.ceil(s.tokens / tokens_per_step))
    return Plan(world_size=world_size, dp_size=dp, micro_batch_size=s.micro_batch_size, accumulation=accumulation,
                sequences_per_step=sequences, tokens_per_step=tokens_per_step, steps=steps,
                total_tokens=steps * tokens_per_step, warmup_steps=round(s.warmup_fraction * steps))


def lr_multiplier(step: int, plan: Plan, min_lr_ratio: float) -> float:
    """Linear warmup over `warmup_steps`, then cosine decay to `min_lr_ratio` at the last step."""
    if step < plan.warmup_steps:
        return (step + 1) / plan.warmup_steps
    progress = (step - plan.warmup_steps) / max(1, plan.steps - plan.warmup_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
