"""Resumable training state of `extend`: `OUT.train/step-NNNNNN/` folders.

Each holds the model and optimizer as a torch.distributed.checkpoint (one shard per rank under FSDP2),
the scheduler, the RNG state of every rank and the data cursor (`state.json`, written last). A step
folder is built as `.tmp-step-*` and renamed once complete; the older one is deleted only after.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import publish_dir, write_json
from longctx.extend.plan import Plan

STATE_FILE = "state.json"


def latest_step_dir(work: Path) -> Path | None:
    """The newest complete step folder (a step folder only appears, by rename, once complete)."""
    steps = sorted(p for p in work.glob("step-*") if p.is_dir() and (p / STATE_FILE).is_file())
    return steps[-1] if steps else None


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


def save_training_state(acc, module, optimizer, scheduler, work: Path, step: int, plan: Plan) -> Path:
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
        write_json(tmp / STATE_FILE, state, indent=1)  # written last: marks it complete
        publish_dir(tmp, final, STATE_FILE)
        for old in work.glob("step-*"):
            if old != final and old.name < final.name:
                shutil.rmtree(old)  # only the newest complete state is kept (each is weights + 2 Adam moments)
    acc.wait_for_everyone()
    return final


def load_training_state(acc, module, optimizer, scheduler, step_dir: Path, plan: Plan, log) -> int:
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
