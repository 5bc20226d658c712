"""`longctx ruler` runs of chat and thinking models (a tiny Qwen3 with Qwen3's real chat template), through
transformers and through an OpenAI-compatible server on 127.0.0.1: the thinking budget, the answer after the
thought, the binding of the chat settings and of the served model, a server checked before any request, and
predictions kept when a server fails mid-run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_openai_backend import serve  # noqa: F401 - the fixture

from longctx.core.errors import InputError
from longctx.eval.runner import run_ruler as run_settings
from longctx.eval.settings import RulerRunSettings

QWEN3 = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text(encoding="utf-8")
VT_BUDGET = 30  # RULER's tokens_to_generate for vt


def run_ruler(checkpoint, out, **settings):
    s = RulerRunSettings(checkpoint=str(checkpoint), lengths=[1024], output=str(out), tasks=["vt"], samples=2,
                         template="chat", **settings)
    return run_settings(s, progress=False)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def qwen3_chat_checkpoint(tmp_path_factory, reference_tokenizer_dir):
    """A tiny random Qwen3 whose tokenizer carries Qwen3's own chat template (thinks by default)."""
    from longctx.init.presets import write_tiny_qwen3

    ck = write_tiny_qwen3(tmp_path_factory.mktemp("q3chat") / "tiny-chat", reference_tokenizer_dir,
                          max_position_embeddings=4096)
    (ck / "chat_template.jinja").write_text(QWEN3, encoding="utf-8")
    return ck


@pytest.mark.slow
def test_a_thinking_model_gets_a_budget_and_its_chat_settings_bind_the_run(qwen3_chat_checkpoint, tmp_path):
    ck = qwen3_chat_checkpoint
    out = tmp_path / "think"
    with pytest.raises(InputError, match="makes the model think before it answers.*--think-tokens N"):
        run_ruler(ck, out, backend="hf")
    assert not out.exists()
    r = run_ruler(ck, out, backend="hf", think_tokens=8)
    assert r.new_predictions == 2
    task = lines(out / "tasks" / "1024" / "vt.jsonl")[0]
    # the answer prefix ends the user turn; the model opens its thought in the assistant turn
    assert task["answer_prefix"].endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>assistant" not in task["input"]
    for rec in lines(out / "pred" / "1024" / "vt.jsonl"):
        # a random model never closes its thought: no answer, the whole output kept
        assert rec["thinking_closed"] is False and rec["pred"] == "" and rec["raw"]
    scores = json.loads((out / "scores.json").read_text())
    assert scores["scores"][0]["unfinished_thinking"] == 2 and scores["scores"][0]["score"] == 0.0
    assert scores["sampling"]["think_tokens"] == 8 and scores["template"]["thinking"] is True
    # every chat setting binds the run directory
    for settings, difference in [
            (dict(think_tokens=16), "--think-tokens 8 -> 16"),
            (dict(think_tokens=8, system_prompt="Be brief."), '--system-prompt null -> "Be brief."'),
            (dict(think_tokens=8, chat_template_kwargs={"enable_thinking": True}),
             '--chat-template-kwargs null -> {"enable_thinking": true}')]:
        with pytest.raises(InputError, match=f"other settings: {difference}; use the same settings"):
            run_ruler(ck, out, backend="hf", **settings)

    # thinking switched off by the template variable: Qwen3's empty thought is in the prompt, no budget needed
    off = tmp_path / "off"
    run_ruler(ck, off, backend="hf", chat_template_kwargs={"enable_thinking": False}, system_prompt="Be brief.")
    task = lines(off / "tasks" / "1024" / "vt.jsonl")[0]
    assert task["input"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    # the prefix starts the answer, after Qwen3's empty thought
    assert task["input"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<|im_" not in task["answer_prefix"]
    assert all("raw" not in rec for rec in lines(off / "pred" / "1024" / "vt.jsonl"))
    # --think-tokens 0: the user's word that this model does not think
    zero = tmp_path / "zero"
    run_ruler(ck, zero, backend="hf", think_tokens=0)
    task = lines(zero / "tasks" / "1024" / "vt.jsonl")[0]
    assert task["input"].endswith("<|im_start|>assistant\n") and "<|im_" not in task["answer_prefix"]
    assert all("raw" not in rec for rec in lines(zero / "pred" / "1024" / "vt.jsonl"))


def _server_for(serve, ck, **kwargs):  # noqa: F811 - `serve` is the fixture
    return serve(cards=kwargs.pop("cards", [{"id": "tiny", "root": str(ck), "max_model_len": 4096}]), **kwargs)


@pytest.mark.slow
def test_a_thinking_answer_from_a_server_is_the_text_after_the_thought(qwen3_chat_checkpoint, tmp_path,
                                                                       serve):  # noqa: F811
    reply = "<think>\nThe chain starts at VAR A = 1.</think>\n\nThe variables are: A B C"
    server = _server_for(serve, qwen3_chat_checkpoint, completion=lambda i: (200, {}, {
        "choices": [{"index": 0, "text": reply}], "usage": {"prompt_tokens": 900}}))
    out = tmp_path / "run"
    run_ruler(qwen3_chat_checkpoint, out, backend="openai", base_url=server.url, think_tokens=64)
    assert {c["body"]["max_tokens"] for c in server.completions()} == {VT_BUDGET + 64}
    for rec in lines(out / "pred" / "1024" / "vt.jsonl"):
        assert rec["pred"] == "\n\nThe variables are: A B C" and rec["raw"] == reply and rec["thinking_closed"]
    assert json.loads((out / "scores.json").read_text())["scores"][0]["unfinished_thinking"] == 0


@pytest.mark.slow
def test_a_server_is_checked_first_and_bound_and_a_failure_keeps_what_was_made(qwen3_chat_checkpoint, tmp_path,
                                                                              serve):  # noqa: F811
    ck = qwen3_chat_checkpoint
    think = {"chat_template_kwargs": {"enable_thinking": False}}
    # a server whose context is too small, or that serves another model: refused before any request or file
    for cards, message in [([{"id": "tiny", "root": str(ck), "max_model_len": 512}],
                            "serves 'tiny' with max_model_len 512, but this run needs 1024 tokens"),
                           ([{"id": "other", "root": "/models/other", "max_model_len": 4096}],
                            r"serves 'other' \(root '/models/other'\), not the checkpoint")]:
        server = _server_for(serve, ck, cards=cards)
        with pytest.raises(InputError, match=message):
            run_ruler(ck, tmp_path / "refused", backend="openai", base_url=server.url, **think)
        assert not (tmp_path / "refused").exists() and not server.completions()

    # a server that fails after one answer: that answer is on disk, and the rerun continues from it
    out = tmp_path / "run"
    two = [{"id": "tiny", "root": str(ck), "max_model_len": 4096},
           {"id": "tiny-2", "root": str(ck), "max_model_len": 4096}]
    failing = {"now": True}
    server = _server_for(serve, ck, cards=two, completion=lambda i: (
        400, {}, {"error": {"message": "a request this server refuses"}}) if failing["now"] and i >= 1 else None)
    with pytest.raises(InputError, match="rejected a completion request .*a request this server refuses"):
        run_ruler(ck, out, backend="openai", base_url=server.url, concurrency=1, **think)
    assert len(lines(out / "pred" / "1024" / "vt.jsonl")) == 1
    failing["now"] = False
    r = run_ruler(ck, out, backend="openai", base_url=server.url, **think)
    assert (r.reused_predictions, r.new_predictions) == (1, 1)
    # bound to the served model (and to the server)
    with pytest.raises(InputError, match='other settings: --served-model "tiny" -> "tiny-2"; use the same'):
        run_ruler(ck, out, backend="openai", base_url=server.url, model="tiny-2", **think)
    other = _server_for(serve, ck, cards=two)
    with pytest.raises(InputError, match=r'other settings: --base-url "http://127.0.0.1:\d+/v1" -> "http://'):
        run_ruler(ck, out, backend="openai", base_url=other.url, **think)
