"""`--template chat` with a system prompt, chat-template variables and thinking models (Qwen3's real templates),
and `longctx.eval.thinking.answer_after_thinking`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ruler_helpers import FIXTURE_DATA

from longctx.eval.thinking import THINK_END, answer_after_thinking
from ruler_tasks.errors import RulerInputError
from ruler_tasks.prepare import load_tokenizer, prepare
from ruler_tasks.templates import model_template

DATA = Path(__file__).parent / "data"
# tests/data/qwen3_chat_template.md: where these come from (verbatim, Apache-2.0)
QWEN3 = (DATA / "qwen3_chat_template.jinja").read_text(encoding="utf-8")
QWEN3_THINKING_2507 = (DATA / "qwen3_thinking_2507_chat_template.jinja").read_text(encoding="utf-8")
# ChatML without any think tags (Qwen2.5-style)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Gemma's way of refusing a system message
NO_SYSTEM = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
             "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
             "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
ASSISTANT = "<|im_start|>assistant"
PREFIX = " The special magic number for {query} mentioned in the provided text is"
TASK = "Some text.\n{context}\nWhat is the special magic number for {query}?"


@pytest.fixture
def tok(reference_tokenizer_dir):
    """A fresh real (Mistral SentencePiece) fast tokenizer; each test sets the chat template it needs."""
    return load_tokenizer(reference_tokenizer_dir)


def _with(tok, template):
    tok.chat_template = template
    return tok


def test_thinking_is_read_from_the_generation_prompt(tok):
    qwen3 = model_template("chat", _with(tok, QWEN3))
    assert (qwen3.head, qwen3.tail) == ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
    assert qwen3.thinking  # no think tag rendered, but the template knows </think>: the model opens <think>
    assert model_template("chat", tok, chat_template_kwargs={"enable_thinking": True}).thinking
    off = model_template("chat", tok, chat_template_kwargs={"enable_thinking": False})
    assert not off.thinking and off.tail == "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    open_think = model_template("chat", _with(tok, QWEN3_THINKING_2507))
    assert open_think.thinking and open_think.tail == "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert not model_template("chat", _with(tok, CHATML)).thinking
    # an open <think> decides by itself (this source has no </think> at all)
    opens = CHATML.replace("assistant\n{% endif %}", "assistant\n<think>\n{% endif %}")
    assert "</think>" not in opens and model_template("chat", _with(tok, opens)).thinking
    # named templates: the one rendered ("default") is the source
    assert model_template("chat", _with(tok, {"default": QWEN3, "tool_use": CHATML})).thinking
    assert not model_template("chat", _with(tok, {"default": CHATML, "tool_use": QWEN3})).thinking


def test_compose_keeps_the_answer_prefix_out_of_the_thought(tok):
    for template in (QWEN3, QWEN3_THINKING_2507):
        mt = model_template("chat", _with(tok, template))
        prompt = mt.compose(TASK, PREFIX)
        assert prompt == mt.head + TASK + PREFIX + mt.tail
        # the prefix ends the user turn; nothing but the generation prompt follows it
        assert prompt.index(PREFIX) + len(PREFIX) == prompt.index("<|im_end|>\n" + ASSISTANT)
        assert PREFIX not in prompt[prompt.index(ASSISTANT):]
        assert "<think>" not in prompt[:prompt.index(ASSISTANT)]
    # not thinking: exactly the layout of before (the prefix starts the assistant turn, as upstream RULER)
    off = model_template("chat", _with(tok, QWEN3), chat_template_kwargs={"enable_thinking": False})
    assert off.compose(TASK, PREFIX) == off.head + TASK + off.tail + PREFIX
    assert off.compose(TASK, PREFIX).endswith("</think>\n\n" + PREFIX)
    chatml = model_template("chat", _with(tok, CHATML))
    assert chatml.compose(TASK, PREFIX) == "<|im_start|>user\n" + TASK + "<|im_end|>\n<|im_start|>assistant\n" + PREFIX
    assert model_template("base").compose(TASK, PREFIX) == TASK + PREFIX


def test_system_prompt_is_a_system_turn(tok):
    mt = model_template("chat", _with(tok, QWEN3), system_prompt="Answer {briefly}.")
    assert mt.head == "<|im_start|>system\nAnswer {briefly}.<|im_end|>\n<|im_start|>user\n"
    # braces of the system prompt survive RULER's str.format of the whole template
    text = mt.compose(TASK, PREFIX).format(context="CTX", query="q")
    assert text.startswith("<|im_start|>system\nAnswer {briefly}.<|im_end|>\n<|im_start|>user\nSome text.\nCTX\n")
    assert mt.describe() == {"name": "chat", "head": mt.head, "tail": mt.tail, "system_prompt": "Answer {briefly}.",
                             "thinking": True}


def test_describe_keeps_the_old_keys_without_the_new_settings(tok):
    assert model_template("base").describe() == {"name": "base", "head": "", "tail": ""}
    chatml = model_template("chat", _with(tok, CHATML), chat_template_kwargs={})
    assert chatml.describe() == {"name": "chat", "head": "<|im_start|>user\n",
                                 "tail": "<|im_end|>\n<|im_start|>assistant\n"}
    off = model_template("chat", _with(tok, QWEN3), chat_template_kwargs={"enable_thinking": False})
    assert off.describe() == {"name": "chat", "head": off.head, "tail": off.tail,
                              "chat_template_kwargs": {"enable_thinking": False}}


@pytest.mark.parametrize("template, kw, msg", [
    (NO_SYSTEM, dict(system_prompt="Be brief."), r"refuses a system message \(TemplateError: System role not "
                                                 r"supported\); drop --system-prompt"),
    ("{% if strict %}{{ raise_exception('strict mode is gone') }}{% endif %}" + CHATML,
     dict(chat_template_kwargs={"strict": True}), r"fails with --chat-template-kwargs \{\"strict\": true\} .*"
                                                  r"strict mode is gone.*change or drop --chat-template-kwargs"),
    (CHATML, dict(chat_template_kwargs={"add_generation_prompt": False}), "cannot set add_generation_prompt"),
    (CHATML, dict(chat_template_kwargs={"when": object()}), "JSON values only"),
    (CHATML, dict(chat_template_kwargs=["enable_thinking"]), "must be a JSON object"),
    (CHATML, dict(system_prompt=3), "must be text"),
])
def test_chat_refusals_are_one_line(tok, template, kw, msg):
    with pytest.raises(RulerInputError, match=msg) as e:
        model_template("chat", _with(tok, template), **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw", [dict(system_prompt="Be brief."), dict(chat_template_kwargs={"x": 1})])
def test_base_refuses_chat_settings(kw):
    with pytest.raises(RulerInputError, match="are for the chat template; add --template chat") as e:
        model_template("base", None, **kw)
    assert "\n" not in str(e.value)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_prepare_with_a_thinking_template(tok, tmp_path):
    _with(tok, QWEN3)
    out = tmp_path / "o"
    args = dict(tasks=["niah_single_1", "vt"], samples=2, seed=3, template="chat", out_dir=out, progress=False,
                system_prompt="You are a careful reader.")
    r1 = prepare(tok, [1024], chat_template_kwargs={"enable_thinking": True}, **args)
    tail = "<|im_end|>\n<|im_start|>assistant\n"
    for path in r1.files:
        for rec in _records(path):
            prompt = rec["input"] + rec["answer_prefix"]
            assert prompt.startswith("<|im_start|>system\nYou are a careful reader.<|im_end|>\n<|im_start|>user\n")
            # RULER's split: input ends where the answer prefix starts; the prefix then ends the user turn
            assert rec["answer_prefix"].startswith((" The special magic number for ", " Answer: According to"))
            assert rec["answer_prefix"].endswith(tail) and prompt.count(ASSISTANT) == 1
            assert ASSISTANT not in rec["input"] and len(prompt) <= len(rec["input"]) + 200
    m = json.loads((out / "manifest.json").read_text())
    assert m["template"] == {"name": "chat", "head": "<|im_start|>system\nYou are a careful reader.<|im_end|>\n"
                             "<|im_start|>user\n", "tail": tail, "system_prompt": "You are a careful reader.",
                             "chat_template_kwargs": {"enable_thinking": True}, "thinking": True}
    shas = {rel: e["sha256"] for rel, e in m["files"].items()}

    # other template variables: new prompts (the prefix back in the assistant turn, after the empty thought)
    r2 = prepare(tok, [1024], chat_template_kwargs={"enable_thinking": False}, **args)
    assert not any(t.reused for t in r2.timings)
    m2 = json.loads((out / "manifest.json").read_text())
    assert all(m2["files"][rel]["sha256"] != sha for rel, sha in shas.items())
    assert "thinking" not in m2["template"] and m2["template"]["chat_template_kwargs"] == {"enable_thinking": False}
    for path in r2.files:
        for rec in _records(path):
            assert rec["input"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
            assert ASSISTANT not in rec["answer_prefix"]
    # the same variables again: every file reused, unchanged
    r3 = prepare(tok, [1024], chat_template_kwargs={"enable_thinking": False}, **args)
    assert all(t.reused for t in r3.timings)
    assert json.loads((out / "manifest.json").read_text())["files"] == m2["files"]
    # no system prompt: a different request again
    r4 = prepare(tok, [1024], chat_template_kwargs={"enable_thinking": False}, **{**args, "system_prompt": None})
    assert not any(t.reused for t in r4.timings)


@pytest.mark.slow
def test_prepare_every_generator_splits_at_the_prefix(tok, tmp_path):
    """Thinking layout for each generator kind: `input + answer_prefix` is the whole prompt, cut where the
    (last) answer prefix starts, and the answer prefix is that prefix plus the generation prompt."""
    _with(tok, QWEN3_THINKING_2507)
    r = prepare(tok, [2048], tasks=["niah_multiquery", "vt", "cwe", "fwe", "qa_1"], samples=2, template="chat",
                data_dir=FIXTURE_DATA, out_dir=tmp_path / "o", progress=False)
    tail = "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    starts = {"niah_multiquery": " The special magic numbers for ", "vt": " Answer: According to the chain(s)",
              "cwe": " Answer: The top 10 words", "fwe": " Answer: According to the coded text", "qa_1": " Answer:"}
    for path, timing in zip(r.files, r.timings):
        for rec in _records(path):
            ap = rec["answer_prefix"]
            assert ap.startswith(starts[timing.task]) and ap.endswith(tail), (timing.task, ap)
            assert ASSISTANT not in ap[:-len(tail)]
            # cwe's one-shot example is a whole templated turn, generation prompt included (as upstream)
            shots = 1 if timing.task == "cwe" else 0
            assert rec["input"].count(ASSISTANT) == rec["input"].count("<think>") == shots


@pytest.mark.slow
def test_prepare_without_the_new_settings_keeps_its_request(reference_tokenizer_dir, tmp_path):
    args = dict(tasks=["niah_single_1"], samples=2, out_dir=tmp_path / "o", progress=False)
    prepare(reference_tokenizer_dir, [1024], **args)
    again = prepare(reference_tokenizer_dir, [1024], system_prompt=None, chat_template_kwargs={}, **args)
    assert all(t.reused for t in again.timings)
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["template"] == {"name": "base", "head": "", "tail": ""}
    with pytest.raises(RulerInputError, match="for the chat template"):
        prepare(reference_tokenizer_dir, [1024], system_prompt="Be brief.", **args)


@pytest.mark.parametrize("text, expected", [
    ("<think>\nthe number is 7?\n</think>\n\nThe answer is 42.", ("\n\nThe answer is 42.", True)),
    ("the thought went on</think>\n\n42", ("\n\n42", True)),  # the prompt opened <think> (Thinking-2507)
    ("<think>a</think>b</think>\n\nlast wins", ("\n\nlast wins", True)),
    ("<think>\n\n</think>\n\n", ("\n\n", True)),
    ("<think>\nstill thinking about 42 when the budget ran out", ("", False)),
    ("42, no tags at all", ("", False)),
    ("", ("", False)),
])
def test_answer_after_thinking(text, expected):
    assert answer_after_thinking(text) == expected
    assert THINK_END == "</think>"


# --- the chat head keeps every token the template wrote that the tokenizer does not add itself ---------------

# Mistral-7B-Instruct-v0.1's way: the template writes the BOS its tokenizer also adds
MISTRAL = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
           "{% endif %}{% endfor %}")
LLAMA_BOS = "{{ bos_token }}" + CHATML
BOS_NAMED_IM_START = CHATML  # SmolLM2: its tokenizer names <|im_start|> the BOS but never adds it


def _bpe(tmp_path, bos: str):
    """The shipped tiny byte-level BPE (adds nothing by itself) with ChatML's tokens and `bos` as its BOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(Path(__file__).parents[1] / "checkpoints" / "tiny-gated")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": bos})
    return tok


@pytest.mark.parametrize("case", ["sentencepiece-adds-bos", "bpe-bos-is-im_start", "bpe-bos-written-not-added",
                                  "qwen3-no-bos"])
def test_the_prompt_is_the_tokens_the_template_renders(case, reference_tokenizer_dir, tmp_path):
    """What every backend encodes (head + task + tail, with the tokenizer's own special tokens) is the ids
    `apply_chat_template(tokenize=True)` gives: no token the template wrote is dropped, none is doubled. Where the
    tokenizer adds the BOS the template writes, the prompt is the rendered text without it, and the tokenizer adds it
    once (a SentencePiece tokenizer may then split the text just after the BOS differently, as it does any text's
    first word)."""
    if case == "sentencepiece-adds-bos":
        tok = _with(load_tokenizer(reference_tokenizer_dir), MISTRAL)
        tok.add_bos_token = True  # as Llama's and Mistral's own tokenizers do (the reference one, RULER's, does not)
        assert tok("a").input_ids[0] == tok.bos_token_id
    elif case == "bpe-bos-is-im_start":
        tok = _with(_bpe(tmp_path, "<|im_start|>"), BOS_NAMED_IM_START)
    elif case == "bpe-bos-written-not-added":
        tok = _with(_bpe(tmp_path, "<s>"), LLAMA_BOS)
    else:
        tok = _with(load_tokenizer(reference_tokenizer_dir), QWEN3)
    task = "The grass is green. What is the special magic number for fair-sleet?"
    for system in (None, "You are a helpful assistant."):
        t = model_template("chat", tok, system_prompt=system)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": task}]
        got = tok(t.head + task + t.tail).input_ids
        if case == "sentencepiece-adds-bos":
            rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert rendered == tok.bos_token + t.head + task + t.tail
            assert got[0] == tok.bos_token_id and got.count(tok.bos_token_id) == 1
            continue
        want = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)
        assert got == want["input_ids"], (case, t.head)
    if case == "bpe-bos-is-im_start":
        assert t.head.startswith("<|im_start|>system\n")


# --- the render limit counts the template's own work, not the machine's ------------------------------------


class _SlowAround:
    """A tokenizer whose `apply_chat_template` first does `seconds` of other Python work (what importing and
    compiling under a trace hook on a busy machine amounted to), then renders."""

    def __init__(self, tok, seconds: float):
        self.tok, self.seconds = tok, seconds
        self.chat_template, self.bos_token = tok.chat_template, tok.bos_token

    def __call__(self, *args, **kwargs):
        return self.tok(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        import time

        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            sum(range(100))
        return self.tok.apply_chat_template(*args, **kwargs)


def test_work_around_the_template_does_not_count_and_a_runaway_template_is_stopped(tok, monkeypatch):
    from ruler_tasks import templates

    monkeypatch.setattr(templates, "RENDER_LIMIT_S", 0.3)
    slow = _SlowAround(_with(tok, CHATML), seconds=1.0)
    assert model_template("chat", slow).head == "<|im_start|>user\n"
    looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + CHATML
    with pytest.raises(RulerInputError, match="within 0.3 s of CPU time"):
        model_template("chat", _with(tok, looping))
