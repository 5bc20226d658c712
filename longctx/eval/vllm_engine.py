"""A vLLM engine's output and failures: where what it prints goes (a log file), the one line that says why it
failed (from the exception, else from what its processes wrote to that log, else from how they ended), and the
death of its processes while it generates made an exception rather than a wait that never ends."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from longctx.core.errors import one_line
from longctx.core.files import open_in_place

# Where a vLLM engine's output goes (all of it while it starts; its processes' and its log records while it
# generates): the run directory when the backend knows it, else longctx's cache (`cache_dir()/logs`).
ENGINE_LOG = "vllm-engine.log"


def _console_handlers(package: str | None = None) -> list[logging.StreamHandler]:
    """The logging handlers that write to the console (this process's stdout or stderr): of every logger, or only
    of `package`'s loggers ("vllm": vllm and vllm.*)."""
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()] if package is None else [
        logger for name, logger in logging.Logger.manager.loggerDict.items()
        if name == package or name.startswith(package + ".")]
    return [h for logger in loggers if isinstance(logger, logging.Logger) for h in logger.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
            and any(h.stream is st for st in streams)]


@contextlib.contextmanager
def vllm_logging_to(path: Path | None) -> Iterator[None]:
    """vLLM's log records in this process (its `vllm` loggers' console handlers) go to the file `path` (appended)
    while the block runs; nothing changes when `path` is None."""
    if path is None:
        yield
        return
    with os.fdopen(open_in_place(path), "a", buffering=1, encoding="utf-8", errors="replace") as log:
        swapped = []
        for h in _console_handlers("vllm"):
            with contextlib.suppress(AttributeError):  # logging's _StderrHandler always writes to sys.stderr
                swapped.append((h, h.setStream(log)))
        try:
            yield
        finally:
            for h, stream in swapped:
                h.setStream(stream)


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Everything printed while the block runs goes to the file `path`: file descriptors 1 and 2 (C code, and
    the engine processes vLLM starts, which inherit them and keep writing there), `sys.stdout`/`sys.stderr`
    and the logging handlers that write to them (vLLM logs through Python logging)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = os.fdopen(open_in_place(path, truncate=True), "a", buffering=1, encoding="utf-8", errors="replace")
    streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    handlers = _console_handlers()
    for st in streams:
        with contextlib.suppress(Exception):
            st.flush()
    saved = {n: os.dup(n) for n in (1, 2)}
    old = sys.stdout, sys.stderr
    swapped = []
    for h in handlers:
        with contextlib.suppress(AttributeError):  # logging's _StderrHandler always writes to sys.stderr
            swapped.append((h, h.setStream(log)))
    try:
        for n in (1, 2):
            os.dup2(log.fileno(), n)
        sys.stdout = sys.stderr = log
        yield
    finally:
        sys.stdout, sys.stderr = old
        for h, stream in swapped:
            h.setStream(stream)
        # Handlers made inside the block (vLLM configures its logger when first imported, on `sys.stdout`)
        # would write to the closed log afterwards: they get the stream they would have got outside it.
        for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            for h in getattr(logger, "handlers", []):
                if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is log:
                    h.setStream(old[0])
        log.flush()
        for n, dup in saved.items():
            os.dup2(dup, n)
            os.close(dup)
        log.close()


# vLLM's log prefixes: "(EngineCore_DP0 pid=123) " on lines of its engine process, "ERROR 12-01 10:00:00
# [core.py:700] " on logged lines.
_LOG_PREFIX = re.compile(r"^(?:\([\w.-]+ pid=\d+\)\s*)?"
                         r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:.]+ \[[^\]]*\]\s*)?")
# The last line of a Python traceback: "ValueError: ...", "torch.OutOfMemoryError: ...", "AssertionError".
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b(?::\s*\S.*)?$")
# Lines that report a failure without saying what it was (vLLM's main process after its engine process died;
# EngineDeadError's own text, vllm/v1/engine/exceptions.py).
_GENERIC = ("Engine core initialization failed", "See root cause above", "EngineCore failed to start",
            "EngineCore encountered an issue")


def _is_generic(text: str) -> bool:
    return any(g in text for g in _GENERIC)


def log_size(log: Path | None) -> int:
    """How many bytes `log` holds now (0: none, or no log)."""
    try:
        return log.stat().st_size if log is not None else 0
    except OSError:
        return 0


def _last_exception(log: Path | None, since: int = 0) -> str | None:
    """The last exception line ("ValueError: ...") the engine's processes wrote to `log` after its first `since`
    bytes (at most its last megabyte), without vLLM's prefixes; None when there is none."""
    found = None
    with contextlib.suppress(OSError, TypeError), open(log, "rb") as f:
        f.seek(max(since, f.seek(0, os.SEEK_END) - 1_000_000))
        for raw in f.read().decode("utf-8", errors="replace").splitlines():
            line = _LOG_PREFIX.sub("", raw).strip()
            if _EXCEPTION_LINE.match(line) and not _is_generic(line):
                found = line
    return found


def engine_error(log: Path | None, e: BaseException, since: int = 0, ended: str | None = None) -> str:
    """What made the engine fail, in one line: `e` itself when it says (it was raised in this process), else
    `ended` when a process was killed by a signal, else the last exception line the engine's processes wrote to
    `log` after byte `since`, else `ended` (how its processes ended), else `e`'s type."""
    own = one_line(str(e), limit=10**6)
    found = None
    if not own or _is_generic(own):
        # a process killed by a signal wrote nothing about it: what is in the log then came from another process
        # (the client's threads as it shut down), so how it ended comes first
        killed = ended if ended is not None and " was killed by " in ended else None
        found = killed or _last_exception(log, since) or ended
    return one_line(found or (f"{type(e).__name__}: {own}" if own else type(e).__name__))


def _engine_processes(client: Any) -> list[Any]:
    """The engine processes (multiprocessing.Process) a vLLM engine client started; [] for an engine in this
    process or in Ray actors (vllm/v1/engine/utils.py `CoreEngineProcManager.processes`)."""
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    return list(getattr(manager, "processes", None) or [])


def _exit_code(proc: Any, wait_s: float = 2.0) -> int | None:
    """The exit code of the ended process `proc`. Two threads may reap it at once (this one and vLLM's monitor,
    which reads `exitcode` as soon as the process ends): the one whose waitpid loses gets ECHILD, which
    multiprocessing reports as "no code yet", until the winner stores the status a moment later."""
    deadline = time.monotonic() + wait_s
    while (code := proc.exitcode) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return code


def ended_processes(client: Any) -> str | None:
    """How the engine processes of `client` that have ended did ("EngineCore was killed by SIGKILL"), or None."""
    from multiprocessing.connection import wait

    said = []
    for proc in _engine_processes(client):
        if not wait([proc.sentinel], timeout=0):
            continue  # still running
        proc.join(timeout=5)  # reaped here, or by vLLM's own monitor thread
        code = _exit_code(proc)
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            oom = " (as the kernel's out-of-memory killer does)" if name == "SIGKILL" else ""
            said.append(f"its process {proc.name} was killed by {name}{oom}")
        else:
            said.append(f"its process {proc.name} ended" + (f" with exit code {code}" if code is not None else ""))
    return "; ".join(said) or None


@contextlib.contextmanager
def dead_engine_raises(client: Any) -> Iterator[None]:
    """While the block runs, the end of any of the engine's processes makes the client's wait for output raise
    EngineDeadError. vLLM v0.32.0's SyncMPClient otherwise waits forever for the output of an engine process that
    was killed: only an engine that fails by itself sends ENGINE_CORE_DEAD, and its monitor thread, on seeing the
    process gone, stops the thread that reads outputs without telling the waiting one
    (vllm/v1/engine/core_client.py `SyncMPClient.process_outputs_socket`, `MPClient.start_engine_core_monitor`)."""
    procs = _engine_processes(client)
    outputs = getattr(client, "outputs_queue", None)
    if not procs or outputs is None:
        yield
        return
    from multiprocessing.connection import wait

    from vllm.v1.engine.exceptions import EngineDeadError

    stop_read, stop_write = os.pipe()

    def watch() -> None:
        if stop_read not in wait([*(p.sentinel for p in procs), stop_read]):
            client.resources.engine_dead = True  # as vLLM's monitor marks it: nothing more is sent to the engine
            outputs.put_nowait(EngineDeadError())

    watcher = threading.Thread(target=watch, name="longctx-engine-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        os.write(stop_write, b"x")
        watcher.join()
        os.close(stop_read)
        os.close(stop_write)


class EngineFailed(Exception):
    """The engine raised while generating (the exception is the `__cause__`)."""


def engine_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, a call into the vLLM engine: an Exception it raises comes out as EngineFailed (a
    KeyboardInterrupt as it is), so that a failure of the engine is told from one of the caller's own code."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # every failure of the engine is one line (VllmBackend.generate)
        raise EngineFailed() from e


def abort_requests(engine: Any, request_ids: list[str]) -> None:
    """Abort the requests `request_ids` (internal ids) and step the engine until it holds none, so that a shared
    engine stays usable; nothing when there are none or the engine is dead (its client would wait for output
    forever)."""
    if not request_ids or getattr(getattr(engine.engine_core, "resources", None), "engine_dead", False):
        return
    engine.abort_request(request_ids, internal=True)
    while engine.has_unfinished_requests():
        engine.step()
