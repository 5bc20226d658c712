"""A lock file is longctx's only when longctx made it (`longctx.core.locks`): whatever else sits at a lock's path
(a link to a user's file, another user's file, a hard link, a pipe, a file of other content) is refused in one
line and left as it was; a planted lock in longctx's shape signals no process that is not one longctx started."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.core.locks import LOCK_FILE
from longctx.core.processes import start_time

PRECIOUS = "the user's notes\n"


def _lock_of(out):
    return out.parent / f".{out.name}{LOCK_FILE}"


def _link_to_users_file(lock, tmp_path):
    (tmp_path / "notes.txt").write_text(PRECIOUS)
    lock.symlink_to(tmp_path / "notes.txt")


def _hard_link_to_users_file(lock, tmp_path):
    (tmp_path / "notes.txt").write_text(PRECIOUS)
    os.link(tmp_path / "notes.txt", lock)


def _other_content(lock, tmp_path):
    lock.write_text(PRECIOUS)


def _a_pipe(lock, tmp_path):
    os.mkfifo(lock)


def _another_users(lock, tmp_path):
    lock.write_text("")
    os.chown(lock, os.geteuid() + 4242, -1)


PLANTS = [_link_to_users_file, _hard_link_to_users_file, _other_content, _a_pipe]
if os.geteuid() == 0:  # only root can give a file another owner
    PLANTS.append(_another_users)


@pytest.mark.parametrize("plant", PLANTS)
def test_what_longctx_did_not_make_at_a_lock_path_is_refused_and_kept(plant, tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    lock = _lock_of(out)
    plant(lock, tmp_path)
    before = (os.lstat(lock).st_mode, os.lstat(lock).st_uid, lock.read_text() if lock.is_file() else None)
    r = CliRunner().invoke(cli, ["yarn", str(tiny_checkpoint), "--factor", "2", "-o", str(out)])
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stderr.count("\n") == 1 and "is not a lock longctx made" in r.stderr and "-o" in r.stderr, r.stderr
    assert not out.exists()
    assert (os.lstat(lock).st_mode, os.lstat(lock).st_uid, lock.read_text() if lock.is_file() else None) == before
    if (tmp_path / "notes.txt").exists():
        assert (tmp_path / "notes.txt").read_text() == PRECIOUS


@pytest.mark.slow
def test_a_planted_lock_signals_no_process_longctx_did_not_start(tiny_checkpoint, tmp_path):
    """A lock in longctx's shape, its holder dead, naming a live process of this user's that no longctx process
    started (another program, started before the holder claims to): the verb runs, and the process lives."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        started = None
        while started is None:
            started = start_time(bystander.pid)
            time.sleep(0.01)
        out = tmp_path / "out"
        _lock_of(out).write_text(f"999999999 {os.uname().nodename} 1\nchild {bystander.pid} {started}\n")
        r = CliRunner().invoke(cli, ["yarn", str(tiny_checkpoint), "--factor", "2", "-o", str(out)])
        assert r.exit_code == 0, r.output
        assert bystander.poll() is None  # not killed
        assert not _lock_of(out).exists()  # the verb took the lock over, and released it
    finally:
        bystander.kill()
        bystander.wait()


def test_nothing_is_written_inside_a_folder_another_process_is_writing(tiny_checkpoint, tmp_path):
    """A run directory being written (its lock names a live process of this machine): an output inside it is
    refused in one line, for every verb (the lock is taken by one class for all of them)."""
    busy = tmp_path / "run"
    busy.mkdir()
    other = os.getppid()  # a live process that is not this one
    _lock_of(busy).write_text(f"{other} {os.uname().nodename} {start_time(other)}\n")
    inside = busy / "yarn-out"
    r = CliRunner().invoke(cli, ["yarn", str(tiny_checkpoint), "--factor", "2", "-o", str(inside)])
    assert r.exit_code == 2, r.output
    assert f"lies in '{busy}', which process {other} on {os.uname().nodename} is writing" in r.stderr
    assert r.stderr.count("\n") == 1 and not inside.exists()
    _lock_of(busy).write_text(f"{other} {os.uname().nodename} {start_time(other) + 1}\n")  # its holder is gone
    r = CliRunner().invoke(cli, ["yarn", str(tiny_checkpoint), "--factor", "2", "-o", str(inside)])
    assert r.exit_code == 0, r.output


def test_an_ownership_mark_that_is_a_link_does_not_make_a_folder_longctxs(tiny_checkpoint, tmp_path):
    """A user's folder whose `.longctx-output` links to a real mark elsewhere is still the user's: --overwrite
    refuses it, and nothing in it is removed."""
    from longctx.core.files import OWNER_FILE, mark_output

    made = tmp_path / "made"
    made.mkdir()
    mark_output(made, "checkpoint")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text(PRECIOUS)
    (mine / OWNER_FILE).symlink_to(made / OWNER_FILE)
    r = CliRunner().invoke(cli, ["yarn", str(tiny_checkpoint), "--factor", "2", "-o", str(mine), "--overwrite"])
    assert r.exit_code == 2 and "was not made by longctx" in r.stderr and r.stderr.count("\n") == 1, r.output
    assert (mine / "notes.txt").read_text() == PRECIOUS


@pytest.mark.parametrize("plant", PLANTS[:2] + [_a_pipe] + ([_another_users] if os.geteuid() == 0 else []))
def test_a_file_longctx_appends_to_is_never_someone_elses(plant, tmp_path):
    """The files longctx appends to in place (predictions, the training log, the engine log), planted as a link to
    a user's file, a hard link, a pipe or another user's file: one line, and the user's file as it was (a torn
    last line would otherwise be cut from it, an engine log would empty it)."""
    from longctx.core.errors import InputError
    from longctx.eval.predictions import PredictionWriter

    pred = tmp_path / "pred" / "1024" / "vt.jsonl"
    pred.parent.mkdir(parents=True)
    plant(pred, tmp_path)
    writer = PredictionWriter()
    with pytest.raises(InputError, match="is not a file longctx wrote"):
        writer.write(pred, {"index": 0, "pred": "x"})
    writer.close()
    if (tmp_path / "notes.txt").exists():
        assert (tmp_path / "notes.txt").read_text() == PRECIOUS
