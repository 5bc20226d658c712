"""Reading a saved step of `extend` as untrusted input: the one-line refusals, and torch.distributed.checkpoint
(DCP) loading with nothing unpickled by full pickle and no file read from outside the step's `dcp/` folder.

Stock DCP trusts its folder: FileSystemReader.read_metadata (torch/distributed/checkpoint/filesystem.py)
`pickle.load`s `.metadata`, DefaultLoadPlanner.load_bytes (default_planner.py) `torch.load(weights_only=False)`s
each non-tensor entry, and FileSystemReader.read_data opens `path / relative_path` for whatever relative path
the metadata names. Here `.metadata` goes through `_MetadataUnpickler`, non-tensor entries through
weights_only=True, and every storage entry must name a plain file of the `dcp/` folder that holds its bytes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import re
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError, SettingError, ref
from longctx.extend.settings import ExtendSettings

DCP_DIR = "dcp"


def unusable(work: Path, path: Path, why: str) -> InputError:
    """The one line for a file of the work folder `work` that a resume cannot use."""
    return SettingError(f"{ref('resume')}: {path} {why}; delete {work} or rerun with {ref('overwrite')} (without "
                        f"{ref('resume')}) to start over", ExtendSettings)


def untrusted(work: Path, path: Path, what: str) -> InputError:
    return unusable(work, path, f"holds code or data a training state never contains ({what}); "
                                "it was not written by longctx")


def load_failed(work: Path, path: Path, e: BaseException) -> InputError:
    """The one line for a failed torch.load(weights_only=True): never torch's text, which suggests
    weights_only=False."""
    if isinstance(e, FileNotFoundError):
        return unusable(work, path, "is missing")
    if isinstance(e, pickle.UnpicklingError):
        found = re.search(r"GLOBAL ([\w.]+)", str(e))  # "Unsupported global: GLOBAL x.y ..."
        return untrusted(work, path, f"global '{found[1]}'" if found else "a pickle torch refuses")
    return unusable(work, path, f"is damaged or truncated ({type(e).__name__})")


def torch_load(work: Path, path: Path) -> Any:
    """torch.load(weights_only=True) of `path`, or the one line saying why it cannot be used."""
    import torch

    try:
        return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise load_failed(work, path, e) from None


def check_inside(work: Path, path: Path, folder: Path) -> None:
    """InputError unless `path` (an entry of a step folder) is what it is named: not a symbolic link, and within
    `folder` once resolved. A link would make a resume read (or a save delete) files elsewhere."""
    if path.is_symlink():
        raise unusable(work, path, f"is a symbolic link (to {os.readlink(path)}); longctx writes a training state "
                                   "as plain files and folders")
    if not path.resolve().is_relative_to(folder.resolve()):
        raise unusable(work, path, f"resolves to {path.resolve()}, outside {folder}")


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


def read_metadata(work: Path, path: Path) -> Any:
    """The DCP Metadata in `path` (a `.metadata` file), unpickled with the allow-list."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except _Refused as e:
        raise untrusted(work, path, f"global '{e}'") from None
    except FileNotFoundError:
        raise unusable(work, path, "is missing") from None
    except Exception as e:  # noqa: BLE001 - whatever bytes make the unpickler fail, the file is damaged
        raise unusable(work, path, f"is damaged or truncated ({type(e).__name__})") from None
    if not isinstance(metadata, Metadata):
        raise untrusted(work, path, f"a {type(metadata).__name__} instead of DCP metadata")
    return metadata


def check_storage(work: Path, dcp_dir: Path, metadata: Any) -> None:
    """InputError unless every storage entry of `metadata` (read from `dcp_dir/.metadata`) names a plain file of
    `dcp_dir` (no path, no link) that holds its bytes, untransformed, as FileSystemWriter writes them."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    meta_path = dcp_dir / ".metadata"
    entries = metadata.storage_data
    if not isinstance(entries, dict) or not all(isinstance(v, _StorageInfo) for v in entries.values()):
        raise unusable(work, meta_path, "is damaged (its storage entries are not DCP storage records)")
    sizes: dict[str, int] = {}
    for index, info in entries.items():
        name = info.relative_path
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise unusable(work, meta_path, f"names the file {name!r} for {getattr(index, 'fqn', index)}, "
                                            f"which is not a file of {dcp_dir}; it was not written by longctx")
        if getattr(info, "transform_descriptors", None):
            raise untrusted(work, meta_path, f"storage transforms {info.transform_descriptors!r}")
        path = dcp_dir / name
        if name not in sizes:
            check_inside(work, path, dcp_dir)
            try:
                sizes[name] = path.stat().st_size
            except FileNotFoundError:
                raise unusable(work, path, "is missing") from None
        offset, length = info.offset, info.length
        if not (type(offset) is int and type(length) is int and offset >= 0 and length >= 0):
            raise unusable(work, meta_path, f"is damaged (entry {getattr(index, 'fqn', index)} has offset "
                                            f"{offset!r}, length {length!r})")
        if offset + length > sizes[name]:
            raise unusable(work, path, f"is damaged or truncated ({sizes[name]:,} bytes; the metadata places "
                                       f"{getattr(index, 'fqn', index)} at bytes {offset:,}-{offset + length:,})")


@contextlib.contextmanager
def dcp_quiet():
    """torch.distributed.checkpoint warns that it assumes one process when none is initialized: it is right."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def load_dcp(target: dict[str, Any], step_dir: Path) -> None:
    """dcp.load(target) of `step_dir/dcp` as the module docstring says. Under FSDP2 every rank loads through the
    same reader and planner; a refusal on any rank reaches all."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import StorageMeta

    work, dcp_dir = step_dir.parent, step_dir / DCP_DIR

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            metadata = read_metadata(work, Path(self._get_metadata_path(kwargs.get("rank"))))
            check_storage(work, dcp_dir, metadata)
            if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader.read_metadata does
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan, planner):
            try:
                return super().read_data(plan, planner)
            except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as e:  # a shard missing, cut, planted
                raise load_failed(work, Path(getattr(e, "filename", None) or self.path), e) from None

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):  # DefaultLoadPlanner.load_bytes, with weights_only=True
            path = Path(reader.path) / reader.storage_data[read_item.storage_index].relative_path
            try:
                obj = torch.load(value, weights_only=True)
            except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
                raise load_failed(work, path, e) from None
            fqn = read_item.dest_index.fqn
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    reader = Reader(dcp_dir)
    # Refused here rather than inside dcp.load, which logs a failed read_metadata with its traceback, retries
    # with rank-local metadata and raises an AssertionError.
    reader.read_metadata()
    try:
        with dcp_quiet():
            dcp.load(target, storage_reader=reader, planner=Planner())
    except CheckpointException as e:  # what dcp.load makes of an exception on any rank
        failures = [exc for exc, _ in e.failures.values()]
        refused = [exc for exc in failures if isinstance(exc, InputError)]
        if refused:
            raise refused[0] from None
        first = failures[0] if failures else e
        lines = str(first).strip().splitlines()
        raise unusable(work, dcp_dir, f"does not fit the model being trained ({type(first).__name__}: "
                                      f"{lines[0][:200] if lines else ''})") from None
