"""Checkpoints by Hugging Face Hub id (`longctx.checkpoint.hub`), from a Hub cache laid out on disk exactly as
huggingface_hub writes one (`models--org--name/refs/main`, `snapshots/<commit>/`), with HF_HUB_OFFLINE=1:
nothing downloads."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from longctx.cli.main import cli

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_exit_2(r, message):
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def _repo(hub, repo_id, commits, subfolders=("",), checkpoint=None):
    """A repo as huggingface_hub caches one: file contents in blobs/<name> (sha256 for the weights, which the Hub
    keeps in Git LFS, git's blob sha1 for the rest), snapshots/<commit>/ holding relative symlinks to them,
    refs/main naming the first commit."""
    import hashlib
    import os

    from longctx.checkpoint.hub import git_blob_sha1

    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commits[0])
    (repo / "blobs").mkdir()
    for commit in commits:
        for sub in subfolders:
            for f in sorted(checkpoint.iterdir()):
                lfs = f.suffix == ".safetensors"
                blob = repo / "blobs" / (hashlib.sha256(f.read_bytes()).hexdigest() if lfs else git_blob_sha1(f))
                if not blob.exists():
                    shutil.copy2(f, blob)
                link = repo / "snapshots" / commit / sub / f.name
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath(blob, link.parent))
    return repo


@pytest.fixture
def hub(tmp_path, tiny_checkpoint, monkeypatch):
    """HF_HOME with org/tiny (main = COMMIT, also OTHER) and org/multi (two models in subfolders)."""
    home = tmp_path / "hf"
    _repo(home / "hub", "org/tiny", [COMMIT, OTHER], checkpoint=tiny_checkpoint)
    _repo(home / "hub", "org/multi", [COMMIT], ("1B_baseline", "1B_gate_headwise"), checkpoint=tiny_checkpoint)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return home / "hub"


@pytest.mark.parametrize("spec,commit,subfolder", [
    ("org/tiny", COMMIT, None),
    (f"org/tiny@{OTHER}", OTHER, None),
    ("org/multi/1B_gate_headwise", COMMIT, "1B_gate_headwise"),
])
def test_info_takes_a_hub_id_revision_and_subfolder(spec, commit, subfolder, hub):
    r = run("info", spec, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["hub"] == {"repo_id": spec.split("@")[0].split("/1B")[0], "commit": commit, "subfolder": subfolder}
    assert d["checkpoint"].startswith(str(hub))
    r = run("info", spec)
    assert f"@ {commit}" in r.output


def test_yarn_of_a_hub_id_records_the_commit_and_writes_beside_the_user(hub, tmp_path):
    before = sorted(str(p) for p in hub.rglob("*"))
    r = run("yarn", "org/tiny", "--factor", "2")
    assert r.exit_code == 0, r.output
    out = tmp_path / "tiny-yarn2x"  # in the current directory, not inside the Hub cache
    prov = json.loads((out / "longctx.json").read_text())
    assert prov["source_hub"] == {"repo_id": "org/tiny", "commit": COMMIT, "subfolder": None}
    # the snapshot's files are symlinks into blobs/: the output holds the files themselves
    assert not any(p.is_symlink() for p in out.iterdir()) and (out / "model.safetensors").stat().st_size > 0
    assert sorted(str(p) for p in hub.rglob("*")) == before


@pytest.mark.slow
def test_sinks_results_name_the_hub_model(hub, tmp_path):
    r = run("sinks", "org/multi/1B_baseline", "--tokens", "256", "-o", tmp_path / "s")
    assert r.exit_code == 0, r.output
    model = json.loads((tmp_path / "s" / "sinks.json").read_text())["model"]
    assert model["name"] == "org/multi/1B_baseline"  # the Hub id, as the user named it
    assert model["hub"] == {"repo_id": "org/multi", "commit": COMMIT, "subfolder": "1B_baseline"}


@pytest.mark.parametrize("spec,message", [
    ("org/absent", "'org/absent' is not in the local Hugging Face cache and HF_HUB_OFFLINE=1; run once online, "
                   "or: hf download org/absent"),
    ("org/tiny@v2", "'org/tiny@v2' is not in the local Hugging Face cache and HF_HUB_OFFLINE=1; run once online, "
                    "or: hf download org/tiny --revision v2"),
    ("org/multi/1B_gate_elementwise", "'org/multi/1B_gate_elementwise': org/multi has no folder '1B_gate_elementwise'"),
])
def test_a_hub_id_that_is_not_cached_offline_is_one_line(spec, message, hub, tmp_path):
    for argv in (["info", spec], ["yarn", spec, "--factor", "2", "-o", tmp_path / "out"]):
        one_line_exit_2(run(*argv), message)
    assert not (tmp_path / "out").exists()


def _blob(link):
    import os

    return link.parent / os.readlink(link)


def _plant_elsewhere(hub, tmp_path, tiny_checkpoint):
    shutil.copytree(tiny_checkpoint, tmp_path / "elsewhere")
    (hub / "models--org--tiny" / "refs" / "main").write_text("../../../../elsewhere")


def _swap_config_blob(hub, tmp_path, tiny_checkpoint):
    blob = _blob(hub / "models--org--tiny" / "snapshots" / COMMIT / "config.json")
    cfg = json.loads(blob.read_text())
    blob.chmod(0o644)
    blob.write_text(json.dumps({**cfg, "rope_theta": 12345.0}))


def _swap_weights_blob(hub, tmp_path, tiny_checkpoint):
    blob = _blob(hub / "models--org--tiny" / "snapshots" / COMMIT / "model.safetensors")
    data = bytearray(blob.read_bytes())
    data[-2] ^= 1  # same size, other weights
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))


def _link_out_of_blobs(hub, tmp_path, tiny_checkpoint):
    link = hub / "models--org--tiny" / "snapshots" / COMMIT / "config.json"
    shutil.copy(link, tmp_path / "mine.json")
    link.unlink()
    link.symlink_to(tmp_path / "mine.json")


@pytest.mark.parametrize("plant,spec,message,verbs", [
    (_plant_elsewhere, "org/tiny", "'org/tiny' resolves to", ("info", "yarn")),
    (None, "org/tiny@../..", "'org/tiny@../..': '../..' is not a branch, tag or commit name", ("info", "yarn")),
    (None, "org/tiny@main/.hidden", "is not a branch, tag or commit name", ("info", "yarn")),
    (_swap_config_blob, "org/tiny", "'org/tiny': config.json in the Hugging Face cache is not the file the Hub "
                                    "published", ("info", "yarn")),
    (_swap_weights_blob, "org/tiny", "'org/tiny': model.safetensors in the Hugging Face cache is not the file the "
                                     "Hub published", ("yarn",)),
    (_link_out_of_blobs, "org/tiny", "'org/tiny': config.json in the Hugging Face cache links to", ("info", "yarn")),
])
def test_the_hub_cache_is_read_as_huggingface_hub_lays_it_out(plant, spec, message, verbs, hub, tmp_path,
                                                              tiny_checkpoint):
    """A snapshot outside its repo's snapshots/, a revision that climbs out of refs/, a blob whose content is not
    its name and a file linking out of blobs/ are each one line, before anything is read or written."""
    if plant is not None:
        plant(hub, tmp_path, tiny_checkpoint)
    for verb in verbs:
        argv = [verb, spec] + (["--factor", "2", "-o", tmp_path / "out"] if verb == "yarn" else [])
        one_line_exit_2(run(*argv), message)
    assert not (tmp_path / "out").exists()


def test_a_local_folder_wins_over_a_hub_id_of_the_same_name(hub, tmp_path, tiny_checkpoint):
    shutil.copytree(tiny_checkpoint, tmp_path / "org" / "absent")
    r = run("info", "org/absent", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["hub"] is None


@pytest.mark.slow
def test_ruler_prepare_takes_a_hub_tokenizer(hub, tmp_path):
    r = run("ruler", "prepare", "--tokenizer", "org/tiny", "--lengths", "1k", "--tasks", "vt", "--samples", "1",
            "-o", tmp_path / "tasks")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "tasks" / "1024" / "vt.jsonl").is_file()


def test_convert_takes_a_hub_id(hub, tmp_path):
    """The released gated models live side by side in one repo: a subfolder names one."""
    from test_convert import write_official

    write_official(tmp_path / "official", "headwise", 4, 2)
    _repo(hub, "QwQZh/gated_attention", [COMMIT], ("1B_gate_headwise",), checkpoint=tmp_path / "official")
    r = run("convert", "QwQZh/gated_attention/1B_gate_headwise", tmp_path / "converted", "--from", "official")
    assert r.exit_code == 0, r.output
    prov = json.loads((tmp_path / "converted" / "longctx.json").read_text())
    assert prov["source_hub"] == {"repo_id": "QwQZh/gated_attention", "commit": COMMIT,
                                  "subfolder": "1B_gate_headwise"}


@pytest.mark.slow
def test_ruler_results_record_the_hub_commit(hub, tmp_path, tiny_checkpoint):
    long = tmp_path / "long"
    shutil.copytree(tiny_checkpoint, long)
    cfg = json.loads((long / "config.json").read_text())
    (long / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 2048}))
    _repo(hub, "org/long", [COMMIT], checkpoint=long)
    r = run("ruler", "org/long", "--lengths", "1k", "--tasks", "vt", "--samples", "1", "--backend", "hf",
            "--no-plot", "-o", tmp_path / "run")
    assert r.exit_code == 0, r.output
    for name in ("run.json", "results.json"):
        model = json.loads((tmp_path / "run" / name).read_text())["model"]
        assert model["hub"] == {"repo_id": "org/long", "commit": COMMIT, "subfolder": None}, name
        assert model["name"] == "org/long"
    # a name given is the name
    r = run("ruler", "org/long", "--lengths", "1k", "--tasks", "vt", "--samples", "1", "--backend", "hf",
            "--no-plot", "--name", "Long 1k", "-o", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "run" / "results.json").read_text())["model"]["name"] == "Long 1k"
    assert "| Long 1k |" in (tmp_path / "run" / "results.md").read_text()


@pytest.mark.slow
def test_a_recipe_takes_a_hub_checkpoint(hub, tmp_path):
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"models": {"m": {"checkpoint": "org/tiny"}}, "yarn": {"factor": 2}}))
    r = run("run", recipe, "-o", tmp_path / "runs", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "is not in the local Hugging Face cache" not in r.output  # it is cached
    r = run("run", recipe, "-o", tmp_path / "runs")
    assert r.exit_code == 0, r.output
    prov = json.loads((tmp_path / "runs" / "m" / "yarn" / "m-yarn" / "longctx.json").read_text())
    assert prov["source_hub"] == {"repo_id": "org/tiny", "commit": COMMIT, "subfolder": None}
    r = run("run", recipe, "-o", tmp_path / "runs")
    assert r.exit_code == 0 and "skip yarn for m: up to date" in r.output, r.output


def test_init_takes_a_hub_tokenizer(hub, tmp_path):
    r = run("init", tmp_path / "fresh", "--preset", "tiny", "--attention", "baseline", "--tokenizer", "org/tiny")
    assert r.exit_code == 0, r.output
    prov = json.loads((tmp_path / "fresh" / "longctx.json").read_text())
    assert prov["args"]["tokenizer_hub"] == {"repo_id": "org/tiny", "commit": COMMIT, "subfolder": None}
    assert not (tmp_path / "fresh" / "tokenizer.json").is_symlink()
    one_line_exit_2(run("init", tmp_path / "other", "--preset", "tiny", "--attention", "baseline", "--tokenizer",
                        "org/absent"), "hf download org/absent --include 'tokenizer*' ")
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("verb", ["init", "ruler prepare"])
@pytest.mark.slow
def test_a_hub_tokenizer_is_fetched_without_the_weights(verb, hub, tmp_path, monkeypatch):
    """Only tokenizer files and config.json are asked of the Hub (the real snapshot_download, offline here,
    sees the patterns it would download with): a model repo's weights are not needed to tokenize."""
    import fnmatch

    import huggingface_hub

    from longctx.checkpoint import hub as hub_module

    asked = []
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **kw: asked.append(kw) or real(*a, **kw))
    hub_module._snapshot.cache_clear()
    if verb == "init":
        r = run("init", tmp_path / "fresh", "--preset", "tiny", "--attention", "baseline", "--tokenizer", "org/tiny")
    else:
        r = run("ruler", "prepare", "--tokenizer", "org/tiny", "--lengths", "1k", "--tasks", "vt", "--samples", "1",
                "-o", tmp_path / "tasks")
    assert r.exit_code == 0, r.output
    patterns = asked[-1]["allow_patterns"]
    files = [f.name for f in (hub / "models--org--tiny" / "snapshots" / COMMIT).iterdir()]
    fetched = {f for f in files if any(fnmatch.fnmatch(f, p) for p in patterns)}
    assert "tokenizer.json" in fetched and "config.json" in fetched
    assert not any(f.endswith(".safetensors") for f in fetched) and any(f.endswith(".safetensors") for f in files)


@pytest.mark.slow
def test_extend_trains_a_hub_checkpoint(hub, tmp_path):
    r = run("extend", "org/tiny@" + OTHER, "--rope-base", "1e5", "--seq-len", 512, "--data", "synthetic:mixed",
            "--steps", 1, "--tokens-per-step", 512, "--cache-dir", tmp_path / "cache", "-o", tmp_path / "ext")
    assert r.exit_code == 0, r.output
    prov = json.loads((tmp_path / "ext" / "longctx.json").read_text())
    assert prov["source_hub"] == {"repo_id": "org/tiny", "commit": OTHER, "subfolder": None}
