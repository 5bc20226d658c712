"""Atomic files and folders: written beside the target, flushed to disk, renamed into place.

A reader (or a process killed half-way) never sees half a file: either the old content or the new.
`os.replace` is atomic on POSIX; the fsyncs make the new content durable before the rename and the
rename durable after it (https://man7.org/linux/man-pages/man2/rename.2.html, fsync(2)).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from longctx.core.errors import InputError, SettingError, ref
from longctx.core.locks import OutputLock, check_link, foreign_file, hold_until_verb_ends
from longctx.core.parse import LimitError, loads
from longctx.core.processes import is_main_process

# Every folder a verb makes holds this file; only folders that do are ever replaced or removed.
OWNER_FILE = ".longctx-output"
OWNER_FORMAT = "longctx-output/1"
# Kinds more than one stage names (a sinks folder may be a RULER run); the others live with their stage.
CHECKPOINT_KIND = "checkpoint"
RULER_RUN_KIND = "ruler run"


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


# --- temporary names: `.NAME.<tag>-<host>-<pid>-<random>`, so that the next process can tell the leftovers
# of a killed one (same host, no such process) from the work of a live one and remove only those.


def temp_prefix(name: str, tag: str) -> str:
    """The start of this process's temporary names for `name` (`tempfile` appends the random part)."""
    return f".{name}.{tag}-{socket.gethostname()}-{os.getpid()}-"


_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<tag>[a-z]+)-(?P<host>.+)-(?P<pid>\d+)-[A-Za-z0-9_]+")


def temporary_target(name: str, any_process: bool = False) -> str | None:
    """The name a writer's temporary stands for, when `name` is one this process made (`any_process`: one
    any process made); None otherwise."""
    m = _TEMPORARY.fullmatch(name)
    if m is None or not (any_process or (m["host"], m["pid"]) == (socket.gethostname(), str(os.getpid()))):
        return None
    return m["name"]


def _process_gone(pid: int) -> bool:
    """Whether process `pid` has ended: there is none, or only its exit status is left (a zombie: a killed writer
    whose parent died too, which nothing has reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's live process
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[:1] == ["Z"]


def remove_leftovers(parent: Path, name: str | None, tag: str) -> None:
    """Remove what a killed process left while writing `parent/name` (its `.NAME.<tag>-*` entries; `name` None:
    for any name in `parent`)."""
    host = socket.gethostname()
    with contextlib.suppress(OSError):
        for item in parent.glob(f".{'*' if name is None else glob.escape(name)}.{tag}-*"):
            m = _TEMPORARY.fullmatch(item.name)
            if m is None or m["tag"] != tag or (name is not None and m["name"] != name):
                continue
            pid = int(m["pid"])
            if m["host"] == host and pid != os.getpid() and _process_gone(pid):
                if item.is_dir() and not item.is_symlink():
                    shutil.rmtree(item, ignore_errors=True)
                else:
                    item.unlink(missing_ok=True)


def make_temp_dir(parent: Path, name: str, tag: str) -> Path:
    """A new folder `parent/.NAME.<tag>-<host>-<pid>-*` with ordinary permissions, after removing what killed
    processes left under that name and tag."""
    remove_leftovers(parent, name, tag)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(name, tag), dir=parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the result is an ordinary directory
    return tmp


def link_or_copy(src: Path, dst: Path) -> None:
    """`dst` as a hard link to the file `src` (to the file itself: Linux link(2) does not follow symlinks, and a
    Hub snapshot's files are relative links into blobs/), or a copy where the disk cannot link."""
    try:
        os.link(src.resolve(), dst)
    except OSError:
        shutil.copy2(src, dst)


def file_in_the_way(path: Path) -> Path | None:
    """The file (not a folder) at `path` or at the nearest of its parents that exists, if any: no folder can
    be made at `path` then. A symbolic link to nothing is not a file: `check_link` says what it is."""
    for p in [path, *path.parents]:
        try:
            if p.is_dir():
                return None
            if p.is_symlink() and not p.exists():
                return None
            if p.exists():
                return p
        except OSError:  # unreadable: let the verb say what it cannot do there
            return None
    return None


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """A file to write (`mode` "w": UTF-8 text with "\n" line ends, "wb": bytes) that replaces `path` when
    the block ends without error, and vanishes when it does not; the file gets ordinary permissions."""
    path = Path(path)
    remove_leftovers(path.parent, path.name, "tmp")
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name, "tmp"), dir=path.parent)
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
    """The JSON in `path` (bounded: `longctx.core.parse.loads`); OSError or ValueError for a missing, broken or
    too deeply nested file."""
    return loads(Path(path).read_text(encoding="utf-8"))


def json_object(path: Path) -> dict[str, Any]:
    """The JSON object in file `path`; {} when there is none (whoever reads the file for its content reports a
    missing or unreadable one). InputError naming the file and the limit when it is nested deeper than
    `longctx.core.parse` allows (a parser that recursed into it would crash)."""
    try:
        doc = read_json(path)
    except LimitError as e:
        raise InputError(f"'{path}': {e}; restore the file from where it came") from None
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_versioned_json(path: Path, fmt: str, kind: str) -> dict:
    """A JSON object whose "format" is `fmt`, or InputError naming what `path` is not."""
    try:
        doc = read_json(path)
    except (OSError, ValueError) as e:
        raise InputError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise InputError(f"{path} is not a longctx {kind} file (format {fmt})")
    return doc


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, kind: str | None = None, keep_existing: str | None = None) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success its files are synced and it replaces `out`,
    on error it vanishes. `kind` marks the result as a longctx output of that kind (see `check_output`);
    an existing `out` is replaced only when it is an empty folder or an output of the same kind. With
    `keep_existing` (a file that marks a finished directory), an `out` that another process finished
    meanwhile is kept and ours dropped (caches several processes may build)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out.parent, out.name, "old")
    tmp = make_temp_dir(out.parent, out.name, "tmp")
    mask = _umask()
    try:
        yield tmp
        if kind is not None:
            mark_output(tmp, kind)
        for f in tmp.rglob("*"):
            if f.is_file() and not f.is_symlink():
                os.chmod(f, 0o666 & ~mask)  # some writers (safetensors) leave private 0600 files
                with open(f, "rb") as handle:
                    os.fsync(handle.fileno())
        _fsync_dir(tmp)
        if keep_existing is not None:
            publish_dir(tmp, out, keep_existing)
        elif out.exists():
            if kind is None or (any(out.iterdir()) and output_kind(out) != kind):
                raise InputError(f"'{out}' appeared while it was being written and is not a longctx {kind}; "
                                 "nothing was replaced")
            old = Path(tempfile.mkdtemp(prefix=temp_prefix(out.name, "old"), dir=out.parent))
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


def open_own(path: Path, limit: int) -> int | None:
    """A read descriptor of `path` when it is a regular file of this user's with one name (`foreign_file`) within
    `limit` bytes, opened without following a link; None otherwise (what longctx reads back of its own: its marks,
    its cache)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if foreign_file(fd) is not None or os.fstat(fd).st_size > limit:
        os.close(fd)
        return None
    return fd


def read_own(path: Path, limit: int) -> bytes | None:
    """The content of `path` when it is a regular file of this user's within `limit` bytes (not a link)."""
    fd = open_own(path, limit)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def open_in_place(path: str | os.PathLike, *, truncate: bool = False, read: bool = False) -> int:
    """A descriptor of the file `path` opened for appending (made when missing; with `truncate` emptied first;
    with `read` readable too), never through a symbolic link, and never a file that is not a plain file of this
    user's with one name: what sits in a folder longctx writes under a name longctx appends to, and is
    otherwise, is not longctx's to change (a link to a user's file would be truncated or appended to).
    InputError naming it otherwise."""
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        fd = None
    if fd is None or foreign_file(fd) is not None:
        if fd is not None:
            os.close(fd)
        raise InputError(f"'{path}' is not a file longctx wrote (a link, a folder, another user's file or one with "
                         "other names) where longctx keeps its own; move it away and rerun")
    if truncate:
        os.ftruncate(fd, 0)
    return fd


# --- outputs: what a verb may write into, replace or remove -----------------------------------------


def mark_output(folder: Path, kind: str) -> None:
    """Mark `folder` as a longctx output of `kind` (a checkpoint, a RULER run, ...)."""
    write_json(folder / OWNER_FILE, {"format": OWNER_FORMAT, "kind": kind})


def output_kind(folder: Path) -> str | None:
    """The kind of longctx output `folder` is, or None when longctx did not make it."""
    with contextlib.suppress(OSError, ValueError):
        data = read_own(folder / OWNER_FILE, 4096)  # a link, or another user's file, is no mark of longctx's
        doc = loads(data.decode("utf-8")) if data is not None else None
        if isinstance(doc, dict) and doc.get("format") == OWNER_FORMAT and isinstance(doc.get("kind"), str):
            return doc["kind"]
    return None


def _not_ours(folder: Path) -> str:
    """Why `folder` does not count as made by longctx: what is at its marker's place."""
    marker = folder / OWNER_FILE
    if marker.is_dir():
        return f"its {OWNER_FILE} is a folder, not the file longctx marks its outputs with"
    if marker.exists() or marker.is_symlink():
        return f"its {OWNER_FILE} is not a longctx ownership mark"
    return f"it has no {OWNER_FILE}"


def check_apart(out: Path, inputs: Iterable[tuple[str, Path]]) -> None:
    """InputError when the output `out` (a folder or a file) and an input overlap (either inside the other, or
    the same file under another name: a link): writing one would change the other."""
    where = out.resolve()
    for label, path in inputs:
        src = Path(path).resolve()
        if where == src or src.is_relative_to(where):
            raise InputError(f"output '{out}' would hold the {label} '{path}'; choose an -o outside it")
        if where.is_relative_to(src):
            raise InputError(f"output '{out}' lies inside the {label} '{path}'; choose an -o outside it")
        with contextlib.suppress(OSError):
            if where.is_file() and src.is_file() and os.path.samefile(where, src):
                raise InputError(f"output '{out}' is the {label} '{path}' (the same file); choose another -o")


def check_output(out: Path, kind: str | tuple[str, ...], *, inputs: Iterable[tuple[str, Path]] = (),
                 overwrite: bool | None = None, legacy: Callable[[Path], bool] | None = None,
                 what: str = "output") -> contextlib.AbstractContextManager:
    """The check of a verb's output folder, before anything is written, and its lock (`OutputLock`), taken
    before the checks that look inside it. It must not overlap an input; an existing one must be a folder that
    is empty or a longctx output of `kind` (or of one of the kinds, when several), never a folder longctx did
    not make (`legacy`, when given, accepts a folder of `kind` made before outputs were marked).
    `overwrite` True or False: the verb replaces the output as a whole, so it may not hold the current
    directory, and with False an existing one is refused (pass --overwrite); None: the verb writes its files
    into an existing output (a RULER run, a report) and never removes it.
    Returns the lock, held until the command that called this ends (the `longctx` verb: `hold_until_verb_ends`)
    or until the caller releases it (`with check_output(...):`); in the other ranks of a multi-process launch
    nothing is locked (the main process holds the lock)."""
    check_link(out, what)
    check_apart(out, inputs)
    if overwrite is not None and Path.cwd().resolve().is_relative_to(out.resolve()):
        raise InputError(f"{what} '{out}' holds the current directory; choose another -o")
    found = file_in_the_way(out)
    if found is not None:
        where = "is a file" if found == out else f"lies under '{found}', which is a file"
        raise InputError(f"{what} '{out}' {where}, not a folder; choose another -o")
    lock = hold_until_verb_ends(OutputLock(out, what)) if is_main_process() else contextlib.nullcontext()
    try:
        _check_owner(out, (kind,) if isinstance(kind, str) else kind, overwrite, legacy, what)
    except BaseException:
        lock.__exit__(None, None, None)
        raise
    return lock


def _check_owner(out: Path, kinds: tuple[str, ...], overwrite: bool | None, legacy: Callable[[Path], bool] | None,
                 what: str) -> None:
    if not out.exists() or not any(out.iterdir()):
        return
    found = output_kind(out)
    if found is None and legacy is not None and legacy(out):
        found = kinds[0]
    if found is None:
        raise InputError(f"{what} '{out}' exists and was not made by longctx ({_not_ours(out)}); longctx replaces "
                         "only folders it made: choose another -o or move it away yourself")
    if found not in kinds:
        raise InputError(f"{what} '{out}' is a longctx {found}, not a {' or a '.join(kinds)}; choose another -o")
    if overwrite is False:
        raise SettingError(f"{what} '{out}' already exists; pass {ref('overwrite')} to replace it or choose another -o")


def remove_output(folder: Path, kind: str) -> None:
    """Remove `folder` (a longctx output of `kind`, or an empty folder); InputError for anything else."""
    if not folder.exists():
        return
    if any(folder.iterdir()) and output_kind(folder) != kind:
        why = _not_ours(folder) if output_kind(folder) is None else f"it is a longctx {output_kind(folder)}"
        raise InputError(f"'{folder}' was not made by longctx as a {kind} ({why}); nothing was removed: move it "
                         "away yourself or choose another -o")
    shutil.rmtree(folder)


def make_output(folder: Path, kind: str) -> Path:
    """Create (or reuse) the output folder `folder`, marked as a `kind` unless it is a longctx output already
    (`check_output` said which kinds it may be)."""
    folder.mkdir(parents=True, exist_ok=True)
    if output_kind(folder) is None:
        mark_output(folder, kind)
    return folder
