"""`longctx extend --resume` reads `OUT.train/` as untrusted input: no file in it runs code when loaded.

Stock torch.distributed.checkpoint unpickles `dcp/.metadata` with plain pickle and its non-tensor
entries with torch.load(weights_only=False); longctx/extend/state.py loads both restrictedly. A tiny
run (1k vocabulary, 3 steps of one 512-token sequence) is interrupted after its first save; each test
plants something in a fresh copy of that work folder and resumes through the CLI.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil

import pytest
import torch
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.extend import loop
from longctx.extend.loop import work_dir
from longctx.init.checkpoint import init_checkpoint
from longctx.init.settings import InitSettings

# every test resumes a real `extend` run (its tokenize workers are processes)
pytestmark = pytest.mark.slow


class _Interrupted(Exception):
    pass


class _Touch:
    """Unpickling it creates `path`: os.system, or builtins.exec."""

    def __init__(self, path, via="system"):
        self.path, self.via = str(path), via

    def __reduce__(self):
        if self.via == "exec":
            return exec, (f"open({self.path!r}, 'w').close()",)
        return os.system, (f"touch '{self.path}'",)


@pytest.fixture(autouse=True)
def _no_progress_bars():
    """transformers' "Loading weights" bar would be a second stderr line of an otherwise one-line error."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    yield
    hf_logging.enable_progress_bar()


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """(argv, work folder, pristine copy of it): step-000001 saved, killed before step 2 was."""
    root = tmp_path_factory.mktemp("trust")
    ckpt = root / "ckpt"
    init_checkpoint(InitSettings(output=str(ckpt), preset="tiny", attention="baseline", tokenizer="bpe", vocab_size=1024,
                                 config={"max_position_embeddings": 256}))
    out = root / "out"
    argv = ["extend", str(ckpt), "--rope-base", "1e5", "--seq-len", "512", "--data", "synthetic:mixed", "--steps", "3",
            "--tokens-per-step", "512", "--save-every", "1", "-o", str(out), "--cache-dir", str(root / "cache")]
    real_save = loop.save_training_state

    def save_then_crash(*args):
        path = real_save(*args)
        if args[5] == 1:
            raise _Interrupted
        return path

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "save_training_state", save_then_crash)
        r = CliRunner().invoke(cli, argv)
    assert isinstance(r.exception, _Interrupted), (r.output, r.exception)
    work = work_dir(out)
    assert sorted(p.name for p in work.glob("*step-*")) == ["step-000001"]
    pristine = root / "pristine.train"
    shutil.copytree(work, pristine)
    return argv, work, pristine


@pytest.fixture
def saved(interrupted_run):
    """(argv, step folder) of a fresh copy of the interrupted run's work folder."""
    argv, work, pristine = interrupted_run
    shutil.rmtree(work)
    shutil.rmtree(work.with_suffix(""), ignore_errors=True)  # the output of a resume that went through
    shutil.copytree(pristine, work)
    return argv, work / "step-000001"


def _resume_is_refused_in_one_line(argv, *names):
    r = CliRunner().invoke(cli, [*argv, "--resume"])
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stderr.startswith("Error: --resume: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.output and "weights_only" not in r.stderr, r.output
    assert "delete " in r.stderr and "--overwrite" in r.stderr, r.stderr
    for name in names:
        assert name in r.stderr, r.stderr
    return r.stderr


@pytest.mark.parametrize("via, global_name", [("system", "posix.system"), ("exec", "builtins.exec")])
def test_planted_dcp_metadata_is_refused_and_never_run(saved, tmp_path, via, global_name):
    argv, step = saved
    sentinel = tmp_path / "SENTINEL"
    (step / "dcp" / ".metadata").write_bytes(pickle.dumps(_Touch(sentinel, via)))
    _resume_is_refused_in_one_line(argv, str(step / "dcp" / ".metadata"), f"global '{global_name}'",
                                   "it was not written by longctx")
    assert not sentinel.exists()


def test_planted_non_tensor_dcp_entry_is_refused_and_never_run(saved, tmp_path):
    """The attacker rewrites a shard and the metadata together: an optimizer hyperparameter's bytes become a
    torch.save of a code-running object (the metadata itself holds only allowed types)."""
    argv, step = saved
    sentinel = tmp_path / "SENTINEL"
    meta_path, shard = step / "dcp" / ".metadata", step / "dcp" / "__0_0.distcp"
    metadata = pickle.loads(meta_path.read_bytes())  # the test trusts the file it just made
    index = next(i for i in metadata.storage_data if i.fqn == "optim.param_groups.0.lr")
    payload = io.BytesIO()
    torch.save(_Touch(sentinel), payload)
    info = metadata.storage_data[index]
    info.offset, info.length = shard.stat().st_size, len(payload.getvalue())
    with open(shard, "ab") as f:
        f.write(payload.getvalue())
    meta_path.write_bytes(pickle.dumps(metadata))
    _resume_is_refused_in_one_line(argv, str(shard), "global 'posix.system'")
    assert not sentinel.exists()


@pytest.mark.parametrize("damage", ["truncated", "missing", "not a pickle"])
def test_damaged_dcp_metadata_is_one_line(saved, damage):
    argv, step = saved
    meta = step / "dcp" / ".metadata"
    if damage == "truncated":
        meta.write_bytes(meta.read_bytes()[: meta.stat().st_size // 2])
    elif damage == "missing":
        meta.unlink()
    else:
        meta.write_text("{}")
    _resume_is_refused_in_one_line(argv, str(meta), "is missing" if damage == "missing" else "damaged or truncated")


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_damaged_dcp_shard_is_one_line(saved, damage):
    argv, step = saved
    shard = step / "dcp" / "__0_0.distcp"
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        _resume_is_refused_in_one_line(argv, str(step / "dcp"), "damaged or truncated")
    else:
        shard.unlink()
        _resume_is_refused_in_one_line(argv, str(shard), "is missing")


@pytest.mark.parametrize("name", ["scheduler.pt", "rng-0.pt"])
def test_planted_or_truncated_scheduler_and_rng_files_are_one_line_without_torchs_text(saved, tmp_path, name):
    """Both are torch.load(weights_only=True) already: the refusal must still be one line, and never torch's
    advice to retry with weights_only=False."""
    argv, step = saved
    sentinel = tmp_path / "SENTINEL"
    torch.save(_Touch(sentinel), step / name)
    _resume_is_refused_in_one_line(argv, str(step / name), "global 'posix.system'")
    assert not sentinel.exists()
    buf = io.BytesIO()
    torch.save({"torch": torch.zeros(8)}, buf)
    (step / name).write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    _resume_is_refused_in_one_line(argv, str(step / name), "damaged or truncated")


def test_stale_tmp_step_folders_are_removed_by_the_next_save(saved):
    """Killed while saving step 2 (its `.tmp-step-000002/` stays), resumed with --save-every 3: the only
    save is step 3's, which removes the stale folder too."""
    argv, step = saved
    stale = step.parent / ".tmp-step-000002"
    (stale / "dcp").mkdir(parents=True)
    (stale / "dcp" / "__0_0.distcp").write_bytes(b"\0" * 1024)
    r = CliRunner().invoke(cli, [*argv, "--resume", "--save-every", "3"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "resumed from" in r.output and "step 1" in r.output, r.output
    assert sorted(p.name for p in step.parent.glob("*step-*")) == ["step-000003"]
