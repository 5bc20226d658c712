"""Resumable training state of `extend`: `OUT.train/step-NNNNNN/` folders.

Each holds the model and optimizer as a torch.distributed.checkpoint (`dcp/`, one shard per rank under FSDP2),
the scheduler, the RNG state of every rank (`rng-R.pt`) and the data cursor (`state.json`, written last). A
step folder is built as `.tmp-step-*` and renamed once complete; the older one is deleted only after. A save
that fails (a full disk) removes its temporary folder and keeps the previous step folder.

`--resume` reads these files as untrusted input (`longctx.extend.dcp`): `check_step` validates a step folder
against itself and the plan before the model is loaded; nothing in it is unpickled with full pickle, and a
file that cannot be used is an `InputError` naming it.
"""

from __future__ import annotations

import errno
import math
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

from longctx.core.errors import SettingError, ref
from longctx.core.failures import os_error_of
from longctx.core.files import publish_dir, write_json
from longctx.core.parse import loads
from longctx.extend.dcp import (
    DCP_DIR,
    check_inside,
    check_storage,
    dcp_quiet,
    load_dcp,
    read_metadata,
    torch_load,
    unusable,
)
from longctx.extend.plan import Plan, lr_multiplier
from longctx.extend.settings import ExtendSettings

STATE_FILE = "state.json"
SCHEDULER_FILE = "scheduler.pt"
STEP_NAME = re.compile(r"step-(\d{6})")
_STATE_KEYS = ("step", "cursor", "world_size", "sequences_per_step")
PARAM_GROUPS = 2  # `longctx.extend.steps.make_trainer`: weight decay, and none on norms and biases


def step_dirs(work: Path) -> list[Path]:
    """The step folders of `work`, oldest first; InputError for an entry named `step-*` that is not one."""
    found = []
    for p in sorted(work.glob("step-*")):
        if not STEP_NAME.fullmatch(p.name):
            raise unusable(work, p, "is not a step folder longctx writes (step-NNNNNN)")
        check_inside(work, p, work)
        if not p.is_dir():
            raise unusable(work, p, "is not a folder")
        found.append(p)
    return found


def _rng_state(cuda: bool = True) -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = [kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached]
    if cuda and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any], cuda: bool = True) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    if cuda and "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _check_rng(work: Path, path: Path) -> None:
    """InputError unless `path` holds RNG states the generators accept: tried on the CPU generators, then put
    back (the CUDA states only checked for their form: setting them would start CUDA on every GPU)."""
    import torch

    state = torch_load(work, path)
    if not isinstance(state, dict) or set(state) - {"python", "torch", "numpy", "cuda"}:
        raise unusable(work, path, "is damaged (not the RNG states longctx saves)")
    cuda = state.get("cuda", [])
    if not isinstance(cuda, list) or not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda):
        raise unusable(work, path, "is damaged (its CUDA RNG states are not byte tensors)")
    ours = _rng_state(cuda=False)
    try:
        _set_rng_state(state, cuda=False)
    except Exception as e:  # noqa: BLE001 - whatever the generators refuse, the file is damaged
        raise unusable(work, path, f"is damaged ({type(e).__name__} setting its RNG state)") from None
    finally:
        _set_rng_state(ours, cuda=False)


def _check_scheduler(work: Path, path: Path, step: int, plan: Plan, s: ExtendSettings) -> None:
    """InputError unless `path` holds the state of the run's LambdaLR after `step` steps: the keys and types
    torch writes (a key it does not know would become an attribute of the scheduler), the run's lr and schedule."""
    import torch

    saved = torch_load(work, path)
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(PARAM_GROUPS)]
    optimizer = torch.optim.AdamW([{"params": [p]} for p in params], lr=s.lr)
    template = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0).state_dict()
    if not isinstance(saved, dict) or set(saved) != set(template):
        raise unusable(work, path, f"is damaged (not a learning-rate schedule's state: keys "
                                   f"{sorted(saved) if isinstance(saved, dict) else type(saved).__name__})")
    for key, want in template.items():
        got = saved[key]
        if type(got) is not type(want) or (isinstance(want, list) and len(got) != len(want)):
            raise unusable(work, path, f"is damaged ({key} is {got!r})")
    lr = s.lr * lr_multiplier(step, plan, s.min_lr_ratio)
    if (saved["last_epoch"] != step or saved["_step_count"] != step + 1 or saved["base_lrs"] != template["base_lrs"]
            or any(not isinstance(x, float) or not math.isclose(x, lr, rel_tol=1e-6) for x in saved["_last_lr"])
            or any(x is not None for x in saved["lr_lambdas"])):
        raise unusable(work, path, f"does not hold this run's schedule after step {step} (last_epoch "
                                   f"{saved['last_epoch']!r}, lr {saved['_last_lr']!r}, base {saved['base_lrs']!r})")


def _read_state(work: Path, path: Path) -> dict[str, int]:
    try:
        state = loads(path.read_bytes(), max_bytes=1 << 16)
    except FileNotFoundError:
        raise unusable(work, path, "is missing") from None
    except (OSError, ValueError) as e:
        raise unusable(work, path, f"is damaged (not JSON: {e})") from None
    if not isinstance(state, dict):
        raise unusable(work, path, f"is damaged (a JSON {type(state).__name__}, not an object)")
    for key in _STATE_KEYS:
        if key not in state:
            raise unusable(work, path, f"is damaged (no '{key}')")
        if type(state[key]) is not int or state[key] < 0:
            raise unusable(work, path, f"is damaged ('{key}' is {state[key]!r}, not a count)")
    return {k: state[k] for k in _STATE_KEYS}


def check_step(work: Path, step_dir: Path, plan: Plan, s: ExtendSettings) -> dict[str, int]:
    """The state.json of `step_dir`, after checking the folder against itself and the plan (its name, step,
    cursor; the files it must hold; scheduler, RNG and DCP metadata as far as they can be read without the
    model); InputError naming the first file that does not fit."""
    path = step_dir / STATE_FILE
    for item in (path, step_dir / SCHEDULER_FILE, step_dir / DCP_DIR):
        check_inside(work, item, step_dir)
    state = _read_state(work, path)
    step = int(step_dir.name.removeprefix("step-"))
    if state["step"] != step:
        raise unusable(work, path, f"says step {state['step']}, but it is the state of {step_dir.name}")
    if not 1 <= step <= plan.steps:
        raise unusable(work, path, f"is the state after step {step}, but this run has {plan.steps} steps")
    if state["sequences_per_step"] != plan.sequences_per_step:
        raise SettingError(f"{ref('resume')}: {step_dir} was trained with {state['sequences_per_step']} sequences "
                           f"per step, this launch gives {plan.sequences_per_step}; launch as many processes as before",
                           ExtendSettings)
    if state["cursor"] != step * state["sequences_per_step"] or state["world_size"] < 1:
        raise unusable(work, path, f"is damaged (cursor {state['cursor']}, world size {state['world_size']} after "
                                   f"step {step} of {state['sequences_per_step']} sequences)")
    _check_scheduler(work, step_dir / SCHEDULER_FILE, step, plan, s)
    rng = {p.name for p in step_dir.glob("rng-*.pt")}
    for rank in range(state["world_size"]):
        if f"rng-{rank}.pt" not in rng:
            raise unusable(work, step_dir / f"rng-{rank}.pt", "is missing")
    for name in sorted(rng):
        check_inside(work, step_dir / name, step_dir)
        _check_rng(work, step_dir / name)
    dcp_dir = step_dir / DCP_DIR
    if not dcp_dir.is_dir():
        raise unusable(work, dcp_dir, "is missing")
    check_inside(work, dcp_dir / ".metadata", dcp_dir)
    check_storage(work, dcp_dir, read_metadata(work, dcp_dir / ".metadata"))
    return state


def _agree_on_error(acc, error: OSError | None) -> OSError | None:
    """The first OSError of any rank (None: every rank succeeded): a rank that failed alone would leave the others
    waiting for it."""
    import torch

    if acc.num_processes == 1:
        return error
    failed = acc.reduce(torch.tensor([0.0 if error is None else 1.0], device=acc.device), reduction="sum")
    if error is None and float(failed.item()) > 0:
        return OSError("another rank could not write its part")
    return error


def write_failure(e: BaseException, where: Path) -> OSError | None:
    """The OS error behind a failed write into the folder `where` (which still holds what was written): the one
    `e` is or carries (`longctx.core.failures.os_error_of`: a safetensors error quotes Rust's), the one in a
    CheckpointException (dcp.save wraps each rank's), or ENOSPC when torch's zip writer failed (a RuntimeError,
    "unexpected pos", without the errno) on a disk now full; None when the disk is not the reason."""
    if (found := os_error_of(e)) is not None:
        return found
    for exc, _ in (getattr(e, "failures", None) or {}).values():
        if (found := write_failure(exc, where)) is not None:
            return found
    if not isinstance(e, RuntimeError):
        return None
    try:
        disk = os.statvfs(where)
    except OSError:
        return None
    if min(disk.f_bavail, disk.f_bfree) * disk.f_frsize < 1 << 20:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


def _write_step(acc, module, optimizer, scheduler, tmp: Path, step: int, plan: Plan) -> OSError | None:
    """Write the step's files into `tmp` (each rank its part); the OSError that stopped it, on every rank."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    error = None
    model_sd, optim_sd = get_state_dict(module, optimizer)
    try:
        with dcp_quiet():
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / DCP_DIR))
        torch.save(_rng_state(), tmp / f"rng-{acc.process_index}.pt")
    except (OSError, RuntimeError, CheckpointException) as e:
        if (error := write_failure(e, tmp)) is None:
            raise
    error = _agree_on_error(acc, error)
    if error is None and acc.is_main_process:
        try:
            torch.save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
            state = {"step": step, "cursor": step * plan.sequences_per_step, "world_size": plan.world_size,
                     "sequences_per_step": plan.sequences_per_step}
            write_json(tmp / STATE_FILE, state, indent=1)  # written last: marks it complete
        except (OSError, RuntimeError) as e:
            if (error := write_failure(e, tmp)) is None:
                raise
    return _agree_on_error(acc, error)


def save_training_state(acc, module, optimizer, scheduler, work: Path, step: int, plan: Plan) -> Path:
    """Write `work/step-NNNNNN/` atomically: DCP model+optimizer, scheduler, RNG per rank, cursor. A write that
    fails (a full disk) is an InputError on every rank, its temporary folder removed, the previous state kept."""
    final = work / f"step-{step:06d}"
    tmp = work / f".tmp-step-{step:06d}"
    error = None
    if acc.is_main_process:
        for stale in work.glob(".tmp-step-*"):  # left by a kill during a save: each a full weights+optimizer copy
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
        except OSError as e:
            error = e
    error = _agree_on_error(acc, error) or _write_step(acc, module, optimizer, scheduler, tmp, step, plan)
    if error is None and acc.is_main_process:
        try:
            publish_dir(tmp, final, STATE_FILE)
        except OSError as e:
            error = e
    error = _agree_on_error(acc, error)
    if error is not None:
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        kept = [p.name for p in step_dirs(work)]
        raise SettingError(f"could not save the training state after step {step} in {work} "
                           f"({error.strerror or error}); "
                           + (f"{kept[-1]} is kept: free space and rerun with {ref('resume')} to continue from it"
                              if kept else f"nothing was saved yet: free space and rerun with {ref('resume')}"),
                           ExtendSettings)
    if acc.is_main_process:
        for old in work.glob("step-*"):
            if old != final and old.name < final.name:
                shutil.rmtree(old)  # only the newest complete state is kept (each is weights + 2 Adam moments)
    acc.wait_for_everyone()
    return final


def load_training_state(acc, module, optimizer, scheduler, step_dir: Path, state: dict[str, int], log) -> int:
    """Load `step_dir` (checked by `check_step`, which gave `state`) into the module, optimizer, scheduler and this
    rank's RNG; returns the step it holds."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    work = step_dir.parent
    model_sd, optim_sd = get_state_dict(module, optimizer)
    target = {"model": model_sd, "optim": optim_sd}
    load_dcp(target, step_dir)
    set_state_dict(module, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    scheduler.load_state_dict(torch_load(work, step_dir / SCHEDULER_FILE))
    rng = step_dir / f"rng-{acc.process_index}.pt"
    if rng.is_file():
        _set_rng_state(torch_load(work, rng))
    else:
        log(f"note: no RNG state for rank {acc.process_index} in {step_dir} (launched with more ranks than before)")
    log(f"resumed from {step_dir} (step {state['step']}, data cursor {state['cursor']:,})")
    return state["step"]
