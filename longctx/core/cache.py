"""longctx's cache (`cache_dir()`): what is kept there is used only once it is verified, and a cache that fails
costs time, never correctness.

Every file longctx keeps in the cache is sealed: its first line is `longctx-seal/1 <mac>`, an HMAC-SHA256
(https://docs.python.org/3/library/hmac.html) of the file's path inside the cache and its content, under a key
that only this user can read (`.seal-key`, 32 random bytes made at first use, mode 0600). A read opens the file
without following links, and takes it only when it is a regular file owned by this user, within its size bound,
whose seal is right; anything else is treated as absent and built again. So an entry another user planted, a link
from the cache to elsewhere, an entry edited by hand, a torn write and an entry moved under another key (its path
is in the seal) are never used. Content too large to read whole (token arrays) lies beside a sealed description
that names its sha256, which the reader checks (`check_sha256`).

A folder of the cache is used only when it, and every folder between it and the cache, is a real folder owned by
this user (`folder`; the cache's own folder may be a link to one); otherwise nothing is read from or written to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from longctx.core.files import cache_dir, open_own, read_own, write_atomic
from longctx.core.hashing import hash_stream
from longctx.core.parse import loads

SEAL = b"longctx-seal/1 "
_KEY_FILE = ".seal-key"
_KEY_BYTES = 32


def _own(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid()


def folder(*parts: str, make: bool = True) -> Path | None:
    """The cache folder `cache_dir()/parts` (made, private to this user, when `make` and it is missing), or None
    when it or a folder between it and the cache is a link, not a folder, not this user's, or cannot be made."""
    chain = [cache_dir()]
    for part in parts:
        chain.append(chain[-1] / part)
    for i, path in enumerate(chain):
        try:
            if make:
                path.mkdir(mode=0o700, parents=i == 0, exist_ok=True)
            # the cache's own folder may be a link (to a larger disk): what it leads to must be this user's
            st = os.stat(path) if i == 0 else os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or not _own(st):
            return None
    return chain[-1]


def _key() -> bytes | None:
    """This user's sealing key (made at first use), or None when the cache cannot hold one that is its own."""
    root = folder()
    if root is None:
        return None
    path = root / _KEY_FILE
    for _ in range(2):
        key = read_own(path, _KEY_BYTES)
        if key is not None and len(key) == _KEY_BYTES and stat.S_IMODE(os.lstat(path).st_mode) & 0o077 == 0:
            return key
        if key is not None or path.is_symlink() or path.exists():  # not a key of ours: replaced, which unseals
            with contextlib.suppress(OSError):  # every entry sealed with the old one (they are built again)
                path.unlink()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # another process made it meanwhile: read that one
            continue
        except OSError:
            return None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(_KEY_BYTES))
        except OSError:  # a full disk: no key, so nothing is kept (the next run tries again)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
    return None


def _mac(key: bytes, path: Path, data: bytes) -> bytes:
    name = os.path.relpath(path, cache_dir()).encode()
    return hmac.new(key, len(name).to_bytes(4, "big") + name + data, hashlib.sha256).hexdigest().encode()


def _in_own_folder(path: Path) -> bool:
    """Whether every folder between the cache and `path` is a real one of this user's (`folder`); a path outside
    the cache (a token cache a user placed with --cache-dir) is the user's to keep."""
    try:
        parts = Path(path).parent.relative_to(cache_dir()).parts
    except ValueError:
        return True
    return folder(*parts, make=False) is not None


def read(path: Path, limit: int) -> bytes | None:
    """The content kept at `path` by `write`, or None when there is none, or it is not whole, not sealed by this
    user's key for this path, not a regular file of this user's, or larger than `limit` bytes."""
    key = _key()
    if not _in_own_folder(path):
        return None
    raw = read_own(path, limit + len(SEAL) + 65)
    if key is None or raw is None or not raw.startswith(SEAL):
        return None
    head, sep, data = raw.partition(b"\n")
    if not sep or not hmac.compare_digest(head[len(SEAL):], _mac(key, path, data)):
        return None
    return data


def write(path: Path, data: bytes, at: Path | None = None) -> bool:
    """Keep `data` at `path` (in a folder from `folder`), sealed for the path `at` it will be read at (default:
    `path`; a folder built elsewhere and renamed into place), atomically; False when the cache cannot take it
    (full, read-only, not this user's): that costs the next run time, nothing else."""
    key = _key()
    if key is None:
        return False
    try:
        write_atomic(path, SEAL + _mac(key, at or path, data) + b"\n" + data)
    except OSError:
        return False
    return True


def read_json(path: Path, limit: int) -> Any:
    """The JSON value kept at `path` by `write_json` (None when `read` finds none, or it does not parse within
    `longctx.core.parse`'s limits)."""
    data = read(path, limit)
    if data is None:
        return None
    try:
        return loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None


def write_json(path: Path, obj: Any, at: Path | None = None) -> bool:
    return write(path, json.dumps(obj, separators=(",", ":")).encode(), at)


def check_sha256(path: Path, sha256: Any, limit: int) -> bool:
    """Whether `path` is a regular file of this user's (not a link) within `limit` bytes whose content hashes to
    `sha256` (as a sealed description of it recorded)."""
    fd = open_own(path, limit) if isinstance(sha256, str) else None
    if fd is None:
        return False
    with os.fdopen(fd, "rb") as f:
        return hmac.compare_digest(hash_stream(hashlib.sha256(), f), sha256)
