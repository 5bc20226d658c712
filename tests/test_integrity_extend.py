"""Issue 29 for `longctx extend`: what `--resume` reads stays in the work folder, one writer per output, every
damaged resume file is one line (and a resume never claims work it did not do), a full disk during a save is one
line with nothing left behind, everything refused is refused before the first step, and the token budget is
packed without padding.

A tiny run (1k vocabulary, 512-token sequences, one per step) is interrupted after the state of step 2 was
saved and step 3 was logged: each test damages a fresh copy of that work folder and resumes through the CLI.
The lock and `kill -9` tests run `python -m longctx extend` as real processes; the full-disk tests write onto a
small tmpfs (they need root to mount it).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import mark_unread

from longctx.cli.main import cli
from longctx.core.locks import OutputLock
from longctx.extend import loop
from longctx.extend.loop import work_dir
from longctx.init.checkpoint import init_checkpoint
from longctx.init.settings import InitSettings

ARGS = ["--rope-base", "1e5", "--seq-len", "512", "--data", "synthetic:mixed", "--tokens-per-step", "512"]
STEP = "step-000002"


class _Interrupted(Exception):
    pass


@pytest.fixture(autouse=True)
def _no_progress_bars():
    """transformers' "Loading weights" bar would be a second stderr line of an otherwise one-line error."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    yield
    hf_logging.enable_progress_bar()


def one_line_exit_2(r, *messages):
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    for message in messages:
        assert message in r.stderr, r.stderr
    return r.stderr


def one_error_line_after_training(r, *messages):
    """A refusal during training: exit 2, no traceback, and after the progress bar one `Error:` line."""
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    last = r.stderr.rstrip("\n").split("\n")[-1]
    assert last.startswith("Error: ") and r.stderr.count("Error") == 1 and r.stderr.endswith("\n"), r.stderr
    for message in messages:
        assert message in last, last


def tree(root: Path) -> dict[str, tuple]:
    """Every path under `root` with its kind and content: what a refused resume may not change."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            kind = "link" if p.is_symlink() else "dir" if p.is_dir() else "file"
            out[str(p.relative_to(root))] = (kind, p.read_bytes() if kind == "file" else None)
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    init_checkpoint(InitSettings(output=str(out), preset="tiny", attention="baseline", tokenizer="bpe", vocab_size=1024,
                                 config={"max_position_embeddings": 256}))
    return out


@pytest.fixture(scope="module")
def interrupted(ckpt, tmp_path_factory):
    """(argv, work folder, pristine copy): 3 steps, state saved after step 2, step 3 logged, killed before its
    save."""
    root = tmp_path_factory.mktemp("resume")
    out = root / "out"
    argv = ["extend", str(ckpt), *ARGS, "--steps", "3", "--save-every", "2", "-o", str(out),
            "--cache-dir", str(root / "cache")]
    real_save = loop.save_training_state

    def save_or_crash(*args):
        if args[5] == 3:
            raise _Interrupted
        return real_save(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "save_training_state", save_or_crash)
        r = CliRunner().invoke(cli, argv)
    assert isinstance(r.exception, _Interrupted), (r.output, r.exception)
    work = work_dir(out)
    assert sorted(p.name for p in work.glob("*step-*")) == [STEP]
    assert [json.loads(x)["step"] for x in (work / "train_log.jsonl").read_text().splitlines()] == [1, 2, 3]
    pristine = root / "pristine.train"
    shutil.copytree(work, pristine)
    return argv, work, pristine


@pytest.fixture
def saved(interrupted):
    """(argv, work folder) of a fresh copy of the interrupted run."""
    argv, work, pristine = interrupted
    if work.is_symlink():
        work.unlink()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(work.with_suffix(""), ignore_errors=True)  # the output of a resume that went through
    shutil.copytree(pristine, work)
    return argv, work


def resume_refused(argv, work, *messages):
    """Resume: one line naming `messages`, and neither the work folder nor the folder around it changed."""
    before, around = tree(work), sorted(p.name for p in work.parent.iterdir())
    stderr = one_line_exit_2(CliRunner().invoke(cli, [*argv, "--resume"]), "--resume", *messages)
    assert tree(work) == before and sorted(p.name for p in work.parent.iterdir()) == around
    return stderr


# --- invariant 1: what --resume reads stays in the step's dcp/ folder ------------------------------------------


def _rewrite_metadata(dcp: Path, relative_path: str) -> None:
    meta_path = dcp / ".metadata"
    metadata = pickle.loads(meta_path.read_bytes())  # the test trusts the file it just made
    for info in metadata.storage_data.values():
        info.relative_path = relative_path
    meta_path.write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize("where", ["relative", "absolute"])
@pytest.mark.slow
def test_dcp_metadata_naming_a_file_outside_the_step_is_refused_unread(saved, tmp_path, reads_show, where):
    """The shard moved out of the step folder and the metadata pointed at it: a reader that followed the metadata
    would train from it."""
    argv, work = saved
    dcp = work / STEP / "dcp"
    outside = tmp_path / "elsewhere.distcp"
    shutil.move(dcp / "__0_0.distcp", outside)
    atime = mark_unread(outside)
    name = os.path.relpath(outside, dcp) if where == "relative" else str(outside)
    _rewrite_metadata(dcp, name)
    resume_refused(argv, work, str(dcp / ".metadata"), repr(name), f"not a file of {dcp}")
    assert not (reads_show and os.stat(outside).st_atime_ns != atime), "the file outside was read"


@pytest.mark.parametrize("link", [STEP, f"{STEP}/dcp", f"{STEP}/dcp/.metadata", f"{STEP}/dcp/__0_0.distcp",
                                  f"{STEP}/state.json", f"{STEP}/scheduler.pt", f"{STEP}/rng-0.pt", "settings.json",
                                  "train_log.jsonl"])
@pytest.mark.slow
def test_a_link_out_of_the_work_folder_is_refused_unread(saved, tmp_path, reads_show, link):
    """Any entry of the work folder a resume reads, moved elsewhere and replaced by a symbolic link to it."""
    argv, work = saved
    inside, outside = work / link, tmp_path / "elsewhere" / Path(link).name
    outside.parent.mkdir()
    shutil.move(inside, outside)
    inside.symlink_to(outside)
    files = [p for p in [outside, *outside.rglob("*")] if p.is_file()]
    atimes = [mark_unread(p) for p in files]
    resume_refused(argv, work, str(inside), "is a symbolic link")
    for f, atime in zip(files, atimes):
        assert not (reads_show and os.stat(f).st_atime_ns != atime), f"{f} was read"


@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
@pytest.mark.slow
def test_a_work_folder_that_is_a_link_is_refused_and_left_alone(saved, tmp_path, flag):
    argv, work = saved
    elsewhere = tmp_path / "elsewhere.train"
    shutil.move(work, elsewhere)
    work.symlink_to(elsewhere)
    before = tree(elsewhere)
    one_line_exit_2(CliRunner().invoke(cli, [*argv, flag]), f"work folder '{work}' is a symbolic link")
    assert tree(elsewhere) == before and work.is_symlink() and not work.with_suffix("").exists()


# --- invariant 6: every damaged resume file is one line, nothing changed ---------------------------------------


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(edit(doc) or doc))


def _edit_torch(path: Path, edit) -> None:
    obj = torch.load(path, weights_only=True)
    path.write_bytes(_torch_bytes(edit(obj) or obj))


def _edit_log(path: Path, number: int, edit) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = edit(json.loads(lines[number - 1]))
    path.write_text("".join(f"{x}\n" for x in lines))


def _without(doc: dict, key: str) -> dict:
    return {k: v for k, v in doc.items() if k != key}


def _torn(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# (file, damage, how, what the line says)
DAMAGES = [
    (f"{STEP}/state.json", "torn", _torn, "not JSON"),
    (f"{STEP}/state.json", "wrong type", lambda p: p.write_text("[2, 2, 1, 1]"), "a JSON list, not an object"),
    (f"{STEP}/state.json", "missing key", lambda p: _edit_json(p, lambda d: _without(d, "cursor")), "no 'cursor'"),
    (f"{STEP}/state.json", "absurd step", lambda p: _edit_json(p, lambda d: {**d, "step": 999}), "says step 999"),
    (f"{STEP}/state.json", "absurd cursor", lambda p: _edit_json(p, lambda d: {**d, "cursor": 7}), "cursor 7"),
    (f"{STEP}/state.json", "wrong value type", lambda p: _edit_json(p, lambda d: {**d, "step": "2"}), "'step' is '2'"),
    ("settings.json", "torn", _torn, "not JSON"),
    ("settings.json", "wrong type", lambda p: p.write_text('"settings"'), "a JSON str, not an object"),
    ("settings.json", "missing key", lambda p: _edit_json(p, lambda d: _without(d, "data_fingerprint")),
     "no 'data_fingerprint'"),
    ("settings.json", "absurd value", lambda p: _edit_json(p, lambda d: {**d, "settings": [1]}), "'settings' is [1]"),
    ("train_log.jsonl", "torn", _torn, "holds 1 steps and a cut line"),
    ("train_log.jsonl", "wrong type", lambda p: _edit_log(p, 2, lambda e: "[2, 0.5]"), "line 2 is a JSON list"),
    ("train_log.jsonl", "missing key", lambda p: _edit_log(p, 1, lambda e: json.dumps(_without(e, "loss"))),
     "line 1 has no loss"),
    ("train_log.jsonl", "absurd step", lambda p: _edit_log(p, 2, lambda e: json.dumps({**e, "step": 7})),
     "line 2 says step 7 where step 2 belongs"),
    ("train_log.jsonl", "absurd value", lambda p: _edit_log(p, 1, lambda e: json.dumps({**e, "tokens": -5})),
     "says -5 tokens"),
    ("train_log.jsonl", "steps missing", lambda p: p.write_text(p.read_text().splitlines()[0] + "\n"),
     "holds 1 steps, but the saved state is after step 2"),
    ("train_log.jsonl", "beyond the plan", lambda p: p.write_text(p.read_text() + "".join(
        json.dumps({**json.loads(p.read_text().splitlines()[-1]), "step": n, "tokens": 512 * n}) + "\n"
        for n in (4, 5))), "line 4 is step 4, beyond the 3 steps"),
    (f"{STEP}/scheduler.pt", "torn", _torn, "damaged or truncated"),
    (f"{STEP}/scheduler.pt", "wrong type", lambda p: p.write_bytes(_torch_bytes([1, 2])),
     "not a learning-rate schedule's state"),
    (f"{STEP}/scheduler.pt", "missing key", lambda p: _edit_torch(p, lambda d: _without(d, "last_epoch")),
     "not a learning-rate schedule's state"),
    (f"{STEP}/scheduler.pt", "absurd value", lambda p: _edit_torch(p, lambda d: {**d, "last_epoch": 999}),
     "does not hold this run's schedule after step 2"),
    (f"{STEP}/scheduler.pt", "wrong value type", lambda p: _edit_torch(p, lambda d: {**d, "base_lrs": "x"}),
     "base_lrs is 'x'"),
    (f"{STEP}/rng-0.pt", "torn", _torn, "damaged or truncated"),
    (f"{STEP}/rng-0.pt", "wrong type", lambda p: p.write_bytes(_torch_bytes(5)), "not the RNG states"),
    (f"{STEP}/rng-0.pt", "missing key", lambda p: _edit_torch(p, lambda d: _without(d, "torch")), "KeyError"),
    (f"{STEP}/rng-0.pt", "absurd value",
     lambda p: _edit_torch(p, lambda d: {**d, "torch": torch.zeros(3, dtype=torch.uint8)}), "setting its RNG state"),
    (f"{STEP}/dcp/.metadata", "absurd value", lambda p: _rewrite_metadata(p.parent, ".."), "not a file of"),
]
MISSING = [f"{STEP}/state.json", f"{STEP}/scheduler.pt", f"{STEP}/rng-0.pt", f"{STEP}/dcp/.metadata",
           f"{STEP}/dcp/__0_0.distcp", "settings.json", "train_log.jsonl"]


def test_every_file_of_a_step_folder_is_in_the_table():
    """A new file in a saved step (or the work folder) must join the damage table."""
    from longctx.extend import state

    names = {Path(f).name for f, *_ in DAMAGES} | {Path(f).name for f in MISSING}
    assert {state.STATE_FILE, state.SCHEDULER_FILE, "rng-0.pt", ".metadata", "__0_0.distcp", "settings.json",
            "train_log.jsonl"} <= names


@pytest.mark.parametrize("name, damage, how, message", DAMAGES, ids=[f"{f}-{d}" for f, d, *_ in DAMAGES])
@pytest.mark.slow
def test_a_damaged_resume_file_is_one_line_and_changes_nothing(saved, name, damage, how, message):
    argv, work = saved
    how(work / name)
    resume_refused(argv, work, str(work / name), message)


@pytest.mark.parametrize("name", MISSING)
@pytest.mark.slow
def test_a_missing_resume_file_is_one_line_and_changes_nothing(saved, name):
    argv, work = saved
    (work / name).unlink()
    resume_refused(argv, work, str(work / name), "is missing")


@pytest.mark.slow
def test_a_state_beyond_the_plan_is_refused(saved):
    """step 999 in a folder of that name: no longer a mismatch of the two, but past the run's 3 steps (today it
    would 'finish' with the log of 2 real steps)."""
    argv, work = saved
    far = work / "step-000999"
    (work / STEP).rename(far)
    _edit_json(far / "state.json", lambda d: {**d, "step": 999, "cursor": 999})
    resume_refused(argv, work, str(far / "state.json"), "after step 999, but this run has 3 steps")


@pytest.mark.slow
def test_an_intact_resume_redoes_the_logged_step_after_the_save(saved):
    """The control of the table: the same copy, undamaged, resumes from step 2, redoes step 3 and logs 1, 2, 3."""
    argv, work = saved
    r = CliRunner().invoke(cli, [*argv, "--resume"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert f"resumed from {work / STEP} (step 2" in r.output
    log = [json.loads(x) for x in (work.with_suffix("") / "train_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [1, 2, 3]


# --- invariant 2: one writer per output, with real processes -----------------------------------------------


def _extend_process(ckpt: Path, out: Path, cache: Path, *extra: str, steps: int = 30) -> subprocess.Popen:
    """`python -m longctx extend` into `out`, its output and errors in `cache.parent / output.log`."""
    cmd = [sys.executable, "-m", "longctx", "extend", str(ckpt), *ARGS, "--steps", str(steps), "-o", str(out),
           "--cache-dir", str(cache), *extra]
    with open(cache.parent / "output.log", "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _wait_for(proc: subprocess.Popen, ready) -> None:
    """Until `ready()` (polled): the process must still be running."""
    while not ready():
        if proc.poll() is not None:
            log = Path(proc.args[proc.args.index("--cache-dir") + 1]).parent / "output.log"
            pytest.fail(f"the run ended (rc {proc.returncode}) before it got there:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def _logged_steps(log: Path) -> list[int]:
    return [json.loads(x)["step"] for x in log.read_text().splitlines()] if log.is_file() else []


@pytest.mark.slow
def test_a_second_run_into_the_same_output_is_refused_while_the_first_finishes_intact(ckpt, tmp_path):
    (tmp_path / "runs").mkdir()
    out, cache = tmp_path / "runs" / "out", tmp_path / "cache"
    first = _extend_process(ckpt, out, cache, "--save-every", "10")
    try:
        _wait_for(first, lambda: len(_logged_steps(work_dir(out) / "train_log.jsonl")) >= 1)
        first.send_signal(signal.SIGSTOP)  # held mid-run (lock, work folder and all) while the others try
        try:
            for flag in ("--overwrite", "--resume"):
                cmd = [sys.executable, "-m", "longctx", "extend", str(ckpt), *ARGS, "--steps", "30", "-o", str(out),
                       "--cache-dir", str(cache), flag]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                assert r.returncode == 2, (r.stdout, r.stderr[-3000:])
                assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
                assert f"output '{out}' is being written by process {first.pid}" in r.stderr, r.stderr
        finally:
            first.send_signal(signal.SIGCONT)
        first.wait(timeout=900)
    finally:
        first.kill()
    assert first.returncode == 0, (tmp_path / "output.log").read_text()[-3000:]
    assert _logged_steps(out / "train_log.jsonl") == list(range(1, 31))
    assert sorted(p.name for p in work_dir(out).glob("*step-*")) == ["step-000030"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["out", "out.train"]  # no lock file left


@pytest.mark.slow
def test_a_killed_run_does_not_block_its_resume(ckpt, tmp_path):
    (tmp_path / "runs").mkdir()
    out, cache = tmp_path / "runs" / "out", tmp_path / "cache"
    run = _extend_process(ckpt, out, cache, "--save-every", "1", steps=12)
    try:
        _wait_for(run, lambda: any(work_dir(out).glob("step-*/state.json")))
        run.send_signal(signal.SIGKILL)
        run.wait()
    finally:
        run.kill()
    assert run.returncode == -signal.SIGKILL and not out.exists()
    r = CliRunner().invoke(cli, ["extend", str(ckpt), *ARGS, "--steps", "12", "--save-every", "1", "-o", str(out),
                                 "--cache-dir", str(cache), "--resume"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "resumed from" in r.output
    assert _logged_steps(out / "train_log.jsonl") == list(range(1, 13))
    assert sorted(p.name for p in out.parent.iterdir()) == ["out", "out.train"]


@pytest.mark.slow
def test_every_rank_refuses_when_the_main_one_cannot_lock(ckpt, tmp_path):
    """Under torchrun only rank 0 locks: rank 1 must stop with the same line, not train or wait forever."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
           "-m", "longctx", "extend", str(ckpt), *ARGS, "--steps", "2", "-o", str(out), "--cache-dir",
           str(tmp_path / "cache")]
    with OutputLock(out, "output"):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode != 0
    lines = [x for x in r.stderr.splitlines() if x.startswith("Error: ")]
    assert lines == [f"Error: output '{out}' is being written by process {os.getpid()} on {os.uname().nodename} "
                     f"(lock {tmp_path / '.out.longctx-lock'}); wait for it to finish, or choose another -o"] * 2, \
        r.stderr[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- invariant 8: a full disk during a save is one line, nothing left behind ------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """`mount(size)`: a tmpfs of `size` at tmp_path/disk (root only); `grow(size)` remounts it larger."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = []

    def mount(size: str) -> Path:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.decode().strip()}")
        mounted.append(disk)
        return disk

    def grow(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)

    yield mount, grow
    for d in mounted:
        subprocess.run(["umount", str(d)], check=True)


@pytest.mark.slow
def test_a_full_disk_during_a_save_keeps_the_last_state_and_leaves_no_temporary(ckpt, tmp_path, small_disk):
    """A step folder is ~7 MB here: on 10 MB the save after step 1 fits, the one after step 2 (while step 1's is
    still there) does not."""
    mount, grow = small_disk
    disk = mount("10m")
    argv = ["extend", str(ckpt), *ARGS, "--steps", "3", "--save-every", "1", "-o", str(disk / "out"),
            "--cache-dir", str(tmp_path / "cache")]
    r = CliRunner().invoke(cli, argv)
    work = disk / "out.train"
    one_error_line_after_training(r, f"could not save the training state after step 2 in {work} (No space left on "
                                     "device)", "step-000001 is kept", "--resume")
    assert sorted(p.name for p in disk.iterdir()) == ["out.train"]
    assert sorted(p.name for p in work.iterdir()) == [".longctx-output", "settings.json", "step-000001",
                                                      "train_log.jsonl"]
    assert (work / "step-000001" / "state.json").is_file()
    grow("64m")  # space freed: the run goes on from step 1
    r = CliRunner().invoke(cli, [*argv, "--resume"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert f"resumed from {work / 'step-000001'} (step 1" in r.output
    assert _logged_steps(disk / "out" / "train_log.jsonl") == [1, 2, 3]


@pytest.mark.slow
def test_a_full_disk_while_writing_the_output_keeps_the_trained_state(ckpt, tmp_path, small_disk):
    """On 8 MB the final state (~7 MB) fits and the output checkpoint (~2 MB) does not."""
    mount, grow = small_disk
    disk = mount("8m")
    argv = ["extend", str(ckpt), *ARGS, "--steps", "1", "-o", str(disk / "out"), "--cache-dir", str(tmp_path / "cache")]
    r = CliRunner().invoke(cli, argv)
    one_error_line_after_training(r, f"could not write the output '{disk / 'out'}' (No space left on device)",
                                  "rerun with --resume to write the output")
    assert sorted(p.name for p in disk.iterdir()) == ["out.train"]  # no temporary output folder
    assert (disk / "out.train" / "step-000001" / "state.json").is_file()
    grow("64m")
    r = CliRunner().invoke(cli, [*argv, "--resume"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "had already finished all 1 steps; writing the output" in r.output
    assert _logged_steps(disk / "out" / "train_log.jsonl") == [1]


# --- checks before work: what write_output would refuse is refused before the first step ----------------------


def _with_config(ckpt: Path, root: Path, **changes) -> Path:
    copy = root / "ckpt"
    shutil.copytree(ckpt, copy)
    cfg = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**cfg, **changes}))
    return copy


@pytest.mark.parametrize("case", ["integer dtype", "unknown dtype", "name too long",
                                  pytest.param("read-only place", marks=pytest.mark.slow)])  # mount: a process
def test_what_the_output_would_refuse_is_refused_before_training(ckpt, tmp_path, case):
    source, out = ckpt, tmp_path / "place" / "out"
    out.parent.mkdir()
    expected = ""
    if case == "integer dtype":
        source, expected = _with_config(ckpt, tmp_path, dtype="int8"), "dtype 'int8' is not a floating-point"
    elif case == "unknown dtype":
        source, expected = _with_config(ckpt, tmp_path, dtype="Tensor"), "dtype 'Tensor' is not a floating-point"
    elif case == "name too long":
        out, expected = out.parent / ("x" * 240), "is too long"  # its lock file (255) fits, not its temporary
    else:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(out.parent)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.decode().strip()}")
        expected = "Read-only file system"
    try:
        r = CliRunner().invoke(cli, ["extend", str(source), *ARGS, "--steps", "1", "-o", str(out),
                                     "--cache-dir", str(tmp_path / "cache")])
        one_line_exit_2(r, expected)
        assert "step/s" not in r.output and sorted(p.name for p in out.parent.iterdir()) == []
        assert not (tmp_path / "cache").exists()  # refused before the data was even tokenized
    finally:
        if case == "read-only place":
            subprocess.run(["umount", str(out.parent)], check=True)


# --- the token budget is packed exactly ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """400 documents of 50-400 words: far more than a 2-step, 512-token budget."""
    words = "river stone lamp garden window silver copper violet morning winter harbor meadow candle forest".split()
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("corpus") / "big.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(words, int(rng.integers(50, 400))))}) + "\n"
                            for _ in range(400)))
    return path


@pytest.mark.slow
def test_a_budget_smaller_than_the_corpus_trains_no_padding(ckpt, big_corpus, tmp_path):
    out = tmp_path / "out"
    args = [a if a != "synthetic:mixed" else str(big_corpus) for a in ARGS]
    r = CliRunner().invoke(cli, ["extend", str(ckpt), *args, "--steps", "2", "-o", str(out),
                                 "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, (r.output, r.exception)
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [(e["step"], e["padding"]) for e in log] == [(1, 0.0), (2, 0.0)]
    assert "into 2 sequences of 512 tokens (0.0% padding)" in r.output


@pytest.mark.slow
def test_split_packing_cuts_the_stream_at_the_budget(ckpt, big_corpus, tmp_path):
    """Every sequence full, every token of them from the corpus once, as many sequences as the budget holds."""
    from transformers import AutoTokenizer

    from longctx.extend.packing import build_packed_dataset

    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    for num_tokens, sequences in ((1024, 2), (1000, 2), (5 * 512 + 1, 6)):
        ds = build_packed_dataset([str(big_corpus)], tokenizer, 512, num_tokens=num_tokens, cache_dir=tmp_path,
                                  log=lambda m: None)
        assert len(ds) == sequences and ds.stats["padding_fraction"] == 0.0
        assert ds.stats["tokens_packed"] == sequences * 512 < ds.stats["tokens"]
        assert all(int(ds.get(i)["tokens"]) == 512 for i in range(len(ds)))
