"""The output of `extend`: an ordinary transformers checkpoint, written once, at the end."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from longctx.extend.plan import Plan
from longctx.extend.settings import ExtendSettings

MAX_SHARD_SIZE = "5GB"  # explicit: transformers 4.x and 5.x defaults differ
LOG_FILE = "train_log.jsonl"


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


def write_output(acc, module, ckpt: Path, new_cfg: dict[str, Any], s: ExtendSettings, plan: Plan, work: Path,
                 extra: dict[str, Any]) -> None:
    """The output checkpoint (main process): gathered weights in the source's dtype, the source's config with
    only the RoPE base and length changed, its side files, the training log and provenance."""
    from longctx.checkpoint.directory import copy_side_files, write_provenance
    from longctx.checkpoint.rope import check_written_rope, read_rope
    from longctx.core.files import CHECKPOINT_KIND, atomic_dir, write_json

    sd = _full_state_dict(acc, module)
    if not acc.is_main_process:
        return
    dtype = _save_dtype(new_cfg)
    lm = acc.unwrap_model(module).lm
    with atomic_dir(Path(s.output), CHECKPOINT_KIND) as tmp:
        lm.save_pretrained(tmp, state_dict={k: v.detach().to("cpu", dtype) for k, v in sd.items()},
                           max_shard_size=MAX_SHARD_SIZE)
        copy_side_files(ckpt, tmp)
        write_json(tmp / "config.json", {**new_cfg, "dtype": str(dtype).removeprefix("torch.")})
        # what _validate checked before training, now on the file itself
        check_written_rope(tmp, read_rope(new_cfg), trust_remote_code=s.trust_remote_code)
        shutil.copy2(work / LOG_FILE, tmp / LOG_FILE)
        args = {**s.record(), "plan": dataclasses.asdict(plan), **extra}
        write_provenance(tmp, "extend", args, ckpt)
