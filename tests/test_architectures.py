"""Every architecture through every verb: tiny random Qwen3, Qwen2, Llama 3.1 (llama3 scaling), Mistral
(sliding window), Gemma, Gemma-2 (alternating sliding layers, soft-capping) and Phi-3 checkpoints
(tests/architectures.py) through `info`, `yarn`, `extend` and `ruler` (`sinks`: tests/test_sinks.py; the
gated family: tests/test_gated_*.py): the `ruler` and `sinks` coverage docs/architectures.md states under
its architecture table (the table itself is the RoPE matrix, tests/test_rope_matrix.py).
"""

from __future__ import annotations

import json

import pytest
from architectures import ARCHITECTURES, TRAINED_LENGTH
from click.testing import CliRunner

from longctx.cli.main import cli

NAMES = list(ARCHITECTURES)
WINDOWS = {"mistral": {"window": 128, "layers": 2, "of": 2}, "gemma2": {"window": 128, "layers": 1, "of": 2}}
YARN_FACTOR = 4


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def yarned(architecture_checkpoint, tmp_path_factory):
    """{name: the architecture's checkpoint YaRN-scaled x4 from its trained length 256, by the CLI}."""
    root = tmp_path_factory.mktemp("yarned")
    out = {}
    for name in NAMES:
        ckpt = architecture_checkpoint(name)
        # llama3 already has a scaling: --rescale replaces it with YaRN from its original length
        r = run("yarn", ckpt, "--factor", YARN_FACTOR, *(["--rescale"] if name == "llama3" else []),
                "-o", root / name)
        assert r.exit_code == 0, (name, r.output)
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", NAMES)
def test_info_shows_architecture_rope_and_sliding_window(name, architecture_checkpoint):
    r = run("info", architecture_checkpoint(name), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["architecture"] == ARCHITECTURES[name][1]
    assert d["sliding_window"] == WINDOWS.get(name)
    if name == "llama3":
        assert (d["rope_type"], d["rope_factor"], d["original_max_position_embeddings"], d["context_length"]) == \
            ("llama3", 8.0, TRAINED_LENGTH, 8 * TRAINED_LENGTH)
    else:
        assert (d["rope_type"], d["context_length"]) == ("default", TRAINED_LENGTH)
    table = run("info", architecture_checkpoint(name)).output
    expected = "128 tokens in" if name in WINDOWS else "none (every layer attends to the whole sequence)"
    assert expected in next(line for line in table.splitlines() if line.startswith("sliding window"))


@pytest.mark.parametrize("name", NAMES)
def test_yarn_writes_a_config_transformers_loads_as_asked(name, yarned):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from longctx.info.describe import describe

    d = describe(yarned[name])
    assert d.context_length == YARN_FACTOR * TRAINED_LENGTH
    assert d.original_max_position_embeddings == TRAINED_LENGTH
    config = AutoConfig.from_pretrained(yarned[name])
    assert config.max_position_embeddings == YARN_FACTOR * TRAINED_LENGTH
    model = AutoModelForCausalLM.from_pretrained(yarned[name]).eval()
    with torch.no_grad():  # a forward past the trained length runs
        assert model(torch.arange(3, 3 + 2 * TRAINED_LENGTH)[None]).logits.isfinite().all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_extend_trains_every_architecture(name, architecture_checkpoint, tmp_path):
    from longctx.info.describe import describe

    out = tmp_path / "ext"
    r = run("extend", architecture_checkpoint(name), "--rope-base", "1e5", "--seq-len", 2 * TRAINED_LENGTH,
            "--data", "synthetic:mixed", "--steps", 1, "--tokens-per-step", 2 * TRAINED_LENGTH, "--cache-dir",
            tmp_path / "cache", "-o", out)
    assert r.exit_code == 0, r.output
    d = describe(out)
    assert (d.rope_theta, d.context_length) == (100000, 2 * TRAINED_LENGTH)
    # llama3 keeps its scaling under the new base (Llama 3.x is trained with it on)
    assert d.rope_type == ("llama3" if name == "llama3" else "default")
    assert d.sliding_window == WINDOWS.get(name)
    assert ("sliding-window attention" in r.output) == (name in WINDOWS)


def _ruler(checkpoint, out, backend, engine=None):
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import RulerRunSettings
    from longctx.report.run import write_report

    said = []
    s = RulerRunSettings(checkpoint=str(checkpoint), lengths=[YARN_FACTOR * TRAINED_LENGTH], output=str(out),
                         tasks="niah_single_1", samples=1, backend=backend)
    run_ruler(s, engine=engine, progress=False, log=said.append)
    return write_report(out).results, said


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_ruler_hf_runs_every_architecture_past_its_trained_length(name, yarned, tmp_path):
    results, said = _ruler(yarned[name], tmp_path / "run", "hf")
    assert results["model"]["architecture"] == ARCHITECTURES[name][1]
    assert results["model"]["sliding_window"] == WINDOWS.get(name)
    assert results["samples"]["niah_single_1"][YARN_FACTOR * TRAINED_LENGTH] == 1
    assert any("sliding-window attention" in line for line in said) == (name in WINDOWS)
    assert ("sliding-window attention" in (tmp_path / "run" / "results.md").read_text()) == (name in WINDOWS)


# llama3 and phi3 run through vLLM in tests/test_yarn_vllm.py (prompt log-probs equal transformers')
@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2", "mistral", "gemma", "gemma2"])
def test_ruler_vllm_runs_every_architecture_as_hf_does(name, yarned, tmp_path, vllm_engines):
    """vLLM and transformers give the same greedy answer on the same task file, sliding windows included."""
    llm = vllm_engines.get(yarned[name], max_model_len=YARN_FACTOR * TRAINED_LENGTH)
    results, _ = _ruler(yarned[name], tmp_path / "vllm", "vllm", engine=llm)
    assert results["model"]["sliding_window"] == WINDOWS.get(name)
    _ruler(yarned[name], tmp_path / "hf", "hf")
    length = str(YARN_FACTOR * TRAINED_LENGTH)
    pred = [json.loads((tmp_path / run / "pred" / length / "niah_single_1.jsonl").read_text())
            for run in ("vllm", "hf")]
    assert pred[0]["prompt_tokens"] == pred[1]["prompt_tokens"]
    # vLLM's incremental detokenizer keeps a leading space transformers' decode drops; scoring strips both
    assert pred[0]["pred"].strip()[:20] == pred[1]["pred"].strip()[:20]


# --- a checkpoint that ships its own code (config.json auto_map) -------------------------------------


@pytest.fixture(scope="module")
def remote_checkpoint(tmp_path_factory, reference_tokenizer_dir):
    from architectures import write_remote_code_checkpoint

    return write_remote_code_checkpoint(tmp_path_factory.mktemp("remote") / "tiny-remote", reference_tokenizer_dir,
                                        max_position_embeddings=4 * TRAINED_LENGTH)


@pytest.fixture
def code_ran(tmp_path, monkeypatch):
    """A path the checkpoint's code creates when it is imported."""
    monkeypatch.setenv("LONGCTX_TEST_REMOTE_CODE_RAN", str(tmp_path / "remote-code-ran"))
    return tmp_path / "remote-code-ran"


@pytest.mark.parametrize("verb", [
    "info {c}", "yarn {c} --factor 2 -o {o}/y", "sinks {c} --tokens 256 -o {o}/s",
    "ruler {c} --lengths 1k --tasks niah_single_1 --samples 1 --backend hf -o {o}/r",
    "extend {c} --rope-base 1e5 --seq-len 512 --data synthetic:mixed --steps 1 -o {o}/e"])
def test_remote_code_is_refused_without_trust_remote_code(verb, remote_checkpoint, code_ran, tmp_path):
    r = run(*verb.format(c=remote_checkpoint, o=tmp_path / "out").split())
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert "needs its own Python code to build its config" in r.stderr and "--trust-remote-code" in r.stderr
    assert not code_ran.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_remote_code_runs_through_every_verb_with_trust_remote_code(remote_checkpoint, code_ran, tmp_path):
    from longctx.report.results import load_results

    r = run("info", remote_checkpoint, "--trust-remote-code")
    assert r.exit_code == 0 and "remote code" in r.output and code_ran.exists(), r.output
    r = run("yarn", remote_checkpoint, "--factor", 2, "-o", tmp_path / "yarn", "--trust-remote-code")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "yarn" / "modeling_tiny_remote.py").is_file()  # the code travels with the checkpoint
    prov = json.loads((tmp_path / "yarn" / "longctx.json").read_text())
    assert prov["args"]["trust_remote_code"] is True
    r = run("sinks", remote_checkpoint, "--tokens", 256, "-o", tmp_path / "sinks", "--trust-remote-code")
    assert r.exit_code == 0, r.output
    sinks = json.loads((tmp_path / "sinks" / "sinks.json").read_text())
    assert sinks["model"]["remote_code"]["AutoModelForCausalLM"] == "modeling_tiny_remote.TinyRemoteForCausalLM"
    r = run("ruler", remote_checkpoint, "--lengths", "1k", "--tasks", "niah_single_1", "--samples", 1, "--backend",
            "hf", "-o", tmp_path / "run", "--trust-remote-code", "--no-plot")
    assert r.exit_code == 0, r.output
    results = load_results(tmp_path / "run")
    assert results["model"]["remote_code"] and results["backend"]["trust_remote_code"] is True
    r = run("extend", remote_checkpoint, "--rope-base", "1e5", "--seq-len", 512, "--data", "synthetic:mixed",
            "--steps", 1, "--tokens-per-step", 512, "--cache-dir", tmp_path / "cache", "-o", tmp_path / "ext",
            "--trust-remote-code")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ext" / "config.json").read_text())["auto_map"]
