"""The `extend` training loop: a transformers model driven by accelerate, resumable, logged.

One code path for a laptop CPU, one GPU and many nodes (extension.md §3 "Recommendation"):
- 1 process: plain accelerate (fp32 on CPU, bf16 autocast on GPU).
- >1 process (`torchrun` / `accelerate launch`): FSDP2 full sharding of every decoder layer
  (`FullyShardedDataParallelPlugin(fsdp_version=2)`), on GPUs with NCCL and on CPUs with gloo.
- `cp_size > 1`: accelerate's torch context parallelism (`ParallelismConfig(cp_size=...)`), GPUs only.

Every optimizer step sees `sequences_per_step` packed sequences (`tokens_per_step` rounded to whole
sequences across data-parallel ranks): rank r of W data-parallel ranks, micro-batch b, accumulation a,
reads for step s the dataset indices `s*W*a*b + (micro*W + r)*b + j`, so the data cursor is just
`step * sequences_per_step`. The loss is summed per token and divided by the number of predicted
tokens of the whole step (all micro-batches, all ranks), never averaged per micro-batch.

State lives in a work folder beside the output (`OUT.train/`): `settings.json` (what the run is),
`step-NNNNNN/` (model + optimizer as a torch.distributed.checkpoint, scheduler, RNG per rank, data
cursor), written to a temp folder and renamed, the older one deleted only after; and
`train_log.jsonl`. The output folder is written once, at the end, as an ordinary HF checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.errors import InputError

DEFAULT_TOKENS_PER_STEP = 4 * 1024 * 1024  # ProLong/Xiong et al.: 4M tokens per step (128 x 32k), extension.md §2
MIN_STEPS_WHEN_CAPPED = 20  # the default tokens per step is lowered so that a short --tokens run has this many steps
MAX_SHARD_SIZE = "5GB"  # explicit: transformers 4.x and 5.x defaults differ (extension.md §4)
LOG_FILE = "train_log.jsonl"
SETTINGS_FILE = "settings.json"
STATE_FILE = "state.json"
# Settings a resumed run may change: they do not change what the run computes. The checkpoint is
# compared by fingerprint instead of by path.
RESUME_FREE_FIELDS = ("checkpoint", "resume", "overwrite", "save_every", "gradient_checkpointing", "cache_dir")
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


@dataclass
class TrainSettings:
    checkpoint: str
    output: str
    seq_len: int
    data: list[str]
    rope_base: float | None = None  # None keeps the checkpoint's base (plain (pre)training)
    short_data: list[str] = field(default_factory=list)
    short_fraction: float = 0.0
    tokens: int | None = None  # exactly one of tokens / steps
    steps: int | None = None
    tokens_per_step: int | None = None  # default DEFAULT_TOKENS_PER_STEP, capped for short runs
    micro_batch_size: int = 1
    lr: float = 2e-5
    warmup_fraction: float = 0.1
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    save_every: int | None = None
    seed: int = 0
    dtype: str | None = None  # None: bf16 on GPU, fp32 on CPU
    gradient_checkpointing: bool = True
    cp_size: int = 1
    resume: bool = False
    overwrite: bool = False
    cache_dir: str | None = None


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


def work_dir(output: str | os.PathLike) -> Path:
    """Where a run keeps its resumable state: beside the output, `OUT.train/`."""
    out = Path(output)
    return out.parent / f"{out.name}.train"


def check_parallelism(cp_size: int, world_size: int, seq_len: int, cuda: bool) -> None:
    """InputError for a context-parallel layout that cannot run."""
    if cp_size < 1:
        raise InputError(f"--cp-size must be >= 1, got {cp_size}")
    if cp_size == 1:
        return
    if world_size % cp_size:
        raise InputError(f"--cp-size {cp_size} does not divide the world size {world_size} "
                         f"(processes launched); launch a multiple of {cp_size} processes or change --cp-size")
    if seq_len % (2 * cp_size):
        raise InputError(f"--seq-len {seq_len} is not divisible by 2 x --cp-size = {2 * cp_size} "
                         "(context parallelism splits each sequence into 2 x cp_size load-balanced chunks)")
    if not cuda:
        raise InputError(f"--cp-size {cp_size} needs CUDA GPUs (torch context parallelism runs SDPA's "
                         "flash/efficient kernels); on CPU use --cp-size 1")


def resolve_plan(s: TrainSettings, world_size: int) -> Plan:
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


def _positive(name: str, value: Any, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise InputError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def _validate(s: TrainSettings, world_size: int, cuda: bool) -> tuple[Path, dict[str, Any], list[str]]:
    """Check every setting before anything is written; returns (checkpoint dir, new config, notes)."""
    from longctx.checkpoint import check_output_dir, checkpoint_dir, read_config
    from longctx.params import parse_number
    from longctx.rope import read_rope, set_rope_base
    from longctx.train.data import check_data_specs

    notes: list[str] = []
    if not isinstance(s.seq_len, int) or s.seq_len < 2:
        raise InputError(f"--seq-len must be a positive length of at least 2 tokens (e.g. 32k), got {s.seq_len!r}")
    base = None
    if s.rope_base is not None:
        try:
            base = parse_number(s.rope_base)
        except ValueError as e:
            raise InputError(f"--rope-base: {e}") from None
    if (s.tokens is None) == (s.steps is None):
        raise InputError("give exactly one of --tokens (e.g. 80B) and --steps")
    for name, value in (("--tokens", s.tokens), ("--steps", s.steps), ("--tokens-per-step", s.tokens_per_step),
                        ("--save-every", s.save_every)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise InputError(f"{name} must be a whole number >= 1, got {value!r}")
    if not isinstance(s.micro_batch_size, int) or s.micro_batch_size < 1:
        raise InputError(f"--micro-batch-size must be a whole number >= 1, got {s.micro_batch_size!r}")
    _positive("--lr", s.lr)
    _positive("--weight-decay", s.weight_decay, allow_zero=True)
    _positive("--grad-clip", s.grad_clip, allow_zero=True)
    if not 0 <= s.warmup_fraction < 1:
        raise InputError(f"--warmup-fraction must be in [0, 1), got {s.warmup_fraction}")
    if not 0 <= s.min_lr_ratio <= 1:
        raise InputError(f"--min-lr-ratio must be in [0, 1], got {s.min_lr_ratio}")
    if not 0 < s.beta2 < 1:
        raise InputError(f"beta2 must be in (0, 1), got {s.beta2}")
    if s.dtype is not None and s.dtype not in DTYPES:
        raise InputError(f"--dtype '{s.dtype}' is not supported; choose float32 or bfloat16 "
                         "(fp16 would need loss scaling)")
    if not 0 <= s.short_fraction < 1:
        raise InputError(f"--short-fraction must be in [0, 1), got {s.short_fraction}")
    if s.short_fraction > 0 and not s.short_data:
        raise InputError(f"--short-fraction {s.short_fraction} needs --short-data SPEC (the short documents to mix in)")
    if not s.data:
        raise InputError("no training data: pass --data SPEC (a file, a folder, hf:<dataset> or synthetic:<kind>)")
    check_parallelism(s.cp_size, world_size, s.seq_len, cuda)

    ckpt = checkpoint_dir(s.checkpoint)
    cfg = read_config(ckpt)
    rope = read_rope(cfg)
    if base is not None and base == rope.theta:
        notes.append(f"the RoPE base is already {rope.theta}; training at the longer length with it unchanged")
    new_cfg, _ = set_rope_base(cfg, base if base is not None else rope.theta, s.seq_len)
    if not any(ckpt.glob("tokenizer*")):
        raise InputError(f"checkpoint '{ckpt}' has no tokenizer files (tokenizer.json / tokenizer_config.json); "
                         "copy the tokenizer of the model into it")
    check_data_specs([*s.data, *s.short_data])

    out = Path(s.output)
    check_output_dir(out, [ckpt], s.overwrite)
    work = work_dir(out)
    if work.exists() and not (s.resume or s.overwrite):
        raise InputError(f"work folder '{work}' exists from an earlier run; pass --resume to continue it "
                         "or --overwrite to start over")
    return ckpt, new_cfg, notes


def _settings_record(s: TrainSettings) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(s).items() if k not in RESUME_FREE_FIELDS}


def _check_resumable(saved: dict[str, Any], s: TrainSettings, source_fp: str) -> None:
    """InputError naming every setting that differs from the run being resumed."""
    now = _settings_record(s)
    diffs = [f"{k} {saved['settings'].get(k)!r} -> {v!r}" for k, v in now.items() if saved["settings"].get(k) != v]
    if saved.get("source_fingerprint") != source_fp:
        diffs.append("checkpoint (other weights or config than the run being resumed)")
    if diffs:
        raise InputError(f"--resume: the run in '{work_dir(s.output)}' used different settings: {'; '.join(diffs)}; "
                         "rerun with the original settings or pass --overwrite (without --resume) to start over")


def _latest_step_dir(work: Path) -> Path | None:
    """The newest complete step folder (a step folder only appears, by rename, once complete)."""
    steps = sorted(p for p in work.glob("step-*") if p.is_dir() and (p / STATE_FILE).is_file())
    return steps[-1] if steps else None


def _training_module_class():
    import torch

    from longctx.train.loss import DEFAULT_CHUNK_TOKENS, chunked_cross_entropy

    class _TrainingModule(torch.nn.Module):
        """A causal LM whose forward returns the summed chunked cross-entropy instead of logits.

        FSDP2 gathers a module's parameters in its forward hooks, so the LM head used by the chunked
        loss must be called inside this module's forward (the root FSDP unit), not after it.
        """

        def __init__(self, lm, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, flatten_batch: bool = False):
            super().__init__()
            self.lm = lm
            self.chunk_tokens = chunk_tokens
            # flash-attention 2 finds document boundaries from position_ids only for batch size 1,
            # so a micro-batch is laid end to end; SDPA builds block-diagonal masks per row instead.
            self.flatten_batch = flatten_batch

        def hidden_states(self, input_ids, position_ids):
            if self.flatten_batch:
                input_ids, position_ids = input_ids.reshape(1, -1), position_ids.reshape(1, -1)
            # attention_mask=None + position_ids restarting at 0 => transformers masks each document
            # separately (masking_utils.find_packed_sequence_indices); use_cache=False, since a cache
            # object disables that detection.
            return self.lm.get_decoder()(input_ids=input_ids, position_ids=position_ids, attention_mask=None,
                                         use_cache=False).last_hidden_state

        def forward(self, input_ids, position_ids, shift_labels):
            hidden = self.hidden_states(input_ids, position_ids)
            weight = self.lm.get_output_embeddings().weight
            return chunked_cross_entropy(hidden, weight, shift_labels.reshape(hidden.shape[:-1]), self.chunk_tokens)

    return _TrainingModule


def make_training_module(lm, chunk_tokens: int | None = None, flatten_batch: bool = False):
    """Wrap a causal LM so that `module(input_ids, position_ids, shift_labels)` is the summed token loss."""
    from longctx.train.loss import DEFAULT_CHUNK_TOKENS

    return _training_module_class()(lm, chunk_tokens or DEFAULT_CHUNK_TOKENS, flatten_batch)


def _attention_implementation(cuda: bool, cp_size: int) -> str:
    if cuda and cp_size == 1:
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            return "sdpa"  # `pip install 'longctx[gpu]'` adds flash-attn
        return "flash_attention_2"
    return "sdpa"


def _load_model(ckpt: Path, new_cfg: dict[str, Any], attn: str, gradient_checkpointing: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import longctx.models.gated_qwen3  # noqa: F401  (registers the gated family with the Auto classes)

    fields = {k: v for k, v in new_cfg.items() if k != "model_type"}
    try:
        config = AutoConfig.for_model(new_cfg.get("model_type"), **fields)
    except ValueError as e:
        raise InputError(f"checkpoint '{ckpt}': unknown model_type {new_cfg.get('model_type')!r} ({e})") from None
    # fp32 master weights always; bf16 is autocast (1 process) or FSDP2 mixed precision (many).
    lm = AutoModelForCausalLM.from_pretrained(ckpt, config=config, dtype=torch.float32, attn_implementation=attn)
    if gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.train()
    return lm


def _fsdp_plugin(lm):
    from accelerate import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=True,  # full sharding (ZeRO-3)
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=list(lm._no_split_modules or []),  # one FSDP unit per decoder layer
        state_dict_type="SHARDED_STATE_DICT",
        cpu_ram_efficient_loading=False,
        activation_checkpointing=False,  # transformers' own gradient checkpointing is on instead
    )


def _make_accelerator(s: TrainSettings, world_size: int, cuda: bool, plugin):
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    dtype = DTYPES[s.dtype] if s.dtype else ("bfloat16" if cuda else "float32")
    kwargs: dict[str, Any] = {"mixed_precision": "bf16" if dtype == "bfloat16" else "no", "cpu": not cuda}
    if plugin is not None:
        kwargs["fsdp_plugin"] = plugin
    if s.cp_size > 1:
        from accelerate import ParallelismConfig

        kwargs["parallelism_config"] = ParallelismConfig(dp_shard_size=world_size // s.cp_size, cp_size=s.cp_size)
    acc = Accelerator(**kwargs)
    if plugin is not None and acc.distributed_type == DistributedType.MULTI_CPU:
        # accelerate applies an FSDP plugin only on accelerators; torch's fully_shard works on gloo CPU
        # ranks as well (DESIGN.md §3), so switch the state over the way accelerate itself does on GPUs.
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = plugin
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return acc, dtype


# --- training state ------------------------------------------------------------------------------


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = [kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached]
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def _single_process_dcp_quiet():
    """torch.distributed.checkpoint warns that it assumes one process when none is initialized: it is right."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _save_training_state(acc, module, optimizer, scheduler, work: Path, step: int, plan: Plan) -> Path:
    """Write `work/step-NNNNNN/` atomically: DCP model+optimizer, scheduler, RNG per rank, cursor."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = work / f"step-{step:06d}"
    tmp = work / f".tmp-step-{step:06d}"
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    model_sd, optim_sd = get_state_dict(module, optimizer)
    with _single_process_dcp_quiet():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
    torch.save(_rng_state(), tmp / f"rng-{acc.process_index}.pt")
    acc.wait_for_everyone()
    if acc.is_main_process:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        state = {"step": step, "cursor": step * plan.sequences_per_step, "world_size": plan.world_size,
                 "sequences_per_step": plan.sequences_per_step}
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")  # written last: marks it complete
        tmp.rename(final)
        for old in work.glob("step-*"):
            if old != final and old.name < final.name:
                shutil.rmtree(old)  # only the newest complete state is kept (each is weights + 2 Adam moments)
    acc.wait_for_everyone()
    return final


def _load_training_state(acc, module, optimizer, scheduler, step_dir: Path, plan: Plan, log) -> int:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    state = json.loads((step_dir / STATE_FILE).read_text())
    if state["sequences_per_step"] != plan.sequences_per_step:
        raise InputError(f"--resume: {step_dir} was trained with {state['sequences_per_step']} sequences per step, "
                         f"this launch gives {plan.sequences_per_step}; launch as many processes as before")
    model_sd, optim_sd = get_state_dict(module, optimizer)
    target = {"model": model_sd, "optim": optim_sd}
    with _single_process_dcp_quiet():
        dcp.load(target, checkpoint_id=str(step_dir / "dcp"))
    set_state_dict(module, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    scheduler.load_state_dict(torch.load(step_dir / "scheduler.pt", weights_only=True))
    rng = step_dir / f"rng-{acc.process_index}.pt"
    if rng.is_file():
        _set_rng_state(torch.load(rng, weights_only=True))
    else:
        log(f"note: no RNG state for rank {acc.process_index} in {step_dir} (launched with more ranks than before)")
    log(f"resumed from {step_dir} (step {state['step']}, data cursor {state['cursor']:,})")
    return int(state["step"])


# --- the output checkpoint -----------------------------------------------------------------------


def _full_state_dict(acc, module) -> dict[str, Any]:
    """The LM's full state dict (on the main process; gathered from the shards under FSDP2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if acc.is_fsdp2:
        sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    else:
        sd = acc.unwrap_model(module).state_dict()
    sd = {k.removeprefix("lm."): v for k, v in sd.items()}
    # Gathered shards no longer share storage, so transformers would save tied weights twice.
    for tied in acc.unwrap_model(module).lm.get_expanded_tied_weights_keys():
        sd.pop(tied, None)
    return sd


def _save_dtype(cfg: dict[str, Any]):
    import torch

    value = getattr(torch, str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"), None)
    return value if isinstance(value, torch.dtype) else torch.float32


def _write_output(acc, module, ckpt: Path, new_cfg: dict[str, Any], s: TrainSettings, plan: Plan, work: Path,
                  extra: dict[str, Any]) -> None:
    from longctx.checkpoint import (PROVENANCE_FILE, WEIGHT_SUFFIXES, atomic_dir, read_config, write_json,
                                    write_provenance)
    from longctx.rope import read_rope

    sd = _full_state_dict(acc, module)
    if not acc.is_main_process:
        return
    dtype = _save_dtype(new_cfg)
    lm = acc.unwrap_model(module).lm
    out = Path(s.output)
    with atomic_dir(out) as tmp:
        lm.save_pretrained(tmp, state_dict={k: v.detach().to("cpu", dtype) for k, v in sd.items()},
                           max_shard_size=MAX_SHARD_SIZE)
        # Tokenizer, generation config, chat template: copied unchanged; weights come from training.
        for item in sorted(ckpt.iterdir()):
            skip = (item.suffix in WEIGHT_SUFFIXES or item.name.endswith(".index.json") or item.name.startswith(".")
                    or item.name in ("config.json", PROVENANCE_FILE) or item.is_dir())
            if not skip:
                shutil.copy2(item, tmp / item.name)
        # The config is the source's with only the RoPE base and length changed; written last, then checked.
        write_json(tmp / "config.json", {**new_cfg, "dtype": str(dtype).removeprefix("torch.")})
        rope = read_rope(read_config(tmp))
        if rope.max_position_embeddings != s.seq_len or rope.rope_type != "default":
            raise RuntimeError(f"written config does not say max_position_embeddings {s.seq_len}: {rope}")
        shutil.copy2(work / LOG_FILE, tmp / LOG_FILE)
        args = {**dataclasses.asdict(s), "plan": dataclasses.asdict(plan), **extra}
        write_provenance(tmp, "extend", args, ckpt)


# --- the loop ------------------------------------------------------------------------------------


def _micro_batches(ds, step: int, plan: Plan, dp_rank: int) -> list[dict[str, Any]]:
    import torch

    b, base = plan.micro_batch_size, step * plan.sequences_per_step
    out = []
    for micro in range(plan.accumulation):
        first = base + (micro * plan.dp_size + dp_rank) * b
        items = [ds.get(first + j) for j in range(b)]
        out.append({k: torch.stack([it[k] for it in items]) for k in ("input_ids", "position_ids", "shift_labels")})
    return out


def train(settings: TrainSettings, progress: bool = True) -> dict[str, Any]:
    """Continue training `settings.checkpoint` at `settings.seq_len` (new RoPE base) and write the result.

    Returns {"output", "steps", "tokens", "final_loss", "log", "seconds"}.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    from longctx.checkpoint import cache_dir as longctx_cache_dir, fingerprint
    from longctx.train.data import build_packed_dataset
    from longctx.train.data import IGNORE_INDEX

    started = time.perf_counter()
    s = settings
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    ckpt, new_cfg, notes = _validate(s, world_size, cuda)
    plan = resolve_plan(s, world_size)
    source_fp = fingerprint(ckpt)
    work = work_dir(s.output)
    saved = None
    if s.resume and (work / SETTINGS_FILE).is_file():
        saved = json.loads((work / SETTINGS_FILE).read_text())
        _check_resumable(saved, s, source_fp)
    attn = _attention_implementation(cuda, s.cp_size)
    lm = _load_model(ckpt, new_cfg, attn, s.gradient_checkpointing)
    acc, dtype = _make_accelerator(s, world_size, cuda, _fsdp_plugin(lm) if world_size > 1 else None)
    log = acc.print
    for note in notes:
        log(f"note: {note}")
    if s.cp_size > 1:
        log(f"note: --cp-size {s.cp_size}: torch context parallelism supports only causal masks, so each sequence is "
            "one causal stream (positions 0..seq_len-1, no document masking); labels still stop at document ends")
    torch.manual_seed(s.seed)
    random.seed(s.seed)

    log(f"sequence length {s.seq_len:,}; {plan.sequences_per_step} sequences ({plan.tokens_per_step:,} tokens) per "
        f"optimizer step = {plan.dp_size} data-parallel rank(s) x {plan.accumulation} accumulation x "
        f"{plan.micro_batch_size} micro-batch")
    log(f"{plan.steps:,} steps, {plan.total_tokens:,} tokens; lr {s.lr:g} cosine to {s.lr * s.min_lr_ratio:g} after "
        f"{plan.warmup_steps} warmup steps; {dtype}, attention {attn}, world size {world_size}"
        f"{' (FSDP2)' if acc.is_fsdp2 else ''}; work folder {work}")

    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    cache_dir = Path(s.cache_dir) if s.cache_dir else longctx_cache_dir() / "data"
    with acc.main_process_first():
        ds = build_packed_dataset(s.data, tokenizer, s.seq_len, num_tokens=plan.total_tokens, short_specs=s.short_data,
                                  short_fraction=s.short_fraction, seed=s.seed, cache_dir=cache_dir, log=log)

    resume_from = None
    if saved is not None:
        if saved.get("data_fingerprint") != ds.fingerprint:
            raise InputError(f"--resume: the data behind {', '.join(s.data + s.short_data)} changed since the run "
                             f"in '{work}' started; restore it or pass --overwrite to start over")
        resume_from = _latest_step_dir(work)
    acc.wait_for_everyone()  # every rank has read the work folder before the main process changes it
    if acc.is_main_process and resume_from is None:
        # _validate allowed an existing folder only with --overwrite, or --resume (nothing saved yet: redo it).
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        record = {"settings": _settings_record(s), "source_fingerprint": source_fp, "data_fingerprint": ds.fingerprint}
        (work / SETTINGS_FILE).write_text(json.dumps(record, indent=1) + "\n")
        (work / LOG_FILE).write_text("")
    acc.wait_for_everyone()

    module = make_training_module(lm, flatten_batch=attn == "flash_attention_2")
    decay = [p for p in module.parameters() if p.ndim >= 2]  # no weight decay on norms and biases
    no_decay = [p for p in module.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, s.beta2))
    # FSDP2 replaces the parameters by sharded ones: accelerate re-points the optimizer when both come together.
    module, accelerated_optimizer = acc.prepare(module, optimizer)
    optimizer = accelerated_optimizer.optimizer  # the torch optimizer, for the scheduler and state dicts
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_multiplier(i, plan, s.min_lr_ratio))

    start_step = 0
    if resume_from is not None:
        start_step = _load_training_state(acc, module, optimizer, scheduler, resume_from, plan, log)
        if acc.is_main_process:  # drop log lines of steps after the saved state (they will be redone)
            lines = (work / LOG_FILE).read_text().splitlines()
            kept = [ln for ln in lines if ln.strip() and json.loads(ln)["step"] <= start_step]
            (work / LOG_FILE).write_text("".join(f"{ln}\n" for ln in kept))
    elif s.resume:
        log(f"--resume: nothing saved in '{work}' yet; starting from step 0")

    dp_rank = acc.process_index // s.cp_size
    max_norm = s.grad_clip if s.grad_clip > 0 else float("inf")
    bar = tqdm(total=plan.steps, initial=start_step, unit="step", disable=not (progress and acc.is_main_process),
               dynamic_ncols=True)
    log_file = open(work / LOG_FILE, "a", encoding="utf-8") if acc.is_main_process else None
    final_loss = float("nan")
    last_end = time.perf_counter()
    try:
        for step in range(start_step, plan.steps):
            batches = _micro_batches(ds, step, plan, dp_rank)
            local = torch.tensor([float(sum(int((b["shift_labels"] != IGNORE_INDEX).sum()) for b in batches))],
                                 device=acc.device)
            # Ranks of one context-parallel group read the same sequences: count them once.
            predicted = float(acc.reduce(local, reduction="sum").item()) / s.cp_size
            scale = world_size / max(predicted, 1.0)  # gradient reduction averages over all ranks
            compute_start = time.perf_counter()
            loss_sum = torch.zeros((), device=acc.device)
            for batch in batches:
                batch = {k: v.to(acc.device) for k, v in batch.items()}
                cp = contextlib.nullcontext()
                if s.cp_size > 1:
                    pos = torch.arange(s.seq_len, device=acc.device).expand_as(batch["position_ids"]).contiguous()
                    batch["position_ids"] = pos
                    bufs = [batch["input_ids"], batch["position_ids"], batch["shift_labels"]]
                    cp = acc.maybe_context_parallel(buffers=bufs, buffer_seq_dims=[1, 1, 1],
                                                    no_restore_buffers=set(bufs))
                with cp:
                    part = module(**batch)
                    acc.backward(part * scale)
                loss_sum += part.detach()
            grad_norm = acc.clip_grad_norm_(module.parameters(), max_norm)
            accelerated_optimizer.step()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss = float(acc.reduce(loss_sum.reshape(1), reduction="sum").item()) / max(predicted, 1.0)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            grad_norm = float(grad_norm)
            end = time.perf_counter()
            compute_s, seconds = end - compute_start, end - last_end
            final_loss = loss
            entry = {"step": step + 1, "loss": round(loss, 6), "lr": lr, "grad_norm": round(grad_norm, 6),
                     "tokens": (step + 1) * plan.tokens_per_step,
                     "tokens_per_s": round(plan.tokens_per_step / seconds, 1), "seconds": round(seconds, 4),
                     "compute_seconds": round(compute_s, 4)}
            if log_file is not None:
                log_file.write(json.dumps(entry) + "\n")
                log_file.flush()
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{entry['tokens_per_s']:,.0f}", refresh=False)
            bar.update(1)
            done = step + 1
            if done == plan.steps or (s.save_every and done % s.save_every == 0):
                if log_file is not None:
                    log_file.flush()
                _save_training_state(acc, module, optimizer, scheduler, work, done, plan)
            last_end = time.perf_counter()
    finally:
        bar.close()
        if log_file is not None:
            log_file.close()

    if start_step == plan.steps:
        log(f"the run in '{work}' had already finished all {plan.steps} steps; writing the output")
        lines = (work / LOG_FILE).read_text().splitlines()
        final_loss = json.loads(lines[-1])["loss"] if lines else final_loss
    _write_output(acc, module, ckpt, new_cfg, s, plan, work,
                  {"source_fingerprint": source_fp, "data_fingerprint": ds.fingerprint, "data_stats": ds.stats,
                   "attention": attn, "dtype": dtype})
    acc.wait_for_everyone()
    seconds = time.perf_counter() - started
    log(f"wrote {s.output} ({plan.steps} steps, {plan.total_tokens:,} tokens, final loss {final_loss:.4f}, "
        f"{seconds:.1f} s); training state in {work}")
    return {"output": str(s.output), "steps": plan.steps, "tokens": plan.total_tokens, "final_loss": final_loss,
            "log": str(Path(s.output) / LOG_FILE), "seconds": seconds}
