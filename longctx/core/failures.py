"""What a verb says when the machine, not the input's content, stops it: one line, exit code 2.

An operating-system refusal (a full disk, a read-only folder, a name too long for the file system) is an
`OSError` with an errno, or, from the Rust libraries longctx writes with (safetensors, tokenizers), an
exception whose text carries Rust's rendering of one. A `RecursionError` or `MemoryError` is an input too
deep or too large for this machine. Each becomes an `InputError` naming the file and what to do, after
what the failed verb left on its way is removed: the folders it made that hold nothing, and this process's
writers' temporaries (the writers in `longctx.core.files` remove their own; this also catches those of a
writer that did not get to). A file the verb finished stays, so a resumable verb resumes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import OWNER_FILE, temporary_target

# Rust's `std::io::Error` displays an OS error as "<message> (os error <code>)"
# (rust-lang/rust library/std/src/io/error.rs, `impl fmt::Display for Error`); safetensors and tokenizers
# raise their own exception types with that text in them.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")

# errno -> what to do, for a write the file system refused
_WRITE_ADVICE = {
    errno.ENOSPC: "free space on that disk or choose another -o",
    errno.EDQUOT: "free space within your disk quota or choose another -o",
    errno.EFBIG: "choose an -o on a file system that allows larger files",
    errno.EROFS: "choose an -o on a writable disk",
}


def shown_path(path: Any) -> str:
    """`path` as the user knows it: a writer's temporary folder or file named as what it stands for."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        return str(path)
    parts = Path(os.fsdecode(path)).parts
    return str(Path(*[temporary_target(p) or p for p in parts])) if parts else str(path)


def os_error_of(exc: BaseException) -> OSError | None:
    """The OS error `exc` is, was raised from (`raise ... from`), or (a Rust library's error) carries; None when
    it has none. An error raised while handling another is not that other one: its own cause is followed only."""
    seen: set[int] = set()
    item: BaseException | None = exc
    while item is not None and id(item) not in seen:
        seen.add(id(item))
        if isinstance(item, OSError) and item.errno is not None:
            return item
        found = None if isinstance(item, OSError) else _RUST_OS_ERROR.search(str(item))
        if found:
            code = int(found.group(1))
            return OSError(code, os.strerror(code))
        item = item.__cause__
    return None


def os_error_line(e: OSError, output: str | None = None) -> str:
    """One line for the OS error `e`: the file it names (else, for a refused write, the verb's `output`), the
    system's reason, and what to do."""
    reason = e.strerror or os.strerror(e.errno)
    if e.errno in _WRITE_ADVICE:
        target = e.filename2 if e.filename2 is not None else e.filename  # a copy's or rename's target
        target = target if target is not None else output
        where = f" '{shown_path(target)}'" if target is not None else ""
        return f"cannot write{where}: {reason}; {_WRITE_ADVICE[e.errno]}"
    where = f"'{shown_path(e.filename)}': " if e.filename is not None else ""
    if e.errno == errno.ENAMETOOLONG:
        return f"{where}{reason} (a file name may have at most 255 bytes); choose shorter names"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"{where}{reason}; choose paths you may read and write"
    return f"{where}{reason}"


def failure_line(exc: BaseException, output: str | None = None) -> str | None:
    """The one line for `exc` when it is the machine's refusal (see the module docstring); None otherwise."""
    if isinstance(exc, RecursionError):
        return (f"an input is nested too deeply to read ({exc}); Python's limit is "
                f"{sys.getrecursionlimit()} levels")
    if isinstance(exc, MemoryError):
        return "out of memory: an input is larger than this machine can hold, or the settings ask for more memory"
    found = os_error_of(exc)
    return os_error_line(found, output) if found is not None else None


class NewFolders:
    """What a verb makes on its way to `output`, that did not exist when this object was made: in the nearest
    folder above `output` that did, the first folder on the way (the output, or its first new parent), the
    siblings named after it (extend's `OUTPUT.train`) and this process's temporaries; inside `output`, when it
    existed, its new folders. `remove_made()` removes, among them, this process's temporaries and the folders
    left holding nothing (or only longctx's ownership mark): what a verb that failed leaves behind. A file the
    verb finished stays (a resumable run's work)."""

    def __init__(self, output: str | None):
        self.top: Path | None = None
        self.out = Path(output).expanduser().absolute() if output else None
        self.before: set[str] = set()
        self.inside: set[str] = set()
        if self.out is None:
            return
        with contextlib.suppress(OSError):
            self.top = next(p for p in [self.out.parent, *self.out.parent.parents] if p.is_dir())
            self.before = set(os.listdir(self.top))
            if self.out.is_dir() and not self.out.is_symlink():
                self.inside = {root for root, _, _ in os.walk(self.out)}

    def _new(self) -> list[Path]:
        if self.top is None:
            return []
        first = self.out.relative_to(self.top).parts[0] if self.out != self.top else None
        with contextlib.suppress(OSError):
            found = [self.top / n for n in set(os.listdir(self.top)) - self.before
                     if n == first or n.startswith(f"{first}.") or temporary_target(n)]
            if self.inside and self.out is not None:
                found += [Path(r) for r, _, _ in os.walk(self.out) if r not in self.inside]
            return found
        return []

    def remove_made(self) -> None:
        for path in sorted(self._new(), key=lambda p: len(p.parts), reverse=True):
            if path.is_symlink() or not path.is_dir():
                if temporary_target(path.name):
                    path.unlink(missing_ok=True)
                continue
            for root, _, files in os.walk(path, topdown=False):
                with contextlib.suppress(OSError):
                    if temporary_target(os.path.basename(root)):
                        shutil.rmtree(root)
                        continue
                    for name in files:
                        if temporary_target(name):
                            os.unlink(os.path.join(root, name))
                    if os.listdir(root) == [OWNER_FILE]:
                        os.unlink(os.path.join(root, OWNER_FILE))
                    os.rmdir(root)  # only an empty folder goes


@contextlib.contextmanager
def one_line_failures(output: str | None) -> Iterator[None]:
    """Run a verb writing to `output`: the machine's refusals become one-line `InputError`s, after what the
    verb left on its way is removed (`NewFolders`)."""
    made = NewFolders(output)
    try:
        yield
    except InputError:
        raise
    except Exception as e:
        line = failure_line(e, output)
        if line is None:
            raise
        made.remove_made()
        raise InputError(line) from None
