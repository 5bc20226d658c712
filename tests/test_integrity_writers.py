"""Invariant 2 of issue 29, one writer per output, for every verb: each takes its output the way `ruler` does,
checked (never a folder of the user's own files), owned (`.longctx-output`) and locked (`OutputLock`, beside the
output, from its check to the verb's end). A lock held by a live process refuses the next writer in one line that
names the holder; one left by a kill -9'd process never blocks. The table is derived from the registered commands:
a new verb that writes an output must join it (or be exempted, with the reason).

Also: a dangling -o symbolic link and a folder-shaped `.longctx-output` get a true one-line message, a file output
never overwrites what its verb reads, and `compare` refuses one run given twice."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner
from test_convert import write_official
from test_report import _run, _scores_doc

from longctx.cli.main import cli
from longctx.core.files import OWNER_FILE
from longctx.eval.runner import run_ruler
from longctx.eval.settings import RulerRunSettings
from longctx.eval.shards import shard_dir

PER_TASK = {"vt": {4096: 90.0, 8192: 60.0}}
# Holds `OutputLock(argv[1])` until killed; says so on stdout once it holds it.
HOLDER = ("import sys, time\nfrom longctx.core.locks import OutputLock\nlock = OutputLock(sys.argv[1], 'output')\n"
          "print('held', flush=True)\ntime.sleep(3600)\n")


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_exit_2(r, *fragments: str) -> None:
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.output
    for fragment in fragments:
        assert fragment in r.stderr, (fragment, r.stderr)


def listing(root: Path) -> dict[str, bytes | None]:
    """Every entry under `root` (links as links): the world a refusal must leave as it was."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            found[str(p.relative_to(root))] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return found


def registered_commands(group: click.Group = cli, prefix: str = "") -> set[str]:
    names = set()
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            names |= registered_commands(cmd, f"{prefix}{name} ")
        else:
            names.add(prefix + name)
    return names


class World:
    """The inputs of every verb, made once: checkpoints, a RULER run, a recipe."""

    def __init__(self, root: Path, tiny: Path, long: Path, tokenizer: Path):
        self.root, self.tiny, self.long, self.tokenizer = root, tiny, long, tokenizer
        self.official = root / "official"
        write_official(self.official, "headwise", 4, 2)
        self.run, _ = _run(root, "ruler-run", _scores_doc("tiny", "fp", PER_TASK))
        self.recipe = root / "recipe.yaml"
        self.recipe.write_text(yaml.safe_dump({"models": {"m": {"checkpoint": str(tiny)}}, "yarn": {"factor": 2}}))


    @functools.cached_property
    def shards(self) -> list[str]:
        """The two shards of a RULER run (made when first asked: the run starts processes)."""
        for i in (1, 2):
            run_ruler(RulerRunSettings(checkpoint=str(self.long), lengths=[1024], tasks="vt", samples=2, backend="hf",
                                       output=str(self.root / "sharded"), shard=f"{i}/2"), progress=False)
        return [str(shard_dir(self.root / "sharded", f"{i}/2")) for i in (1, 2)]


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_checkpoint, reference_tokenizer_dir):
    from longctx.init.presets import write_tiny_qwen3

    root = tmp_path_factory.mktemp("world")
    long = write_tiny_qwen3(root / "tiny4k", reference_tokenizer_dir, max_position_embeddings=4096)
    return World(root, tiny_checkpoint, long, reference_tokenizer_dir)


# Each verb that writes an output: the arguments of a cheap valid command writing to `out`.
WRITERS: dict[str, Callable[[World, Path], list]] = {
    "yarn": lambda w, out: ["yarn", w.tiny, "--factor", "2", "-o", out],
    "init": lambda w, out: ["init", out, "--preset", "tiny", "--attention", "baseline", "--tokenizer", w.tokenizer],
    "convert": lambda w, out: ["convert", w.official, out, "--from", "official"],
    "sinks": lambda w, out: ["sinks", w.tiny, "--tokens", "128", "--length", "64", "--no-plot", "-o", out],
    "extend": lambda w, out: ["extend", w.tiny, "--rope-base", "1e5", "--seq-len", "512", "--data",
                              "synthetic:mixed", "--steps", "1", "--tokens-per-step", "512", "-o", out,
                              "--cache-dir", w.root / "cache"],
    "compare": lambda w, out: ["compare", w.run, "-o", out],
    "export": lambda w, out: ["export", w.run, "--format", "ruler", "-o", out],
    "export lm-eval": lambda w, out: ["export", w.run, "--format", "lm-eval", "-o", out],
    "run": lambda w, out: ["run", w.recipe, "-o", out],
    "ruler prepare": lambda w, out: ["ruler", "prepare", "--tokenizer", w.tokenizer, "--lengths", "1k", "--tasks",
                                     "vt", "--samples", "2", "-o", out],
    "ruler run": lambda w, out: ["ruler", "run", w.long, "--lengths", "1k", "--tasks", "vt", "--samples", "1",
                                 "--backend", "hf", "--no-plot", "-o", out],
    "ruler merge": lambda w, out: ["ruler", "merge", out, "--no-plot",
                                   *(a for d in w.shards for a in ("--shard-dir", d))],
}
EXEMPT = {"info": "reads a checkpoint and prints; it writes nothing"}
# What each verb calls its output in its messages (default "output").
WHAT = {"ruler run": "run directory", "ruler merge": "run directory"}
# How a verb whose output is one file refuses a folder there, and a run directory refuses a foreign folder.
FOLDER_REFUSAL = {"export lm-eval": "is a folder; lm-eval results are one JSON file",
                  "ruler run": "exists and is not a longctx ruler run directory",
                  "ruler merge": "exists and is not a longctx ruler run directory"}
SLOW = {"run"}  # runs a recipe
INPUTS_START_PROCESSES = {"ruler merge"}  # its shards are made by RULER runs


def cases(names=WRITERS, slow_ones=()):
    return [pytest.param(n, marks=pytest.mark.slow) if n in {*slow_ones, *INPUTS_START_PROCESSES} else n
            for n in sorted(names)]


def test_every_registered_command_is_in_the_table_or_exempt():
    verbs = {name.split(" lm-eval")[0] for name in WRITERS}
    assert registered_commands() == verbs | set(EXEMPT), registered_commands() ^ (verbs | set(EXEMPT))


@pytest.mark.parametrize("verb", cases())
def test_a_folder_of_the_users_files_is_refused_and_untouched(verb, world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = listing(tmp_path)
    r = invoke(*WRITERS[verb](world, out))
    one_line_exit_2(r, FOLDER_REFUSAL.get(verb, f"{WHAT.get(verb, 'output')} '{out}' exists and was not made by "
                                                f"longctx (it has no {OWNER_FILE})"))
    assert listing(tmp_path) == before


@pytest.mark.parametrize("verb", cases())
def test_a_folder_shaped_marker_is_named_as_such(verb, world, tmp_path):
    out = tmp_path / "out"
    (out / OWNER_FILE).mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    before = listing(tmp_path)
    r = invoke(*WRITERS[verb](world, out))
    one_line_exit_2(r, FOLDER_REFUSAL.get(verb, f"its {OWNER_FILE} is a folder, not the file longctx marks its "
                                                "outputs with"))
    assert listing(tmp_path) == before


@pytest.mark.parametrize("verb", cases())
def test_a_dangling_output_link_is_named_as_such(verb, world, tmp_path):
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "gone")
    before = listing(tmp_path)
    r = invoke(*WRITERS[verb](world, out))
    what = "-o" if verb == "export lm-eval" else WHAT.get(verb, "output")
    one_line_exit_2(r, f"{what} '{out}' is a symbolic link to '{tmp_path / 'gone'}', which does not exist")
    assert listing(tmp_path) == before


def hold(out: Path) -> subprocess.Popen:
    """A process that holds the lock on `out` (once this returns)."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


@pytest.mark.parametrize("verb", cases())
@pytest.mark.slow
def test_an_output_another_process_writes_is_refused_naming_it(verb, world, tmp_path):
    out = tmp_path / "out.json" if verb == "export lm-eval" else tmp_path / "out"
    holder = hold(out)
    try:
        before = listing(tmp_path)
        r = invoke(*WRITERS[verb](world, out))
        one_line_exit_2(r, f"{WHAT.get(verb, 'output')} '{out}' is being written by process {holder.pid} on "
                           f"{os.uname().nodename} (lock {tmp_path / f'.{out.name}.longctx-lock'})")
        assert listing(tmp_path) == before
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("verb", cases(slow_ones=SLOW))
@pytest.mark.slow
def test_a_lock_left_by_a_killed_process_never_blocks(verb, world, tmp_path):
    out = tmp_path / "out.json" if verb == "export lm-eval" else tmp_path / "out"
    holder = hold(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / f".{out.name}.longctx-lock").is_file()  # left behind, no longer locked
    r = invoke(*WRITERS[verb](world, out))
    assert r.exit_code == 0, (r.output, r.exception)
    assert out.exists()
    # released as the verb ended: the lock file is gone, and nothing else is left beside the output
    beside = [out.name, f"{out.name}.train"] if verb == "extend" else [out.name]  # extend's work folder
    assert sorted(p.name for p in tmp_path.iterdir()) == beside, list(tmp_path.iterdir())


def holds(lock: Path, pid: int) -> bool:
    """Whether the lock file `lock` names process `pid` as its holder."""
    try:
        return lock.read_text().startswith(f"{pid} ")
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_two_writers_into_one_output_exactly_one_writes(world, tmp_path):
    """Two `ruler prepare` processes into one -o: the second, started while the first is writing (held there
    with SIGSTOP, so that the two overlap whatever the machine's speed), is refused naming the first and writes
    nothing; the first, let go, finishes intact."""
    out = tmp_path / "tasks"
    lock = tmp_path / ".tasks.longctx-lock"
    argv = [sys.executable, "-m", "longctx", "ruler", "prepare", "--tokenizer", str(world.tokenizer), "--lengths",
            "4k", "--tasks", "vt", "--samples", "300", "-o", str(out)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not holds(lock, first.pid):
            assert first.poll() is None, first.communicate()
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)
        assert first.poll() is None, "the first finished before it could be held"
        second = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stderr == (f"Error: output '{out}' is being written by process {first.pid} on "
                                 f"{os.uname().nodename} (lock {lock}); wait for it to finish, or choose another -o\n")
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-3000:]
    assert "1 task files (0 reused)" in stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["4096/vt.jsonl"]["samples"] == 300
    assert len((out / "4096" / "vt.jsonl").read_text().splitlines()) == 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks"]


# --- file outputs never overwrite what the verb reads -----------------------------------------------------------


def test_export_never_overwrites_the_run_it_reads(world, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(world.run, run)
    before = listing(run)
    r = invoke("export", run, "--format", "lm-eval", "-o", run / "results.json", "--overwrite")
    one_line_exit_2(r, f"output '{run / 'results.json'}' lies inside the run '{run}'")
    os.link(run / "results.json", tmp_path / "linked.json")  # the same file under another name
    r = invoke("export", run, "--format", "lm-eval", "-o", tmp_path / "linked.json", "--overwrite")
    one_line_exit_2(r, f"output '{tmp_path / 'linked.json'}' is the run's results '{run / 'results.json'}' "
                       "(the same file)")
    assert listing(run) == before


def test_compare_never_writes_over_a_sinks_file_it_reads(world, tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "sinks.json").write_text("{}")
    r = invoke("compare", world.run, "--sinks", out / "sinks.json", "-o", out)
    one_line_exit_2(r, f"output '{out}' would hold the sinks file '{out / 'sinks.json'}'")


# --- compare refuses one run given twice ------------------------------------------------------------------------


def test_compare_refuses_the_same_run_twice(world, tmp_path):
    run = world.run
    (tmp_path / "link").symlink_to(run)
    for args, message in [
            ([run, run], f"'{run}' is the run '{run}' again (the same folder); give each run once"),
            ([run, tmp_path / "link"], f"'{tmp_path / 'link'}' is the run '{run}' again (the same folder)")]:
        r = invoke("compare", *args)
        one_line_exit_2(r, message)
    # the baseline named again as one of the runs is that run, not a second one
    other, _ = _run(tmp_path, "other", _scores_doc("other", "fp2", {"vt": {4096: 50.0, 8192: 40.0}}))
    assert invoke("compare", run, other, "--baseline", tmp_path / "link").exit_code == 0
