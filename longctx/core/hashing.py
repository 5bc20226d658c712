"""Hashes: of files (streamed, and cached for large weight files), of JSON values, of tokenizers."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longctx.core.files import cache_dir, write_json
from longctx.core.parse import loads


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def cached_sha256_file(path: Path) -> str:
    """sha256 of a (large) file, cached by (real path, size, mtime) in longctx's cache: hashing 3 GB takes
    seconds, and fingerprints are asked for often."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    cache_file = cache_dir() / "file-hashes.json"
    try:
        cache = loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or torn or over a limit: hashing again only costs time
        cache = {}
    if not isinstance(cache, dict):
        cache = {}
    if key not in cache:
        cache[key] = sha256_file(path)
        with contextlib.suppress(OSError):  # a read-only cache only costs time
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            write_json(cache_file, cache, indent=None)
    return cache[key]


def tree_files(root: Path, skip: Callable[[str], bool] = lambda name: False) -> list[str]:
    """The files under the folder `root` as sorted POSIX paths relative to it, leaving out every file or folder
    (with what it holds) whose name `skip` accepts; folder symlinks are not followed."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not skip(d)]
        rel = Path(folder).relative_to(root)
        found += [(rel / f).as_posix() for f in files if not skip(f)]
    return sorted(found)


# Files up to this size are hashed whole each time; larger ones (weights, optimizer states) through
# `cached_sha256_file`, whose cache entry a change of size or modification time invalidates.
_HASH_WHOLE_BYTES = 1 << 20


def tree_hashes(root: Path, skip: Callable[[str], bool] = lambda name: False) -> dict[str, str]:
    """sha256 of each of `tree_files(root, skip)`, by relative path."""
    out = {}
    for rel in tree_files(root, skip):
        path = root / rel
        out[rel] = sha256_file(path) if path.stat().st_size <= _HASH_WHOLE_BYTES else cached_sha256_file(path)
    return out


def hash_json(obj: Any) -> str:
    """sha256 of `obj` as canonical JSON (sorted keys); non-JSON values by their str()."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of what makes a fast tokenizer's ids and prompts: its full definition (vocabulary, merges,
    normalizer, pre-tokenizer, added tokens), chat template and BOS token."""
    backend = next((b for b in (getattr(tokenizer, "backend_tokenizer", None), getattr(tokenizer, "_tokenizer", None))
                    if b is not None and hasattr(b, "to_str")), None)
    if backend is None:
        raise TypeError("need a fast (Rust `tokenizers`) tokenizer")
    h = hashlib.sha256()
    h.update(backend.to_str().encode())
    h.update(b"\0" + str(getattr(tokenizer, "chat_template", None) or "").encode())
    h.update(b"\0" + str(getattr(tokenizer, "bos_token", None) or "").encode())
    return h.hexdigest()
