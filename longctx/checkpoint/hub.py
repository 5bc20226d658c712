"""Checkpoints named by Hugging Face Hub id, resolved to a snapshot folder of the local Hub cache.

A checkpoint argument that is not a local path and reads `org/name[/subfolder...][@revision]` is a Hub
repo (a model repo that holds several checkpoints side by side names one by its subfolder; the revision
is a branch, tag or commit, default `main`). `huggingface_hub.snapshot_download` fetches it into the
cache (`HF_HOME`, `HF_HUB_CACHE`; a private repo reads `HF_TOKEN`, never stored by longctx) and returns
the snapshot folder, `.../models--org--name/snapshots/<commit>/`. That path says which commit it is,
so what a verb records about its input (`hub_origin`) needs no other state.

The cache is read as huggingface_hub lays it out and no further (https://huggingface.co/docs/huggingface_hub/
guides/manage-cache): the snapshot a revision resolves to is a folder directly under the repo's `snapshots/`
named by a commit, each file in it is a link to `blobs/<name>`, and a blob's name is what its content hashes to
(sha256 for a file stored with Git LFS, git's blob sha1 for the rest). A snapshot or file that leads elsewhere,
or a blob whose content is not its name, is refused in one line before anything reads or records it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
from pathlib import Path
from typing import Any

from longctx.checkpoint.weights import WEIGHT_SUFFIXES
from longctx.core.errors import InputError
from longctx.core.hashing import content_sha256, hash_stream
from longctx.core.kinds import HUB_ID

_TRUE = ("1", "ON", "YES", "TRUE")
# What a tokenizer is made of (file name prefixes): all a verb that only tokenizes fetches of a model repo,
# with config.json, which AutoTokenizer may read for the model type.
TOKENIZER_PREFIXES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")
# The Python files too: the code a tokenizer_config.json's auto_map names (run only with --trust-remote-code).
TOKENIZER_PATTERNS = tuple(f"{p}*" for p in TOKENIZER_PREFIXES) + ("config.json", "*.py")
# Formats no verb reads: left out of a download (a repo may hold GGUF, ONNX, the original Meta weights...).
_NOT_NEEDED = ["*.gguf", "*.onnx", "*.onnx_data", "*.h5", "*.msgpack", "*.ot", "*.tflite", "*.mlmodel",
               "original/*", "onnx/*", "coreml/*", "*.md"]


def offline_variable(*names: str) -> str | None:
    """The first of `names` (default: HF_HUB_OFFLINE) set to a true value now; huggingface_hub reads its own
    constants once, at import, which a test or a long-lived process may outlive."""
    for name in names or ("HF_HUB_OFFLINE",):
        if os.environ.get(name, "").strip().upper() in _TRUE:
            return name
    return None


def hf_home() -> Path:
    return Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
                ).expanduser()


def hub_cache() -> Path:
    """The Hub cache folder, as huggingface_hub documents it: HF_HUB_CACHE, else HF_HOME/hub."""
    return Path(os.environ.get("HF_HUB_CACHE") or hf_home() / "hub").expanduser()


def parse_hub_id(spec: str) -> tuple[str, str, str | None] | None:
    """(repo id, subfolder, revision) of a Hub checkpoint spec, or None when `spec` is not one (or is a local
    path: a folder that exists always wins)."""
    if Path(spec).expanduser().exists():
        return None
    m = HUB_ID.match(spec)
    if m is None:
        return None
    revision = m["revision"]
    if revision is not None and any(not part or part.startswith(".") or part.endswith(".lock") or ".." in part
                                    for part in revision.split("/")):
        raise InputError(f"'{spec}': '{revision}' is not a branch, tag or commit name (git check-ref-format); name "
                         "one, e.g. @main or a commit")
    return m["repo"], m["sub"].strip("/"), revision


_COMMIT = re.compile(r"[0-9a-f]{40}")
_BLOB = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def is_repo_snapshot(snapshot: Path) -> bool:
    """Whether `snapshot` is a folder directly under its repo's `snapshots/`, named by a commit (what a revision
    resolves to through `refs/`), not a link out of it."""
    snapshots = Path(os.path.normpath(snapshot)).parent
    return (snapshots.name == "snapshots" and snapshots.parent.name.startswith(("models--", "datasets--"))
            and _COMMIT.fullmatch(snapshot.name) is not None and not snapshot.is_symlink() and snapshot.is_dir()
            and Path(os.path.realpath(snapshot)).parent == Path(os.path.realpath(snapshots)))


def _inside_repo(snapshot: Path, spec: str, get: str) -> Path:
    """`snapshot` when it `is_repo_snapshot`; InputError otherwise."""
    if not is_repo_snapshot(snapshot):
        raise InputError(f"'{spec}' resolves to '{snapshot}', which is not a commit's snapshot folder of its repo "
                         f"in the Hugging Face cache (a refs/ file or link there points elsewhere); delete the "
                         f"repo's folder from the cache and run: {get}")
    return snapshot


def _blob_claim(path: Path, spec: str) -> str | None:
    """The blob name the snapshot file `path` links to (its content's hash), None for a file that is not a link
    (huggingface_hub copies files where links are not supported); InputError for a link anywhere but the repo's
    `blobs/`."""
    if not path.is_symlink():
        return None
    target = Path(os.path.realpath(path))
    snapshot = next((p for p in path.parents if p.parent.name == "snapshots"), None)
    blobs = Path(os.path.realpath(snapshot.parent.parent / "blobs")) if snapshot is not None else None
    if blobs is None or target.parent != blobs or not _BLOB.fullmatch(target.name):
        raise InputError(f"'{spec}': {path.name} in the Hugging Face cache links to '{target}', not to a blob of its "
                         f"repo; delete the repo's folder from the cache and download it again")
    return target.name


def git_blob_sha1(path: Path) -> str:
    """git's object name of the file `path` (sha1 of "blob <size>\0" and the content)."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        return hash_stream(h, f)


def check_blob(path: Path, spec: str, sha256: str | None = None) -> None:
    """InputError when the Hub cache file `path` links outside its repo's blobs, or to a blob whose content is not
    the hash it is named by (`sha256`: the content's, when the caller has it). Nothing for other files."""
    claim = _blob_claim(path, spec)
    if claim is None:
        return
    found = (sha256 or content_sha256(path)) if len(claim) == 64 else git_blob_sha1(path)
    if found != claim:
        raise InputError(f"'{spec}': {path.name} in the Hugging Face cache is not the file the Hub published (its "
                         f"blob {claim[:12]}... holds content hashing to {found[:12]}...); delete that blob and run "
                         "the download again")


@functools.lru_cache(maxsize=64)
def _snapshot(repo: str, subfolder: str, revision: str | None, offline: bool, cache: str,
              tokenizer_only: bool = False) -> Path:
    spec = f"{repo}{'/' + subfolder if subfolder else ''}{'@' + revision if revision else ''}"
    get = download_command(repo, subfolder, revision, tokenizer_only)
    if not tokenizer_only:
        # The config.json files first (a few kB each): a repo whose checkpoints sit in subfolders has none where
        # it is named, and `checkpoint_dir` names those subfolders before gigabytes of weights download.
        prefix = f"{subfolder}/" if subfolder else ""
        snapshot = _download(repo, revision, offline, cache, [f"{prefix}config.json", f"{prefix}*/config.json"],
                             spec, get)
        folder = _checked(snapshot, subfolder, spec, get)
        if not (folder / "config.json").is_file() and folder.is_dir():
            return folder
    snapshot = _download(repo, revision, offline, cache, _wanted(subfolder, tokenizer_only) or None, spec, get)
    folder = _checked(snapshot, subfolder, spec, get)
    if not folder.is_dir():
        raise InputError(f"'{spec}': {repo} has no folder '{subfolder}'")
    return folder


def _checked(snapshot: Path, subfolder: str, spec: str, get: str) -> Path:
    """The folder `subfolder` of the snapshot, once the snapshot is its repo's and every file in the folder links
    to a blob of the repo; the small files (all but weights, which `fingerprint` checks as it hashes them) are
    checked against their blob's name."""
    _inside_repo(snapshot, spec, get)
    folder = snapshot / subfolder
    if subfolder and folder.exists() and Path(os.path.realpath(folder)) != Path(os.path.realpath(snapshot),
                                                                                  subfolder):
        raise InputError(f"'{spec}': the folder '{subfolder}' in the Hugging Face cache links out of its snapshot; "
                         f"delete the repo's folder from the cache and run: {get}")
    if folder.is_dir():
        for path in sorted(folder.rglob("*")):
            if path.is_symlink() or path.is_file():
                if path.suffix in WEIGHT_SUFFIXES:
                    _blob_claim(path, spec)
                else:
                    check_blob(path, spec)
    return folder


def _download(repo: str, revision: str | None, offline: bool, cache: str, patterns: list[str] | None, spec: str,
              get: str) -> Path:
    """The snapshot folder of `repo` at `revision` in the Hub cache `cache`, holding (at least) the files
    `patterns` match (None: all but `_NOT_NEEDED`), fetched unless `offline`; InputError naming `spec` and, where
    it helps, the `hf download` command `get`."""
    from huggingface_hub import errors, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache, local_files_only=offline,
                                      allow_patterns=patterns, ignore_patterns=_NOT_NEEDED))
    except GatedRepoError:
        raise InputError(f"'{spec}' is a gated repo: accept its terms on huggingface.co and set HF_TOKEN "
                         "(or run: hf auth login)") from None
    except RevisionNotFoundError:
        raise InputError(f"'{spec}': {repo} has no revision '{revision}'") from None
    except RepositoryNotFoundError:
        raise InputError(f"'{spec}' is neither a local folder nor a Hub model repo (private? set HF_TOKEN)") from None
    except LocalEntryNotFoundError as e:
        why = f"{offline_variable()}=1" if offline else "the Hub could not be reached"
        # huggingface_hub 2.4 keeps a repo's file list beside its snapshots (trees/<commit>.json) and, offline,
        # refuses a snapshot that lacks some of the files asked for, e.g. one only a tokenizer was fetched into
        # (huggingface_hub/_snapshot_download.py `_raise_if_incomplete_snapshot`); earlier versions return it
        partly = isinstance(e, getattr(errors, "IncompleteSnapshotError", ()))
        where = ("only partly in the local Hugging Face cache (files of the repo are missing)" if partly
                 else "not in the local Hugging Face cache")
        raise InputError(f"'{spec}' is {where} and {why}; run once online, or: {get}") from None
    except OSError as e:
        raise InputError(f"'{spec}': could not fetch it from the Hub ({type(e).__name__}: {e}); retry, or: {get}"
                         ) from None


def _wanted(subfolder: str, tokenizer_only: bool) -> list[str]:
    """The file patterns of a repo a snapshot needs ([]: all of it)."""
    prefix = f"{subfolder}/" if subfolder else ""
    return [prefix + p for p in TOKENIZER_PATTERNS] if tokenizer_only else [f"{prefix}*"] if subfolder else []


def download_command(repo: str, subfolder: str, revision: str | None, tokenizer_only: bool = False) -> str:
    """The `hf download` command that puts a Hub checkpoint (or only its tokenizer) into the cache."""
    argv = ["hf", "download", repo, *(["--revision", revision] if revision else [])]
    include = _wanted(subfolder, tokenizer_only)
    return shlex.join([*argv, *(["--include", *include] if include else [])])


def cached_file(spec: str, name: str) -> Path | None:
    """The file `name` (e.g. config.json) of the Hub checkpoint `spec` from the local cache, or None when it
    is not there; never the network (a recipe is planned before anything downloads)."""
    from huggingface_hub import try_to_load_from_cache

    repo, subfolder, revision = parse_hub_id(spec)
    found = try_to_load_from_cache(repo, f"{subfolder}/{name}" if subfolder else name, cache_dir=str(hub_cache()),
                                   revision=revision)
    return Path(found) if isinstance(found, str) else None


def resolve_checkpoint(spec: str | os.PathLike, tokenizer_only: bool = False) -> Path:
    """The local folder of a checkpoint spec: the path itself, or the cached Hub snapshot (fetched if needed;
    with `tokenizer_only`, only the tokenizer's files and config.json of it, not the weights)."""
    hub = parse_hub_id(os.fspath(spec)) if isinstance(spec, str) else None
    if hub is None:
        return Path(spec)
    return _snapshot(*hub, offline_variable() is not None, str(hub_cache()), tokenizer_only)


def hub_origin(path: str | os.PathLike) -> dict[str, Any] | None:
    """{"repo_id", "commit", "subfolder"} of a folder inside a Hub cache snapshot, else None."""
    parts = Path(path).resolve().parts
    for i in range(len(parts) - 2):
        if parts[i].startswith("models--") and parts[i + 1] == "snapshots":
            return {"repo_id": parts[i].removeprefix("models--").replace("--", "/"), "commit": parts[i + 2],
                    "subfolder": "/".join(parts[i + 3:]) or None}
    return None
