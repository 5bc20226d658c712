"""What a verb may write, replace or remove (`longctx.core.files`): only folders longctx made, never its inputs,
never the current directory; leftovers of killed writers are removed by the next writer."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.core.files import OWNER_FILE, atomic_dir, mark_output, open_atomic, output_kind


def run(*args, **kw):
    return CliRunner().invoke(cli, [*map(str, args)], **kw)


def one_line_exit_2(r, message):
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "Traceback" not in r.output


def _dead_pid() -> int:
    """The PID of a process that has ended (and, being ours, was reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_extend_resume_never_removes_a_work_folder_longctx_did_not_make(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    work = tmp_path / "out.train"
    work.mkdir()
    (work / "thesis.tex").write_text("months of work")
    r = run("extend", tiny_checkpoint, "--rope-base", "1e5", "--seq-len", "512", "--data", "synthetic:mixed",
            "--steps", "1", "-o", out, "--resume", "--cache-dir", tmp_path / "cache")
    one_line_exit_2(r, f"output '{work}' exists and was not made by longctx")
    assert [p.name for p in work.iterdir()] == ["thesis.tex"] and not out.exists()


def test_extend_output_inside_its_input_is_refused(tiny_checkpoint, tmp_path):
    out = tiny_checkpoint / "extended"
    before = sorted(p.name for p in tiny_checkpoint.iterdir())
    r = run("extend", tiny_checkpoint, "--rope-base", "1e5", "--seq-len", "512", "--data", "synthetic:mixed",
            "--steps", "1", "-o", out, "--cache-dir", tmp_path / "cache")
    one_line_exit_2(r, "lies inside the input checkpoint")
    assert sorted(p.name for p in tiny_checkpoint.iterdir()) == before


def test_yarn_overwrite_replaces_a_longctx_checkpoint_and_nothing_else(tiny_checkpoint, tmp_path):
    out = tmp_path / "scaled"
    assert run("yarn", tiny_checkpoint, "--factor", "2", "-o", out).exit_code == 0
    assert output_kind(out) == "checkpoint"
    r = run("yarn", tiny_checkpoint, "--factor", "4", "-o", out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert '"factor": 4.0' in (out / "config.json").read_text()
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    one_line_exit_2(run("yarn", tiny_checkpoint, "--factor", "4", "-o", tmp_path / "photos", "--overwrite"),
                    "exists and was not made by longctx")
    assert [p.name for p in (tmp_path / "photos").iterdir()] == ["a.jpg"]
    # a RULER run folder is a longctx output too, but not a checkpoint: never replaced by one
    (tmp_path / "run").mkdir()
    mark_output(tmp_path / "run", "ruler run")
    (tmp_path / "run" / "scores.json").write_text("{}")
    one_line_exit_2(run("yarn", tiny_checkpoint, "--factor", "4", "-o", tmp_path / "run", "--overwrite"),
                    "is a longctx ruler run, not a checkpoint")


def test_yarn_into_the_current_directory_is_refused(tiny_checkpoint, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    mark_output(here, "checkpoint")
    monkeypatch.chdir(here)
    one_line_exit_2(run("yarn", tiny_checkpoint, "--factor", "2", "-o", ".", "--overwrite"),
                    "output '.' holds the current directory")
    monkeypatch.chdir(tmp_path)
    one_line_exit_2(run("yarn", tiny_checkpoint, "--factor", "2", "-o", tmp_path, "--overwrite"),
                    "holds the current directory")
    assert here.is_dir() and [p.name for p in here.iterdir()] == [OWNER_FILE]


@pytest.mark.slow
def test_a_verb_that_only_adds_files_may_write_into_the_current_directory(tiny_checkpoint, tmp_path, monkeypatch):
    here = tmp_path / "report"
    here.mkdir()
    monkeypatch.chdir(here)
    r = run("sinks", tiny_checkpoint, "--tokens", "256", "-o", ".")
    assert r.exit_code == 0, r.output
    assert (here / "sinks.json").is_file() and output_kind(here) == "sinks measurement"


def test_an_empty_folder_is_a_valid_output(tiny_checkpoint, tmp_path):
    (tmp_path / "empty").mkdir()
    assert run("yarn", tiny_checkpoint, "--factor", "2", "-o", tmp_path / "empty").exit_code == 0
    assert output_kind(tmp_path / "empty") == "checkpoint"


@pytest.mark.slow
def test_leftovers_of_a_killed_writer_are_removed_by_the_next_one(tmp_path):
    host, dead = socket.gethostname(), _dead_pid()
    stale_dir = tmp_path / f".out.tmp-{host}-{dead}-abc123"
    stale_dir.mkdir()
    (stale_dir / "model.safetensors").write_bytes(b"0" * 1024)
    stale_old = tmp_path / f".out.old-{host}-{dead}-abc123"
    stale_old.mkdir()
    stale_file = tmp_path / f".scores.json.tmp-{host}-{dead}-xyz"
    stale_file.write_text("{")
    live = tmp_path / f".out.tmp-{host}-{os.getppid()}-live"  # a live process's work in progress
    live.mkdir()
    elsewhere = tmp_path / f".out.tmp-other-host-{dead}-abc"  # another machine's (shared file system)
    elsewhere.mkdir()
    with atomic_dir(tmp_path / "out", "checkpoint") as tmp:
        (tmp / "config.json").write_text("{}")
    with open_atomic(tmp_path / "scores.json") as f:
        f.write("{}")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([live.name, elsewhere.name, "out", "scores.json"])


def test_written_files_get_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out", "checkpoint") as tmp:
            (tmp / "weights.bin").write_bytes(b"x")
            os.chmod(tmp / "weights.bin", 0o600)  # as safetensors leaves them
        with open_atomic(tmp_path / "task.jsonl") as f:
            f.write("{}\n")
    finally:
        os.umask(old)
    for path in (tmp_path / "out" / "weights.bin", tmp_path / "task.jsonl", tmp_path / "out" / OWNER_FILE):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755


def test_recipe_refuses_an_input_inside_its_own_output(tiny_checkpoint, tmp_path):
    """The checkpoint of an earlier run's YaRN stage, reused by a recipe writing into that same run: a rerun of
    the stage would remove its folder, input and all. Refused when planning; --dry-run says so."""
    import shutil

    out = tmp_path / "runs"
    inside = out / "base" / "yarn" / "base-yarn"
    shutil.copytree(tiny_checkpoint, inside)
    (out / "base" / "yarn" / "stage.json").write_text("{}")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"models": {"base": {"checkpoint": str(inside)}}, "yarn": {"factor": 2}}))
    for extra in (["--dry-run"], []):
        r = run("run", recipe, "-o", out, *extra)
        one_line_exit_2(r, f"models.base.checkpoint '{inside}' lies inside this run's output folder")
    assert (inside / "config.json").is_file()
