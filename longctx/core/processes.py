"""Nothing longctx starts outlives it: the processes it starts (vLLM's engine and workers, the tokenize workers, a
recipe's launcher and its ranks) die with the process that started them, and the next writer of an output removes
what a killed one left.

Two mechanisms, for two ways a process ends:
- Linux's parent-death signal (prctl(2) PR_SET_PDEATHSIG, https://man7.org/linux/man-pages/man2/prctl.2.html):
  the kernel sends SIGKILL to a process when the thread that created it ends, whatever ended it (kill -9
  included). It must be set in the child itself and is cleared on fork, so every process sets it for itself:
  a forked child in an `os.register_at_fork` hook (`children_bound`; vLLM forks its engine process unless it
  must spawn, as on CPU or with CUDA initialised: vllm-project/vllm v0.32.0 vllm/utils/system_utils.py
  `get_mp_context`, vllm/platforms/cpu.py), a spawned one when it
  starts (`adopt`, which importing longctx runs first thing in a process started for longctx: multiprocessing's
  spawn imports the parent's main module, longctx's CLI, before anything else; and again from the tokenize
  workers' initializer and the `vllm.general_plugins` entry point longctx.models.plugin:register, which vLLM runs
  in each engine and worker process, v0.32.0 vllm/v1/engine/core.py `EngineCore.__init__`,
  vllm/v1/worker/worker_base.py `init_worker`). A launcher (torchrun) runs bound the same way, and its ranks,
  which run `-m longctx`, bind themselves to it. vLLM starts
  its engine process from the thread that builds `vllm.LLM` and its workers from the engine process's main
  thread (v0.32.0 vllm/v1/engine/utils.py `CoreEngineProcManager`, vllm/v1/executor/multiproc_executor.py
  `WorkerProc.make_worker_process`); longctx builds the engine and its tokenize pool in its main thread, so the
  creating thread lives as long as the process. Only forks made from the main thread are bound.
- Records: each bound process appends "child <pid> <start time>" to the lock files of the outputs its work is
  for (`LOCKS_ENV`, kept by `longctx.core.files.OutputLock`); the next writer that takes such a lock from a dead
  holder kills the recorded processes still alive whose start time (/proc/<pid>/stat field 22, proc(5)) shows
  they are the same processes, not new ones that reuse the pid, and which can be the holder's: this user's,
  started after it, running the same program (`_ours`). A lock file is read only when longctx made it
  (`longctx.core.locks`), so a planted one signals nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any

# "<pid>:<start time>" of the process that started this one for longctx: a child checks that it is still
# its parent.
PARENT_ENV = "LONGCTX_PARENT"
# The lock files (os.pathsep-separated) of the outputs this process writes, which its children record
# themselves in.
LOCKS_ENV = "LONGCTX_OUTPUT_LOCKS"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_hooked = False
_forking_from_main = False


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22), or None when there is no
    such process, it is a zombie, or this system has no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the name (field 2) may hold spaces and parentheses
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19]) if fields[19].isdigit() else None


def _ours(pid: int, holder_started: int) -> bool:
    """Whether process `pid` can be one a longctx process that started at `holder_started` started: this user's,
    started no earlier, running this process's program (Python: vLLM's engine and workers, torchrun's ranks and
    the tokenize workers all are)."""
    try:
        st = os.stat(f"/proc/{pid}")
        same_program = os.path.samestat(os.stat(f"/proc/{pid}/exe"), os.stat("/proc/self/exe"))
    except OSError:
        return False
    started = start_time(pid)
    return st.st_uid == os.geteuid() and same_program and started is not None and started >= holder_started


def kill_recorded(records: list[tuple[int, int]], holder_started: int) -> list[int]:
    """SIGKILL every recorded (pid, start time) that is still that same process and can be one the holder, a
    longctx process that started at `holder_started`, started (`_ours`); returns the pids killed."""
    killed = []
    for pid, started in records:
        if pid != os.getpid() and start_time(pid) == started and _ours(pid, holder_started):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def is_main_process() -> bool:
    """False in the other ranks of a multi-process launch (torchrun and accelerate set RANK): the main one owns
    the outputs."""
    rank = os.environ.get("RANK", "0").strip()
    return not rank.isdigit() or int(rank) == 0


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when the thread that created it ends; False where it cannot
    (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def record_child(pid: int) -> None:
    """Record process `pid` in the lock files `LOCKS_ENV` names (this process's outputs, or its starter's)."""
    started = start_time(pid)
    if started is None:
        return
    line = f"child {pid} {started}\n".encode()
    for path in filter(None, os.environ.get(LOCKS_ENV, "").split(os.pathsep)):
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK)  # never creates
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
                    os.write(fd, line)
            finally:
                os.close(fd)


def _starter() -> tuple[int, int] | None:
    """(pid, start time) of the process `PARENT_ENV` names, if it names one."""
    pid, _, started = os.environ.get(PARENT_ENV, "").partition(":")
    return (int(pid), int(started)) if pid.isdigit() and started.isdigit() else None


def _bound_to(parent: int) -> None:
    """This process dies with `parent`, which started it; it records itself, and binds its own children (vLLM's
    engine process starts the workers) for the rest of its life."""
    if die_with_parent() and os.getppid() != parent:
        os._exit(1)  # the parent ended before the signal was set: it will never come
    _bind()
    record_child(os.getpid())


def _bind() -> bool:
    """Name this process as the starter its children check for; False where there is no /proc to check with."""
    global _hooked
    me = start_time(os.getpid())
    if me is None:
        return False
    os.environ[PARENT_ENV] = f"{os.getpid()}:{me}"
    if not _hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _hooked = True
    return True


def _before_fork() -> None:
    global _forking_from_main
    _forking_from_main = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    # The signal follows the forking thread: a fork from a short-lived thread would kill the child with it.
    starter = _starter()
    if _forking_from_main and starter is not None and starter[0] == os.getppid():
        _bound_to(os.getppid())


_bound_lock = threading.Lock()
_bound_depth = 0  # blocks of `children_bound` running now, in any thread
_bound_before: str | None = None  # PARENT_ENV before the first of them


@contextlib.contextmanager
def children_bound() -> Iterator[None]:
    """While the block runs, the processes this one starts die with it: forked ones at once, spawned ones when
    they call `adopt()`. Run it in the thread that starts them and lives as long as they should; processes
    started after the block (by anything else) are not bound. Blocks may nest and run in several threads at once
    (`ruler` starts its engine while worker processes write the task files): the last one to end restores the
    environment."""
    global _bound_depth, _bound_before
    with _bound_lock:
        if _bound_depth == 0:
            _bound_before = os.environ.get(PARENT_ENV)
        _bind()
        _bound_depth += 1
    try:
        yield
    finally:
        with _bound_lock:
            _bound_depth -= 1
            if _bound_depth == 0:
                if _bound_before is None:
                    os.environ.pop(PARENT_ENV, None)
                else:
                    os.environ[PARENT_ENV] = _bound_before


def adopt() -> None:
    """In a process that a longctx process inside `children_bound()` started, directly or through a program it
    started (torchrun's ranks): die with the parent (and end now when the starter has ended already), record this
    process in its outputs' locks, and bind the processes this one starts. A rank dies with the launcher, which
    dies with longctx. Does nothing elsewhere: in a process nothing bound started (a vLLM server a user started,
    the longctx process itself)."""
    starter = _starter()
    if starter is None or starter[0] == os.getpid():
        return
    pid, started = starter
    if os.getppid() != pid and start_time(pid) != started:
        os._exit(1)  # the process that started this one's work has ended: so does the work
    _bound_to(os.getppid())


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def can_spawn() -> bool:
    """Whether a spawned process can start here: it runs the main script again, which it cannot when that came
    from standard input (`python -`, whose `__file__` is "<stdin>"); its workers would fail to start, over and
    over."""
    import __main__

    path = getattr(__main__, "__file__", None)
    return path is None or os.path.exists(path)


@contextlib.contextmanager
def worker_pool(workers: int, initializer: Callable[..., None], initargs: tuple = ()) -> Iterator[Any]:
    """A `concurrent.futures.ProcessPoolExecutor` of `workers` processes, each set up by `initializer(*initargs)`
    and single-threaded for the Rust tokenizer (its TOKENIZERS_PARALLELISM), which die with this process (a kill -9
    included). Spawned, not forked: the caller may hold torch and process-group threads, which a fork would copy
    mid-state. Started from the calling thread, which must live as long as the pool (`children_bound`); on leaving
    the block, work not started is cancelled and the workers end."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with children_bound():
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_start_worker, initargs=(initializer, initargs))
        try:
            yield pool
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _start_worker(initializer: Callable[..., None], initargs: tuple) -> None:
    adopt()  # first: a worker whose parent is gone ends here
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker
    initializer(*initargs)
