"""Resumable training state of `extend`: `OUT.train/step-NNNNNN/` folders.

Each holds the model and optimizer as a torch.distributed.checkpoint (one shard per rank under FSDP2),
the scheduler, the RNG state of every rank and the data cursor (`state.json`, written last). A step
folder is built as `.tmp-step-*` and renamed once complete; the older one is deleted only after.

`--resume` reads these files as untrusted input: nothing in them is unpickled with full pickle (see
`_load_dcp`); a file that fails to load is an `InputError` naming it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pickle
import random
import re
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


def _unusable(step_dir: Path, path: Path, why: str) -> InputError:
    return InputError(f"--resume: {path} {why}; delete {step_dir.parent} or rerun with --overwrite "
                      "(without --resume) to start over")


def _untrusted(step_dir: Path, path: Path, what: str) -> InputError:
    return _unusable(step_dir, path, f"holds code or data a training state never contains ({what}); "
                                     "it was not written by longctx")


def _load_failed(step_dir: Path, path: Path, e: Exception) -> InputError:
    """The one line for a failed torch.load(weights_only=True): never torch's text, which suggests
    weights_only=False."""
    if isinstance(e, FileNotFoundError):
        return _unusable(step_dir, path, "is missing")
    if isinstance(e, pickle.UnpicklingError):
        found = re.search(r"GLOBAL ([\w.]+)", str(e))  # "Unsupported global: GLOBAL x.y ..."
        return _untrusted(step_dir, path, f"global '{found[1]}'" if found else "a pickle torch refuses")
    return _unusable(step_dir, path, f"is damaged or truncated ({type(e).__name__})")


def _torch_load(step_dir: Path, path: Path) -> Any:
    import torch

    try:
        return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise _load_failed(step_dir, path, e) from None


class _Refused(pickle.UnpicklingError):
    pass


@functools.cache
def _metadata_globals() -> dict[str, Any]:
    """Every global a DCP `.metadata` pickle references (listed with pickletools.genops on saved states, one
    process and FSDP2): the dataclasses of torch/distributed/checkpoint/metadata.py and filesystem._StorageInfo,
    torch.Size, dtypes, torch.serialization._get_layout (how a layout pickles) and the Path of the writer's
    checkpoint_id. All are plain data: calling them runs no code of the file's choosing."""
    import pathlib

    import torch
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint import metadata as md

    types = [md.Metadata, md.MetadataIndex, md.StorageMeta, md.TensorStorageMetadata, md.BytesStorageMetadata,
             md.ChunkStorageMetadata, md.TensorProperties, md._MEM_FORMAT_ENCODING, filesystem._StorageInfo,
             torch.Size, pathlib.PosixPath, pathlib.WindowsPath]
    allowed: dict[str, Any] = {f"{t.__module__}.{t.__qualname__}": t for t in types}
    allowed["torch.serialization._get_layout"] = torch.serialization._get_layout
    allowed.update({f"torch.{n}": v for n, v in vars(torch).items() if isinstance(v, torch.dtype)})
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only `_metadata_globals()`. Not torch's weights-only unpickler (torch/_weights_only_unpickler.py):
    it refuses the FRAME opcode of the protocol-4 pickle FileSystemWriter writes ("Unsupported operand 149")."""

    def find_class(self, module: str, name: str) -> Any:
        found = _metadata_globals().get(f"{module}.{name}")
        if found is None:
            raise _Refused(f"{module}.{name}")
        return found


def _read_metadata(step_dir: Path, path: Path) -> Any:
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except _Refused as e:
        raise _untrusted(step_dir, path, f"global '{e}'") from None
    except FileNotFoundError:
        raise _unusable(step_dir, path, "is missing") from None
    except Exception as e:  # noqa: BLE001 - whatever bytes make the unpickler fail, the file is damaged
        raise _unusable(step_dir, path, f"is damaged or truncated ({type(e).__name__})") from None
    if not isinstance(metadata, Metadata):
        raise _untrusted(step_dir, path, f"a {type(metadata).__name__} instead of DCP metadata")
    return metadata


def _load_dcp(target: dict[str, Any], step_dir: Path) -> None:
    """dcp.load(target) of `step_dir/dcp` with nothing unpickled by full pickle, as stock DCP does twice:
    FileSystemReader.read_metadata (torch/distributed/checkpoint/filesystem.py) `pickle.load`s `.metadata`, and
    DefaultLoadPlanner.load_bytes (default_planner.py) `torch.load(weights_only=False)`s each non-tensor entry
    (the optimizer's hyperparameters). Here `.metadata` goes through `_MetadataUnpickler` and those entries
    through weights_only=True; tensors are storage bytes FileSystemReader.read_data already loads weights_only.
    Under FSDP2 every rank loads through the same reader and planner; a refusal on any rank reaches all."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            metadata = _read_metadata(step_dir, Path(self._get_metadata_path(kwargs.get("rank"))))
            if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan, planner):
            try:
                return super().read_data(plan, planner)
            except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as e:  # a shard missing, cut, planted
                raise _load_failed(step_dir, Path(getattr(e, "filename", None) or self.path), e) from None

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):  # DefaultLoadPlanner.load_bytes, with weights_only=True
            path = Path(reader.path) / reader.storage_data[read_item.storage_index].relative_path
            try:
                obj = torch.load(value, weights_only=True)
            except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
                raise _load_failed(step_dir, path, e) from None
            fqn = read_item.dest_index.fqn
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    reader = Reader(step_dir / "dcp")
    # Refused here rather than inside dcp.load, which logs a failed read_metadata with its traceback, retries
    # with rank-local metadata and raises an AssertionError.
    reader.read_metadata()
    try:
        dcp.load(target, storage_reader=reader, planner=Planner())
    except CheckpointException as e:  # what dcp.load makes of an exception on any rank
        refused = [exc for exc, _ in e.failures.values() if isinstance(exc, InputError)]
        if not refused:
            raise
        raise refused[0] from None


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
        for stale in work.glob(".tmp-step-*"):  # left by a kill during a save: each a full weights+optimizer copy
            shutil.rmtree(stale, ignore_errors=True)
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
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    try:
        state = json.loads((step_dir / STATE_FILE).read_text())
    except ValueError:
        raise _unusable(step_dir, step_dir / STATE_FILE, "is damaged (not JSON)") from None
    if state["sequences_per_step"] != plan.sequences_per_step:
        raise InputError(f"--resume: {step_dir} was trained with {state['sequences_per_step']} sequences per step, "
                         f"this launch gives {plan.sequences_per_step}; launch as many processes as before")
    model_sd, optim_sd = get_state_dict(module, optimizer)
    target = {"model": model_sd, "optim": optim_sd}
    with _single_process_dcp_quiet():
        _load_dcp(target, step_dir)
    set_state_dict(module, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    scheduler.load_state_dict(_torch_load(step_dir, step_dir / "scheduler.pt"))
    rng = step_dir / f"rng-{acc.process_index}.pt"
    if rng.is_file():
        _set_rng_state(_torch_load(step_dir, rng))
    else:
        log(f"note: no RNG state for rank {acc.process_index} in {step_dir} (launched with more ranks than before)")
    log(f"resumed from {step_dir} (step {state['step']}, data cursor {state['cursor']:,})")
    return int(state["step"])
