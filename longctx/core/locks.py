"""One writer per output: `OutputLock`, an exclusive `flock` on a hidden file beside a verb's output, held from
the verb's output check (`longctx.core.files.check_output`) to its end.

flock(2) (https://man7.org/linux/man-pages/man2/flock.2.html): the lock belongs to the open file, so the kernel
drops it when the last descriptor of that file closes, which a killed process's exit does; a forked child's
copy of the descriptor would keep it (`_forget_held_in_child`).

A lock file is longctx's only when longctx made it: it is opened without following a link, and must be a regular
file of this user's with one name, holding a header and "child" lines; anything else at its path is refused in
one line and left as it is.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import threading
import weakref
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.processes import LOCKS_ENV, kill_recorded, start_time

LOCK_FILE = ".longctx-lock"
_LOCK_READ_LIMIT = 1 << 20  # a lock file holds a header and a line per recorded child


def dangling_link(path: Path) -> Path | None:
    """`path`, or the nearest of its parents, when that is a symbolic link to nothing (the first of them that
    exists or is a link decides); None otherwise."""
    for p in [path, *path.parents]:
        if p.is_symlink():
            return None if p.exists() else p
        if p.exists():
            return None
    return None


def check_link(out: Path, what: str = "output") -> None:
    """InputError when the output `out` is (or lies under) a symbolic link to something that does not exist:
    nothing can be written there."""
    link = dangling_link(Path(out))
    if link is None:
        return
    target = os.readlink(link)
    where = "is" if link == Path(out) else f"lies under '{link}', which is"
    raise InputError(f"{what} '{out}' {where} a symbolic link to '{target}', which does not exist; remove the link "
                     "or choose another -o")


class _Held:
    """A lock this process holds: its open lock file (the `flock` lives with it), how many `OutputLock`s share
    it, and the folders it made to hold the lock file."""

    def __init__(self, fd: int, made: list[Path]):
        self.fd, self.made, self.count = fd, made, 1


_HELD: dict[str, _Held] = {}  # lock file path -> the lock this process holds there
_HELD_GUARD = threading.RLock()  # re-entered by a finalizer that runs during a collection


# The locks of the process that started this one for its work (a recipe, for the training ranks it launches):
# held for this process's outputs too.
_INHERITED = tuple(filter(None, os.environ.get(LOCKS_ENV, "").split(os.pathsep)))


def _publish_held() -> None:
    """The lock files this process holds, and those its starter holds for it, where the processes it starts
    record themselves (`longctx.core.processes.record_child`)."""

    held = [*_INHERITED, *(p for p in _HELD if p not in _INHERITED)]
    if held:
        os.environ[LOCKS_ENV] = os.pathsep.join(held)
    else:
        os.environ.pop(LOCKS_ENV, None)


def _read_holder(fd: int) -> tuple[list[str], list[tuple[int, int]]] | None:
    """(the header's words: pid, host, start time; the recorded children as (pid, start time)) of a lock file,
    or None when it is not shaped as longctx writes one (an empty file is: its writer died before writing)."""
    data = os.pread(fd, _LOCK_READ_LIMIT + 1, 0)
    if len(data) > _LOCK_READ_LIMIT:
        return None
    try:
        lines = data.decode("ascii").splitlines()
    except UnicodeDecodeError:
        return None
    if not lines:
        return [], []
    header = lines[0].split()
    if len(header) != 3 or not header[0].isdigit() or not header[2].isdigit():
        return None
    children = []
    for line in lines[1:]:
        words = line.split()
        if len(words) != 3 or words[0] != "child" or not words[1].isdigit() or not words[2].isdigit():
            return None
        children.append((int(words[1]), int(words[2])))
    return header, children


def foreign_file(fd: int) -> str | None:
    """Why the open file `fd` cannot be one longctx wrote (not a regular file, another user's, a hard link with
    other names), or None: what longctx reads back or changes in place of its own (locks, marks, caches, logs)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.geteuid():
        return f"it belongs to user {st.st_uid}"
    if st.st_nlink != 1:
        return "it is a hard link to another file"
    return None


def _writer_above(real: Path) -> tuple[Path, str] | None:
    """The nearest folder above the output `real` that another process is writing (its lock file names a live
    holder on this machine, the same process that started then), with who that is; None when there is none.
    Locks this process holds, or its starter holds for it (`LOCKS_ENV`: a recipe's stages), do not count."""
    ours = {*_HELD, *_INHERITED, *filter(None, os.environ.get(LOCKS_ENV, "").split(os.pathsep))}
    for folder in real.parents:
        if folder.parent == folder:
            return None
        lock = folder.parent / f".{folder.name}{LOCK_FILE}"
        if str(lock) in ours:
            continue
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            holder = (_read_holder(fd) or ([], []))[0] if foreign_file(fd) is None else []
        finally:
            os.close(fd)
        if (len(holder) == 3 and holder[1] == socket.gethostname() and int(holder[0]) != os.getpid()
                and start_time(int(holder[0])) == int(holder[2])):
            return folder, f"process {holder[0]} on {holder[1]}"
    return None


def _make_parents(folder: Path, what: str, out: Path) -> list[Path]:
    """Make `folder` and the parents it lacks; returns those made, outermost first."""
    missing = []
    p = folder
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    made = []
    for p in reversed(missing):
        try:
            p.mkdir()
        except FileExistsError:
            if not p.is_dir():
                raise InputError(f"{what} '{out}' lies under '{p}', which is a file, not a folder; choose another "
                                 "-o") from None
        except OSError as e:
            raise InputError(f"cannot make the folder '{p}' for {what} '{out}' ({e.strerror or e}); choose "
                             "another -o") from None
        else:
            made.append(p)
    return made


class OutputLock:
    """One writer for the output `out`, whether or not it exists yet, for as long as this object holds it
    (`release()`, or a `with` block). It is an exclusive `flock` on a hidden file beside the output,
    PARENT/.NAME.longctx-lock (of `out` with its symbolic links resolved, so that every path to one output
    takes one lock; PARENT is made when missing and removed again on release when still empty), which names
    the holder (pid, host and start time) and the processes the holder's work started (`longctx.core.processes`).
    The kernel drops the lock when its process ends, so a lock left by a killed process never blocks the next
    writer, which kills the children the dead holder recorded that are still alive; `release()` removes the
    file. A process that locked a file another one removed meanwhile sees that the path no longer names it,
    and tries again. Within one process the lock is shared: a second `OutputLock` on the same output holds it
    too, and it is released with the last one."""

    def __init__(self, out: Path, what: str):
        check_link(Path(out), what)
        real = Path(os.path.realpath(out))
        self.out, self.what = Path(out), what
        self.path = real.parent / f".{real.name}{LOCK_FILE}"
        writing = _writer_above(real)
        if writing is not None:
            folder, who = writing
            raise InputError(f"{what} '{out}' lies in '{folder}', which {who} is writing; wait for it to finish, or "
                             "choose another -o")
        with _HELD_GUARD:
            held = _HELD.get(str(self.path))
            if held is not None:
                held.count += 1
            else:
                made = _make_parents(real.parent, what, self.out)
                try:
                    fd = self._lock(made)
                except BaseException:
                    _remove_empty(made)
                    raise
                _HELD[str(self.path)] = _Held(fd, made)
                _publish_held()
        # this object's share of the lock, released once: by `release()`, or when the object is dropped
        self._share = [str(self.path)]
        weakref.finalize(self, _release_share, self._share)

    def _lock(self, made: list[Path]) -> int:
        """The locked lock file's descriptor (after killing what a dead holder left running), or InputError
        naming the live holder; `made` gets the folders made on the way."""

        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            except FileNotFoundError:  # the holder before us removed the folder it had made
                made += _make_parents(self.path.parent, self.what, self.out)
                continue
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a link, a socket or a folder
                    raise InputError(f"'{self.path}' (the lock of {self.what} '{self.out}') is not a lock longctx "
                                     "made (it is a link or not a file); remove it if it is not yours to keep, or "
                                     "choose another -o") from None
                raise InputError(f"cannot write the lock '{self.path}' of {self.what} '{self.out}' "
                                 f"({e.strerror or e}); choose another -o") from None
            why = foreign_file(fd)
            if why is not None:
                os.close(fd)
                raise InputError(f"'{self.path}' (the lock of {self.what} '{self.out}') is not a lock longctx made "
                                 f"({why}); remove it if it is not yours to keep, or choose another -o")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = (_read_holder(fd) or ([], []))[0]
                os.close(fd)
                who = f"process {holder[0]} on {holder[1]}" if len(holder) >= 2 else "another process"
                raise InputError(f"{self.what} '{self.out}' is being written by {who} (lock {self.path}); wait for "
                                 "it to finish, or choose another -o") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder before us removed that file as it released it
        found = _read_holder(fd)
        if found is None:
            os.close(fd)
            raise InputError(f"'{self.path}' (the lock of {self.what} '{self.out}') is not a lock longctx made (it "
                             "holds something else); remove it if it is not yours to keep, or choose another -o")
        holder, children = found
        if len(holder) == 3 and holder[1] == socket.gethostname() and start_time(int(holder[0])) != int(holder[2]):
            kill_recorded(children, int(holder[2]))  # a holder that died: what it started and left running
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {start_time(os.getpid()) or 0}\n".encode(), 0)
        except OSError:  # a full disk: the lock file goes (while still locked), the caller says why
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            os.close(fd)
            raise
        return fd

    def release(self) -> None:
        """Let the next writer in (once every `OutputLock` of this process on the output is released)."""
        _release_share(self._share)

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _remove_empty(made: list[Path]) -> None:
    """Remove the folders in `made` (outermost first) that are still empty, innermost first."""
    for p in reversed(made):
        try:
            p.rmdir()
        except OSError:  # not empty: the output is in it, or another writer uses it
            return


def _release_share(share: list[str]) -> None:
    """Release one `OutputLock`'s share (`share`: [its lock file], emptied once released) of a lock; the last
    share unlocks and removes the lock file and the folders made for it."""
    with _HELD_GUARD:
        if not share:
            return
        path = share.pop()
        held = _HELD.get(path)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _HELD[path]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # while still locked: a waiting process then finds the path gone
        os.close(held.fd)
        _remove_empty(held.made)
        _publish_held()


def _forget_held_in_child() -> None:
    """In a forked child: close its copies of the lock files' descriptors (an `flock` lasts until every
    descriptor of its open file is closed, so a child that outlived its parent would keep the parent's outputs
    locked); the locks stay the parent's, and the child still records itself in them (`LOCKS_ENV`)."""
    global _HELD_GUARD
    _HELD_GUARD = threading.RLock()  # another thread of the parent may have held it as it forked
    for held in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_held_in_child)


def hold_until_verb_ends(lock: OutputLock) -> OutputLock:
    """`lock`, released when the `longctx` command running now ends, however it ends (click's
    `Context.call_on_close`, https://click.palletsprojects.com/en/stable/api/#click.Context.call_on_close); a
    verb then holds its output from its check to its end without carrying the lock through its code. Without
    such a command (a library call) the caller holds it for as long as it keeps it."""
    import click

    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(lock.release)
    return lock
