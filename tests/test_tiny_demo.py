"""The shipped tiny checkpoints (`checkpoints/`, made by `recipes/tiny-pretrain.yaml`), and the README's demo
(`recipes/tiny-seeds.yaml`): its quick variant runs, and prints the numbers the README shows for it."""

import hashlib
import json
import os
import re
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


QUICK_BEGIN = "<!-- tiny-seeds-quick: begin -->"
QUICK_END = "<!-- tiny-seeds-quick: end -->"
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _across_seed_rows(text: str) -> list[str]:
    """The rows of the across-seed tables (means, then paired differences) in a comparison's text, or in the
    README's block of them."""
    section = text[text.index("### Across "):] if "### Across " in text else text
    section = section.split("\nVerdict")[0]  # the training-loss table follows the verdict
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| Model", "| ---"))]


def _same_numbers(shown: str, printed: str) -> bool:
    """The same row up to two units of the last printed digit or 0.5%: a CPU with other vector units rounds a little
    differently, where a row from another recipe or an older run differs in its words or more than that (YaRN x16
    instead of x32 moves the quick run's perplexity by 0.6%)."""
    if _NUMBER.sub("#", shown) != _NUMBER.sub("#", printed):
        return False
    for a, b in zip(_NUMBER.findall(shown), _NUMBER.findall(printed)):
        unit = 10.0 ** -len(a.split(".")[1]) if "." in a else 1.0
        if abs(float(a) - float(b)) > max(2 * unit, 0.005 * abs(float(a))):
            return False
    return True


def test_same_numbers_tells_rounding_from_another_run():
    row = "| gated-yarn | 0.00 ± 22.96 | 0.015 ± 0.009 | 18.149 ± 1.859 | -1.13 [-2.01, -0.25] p=0.031 |"
    assert _same_numbers(row, row.replace("18.149", "18.151").replace("0.031", "0.032"))
    assert not _same_numbers(row, row.replace("0.015", "0.025"))  # another run's value
    assert not _same_numbers(row, row.replace("18.149", "18.26"))  # 0.6%: the quick run's PPL under YaRN x16
    assert not _same_numbers(row, row.replace("p=0.031 |", "p=0.031 ns |"))  # another verdict on the difference
    assert not _same_numbers(row, row.replace("gated-yarn", "headwise-yarn"))


def test_readme_shows_a_quick_block_of_the_across_seed_tables():
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(QUICK_BEGIN):readme.index(QUICK_END)]
    rows = _across_seed_rows(block)
    assert [r.split(" | ")[0] for r in rows] == ["| baseline-yarn", "| gated-yarn", "| gated-yarn"], rows


@pytest.mark.slow
def test_quick_demo_prints_what_the_readme_shows(tmp_path, vllm_engines):
    """`longctx run recipes/tiny-seeds-quick.yaml` as a user runs it (own process, real vLLM), and the README's block
    of its across-seed tables is what it prints, so the two cannot drift apart. Each vLLM engine core runs in the
    run's process: the same model code and scheduler, without the ~30 s an engine process takes to start on 2 cores
    (the engine process itself is what the tests of engine failures, kills and `vllm serve` start)."""
    vllm_engines.close()  # one engine at a time on this machine
    out = tmp_path / "run"
    env = {**user_environment(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    r = subprocess.run([sys.executable, "-m", "longctx", "run", str(ROOT / "recipes" / "tiny-seeds-quick.yaml"),
                        "-o", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for m in ("baseline", "gated"):
        for seed in (0, 1):
            results = json.loads((out / f"{m}-seed{seed}" / "ruler" / f"{m}-seed{seed}-yarn" / "results.json").read_text())
            assert results["model"]["yarn_factor"] == 32 and results["model"]["trained_length"] == 256
            assert results["backend"]["name"] == "vllm"
    assert (out / "compare" / "compare.png").is_file() and (out / "compare" / "loss.png").is_file()
    readme = (ROOT / "README.md").read_text()
    shown = _across_seed_rows(readme[readme.index(QUICK_BEGIN):readme.index(QUICK_END)])
    printed = _across_seed_rows(r.stdout)
    assert len(printed) == len(shown)
    for a, b in zip(shown, printed):
        assert _same_numbers(a, b), f"README shows\n{a}\nthe quick recipe printed\n{b}"


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
