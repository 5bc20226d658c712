"""`longctx ruler prepare`: the CLI over `ruler_tasks.prepare` (bad input: one line, exit 2, nothing written)."""

import json

import pytest
from click.testing import CliRunner
from ruler_helpers import FIXTURE_DATA

from longctx.cli.main import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.slow
def test_prepare_writes_task_files_and_reuses_them(reference_tokenizer_dir, tmp_path):
    out = tmp_path / "tasks"
    args = ["ruler", "prepare", "--tokenizer", reference_tokenizer_dir, "--lengths", "2k,3000", "--tasks",
            "niah_single_1,vt", "--samples", "2", "--data-dir", FIXTURE_DATA, "-o", out]
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert "lengths: 2048, 3000" in r.output and "4 task files (0 reused)" in r.output
    for length in (2048, 3000):
        rows = [json.loads(x) for x in (out / str(length) / "vt.jsonl").read_text().splitlines()]
        assert len(rows) == 2 and all(row["length"] <= length for row in rows)
    assert json.loads((out / "manifest.json").read_text())
    again = run(*args)
    assert again.exit_code == 0 and "4 task files (4 reused)" in again.output


@pytest.mark.parametrize("extra,message", [
    (["--tasks", "niah_single_9"], "niah_single_9"),
    (["--lengths", "512"], "at least"),
    (["--samples", "0"], "0 is not in the range x>=1"),
    (["--lengths", "4k,4k"], "repeats 4096"),
    (["--tokenizer", "{tmp}/nowhere"], "does not exist"),
    (["--tokenizer", "{tmp}"], "has no tokenizer files"),
    (["--data-dir", "{tmp}/lfs"], "LFS"),
])
def test_prepare_bad_input(extra, message, reference_tokenizer_dir, tmp_path):
    lfs = tmp_path / "lfs"
    lfs.mkdir()
    for name in ("essay.json", "squad.json", "hotpotqa.json"):
        (lfs / name).write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 1\n")
    out = tmp_path / "out"
    args = {"--tokenizer": str(reference_tokenizer_dir), "--lengths": "4k", "--tasks": "qa_1", "--samples": "1",
            "--data-dir": str(FIXTURE_DATA), "-o": str(out)}
    for key, value in zip(extra[::2], extra[1::2]):
        args[key] = value.format(tmp=tmp_path)
    r = run("ruler", "prepare", *[x for kv in args.items() for x in kv])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()
