"""Bad input to `ruler`, `ruler prepare`, `compare`, `yarn` and `hf:` data specs: one line, exit 2, and the
output left as it was (a new one not made at all); a rerun with good settings then works. Nothing here starts
a vLLM engine: runs use `--backend hf` or are refused before a backend is used."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from ruler_helpers import FIXTURE_DATA

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.core.kinds import Count, Factor, Float, KindError, Number

LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 1\n"
# With the reference tokenizer, seed 42's first niah_single_1 sample at 1068 tokens is exactly 1068 tokens
# long: with a BOS it needs 1069, one more than a checkpoint of context 1068 has.
ROOM = 1068


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def last_line(text: str) -> str:
    """The last line of stderr, past the progress bars (\\r-separated) a generation drew before it."""
    return text.replace("\r", "\n").strip().splitlines()[-1].strip()


def refused(r, message: str) -> None:
    """Exit 2, one `Error: ...` line holding `message` on stderr, no traceback."""
    assert r.exit_code == 2, (r.output, r.exception)
    assert "Traceback" not in r.output and not isinstance(r.exception, (KeyError, TypeError, AttributeError))
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (hidden ones too) with its content's sha256 ('dir' for a folder)."""
    return {str(p.relative_to(folder)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def bos_checkpoint(tmp_path_factory, reference_tokenizer_dir):
    """A tiny Qwen3 with context 1068 whose tokenizer adds a BOS (one special token the engine adds)."""
    from longctx.init.presets import write_tiny_qwen3

    ckpt = write_tiny_qwen3(tmp_path_factory.mktemp("bos") / "tiny-bos", reference_tokenizer_dir,
                            max_position_embeddings=ROOM)
    tj = Path(ckpt) / "tokenizer.json"
    doc = json.loads(tj.read_text())
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    doc["post_processor"] = {"type": "TemplateProcessing",
                             "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    tj.write_text(json.dumps(doc))
    return Path(ckpt)


def ruler_args(ckpt, out, *extra, lengths="1k", tasks="niah_single_1"):
    return ["ruler", ckpt, "--lengths", lengths, "--tasks", tasks, "--samples", "1", "--backend", "hf",
            "-o", out, *extra]


# --- 1. `ruler` refusals leave the run directory as it was ----------------------------------------------


@pytest.mark.slow
def test_ruler_refusing_missing_essay_data_makes_no_run_dir_and_binds_nothing(bos_checkpoint, tmp_path):
    out = tmp_path / "deep" / "run"
    r = run(*ruler_args(bos_checkpoint, out, "--seed", "3", tasks="niah_single_2"))
    refused(r, "the selected tasks need the essay data")
    assert not (tmp_path / "deep").exists() and sorted(os.listdir(tmp_path)) == []
    # not bound to the refused seed: the same directory with good settings (and another seed) runs
    r = run(*ruler_args(bos_checkpoint, out, "--essay", FIXTURE_DATA / "essay.json", tasks="niah_single_2"))
    assert r.exit_code == 0, r.output
    assert json.loads((out / "run.json").read_text())["binding"]["seed"] == 42


@pytest.mark.slow
def test_ruler_refusing_a_git_lfs_pointer_leaves_an_existing_run_dir_as_it_was(bos_checkpoint, tmp_path):
    out = tmp_path / "run"
    lfs = tmp_path / "essay.json"
    lfs.write_text(LFS_POINTER)
    refused(run(*ruler_args(bos_checkpoint, out, "--essay", lfs, tasks="niah_single_2")), "is a Git LFS pointer")
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["essay.json"]
    assert run(*ruler_args(bos_checkpoint, out)).exit_code == 0
    before = snapshot(out)
    r = run(*ruler_args(bos_checkpoint, out, "--essay", lfs, tasks="niah_single_1,niah_single_2"))
    refused(r, "is a Git LFS pointer")
    assert snapshot(out) == before


@pytest.mark.slow
def test_ruler_refusing_a_sample_one_token_beyond_the_checkpoint_leaves_the_run_dir_as_it_was(bos_checkpoint,
                                                                                                 tmp_path):
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import RulerRunSettings

    out = tmp_path / "run"
    with pytest.raises(InputError, match=f"a {ROOM}-token sample needs {ROOM + 1} tokens with the 1 special"):
        run_ruler(RulerRunSettings(checkpoint=str(bos_checkpoint), lengths=[ROOM], tasks="niah_single_1", samples=1,
                                   backend="hf", output=str(out)), progress=False)
    assert sorted(os.listdir(tmp_path)) == []  # no run dir, no staging folder
    r = run(*ruler_args(bos_checkpoint, out, lengths=str(ROOM)))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert last_line(r.stderr).startswith(f"Error: a {ROOM}-token sample needs {ROOM + 1} tokens"), r.stderr
    assert sorted(os.listdir(tmp_path)) == []
    # a good length in the same place runs; a refused length added to it leaves it as it was
    assert run(*ruler_args(bos_checkpoint, out)).exit_code == 0
    before = snapshot(out)
    r = run(*ruler_args(bos_checkpoint, out, lengths=f"1k,{ROOM}"))
    assert r.exit_code == 2 and last_line(r.stderr).startswith(f"Error: a {ROOM}-token sample"), r.stderr
    assert snapshot(out) == before
    again = run(*ruler_args(bos_checkpoint, out))
    assert again.exit_code == 0 and "0 new predictions (1 reused)" in again.output, again.output


def test_ruler_prepare_refusing_a_chat_template_or_too_few_questions_writes_nothing(reference_tokenizer_dir, tmp_path):
    out = tmp_path / "tasks"
    base = ["ruler", "prepare", "--tokenizer", reference_tokenizer_dir, "--samples", "1", "-o", out]
    refused(run(*base, "--lengths", "1k", "--tasks", "vt", "--template", "chat"), "needs a tokenizer with a chat")
    refused(run(*base[:-4], "--samples", "100000", "-o", out, "--lengths", "2k,4k", "--tasks", "qa_1", "--data-dir",
                FIXTURE_DATA), "usable questions, fewer than the 100000 samples")
    assert not out.exists()


# --- 2. a file where a folder goes ------------------------------------------------------------------------


@pytest.mark.parametrize("args, flag", [
    (["ruler", "prepare", "--tokenizer", "{tok}", "--lengths", "1k", "--tasks", "vt", "-o", "{file}"], "--output"),
    (["ruler", "prepare", "--tokenizer", "{tok}", "--lengths", "1k", "--tasks", "vt", "-o", "{file}/sub"],
     "--output"),
    (["ruler", "prepare", "--tokenizer", "{tok}", "--lengths", "1k", "--tasks", "niah_single_2", "--data-dir",
      "{file}", "-o", "{tmp}/out"], "--data-dir"),
    (["ruler", "{ckpt}", "--lengths", "1k", "--tasks", "vt", "--backend", "hf", "-o", "{file}"], "--output"),
    (["ruler", "{ckpt}", "--lengths", "1k", "--tasks", "vt", "--backend", "hf", "-o", "{file}/sub/run"], "--output"),
    (["compare", "{tmp}/run", "-o", "{file}"], "--output"),
    (["compare", "{tmp}/run", "-o", "{file}/x"], "--output"),
    (["compare", "{tmp}/run", "--baseline", "{file}"], "--baseline"),
    (["yarn", "{ckpt}", "--factor", "2", "-o", "{file}"], "--output"),
])
def test_a_file_given_where_a_folder_goes_is_one_line(args, flag, bos_checkpoint, reference_tokenizer_dir, tmp_path):
    file = tmp_path / "file"
    file.write_text("not a folder")
    values = {"tok": reference_tokenizer_dir, "file": file, "tmp": tmp_path, "ckpt": bos_checkpoint}
    r = run(*[a.format(**values) for a in args])
    refused(r, f"{flag} '{file}")
    assert "is a file, not a folder" in r.stderr and r.stdout == ""  # refused before anything is printed
    assert sorted(os.listdir(tmp_path)) == ["file"] and file.read_text() == "not a folder"


def test_a_recipe_refuses_a_file_where_a_folder_goes_as_the_command_line_does(tiny_checkpoint, tmp_path):
    file = tmp_path / "data"
    file.write_text("x")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"models": {"base": {"checkpoint": str(tiny_checkpoint)}},
                                      "ruler": {"lengths": "1k", "tasks": "niah_single_2", "data_dir": "data"}}))
    r = run("run", recipe, "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"Error: {recipe}: ruler.data_dir '{file}' is a file, not a folder"), r.output
    assert not (tmp_path / "out").exists()


# --- 3. compare over partial or corrupt result files -----------------------------------------------------


def _finished_run(tmp_path: Path, name: str = "run") -> Path:
    from longctx.report.run import write_report

    d = tmp_path / name
    d.mkdir()
    (d / "scores.json").write_text(json.dumps({
        "model": {"name": name, "fingerprint": "fp-" + name, "trained_length": 4096, "context_length": 4096},
        "backend": {"name": "hf"}, "sampling": {}, "template": {"name": "base"}, "upstream": "NVIDIA/RULER@c3f5e3b",
        "task_set": "t", "lengths": [4096, 8192], "tasks": ["vt"], "seeds": {}, "versions": {},
        "task_versions": {"vt": "1"}, "timings": {},
        "scores": [{"task": "vt", "length": L, "metric": "string_match_all", "score": 50.0, "nulls": 0, "samples": 2}
                   for L in (4096, 8192)]}))
    write_report(d, plot=False)
    return d


def _drop(key):
    def edit(doc):
        del doc[key]
    return edit


def _set(path, value):
    def edit(doc):
        *head, last = path
        for k in head:
            doc = doc[k]
        doc[last] = value
    return edit


@pytest.mark.parametrize("edit, what", [
    (_drop("scores"), "it has no 'scores'"),
    (_drop("model"), "it has no 'model'"),
    (_set(["lengths"], "4k"), "'lengths' is not a list of lengths"),
    (_set(["tasks"], []), "'tasks' is not a list of task names"),
    (_set(["metrics"], {}), "'metrics' does not name the metric of every task"),
    (_set(["scores", "vt"], {"4096": 50.0}), "'scores' of task vt lacks a length"),
    (_set(["samples", "vt", "8192"], "two"), "'samples' has no row of numbers by length for task vt"),
    (_set(["nulls"], {}), "'nulls' has no row of numbers by length for task vt"),
    (_set(["per_length"], {"x": 1}), "'per_length' is not numbers by length"),
])
def test_compare_over_a_partial_results_json_is_one_line_naming_the_file(edit, what, tmp_path):
    good, bad = _finished_run(tmp_path, "good"), _finished_run(tmp_path, "bad")
    doc = json.loads((bad / "results.json").read_text())
    edit(doc)
    (bad / "results.json").write_text(json.dumps(doc))
    refused(run("compare", good, bad), f"{bad / 'results.json'} is incomplete or corrupt: {what}")


def test_compare_over_a_truncated_results_json_is_one_line(tmp_path):
    good, bad = _finished_run(tmp_path, "good"), _finished_run(tmp_path, "bad")
    text = (bad / "results.json").read_text()
    (bad / "results.json").write_text(text[: len(text) // 2])
    refused(run("compare", good, bad), f"{bad / 'results.json'} is not valid JSON")


def test_compare_over_a_partial_sinks_json_is_one_line_naming_the_file(tmp_path):
    good, other = _finished_run(tmp_path, "good"), _finished_run(tmp_path, "other")
    (good / "sinks.json").write_text(json.dumps({"format": "longctx-sinks/1", "model": {"fingerprint": "fp-good"}}))
    refused(run("compare", good, other), f"{good / 'sinks.json'} is incomplete or corrupt")


def test_a_report_over_a_partial_scores_json_names_the_file_and_what_it_lacks(tmp_path):
    from longctx.report.run import write_report

    d = _finished_run(tmp_path)
    doc = json.loads((d / "scores.json").read_text())
    for edit, what in [(_drop("tasks"), "it has no 'tasks'"),
                       (_set(["scores"], [{"task": "cwe", "length": 4096}]), "'scores' row 0 is not"),
                       (_set(["lengths"], [4096, "8k"]), "'lengths' is not a list of lengths")]:
        broken = json.loads(json.dumps(doc))
        edit(broken)
        (d / "scores.json").write_text(json.dumps(broken))
        with pytest.raises(InputError, match=f"{d / 'scores.json'} is incomplete or corrupt: {what}"):
            write_report(d, plot=False)


def test_hand_edited_prediction_lines_are_skipped_not_a_traceback(tmp_path):
    from longctx.eval.predictions import read_predictions

    p = tmp_path / "vt.jsonl"
    p.write_text('{"index": 0, "pred": "a", "outputs": ["a"]}\n[1, 2]\n{"index": "1", "pred": "b"}\n'
                 '{"index": 2}\n{"index": 3, "pred": "c", "outputs": ["c"]}\n')
    assert sorted(read_predictions(p)) == [0, 3]


# --- 4. hf: specs offline --------------------------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Offline with an empty Hugging Face cache (HF_HOME in tmp_path); loading a dataset at all fails the test.
    Returns (HF_HOME, the real `datasets.load_dataset`)."""
    import datasets
    import datasets.config

    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "hf-home"
    home.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")  # read by datasets at import
    real = datasets.load_dataset

    def no_network(path, *a, **kw):
        raise AssertionError(f"load_dataset({path!r}) was called: a network attempt")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    return home, real


HOW = ("hf:org/name is not in the local Hugging Face cache and HF_HUB_OFFLINE=1; run once online, or: "
       "hf download --repo-type dataset org/name")


def test_an_uncached_hf_spec_offline_fails_at_once_saying_how_to_download_it(offline, tiny_checkpoint, tmp_path):
    from longctx.data.sources import check_data_specs, iter_documents

    out = tmp_path / "sinks"
    r = run("sinks", tiny_checkpoint, "--data", "hf:org/name:train", "-o", out)
    refused(r, f"--data: {HOW}")
    assert not out.exists()
    with pytest.raises(InputError, match="^" + re.escape(HOW) + "$"):
        check_data_specs(["hf:org/name"])
    with pytest.raises(InputError, match="^" + re.escape(HOW) + "$"):
        next(iter_documents("hf:org/name"))


def test_hf_datasets_offline_counts_too(offline, monkeypatch):
    from longctx.data.sources import check_data_specs

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(InputError, match="not in the local Hugging Face cache and HF_DATASETS_OFFLINE=1"):
        check_data_specs(["hf:org/name"])


def test_offline_an_hf_download_snapshot_is_what_the_spec_loads(offline, monkeypatch):
    """What the message says to do works: a dataset `hf download` put in the hub cache loads offline."""
    import datasets

    from longctx.data.sources import check_data_specs, iter_documents

    home, real = offline
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / "datasets--org--name"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "train.jsonl").write_text('{"text": "a cached document"}\n')
    seen = []  # the real load_dataset, of a local folder (no network)
    monkeypatch.setattr(datasets, "load_dataset", lambda path, *a, **kw: seen.append(path) or real(path, *a, **kw))
    check_data_specs(["hf:org/name"])
    assert list(iter_documents("hf:org/name")) == ["a cached document"]
    assert seen == [str(repo / "snapshots" / commit)]


# --- 5. nothing is printed before a refusal ----------------------------------------------------------------


@pytest.mark.parametrize("extra", [["--tasks", "niah_single_2"], ["--essay", "{lfs}", "--tasks", "niah_single_2"]])
@pytest.mark.parametrize("verb", ["prepare", "run"])
def test_nothing_is_printed_before_a_refusal(verb, extra, bos_checkpoint, reference_tokenizer_dir, tmp_path):
    lfs = tmp_path / "essay.json"
    lfs.write_text(LFS_POINTER)
    extra = [a.format(lfs=lfs) for a in extra]
    if verb == "prepare":
        args = ["ruler", "prepare", "--tokenizer", reference_tokenizer_dir, "--lengths", "1k", "-o", tmp_path / "o",
                *extra]
    else:
        args = ["ruler", bos_checkpoint, "--lengths", "1k", "--backend", "hf", "-o", tmp_path / "o", *extra]
    r = run(*args)
    assert r.exit_code == 2 and r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.output
    assert r.stdout == "", r.stdout
    assert not (tmp_path / "o").exists()


def test_run_ruler_logs_nothing_before_a_refusal(bos_checkpoint, tmp_path):
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import RulerRunSettings

    said = []
    with pytest.raises(Exception, match="the selected tasks need the essay data"):
        run_ruler(RulerRunSettings(checkpoint=str(bos_checkpoint), lengths=[1024], tasks="niah_single_2", samples=1,
                                   backend="hf", output=str(tmp_path / "o")), progress=False, log=said.append)
    assert said == [] and not (tmp_path / "o").exists()


# --- 6. non-finite and negative numbers -------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--beta-fast", "--beta-slow"])
@pytest.mark.parametrize("value", ["nan", "-5", "inf", "-inf", "0", "1e999"])
def test_yarn_refuses_a_non_finite_or_negative_beta_on_the_command_line(flag, value, tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    r = run("yarn", tiny_checkpoint, "--factor", "2", flag, value, "-o", out)
    refused(r, f"{flag} must be a number > 0, got")
    assert not out.exists()


@pytest.mark.parametrize("key", ["beta_fast", "beta_slow"])
@pytest.mark.parametrize("value", [".nan", "-5", ".inf", "-.inf", "nan", "inf"])
def test_yarn_refuses_a_non_finite_or_negative_beta_in_a_recipe(key, value, tiny_checkpoint, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"models:\n  base:\n    checkpoint: {tiny_checkpoint}\nyarn:\n  factor: 2\n  {key}: {value}\n")
    r = run("run", recipe, "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"Error: {recipe}: yarn.{key} must be a number > 0, got"), r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", [Float(), Float(0, low_open=True), Float(0, 1), Number(), Count(), Factor()],
                         ids=["Float", "Float>0", "Float0-1", "Number", "Count", "Factor"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan", "inf", "-inf", "1e999", "NaN"])
def test_every_number_kind_refuses_nan_and_inf(kind, value):
    with pytest.raises(KindError):
        kind.parse(value)


# --- 7. ordinary permissions ----------------------------------------------------------------------------


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(folder: Path) -> set[tuple[str, int]]:
    return {("dir" if p.is_dir() else "file", stat.S_IMODE(p.stat().st_mode)) for p in [folder, *folder.rglob("*")]}


@pytest.mark.slow
def test_ruler_task_files_predictions_and_reports_get_the_umask_mode(umask_022, bos_checkpoint, tmp_path):
    out = tmp_path / "run"
    assert run(*ruler_args(bos_checkpoint, out, tasks="niah_single_1,vt")).exit_code == 0
    assert {p.name for p in (out / "tasks" / "1024").iterdir()} == {"niah_single_1.jsonl", "vt.jsonl"}
    assert (out / "pred" / "1024" / "vt.jsonl").is_file() and (out / "run.json").is_file()
    assert _modes(out) == {("dir", 0o755), ("file", 0o644)}, sorted(
        (str(p.relative_to(out)), oct(stat.S_IMODE(p.stat().st_mode))) for p in out.rglob("*"))


def test_ruler_prepare_task_files_get_the_umask_mode(umask_022, reference_tokenizer_dir, tmp_path):
    out = tmp_path / "tasks"
    r = run("ruler", "prepare", "--tokenizer", reference_tokenizer_dir, "--lengths", "1k", "--tasks", "vt",
            "--samples", "1", "-o", out)
    assert r.exit_code == 0, r.output
    assert (out / "1024" / "vt.jsonl").is_file()
    assert _modes(out) == {("dir", 0o755), ("file", 0o644)}
