"""A RULER run split into shards (`--shard I/N`) and put together (`longctx ruler merge`): the same task files,
predictions (sha256) and scores as the run done in one go; shards of another run, split or checkpoint, missing,
twice or unfinished are one line each; a shard resumes; compare and export read a merged run."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.core.kinds import KindError, Shard
from longctx.eval.runner import run_ruler
from longctx.eval.settings import MergeSettings, RulerRunSettings
from longctx.eval.shards import merge_run, owner, samples_of, shard_dir
from longctx.report.run import write_report

TASKS = "niah_single_1,vt"
SAMPLES = 5


def settings(checkpoint, out, **over) -> RulerRunSettings:
    return RulerRunSettings(**{"checkpoint": str(checkpoint), "lengths": [1024], "output": str(out), "tasks": TASKS,
                               "samples": SAMPLES, "backend": "hf", "plot": False, **over})


def files(run: Path) -> dict[str, str]:
    """sha256 of every task and prediction file of a run directory."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for sub in ("tasks", "pred") for p in sorted((run / sub).rglob("*.jsonl"))}


def scores(run: Path) -> list[dict]:
    return json.loads((run / "scores.json").read_text())["scores"]


@pytest.mark.parametrize("text, parsed", [("1/1", "1/1"), ("2/8", "2/8"), (" 3/4", "3/4"), ("04/10", "4/10")])
def test_a_shard_reads_as_i_of_n(text, parsed):
    assert Shard().parse(text) == parsed


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "2", "a/b", "1/2/3", "-1/2", "1.5/2", 3, "²/3"])
def test_a_shard_that_is_not_i_of_n_is_refused(text):
    with pytest.raises(KindError):
        Shard().parse(text)


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_every_sample_has_one_shard_and_shards_are_even_in_every_task_file(count):
    """Each task file's lines are split floor/ceil between shards, so shards take about the same time; a line's
    shard depends on its file and line only."""
    per_shard = Counter()
    for length in (4096, 8192, 131072):
        for task in ("niah_single_1", "vt", "qa_2"):
            lines = 500
            parts = [samples_of(f"{i}/{count}", length, task, lines) for i in range(1, count + 1)]
            assert set().union(*parts) == set(range(lines)) and sum(map(len, parts)) == lines
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
            for i, part in enumerate(parts, 1):
                per_shard[i] += len(part)
                assert all(owner(length, task, j, count) == i for j in part)
    assert max(per_shard.values()) - min(per_shard.values()) <= 9  # at most one more per file


@pytest.fixture(scope="module")
def whole(ruler_checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    run_ruler(settings(ruler_checkpoint, out), progress=False)
    write_report(out, plot=False)
    return out


@pytest.mark.slow
def test_shards_merged_are_the_run_done_in_one_go(ruler_checkpoint, whole, tmp_path):
    out = tmp_path / "run"
    for i in (1, 2, 3):
        r = run_ruler(settings(ruler_checkpoint, out, shard=f"{i}/3"), progress=False)
        assert r.scores_file is None and r.run_dir == shard_dir(out, f"{i}/3")
    assert sum(len((out / "shards" / f"{i}-of-3" / "pred" / "1024" / "vt.jsonl").read_text().splitlines())
               for i in (1, 2, 3)) == SAMPLES
    result = CliRunner().invoke(cli, ["ruler", "merge", str(out), "--no-plot"])
    assert result.exit_code == 0, result.output
    assert "merged 3 shards: 10 predictions" in result.output
    assert files(out) == files(whole)  # task files and predictions, byte for byte
    assert scores(out) == scores(whole)
    assert _tables(out) == _tables(whole)
    # a merged run is a run: rerun with the same settings predicts nothing and scores the same
    again = run_ruler(settings(ruler_checkpoint, out), progress=False)
    assert again.new_predictions == 0 and scores(out) == scores(whole) and files(out) == files(whole)
    # compare and export read it like any other
    compared = CliRunner().invoke(cli, ["compare", str(out)])
    assert compared.exit_code == 0 and "tiny4k" in compared.output, compared.output
    exported = CliRunner().invoke(cli, ["export", str(out), "--format", "lm-eval", "-o", str(tmp_path / "e.json")])
    assert exported.exit_code == 0, exported.output


def _tables(run: Path) -> list[str]:
    """The table lines of results.md."""
    return [x for x in (run / "results.md").read_text().splitlines() if x.startswith("|")]


@pytest.mark.slow
def test_a_stopped_shard_resumes_and_an_unfinished_run_is_not_merged(ruler_checkpoint, whole, tmp_path):
    out = tmp_path / "run"

    class Stop(Exception):
        pass

    def stop(_rec):
        raise Stop

    with pytest.raises(Stop):
        run_ruler(settings(ruler_checkpoint, out, shard="1/2"), progress=False, on_prediction=stop)
    with pytest.raises(InputError, match=r"shard\(s\) 2/2 of 2 are missing; .*--shard 2/2 -o "):
        merge_run(MergeSettings(run_dir=str(out)), lambda folder: None)
    said = []
    run_ruler(settings(ruler_checkpoint, out, shard="2/2"), progress=False, log=said.append)
    first = sum(len(samples_of("1/2", 1024, task, SAMPLES)) for task in TASKS.split(","))
    with pytest.raises(InputError, match=rf"{2 * SAMPLES - first + 1} of the run's {2 * SAMPLES} samples are "
                                         rf"predicted; not finished: shard 1/2 \(1 of {first} predicted\)"):
        merge_run(MergeSettings(run_dir=str(out)), lambda folder: None)
    assert not (out / "run.json").exists()  # nothing written
    # a shard starts by saying how far the whole run is
    assert f"shard 2/2: {2 * SAMPLES - first} of the run's {2 * SAMPLES} samples" in said[1], said
    assert said[1].endswith(f"the run has 1 of {2 * SAMPLES} predicted across its shards"), said
    r = run_ruler(settings(ruler_checkpoint, out, shard="1/2"), progress=False)
    assert (r.new_predictions, r.reused_predictions) == (first - 1, 1)
    merge_run(MergeSettings(run_dir=str(out)), lambda folder: None)
    assert files(out) == files(whole) and scores(out) == scores(whole)


@pytest.mark.slow
def test_shards_of_another_run_split_or_checkpoint_are_refused(ruler_checkpoint, tmp_path):
    base = tmp_path / "base"
    for i in (1, 2):
        run_ruler(settings(ruler_checkpoint, base, shard=f"{i}/2"), progress=False)
    one, two = (str(shard_dir(base, f"{i}/2")) for i in (1, 2))

    def refused(dirs: list[str], match: str, run_dir: Path | None = None) -> None:
        target = run_dir or tmp_path / "merged"
        r = CliRunner().invoke(cli, ["ruler", "merge", str(target), *[a for d in dirs for a in ("--shard-dir", d)]])
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1 and match in r.output, r.output
        assert not (target / "run.json").exists()

    refused([one, one], "shard 1/2 is given twice")
    refused([one], "shard(s) 2/2 of 2 are missing")
    other = tmp_path / "seed"
    run_ruler(settings(ruler_checkpoint, other, shard="2/2", seed=7), progress=False)
    refused([one, str(shard_dir(other, "2/2"))], "was made with other settings than shard 1/2")
    refused([one, str(shard_dir(other, "2/2"))], "--seed 42 -> 7")
    split3 = tmp_path / "three"
    run_ruler(settings(ruler_checkpoint, split3, shard="2/3"), progress=False)
    refused([one, str(shard_dir(split3, "2/3"))], "these shards split the run 2 and 3 ways")
    lengths = tmp_path / "lengths"
    run_ruler(settings(ruler_checkpoint, lengths, shard="2/2", tasks="vt"), progress=False)
    refused([one, str(shard_dir(lengths, "2/2"))], "predicted other task files than shard 1/2")
    copy = tmp_path / "copy"
    shutil.copytree(ruler_checkpoint, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "initializer_range": 0.03}))  # another fingerprint
    ckpt = tmp_path / "ckpt"
    run_ruler(settings(copy, ckpt, shard="2/2"), progress=False)
    refused([one, str(shard_dir(ckpt, "2/2"))], "was made for another checkpoint")
    whole_dir = tmp_path / "whole"
    shutil.copytree(base / "shards" / "1-of-2", whole_dir)
    binding = json.loads((whole_dir / "run.json").read_text())
    binding["binding"]["shard"] = None
    (whole_dir / "run.json").write_text(json.dumps(binding))
    refused([one, str(whole_dir)], "is a whole run, not a shard")
    refused([], "no shards in", run_dir=tmp_path / "empty")


@pytest.mark.slow
def test_a_recipe_runs_its_ruler_stage_as_shards_at_once(ruler_checkpoint, whole, tmp_path):
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "models": {"tiny": {"checkpoint": str(ruler_checkpoint)}},
        "ruler": {"lengths": "1k", "tasks": TASKS, "samples": SAMPLES, "backend": "hf", "plot": False, "shards": 2,
                  "checkpoints": ["model"]}}))
    r = CliRunner().invoke(cli, ["run", str(recipe), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    run = next((tmp_path / "out").rglob("scores.json")).parent
    assert sorted(p.name for p in (run / "shards").iterdir() if p.is_dir()) == ["1-of-2", "2-of-2"]
    assert files(run) == files(whole) and scores(run) == scores(whole)
