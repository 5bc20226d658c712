"""Hashes: of files' content (streamed), of JSON values, of tokenizers."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def hash_stream(h: Any, f: Any) -> str:
    """The hex digest of hash object `h` once fed everything the binary file object `f` holds (16 MiB at a time)."""
    for block in iter(lambda: f.read(1 << 24), b""):
        h.update(block)
    return h.hexdigest()


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hash_stream(hashlib.sha256(), f)


# sha256 by (device, inode, size, modification and change time) of the files this process hashed. Any write to a
# file, and any change of its times, sets its change time to the clock's now, which no call can set back, so an entry
# holds while its file is unchanged; it lives only as long as the process, so every command hashes every file it
# fingerprints once, from its content (a 3 GB shard costs about 2 s), and never trusts what an earlier one saw.
_HASHED: dict[tuple[int, ...], str] = {}


def file_version(path: str | os.PathLike) -> tuple[int, ...]:
    """What changes whenever the file `path` changes: (device, inode, size, modification and change time)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def content_sha256(path: Path) -> str:
    """sha256 of the file `path`'s content, computed once per process while the file is unchanged."""
    key = file_version(path)
    found = _HASHED.get(key)
    if found is None:
        found = _HASHED[key] = sha256_file(path)
    return found


def content_sha256s(paths: list[Path]) -> list[str]:
    """`content_sha256` of each of `paths`, several at once (hashlib hashes without the GIL, so a sharded
    checkpoint hashes at the speed of its disk rather than of one core)."""
    if len(paths) < 2:
        return [content_sha256(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    from longctx.core.processes import available_cores

    with ThreadPoolExecutor(min(len(paths), available_cores(), 8)) as pool:
        return list(pool.map(content_sha256, paths))


def tree_files(root: Path, skip: Callable[[str], bool] = lambda name: False) -> list[str]:
    """The files under the folder `root` as sorted POSIX paths relative to it, leaving out every file or folder
    (with what it holds) whose name `skip` accepts; folder symlinks are not followed."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not skip(d)]
        rel = Path(folder).relative_to(root)
        found += [(rel / f).as_posix() for f in files if not skip(f)]
    return sorted(found)


def tree_hashes(root: Path, skip: Callable[[str], bool] = lambda name: False) -> dict[str, str]:
    """sha256 of each of `tree_files(root, skip)`, by relative path."""
    names = tree_files(root, skip)
    return dict(zip(names, content_sha256s([root / rel for rel in names])))


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
