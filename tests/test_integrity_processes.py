"""Invariant 5 of issue 29, nothing longctx started outlives it (`longctx.core.processes`): after a kill -9 of
`longctx ruler` (vLLM's engine and worker processes) or of `longctx extend --tokenize-workers 2` (the tokenize
workers), no process of theirs is left; and the next writer of an output kills what a dead holder recorded and
left running, never a process that only reuses a recorded pid.

Every process a run starts inherits its environment, so the run's processes are found by a marker variable in
/proc/<pid>/environ, whoever their parent is now."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import require_vllm, user_environment

from longctx.core.locks import OutputLock
from longctx.core.processes import start_time

MARK = "LONGCTX_TEST_PROCESS_MARK"


def marked(mark: str) -> dict[int, str]:
    """{pid: command line} of the live processes whose environment holds MARK=mark."""
    needle = f"{MARK}={mark}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in env.split(b"\0") and start_time(int(entry)) is not None:  # a zombie has ended
            found[int(entry)] = cmd
    return found


def recorded(lock: Path) -> list[int]:
    """The pids of the children recorded in the lock file `lock` (none when there is no such file)."""
    try:
        return [int(line.split()[1]) for line in lock.read_text().splitlines()[1:] if line.startswith("child ")]
    except FileNotFoundError:
        return []


def wait_until(condition, proc: subprocess.Popen) -> None:
    """Wait until `condition()` holds while `proc` runs (its output when it ends first)."""
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended first (code {proc.returncode}): {proc.stderr.read()[-3000:]}")
        time.sleep(0.2)


def assert_all_gone(mark: str, proc: subprocess.Popen, how: signal.Signals = signal.SIGKILL) -> None:
    """Kill `proc` (kill -9: no cleanup of its own; SIGTERM: Python's default, the same), then see every process
    it started end: the kernel's parent-death signal kills them at once; the wait only covers the moments a killed
    process takes to go."""
    proc.send_signal(how)
    proc.wait()
    left = marked(mark)
    for _ in range(300):
        if not left:
            break
        time.sleep(0.1)
        left = marked(mark)
    assert not left, f"still running after the kill: {left}"


@pytest.fixture(scope="module")
def ruler_ckpt(tmp_path_factory, reference_tokenizer_dir):
    from longctx.init.presets import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("proc-ckpt") / "tiny2k", reference_tokenizer_dir,
                            max_position_embeddings=2048)


def _ruler(ruler_ckpt, out, mark) -> subprocess.Popen:
    env = {**user_environment(), MARK: mark, "VLLM_CPU_KVCACHE_SPACE": "1", "TQDM_DISABLE": "1"}
    return subprocess.Popen([sys.executable, "-m", "longctx", "ruler", "run", str(ruler_ckpt), "--backend", "vllm",
                             "--dtype", "float32", "--enforce-eager", "--lengths", "1k", "--tasks", "vt",
                             "--samples", "40", "-o", str(out), "--no-plot"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_killing_ruler_leaves_no_vllm_process(ruler_ckpt, tmp_path):
    """The engine process (spawned: vLLM's CPU platform asks for it) binds itself while it is still starting, before
    it imports vLLM (it records itself in the run's lock before it is titled VLLM::EngineCore, which the parent-death
    signal set just before the record makes a kill at any moment from then on safe); killed while generating, the
    run leaves no process behind."""
    require_vllm()
    mark = uuid.uuid4().hex
    out = tmp_path / "run"
    lock = tmp_path / ".run.longctx-lock"
    proc = _ruler(ruler_ckpt, out, mark)
    try:
        # poll until the engine is titled; it must have been seen recorded at an earlier poll (without the early
        # binding it records itself only from vLLM's plugin hook, after the title)
        seen_recorded: set[int] = set()
        engine = None
        while engine is None:
            if proc.poll() is not None:
                raise AssertionError(f"the run ended first (code {proc.returncode}): {proc.stderr.read()[-3000:]}")
            now = marked(mark)
            engine = next((pid for pid, cmd in now.items() if cmd.startswith("VLLM::EngineCore")), None)
            if engine is None:
                seen_recorded |= set(recorded(lock)) & set(now)
                time.sleep(0.05)
        assert engine in seen_recorded, "the engine process was titled by vLLM before it bound itself"
        pred = out / "pred" / "1024" / "vt.jsonl"
        wait_until(lambda: pred.is_file() and pred.read_text().count("\n") >= 1, proc)
        # the engine process and its worker recorded themselves in the run directory's lock (as did the workers
        # that wrote the task files, which have ended since)
        children = [pid for pid in recorded(lock) if start_time(pid) is not None]
        assert len(children) >= 2 and set(children) <= set(marked(mark)), (children, marked(mark))
        assert_all_gone(mark, proc)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A JSONL corpus of ~8M tokens: tokenizing it takes two workers several seconds."""
    rng = np.random.default_rng(0)
    words = np.array("the river stone of a lamp and garden window silver copper in violet morning".split())
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    with open(path, "w") as f:
        for _ in range(20_000):
            f.write(json.dumps({"text": " ".join(rng.choice(words, 400))}) + "\n")
    return path


@pytest.mark.slow
def test_killing_extend_while_it_tokenizes_leaves_no_worker(tiny_checkpoint, corpus, tmp_path):
    mark = uuid.uuid4().hex
    out = tmp_path / "out"
    env = {**os.environ, MARK: mark}
    proc = subprocess.Popen([sys.executable, "-m", "longctx", "extend", str(tiny_checkpoint), "--rope-base", "1e5",
                             "--seq-len", "512", "--data", str(corpus), "--steps", "8", "--tokens-per-step", "1M",
                             "--tokenize-workers", "2", "--cache-dir", str(tmp_path / "cache"), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # both workers have started (each records itself in the output's lock as it starts) and tokenize
        wait_until(lambda: len(recorded(tmp_path / ".out.longctx-lock")) >= 2, proc)
        assert set(recorded(tmp_path / ".out.longctx-lock")) <= set(marked(mark))
        assert_all_gone(mark, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not any((tmp_path / "cache").glob("tokens-*/meta.json"))  # nothing half-built was published


# Takes the lock on argv[1], starts a process and records it as its child, records argv[2] as a child of another
# start time (a process that merely has a pid the holder's child once had), says so (with its child's pid) and
# waits to be killed.
HOLDER = """
import os, subprocess, sys, time
from longctx.core.locks import OutputLock
from longctx.core.processes import record_child, start_time
lock = OutputLock(sys.argv[1], "output")
left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
record_child(left.pid)
with open(lock.path, "a") as f:
    f.write(f"child {sys.argv[2]} {start_time(int(sys.argv[2])) + 1}\\n")
print(left.pid, flush=True)
time.sleep(3600)
"""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.slow
def test_the_next_writer_kills_what_a_dead_holder_left_running(tmp_path):
    out = tmp_path / "out"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    left = None
    try:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), str(bystander.pid)],
                                  stdout=subprocess.PIPE, text=True)
        left = int(holder.stdout.readline())
        assert recorded(tmp_path / ".out.longctx-lock") == [left, bystander.pid]
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert start_time(left) is not None  # a process the holder did not bind: it outlived the holder
        with OutputLock(out, "output"):
            for _ in range(600):
                if start_time(left) is None:
                    break
                time.sleep(0.1)
            assert start_time(left) is None
            assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        if left is not None:
            _kill(left)
    assert not (tmp_path / ".out.longctx-lock").exists()


def test_blocks_that_bind_children_nest_across_threads(monkeypatch):
    """`ruler` starts its engine (one block) while another thread starts the task-file workers (another): the
    processes either starts are bound until the last block ends, and the environment is restored then."""
    import threading

    from longctx.core.processes import PARENT_ENV, children_bound

    monkeypatch.delenv(PARENT_ENV, raising=False)
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with children_bound():
            entered.set()
            release.wait()

    thread = threading.Thread(target=other)
    with children_bound():
        thread.start()
        entered.wait()
        assert os.environ[PARENT_ENV].startswith(f"{os.getpid()}:")
    assert os.environ[PARENT_ENV].startswith(f"{os.getpid()}:")  # the other block still runs
    release.set()
    thread.join()
    assert PARENT_ENV not in os.environ


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launched_recipe(tmp_path: Path, checkpoint: Path, steps: int) -> Path:
    """A recipe whose extend stage runs under torchrun with 2 ranks."""
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "models": {"baseline": {"checkpoint": str(checkpoint)}},
        "extend": {"seq_len": 256, "data": "synthetic:mixed", "steps": steps, "tokens_per_step": 512,
                   "rope_base": 1e5},
        "launcher": {"launcher": "torchrun", "num_processes": 2, "main_process_port": _free_port()}}))
    return recipe


# A launcher as torchrun behaves when a rank refuses: progress drawn with carriage returns, the rank's one line,
# then the launcher's own report of the failed rank; exit code 2 (or 1 with no refusal: a crash).
LAUNCHER = """
import sys
sys.stderr.write("loading\\rstep 1/3\\rstep 2/3\\n")
if sys.argv[1] == "refuse":
    sys.stderr.write("Error: checkpoint 'x': the weight files lack 1 tensor\\n" * 2)  # both ranks
    sys.stderr.write("Traceback (most recent call last):\\n  ...\\nChildFailedError: rank 0 failed\\n")
    sys.exit(2)
sys.stderr.write("Traceback (most recent call last):\\nRuntimeError: a crash\\n")
sys.exit(1)
"""


@pytest.mark.slow
def test_a_launched_trainings_refusal_is_its_one_line(tmp_path, monkeypatch, capfd):
    """The ranks refuse: the recipe's stage ends with that line alone (an InputError the CLI prints once), the
    launcher's report of failed ranks not shown, the progress before it shown as it came; a crash is one line
    too, its output above."""
    from longctx.core.errors import InputError, ProcessFailed
    from longctx.recipe.launch import run_launched

    (tmp_path / "fake_launcher.py").write_text(LAUNCHER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    with pytest.raises(InputError) as refused:
        run_launched([sys.executable, "-m", "fake_launcher", "refuse"], "extend for baseline")
    assert str(refused.value) == "extend for baseline: checkpoint 'x': the weight files lack 1 tensor"
    err = capfd.readouterr().err
    assert err == "loading\rstep 1/3\rstep 2/3\n", err
    with pytest.raises(ProcessFailed, match="extend for baseline: the launched processes exited with code 1; their "
                                            "output is above"):
        run_launched([sys.executable, "-m", "fake_launcher", "crash"], "extend for baseline")
    assert "RuntimeError: a crash" in capfd.readouterr().err


@pytest.mark.slow
def test_killing_a_recipe_leaves_no_launcher_or_rank(tiny_checkpoint, tmp_path):
    """SIGTERM (Python's default: the process ends at once, as on kill -9) of `longctx run` once torchrun has
    launched its ranks: torchrun dies with the recipe and the ranks with torchrun, and nothing of the stage's
    checkpoint is written."""
    mark = uuid.uuid4().hex
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "longctx", "run", str(_launched_recipe(tmp_path, tiny_checkpoint,
                                                                                         10_000)),
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**user_environment(), MARK: mark, "TQDM_DISABLE": "1"})
    try:
        def ranks() -> list[str]:
            return [cmd for cmd in marked(mark).values() if "-m longctx extend" in cmd and "runpy" not in cmd]

        wait_until(lambda: len(ranks()) == 2, proc)
        assert_all_gone(mark, proc, signal.SIGTERM)
        assert not (out / "baseline" / "extend" / "baseline-extend").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
