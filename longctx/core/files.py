"""Atomic files and folders: written beside the target, flushed to disk, renamed into place.

A reader (or a process killed half-way) never sees half a file: either the old content or the new.
`os.replace` is atomic on POSIX; the fsyncs make the new content durable before the rename and the
rename durable after it (https://man7.org/linux/man-pages/man2/rename.2.html, fsync(2)).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def cache_dir() -> Path:
    """longctx's cache: `$LONGCTX_CACHE_DIR`, else `$XDG_CACHE_HOME/longctx`, else `~/.cache/longctx`."""
    root = os.environ.get("LONGCTX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "longctx")
    return Path(root)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot open a directory for fsync
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """A file to write (`mode` "w": UTF-8 text with "\n" line ends, "wb": bytes) that replaces `path` when
    the block ends without error, and vanishes when it does not; the file gets ordinary permissions."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8", "newline": "\n"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically."""
    with open_atomic(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """`obj` as JSON (plus a newline) to `path`, atomically."""
    return write_atomic(path, json.dumps(obj, indent=indent) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in `path`; OSError or ValueError (json.JSONDecodeError) for a missing or broken file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_versioned_json(path: Path, fmt: str, kind: str) -> dict:
    """A JSON object whose "format" is `fmt`, or InputError naming what `path` is not."""
    from longctx.core.errors import InputError

    try:
        doc = read_json(path)
    except (OSError, ValueError) as e:
        raise InputError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise InputError(f"{path} is not a longctx {kind} file (format {fmt})")
    return doc


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, keep_existing: str | None = None) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success its files are synced and it replaces `out`,
    on error it vanishes. With `keep_existing` (a file that marks a finished directory), an `out` that
    another process finished meanwhile is kept and ours dropped (caches several processes may build)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    mask = _umask()
    os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file() and not f.is_symlink():
                os.chmod(f, 0o666 & ~mask)  # some writers (safetensors) leave private 0600 files
                with open(f, "rb") as handle:
                    os.fsync(handle.fileno())
        _fsync_dir(tmp)
        if keep_existing is not None:
            publish_dir(tmp, out, keep_existing)
        elif out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.rename(old / out.name)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
        _fsync_dir(out.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def publish_dir(tmp: Path, final: Path, complete: str) -> None:
    """Rename a finished temp dir into place; when another process got there first (its `complete` file
    exists), keep theirs and drop ours."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / complete).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        _fsync_dir(final.parent)
