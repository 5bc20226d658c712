"""The output of `extend`: an ordinary transformers checkpoint, written once, at the end."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import copy_side_files, write_provenance
from longctx.checkpoint.load import model_config
from longctx.core.errors import InputError
from longctx.core.files import CHECKPOINT_KIND, atomic_dir, write_json
from longctx.extend.plan import Plan
from longctx.extend.settings import ExtendSettings
from longctx.extend.state import write_failure
from longctx.rope.config import check_written_rope
from longctx.rope.layers import asked_rope

MAX_SHARD_SIZE = "5GB"  # explicit: transformers 4.x and 5.x defaults differ
LOG_FILE = "train_log.jsonl"
# The keys of each line of the training log (`longctx.extend.loop`), one line per finished step.
LOG_KEYS = ("step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "seconds", "compute_seconds", "padding",
            "mfu", "mfu_attention")


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


def save_dtype(cfg: dict[str, Any], source: str = "config.json"):
    """The torch dtype the output's weights are saved in: the source config's `dtype` (or `torch_dtype`),
    float32 when it names none; InputError for one that is not a floating-point dtype torch knows."""
    import torch

    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise InputError(f"'{source}': dtype {name!r} is not a floating-point torch dtype, so the trained weights "
                         "could not be saved in it; set it to float32, bfloat16 or float16")
    return value


def output_config(new_cfg: dict[str, Any], source: str = "config.json") -> dict[str, Any]:
    """The config.json the output gets: `new_cfg` (the source's, RoPE base and length changed) with its dtype."""
    return {**new_cfg, "dtype": str(save_dtype(new_cfg, source)).removeprefix("torch.")}


def write_output(acc, module, *, ckpt: Path, new_cfg: dict[str, Any], s: ExtendSettings, plan: Plan, work: Path,
                 extra: dict[str, Any]) -> None:
    """The output checkpoint (main process): gathered weights in the source's dtype, the source's config with
    only the RoPE base and length changed, its side files, the training log and provenance."""
    sd = _full_state_dict(acc, module)
    if not acc.is_main_process:
        return
    dtype = save_dtype(new_cfg)
    lm = acc.unwrap_model(module).lm
    with atomic_dir(Path(s.output), CHECKPOINT_KIND) as tmp:
        try:
            lm.save_pretrained(tmp, state_dict={k: v.detach().to("cpu", dtype) for k, v in sd.items()},
                               max_shard_size=MAX_SHARD_SIZE)
            copy_side_files(ckpt, tmp)
            write_json(tmp / "config.json", output_config(new_cfg))
            # what _validate checked before training, now on the file itself
            asked = asked_rope(new_cfg, model_config(ckpt, new_cfg, trust_remote_code=s.trust_remote_code))
            check_written_rope(tmp, asked, trust_remote_code=s.trust_remote_code)
            shutil.copy2(work / LOG_FILE, tmp / LOG_FILE)
            args = {**s.record(), "plan": dataclasses.asdict(plan), **extra}
            write_provenance(tmp, "extend", args, ckpt)
        except InputError:
            raise
        except Exception as e:
            if (failure := write_failure(e, tmp)) is None or failure is e:
                raise
            raise failure from None  # an OSError: atomic_dir removes the folder, the caller says it in one line
