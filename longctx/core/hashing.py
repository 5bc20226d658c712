"""Hashes: of files (streamed, and cached for large weight files), of JSON values, of tokenizers."""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from longctx.core.files import cache_dir, write_json


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
        cache = json.loads(cache_file.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    if key not in cache:
        cache[key] = sha256_file(path)
        with contextlib.suppress(OSError):  # a read-only cache only costs time
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            write_json(cache_file, cache, indent=None)
    return cache[key]


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
