"""One optimizer step of `extend` and what it is made of: the trainer (the module, AdamW and its schedule, as
accelerate prepared them), the micro-batches of a step, the step itself, a line of the training log and the peak
FLOP/s MFU is taken against (`longctx.extend.throughput`). The loop over steps is `longctx.extend.loop`."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.core.errors import SettingError, ref
from longctx.extend.output import LOG_FILE
from longctx.extend.plan import Plan, lr_multiplier
from longctx.extend.settings import ExtendSettings
from longctx.extend.throughput import ModelFlops, peak_flops


@dataclass(frozen=True)
class Trainer:
    """What a step updates, as accelerate prepared it."""

    module: Any  # the training module (`longctx.extend.model.make_training_module`), FSDP2-sharded on many ranks
    accelerated: Any  # accelerate's optimizer wrapper: what steps
    optimizer: Any  # the torch optimizer inside it: what the scheduler and the saved state see
    scheduler: Any


@dataclass(frozen=True)
class StepResult:
    loss: float  # summed over the step's predicted tokens (all micro-batches, all ranks), divided by their number
    lr: float  # the learning rate the step used
    grad_norm: float  # before clipping
    compute_seconds: float
    real_tokens: float  # non-padding tokens of the step, over all ranks
    attention_flops: float | None  # attention-score FLOPs of those tokens (None: not known for this model)


def make_trainer(module, s: ExtendSettings, acc, plan: Plan) -> Trainer:
    """AdamW without weight decay on norms and biases (`longctx.extend.state.PARAM_GROUPS`), linear warmup then
    cosine."""
    import torch

    decay = [p for p in module.parameters() if p.ndim >= 2]
    no_decay = [p for p in module.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, s.beta2))
    # FSDP2 replaces the parameters by sharded ones: accelerate re-points the optimizer when both come together.
    module, accelerated = acc.prepare(module, optimizer)
    optimizer = accelerated.optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_multiplier(i, plan, s.min_lr_ratio))
    return Trainer(module, accelerated, optimizer, scheduler)


def micro_batches(ds, step: int, plan: Plan, dp_rank: int) -> list[dict[str, Any]]:
    """This data-parallel rank's micro-batches of `step`, stacked from the packed dataset."""
    import torch

    b, base = plan.micro_batch_size, step * plan.sequences_per_step
    out = []
    for micro in range(plan.accumulation):
        first = base + (micro * plan.dp_size + dp_rank) * b
        items = [ds.get(first + j) for j in range(b)]
        out.append({k: torch.stack([it[k] for it in items])
                    for k in ("input_ids", "position_ids", "shift_labels", "tokens")})
    return out


def _count(acc, batches, s: ExtendSettings, flops: ModelFlops) -> tuple[float, float, float]:
    """(predicted tokens, non-padding tokens, attention FLOPs) of the step over all ranks; takes the `tokens`
    entries out of the batches."""
    import torch

    from longctx.extend.loss import IGNORE_INDEX

    counts = [0.0, 0.0, 0.0]
    for b in batches:
        tokens = b.pop("tokens")
        # with context parallelism each sequence is one causal stream (positions replaced in `train_step`)
        pos = b["position_ids"] if s.cp_size == 1 else torch.arange(s.seq_len).expand_as(b["position_ids"])
        counts[0] += int((b["shift_labels"] != IGNORE_INDEX).sum())
        counts[1] += int(tokens.sum())
        counts[2] += flops.attention_flops(pos, tokens) or 0.0
    # Ranks of one context-parallel group read the same sequences: count them once.
    totals = acc.reduce(torch.tensor(counts, dtype=torch.float64, device=acc.device), reduction="sum")
    predicted, real_tokens, attention = (float(x) / s.cp_size for x in totals.tolist())
    return predicted, real_tokens, attention


def train_step(acc, trainer: Trainer, batches, s: ExtendSettings, world_size: int, flops: ModelFlops) -> StepResult:
    """One optimizer step over `batches`."""
    import torch

    predicted, real_tokens, attention = _count(acc, batches, s, flops)
    scale = world_size / max(predicted, 1.0)  # gradient reduction averages over all ranks
    start = time.perf_counter()
    loss_sum = torch.zeros((), device=acc.device)
    for batch in batches:
        batch = {k: v.to(acc.device) for k, v in batch.items()}
        cp = contextlib.nullcontext()
        if s.cp_size > 1:
            pos = torch.arange(s.seq_len, device=acc.device).expand_as(batch["position_ids"]).contiguous()
            batch["position_ids"] = pos
            bufs = [batch["input_ids"], batch["position_ids"], batch["shift_labels"]]
            cp = acc.maybe_context_parallel(buffers=bufs, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(bufs))
        with cp:
            part = trainer.module(**batch)
            acc.backward(part * scale)
        loss_sum += part.detach()
    grad_clip = s.grad_clip if s.grad_clip > 0 else float("inf")
    grad_norm = acc.clip_grad_norm_(trainer.module.parameters(), grad_clip)
    trainer.accelerated.step()
    lr = trainer.scheduler.get_last_lr()[0]
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    loss = float(acc.reduce(loss_sum.reshape(1), reduction="sum").item()) / max(predicted, 1.0)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    return StepResult(loss, lr, float(grad_norm), time.perf_counter() - start, real_tokens,
                      attention if flops.layers is not None else None)


def log_entry(step: int, r: StepResult, seconds: float, plan: Plan, peak: float | None, flops: ModelFlops
              ) -> dict[str, Any]:
    """The training log's line for `step` (counted from 1), which took `seconds` of wall time."""
    # MFU: useful (non-padding) tokens' model FLOPs over the step's wall time, over every device's peak
    capacity = None if peak is None else peak * plan.world_size * seconds
    mfu = None if capacity is None else flops.matmul_flops(r.real_tokens) / capacity
    mfu_attention = None if mfu is None or r.attention_flops is None else mfu + r.attention_flops / capacity
    return {"step": step, "loss": round(r.loss, 6), "lr": r.lr, "grad_norm": round(r.grad_norm, 6),
            "tokens": step * plan.tokens_per_step, "tokens_per_s": round(plan.tokens_per_step / seconds, 1),
            "seconds": round(seconds, 4), "compute_seconds": round(r.compute_seconds, 4),
            "padding": round(1 - r.real_tokens / plan.tokens_per_step, 6),
            "mfu": None if mfu is None else round(mfu, 6),
            "mfu_attention": None if mfu_attention is None else round(mfu_attention, 6)}


def append_log_line(log_file, entry: dict[str, Any], work: Path) -> None:
    """One line of the training log, on disk before the next step (a failed write leaves at most a cut last line,
    which `--resume` redoes)."""
    try:
        log_file.write(json.dumps(entry) + "\n")
        log_file.flush()
    except OSError as e:
        raise SettingError(f"could not write step {entry['step']} to the training log {work / LOG_FILE} "
                           f"({e.strerror or e}); the state saved last is kept in {work}: free space and rerun with "
                           f"{ref('resume')}", ExtendSettings) from None


def peak_per_device(acc, s: ExtendSettings, plan: Plan, flops: ModelFlops, dtype: str) -> float | None:
    """The peak FLOP/s per device MFU is taken against (None: unknown); says which, or why there is none."""
    import torch

    device_name = torch.cuda.get_device_name(acc.device) if acc.device.type == "cuda" else None
    peak, source = peak_flops(s.peak_tflops, device_name, dtype)
    if peak is None:
        acc.print(f"MFU not reported: {source}")
    else:
        acc.print(f"MFU against {peak / 1e12:g} TFLOP/s per device x {plan.world_size} ({source}); model FLOPs "
                  f"6 x {flops.params:,} parameters per non-padding token"
                  f"{'' if flops.layers is None else ', mfu_attention adds attention scores'}")
    return peak
