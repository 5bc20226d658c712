"""The shipped tiny checkpoints (`checkpoints/`, made by `recipes/tiny-pretrain.yaml`) and the README's demo
recipe run on them (`recipes/tiny-cpu-quick.yaml`, the ~3-minute variant of `tiny-cpu.yaml`)."""

import hashlib
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import user_environment

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ROOT / "checkpoints"


def test_shipped_checkpoints_match_their_checksums():
    lines = (CHECKPOINTS / "SHA256SUMS").read_text().splitlines()
    assert {line.split("  ")[1].split("/")[0] for line in lines} == {"tiny-baseline", "tiny-gated"}
    for line in lines:
        digest, name = line.split("  ")
        assert hashlib.sha256((CHECKPOINTS / name).read_bytes()).hexdigest() == digest, name


def test_shipped_checkpoints_are_the_pretrain_recipes_bf16_models():
    from transformers import AutoConfig

    from longctx.init.presets import parameter_count

    configs = {m: AutoConfig.from_pretrained(CHECKPOINTS / f"tiny-{m}") for m in ("baseline", "gated")}
    assert configs["baseline"].architectures == ["Qwen3ForCausalLM"]
    assert configs["gated"].architectures == ["GatedQwen3ForCausalLM"]
    for m, config in configs.items():
        assert config.dtype in ("bfloat16", __import__("torch").bfloat16)
        assert config.rope_parameters["rope_theta"] == 10000 and config.max_position_embeddings == 1024
        record = json.loads((CHECKPOINTS / f"tiny-{m}" / "longctx.json").read_text())
        assert record["verb"] == "shipped" and record["args"]["recipe"] == "recipes/tiny-pretrain.yaml"
        assert [h["verb"] for h in record["history"]] == ["init", "extend", "extend", "shipped"]
        scores = record["args"]["ruler_at_training_length"]["scores"]
        assert set(scores) == {"niah_single_1", "niah_multikey_2", "vt", "fwe"} and "1024" in scores["vt"]
        # the numbers checkpoints/README.md quotes are the ones recorded
        assert f"| tiny-{m} | {scores['niah_single_1']['1024']:.1f} |" in (CHECKPOINTS / "README.md").read_text()
    # equal parameters (the gate's few extra weights aside) and one tokenizer
    sizes = {m: parameter_count(c) for m, c in configs.items()}
    assert abs(sizes["gated"] - sizes["baseline"]) / sizes["baseline"] < 0.001
    assert (CHECKPOINTS / "tiny-baseline" / "tokenizer.json").read_bytes() == \
        (CHECKPOINTS / "tiny-gated" / "tokenizer.json").read_bytes()


@pytest.mark.slow
def test_quick_demo_recipe_runs_on_the_shipped_checkpoints(tmp_path, vllm_engines):
    """`longctx run recipes/tiny-cpu-quick.yaml` as a user runs it (own process, real vLLM), but with each vLLM
    engine core in the run's process: the same model code and scheduler, without the ~30 s an engine process takes
    to start on 2 cores (the engine process itself is what the tests of engine failures, kills and `vllm serve`
    start)."""
    vllm_engines.close()  # one engine at a time on this machine
    out = tmp_path / "run"
    env = {**user_environment(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    r = subprocess.run([sys.executable, "-m", "longctx", "run", str(ROOT / "recipes" / "tiny-cpu-quick.yaml"),
                        "-o", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| baseline-yarn |" in r.stdout and "| gated-yarn |" in r.stdout and "Training loss:" in r.stdout
    for m in ("baseline", "gated"):
        results = json.loads((out / m / "ruler" / f"{m}-yarn" / "results.json").read_text())
        assert results["model"]["yarn_factor"] == 4 and results["model"]["trained_length"] == 4096
        assert results["backend"]["name"] == "vllm"
        assert (out / m / "extend" / f"{m}-extend" / "train_log.jsonl").is_file()
    assert (out / "compare" / "compare.png").is_file() and (out / "compare" / "loss.png").is_file()


@pytest.mark.slow
def test_answer_loss_shows_what_the_shipped_models_can_do(tmp_path, capsys, monkeypatch):
    """`scripts/answer_loss.py` on niah_single_1 at 1k, as checkpoints/README.md quotes it: both models copy a
    needle's later digits (their digit embeddings stay apart), the gated one also looks its first digit up
    and the baseline only guesses it. The commands run in this process (`runpy`, the CLI's own entry point):
    what they print is what a shell would show, without paying torch's import three times."""
    from click.testing import CliRunner

    from longctx.cli.main import cli

    tasks = tmp_path / "tasks"
    prep = CliRunner().invoke(cli, ["ruler", "prepare", "--tokenizer", str(CHECKPOINTS / "tiny-gated"), "--lengths",
                                    "1k", "--tasks", "niah_single_1", "--samples", "10", "-o", str(tasks)])
    assert prep.exit_code == 0, prep.output
    losses, cosines = {}, {}
    for m in ("baseline", "gated"):
        monkeypatch.setattr(sys, "argv", ["answer_loss.py", str(CHECKPOINTS / f"tiny-{m}"),
                                          str(tasks / "1024" / "niah_single_1.jsonl"), "--samples", "10"])
        capsys.readouterr()
        runpy.run_path(str(ROOT / "scripts" / "answer_loss.py"), run_name="__main__")
        cosine_line, line = capsys.readouterr().out.strip().splitlines()[-2:]
        cosines[m] = float(cosine_line.split("between digits ")[1].split(",")[0])
        first = float(line.split("first answer token ")[1].split(" nats")[0])
        later = float(line.split("later tokens ")[1].split(" nats")[0])
        losses[m] = first, later
    assert max(losses["baseline"][1], losses["gated"][1]) < 0.5, losses  # ln 10 = 2.3 would be a guess
    assert losses["gated"][0] < 0.7 < 1.5 < losses["baseline"][0], losses
    assert max(cosines.values()) < 0.85, cosines  # a collapsed model's digits were at 0.94


@pytest.mark.parametrize("checkpoint, tasks, message", [
    ("tiny-gated", "none.jsonl", "cannot read task file"),
    ("tiny-gated", "empty.jsonl", "has no samples"),
    ("no-such-model", "one.jsonl", "has no config.json"),
])
@pytest.mark.slow
def test_answer_loss_refuses_bad_input_in_one_line(checkpoint, tasks, message, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "one.jsonl").write_text(json.dumps({"input": "x", "outputs": ["1"]}) + "\n")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "answer_loss.py"), str(CHECKPOINTS / checkpoint),
                        str(tmp_path / tasks)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr[-2000:]
