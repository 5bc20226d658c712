"""The tokenizer prompts are written with, read back from longctx's cache: the same ids, fingerprint, special
tokens and chat renderings as the tokenizer transformers builds, a new entry when a file changes, a damaged entry
rebuilt, nothing kept that could differ; and a RULER prepare that imports neither torch nor transformers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import user_environment
from ruler_helpers import FIXTURE_DATA

from longctx.checkpoint import prompt_tokenizer as pt
from longctx.checkpoint.prompt_tokenizer import PromptTokenizer, source_key
from longctx.core.hashing import tokenizer_fingerprint
from longctx.core.special_tokens import special_tokens_added
from longctx.eval.tasks import load_task_tokenizer
from ruler_tasks.templates import model_template

ROOT = Path(__file__).resolve().parents[1]
QWEN3 = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text(encoding="utf-8")
TEXTS = ["a", "Hello world", " leading space and  two", "<s> literal specials </s>", "1234567 uuids 4f1b-9c2e-aa",
         "ünïcödé → ☃", "line\nbreaks\n\n\tand tabs"]


@pytest.fixture
def byte_level_dir(tmp_path):
    """A byte-level BPE tokenizer (no BOS) with Qwen3's chat template, saved as transformers saves one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(["The special magic numbers are hidden in this text. " * 20] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
    tok.chat_template = QWEN3
    tok.save_pretrained(tmp_path / "bpe")
    return tmp_path / "bpe"


def _transformers(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _same(cached, real) -> None:
    assert isinstance(cached, PromptTokenizer)
    assert tokenizer_fingerprint(cached) == tokenizer_fingerprint(real)
    for text in TEXTS:
        for add in (True, False):
            assert cached(text, add_special_tokens=add).input_ids == list(real(text, add_special_tokens=add).input_ids)
    assert (len(cached), cached.bos_token, cached.bos_token_id) == (len(real), real.bos_token, real.bos_token_id)
    assert special_tokens_added(cached) == special_tokens_added(real)
    assert sorted(cached.all_special_ids) == sorted(real.all_special_ids)
    if real.chat_template:
        for kwargs in (None, {"enable_thinking": False}):
            a = model_template("chat", cached, "Be brief.", kwargs)
            b = model_template("chat", real, "Be brief.", kwargs)
            assert (a.head, a.tail, a.thinking) == (b.head, b.tail, b.thinking)


@pytest.mark.parametrize("which", ["reference", "byte-level"])
def test_a_cached_tokenizer_is_the_one_transformers_builds(which, reference_tokenizer_dir, byte_level_dir, tmp_path,
                                                          monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(cache))
    folder = reference_tokenizer_dir if which == "reference" else byte_level_dir
    real = _transformers(folder)
    first = load_task_tokenizer(folder, False)  # through transformers, kept
    _same(first, real)
    assert first.loaded is not None and (cache / "tokenizers" / source_key(folder, False)).is_dir()
    second = load_task_tokenizer(folder, False)  # read back
    assert second.loaded is None
    _same(second, real)
    if real.chat_template:  # the renderings were kept with the entry: the third load renders without transformers
        third = load_task_tokenizer(folder, False)
        model_template("chat", third, "Be brief.", {"enable_thinking": False})
        assert third.loaded is None


def _set_template(folder: Path, template: str) -> None:
    """The chat template of the tokenizer saved in `folder`, as tokenizer_config.json's own."""
    config = folder / "tokenizer_config.json"
    cfg = json.loads(config.read_text())
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    cfg["chat_template"] = template
    config.write_text(json.dumps(cfg))


def test_a_changed_file_is_a_new_entry_and_a_damaged_one_is_rebuilt(byte_level_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(tmp_path / "cache"))
    before = load_task_tokenizer(byte_level_dir, False)
    _set_template(byte_level_dir, "{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    after = load_task_tokenizer(byte_level_dir, False)
    assert after.loaded is not None  # not the old entry
    assert after.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "[x]"
    assert before.chat_template != after.chat_template
    entry = tmp_path / "cache" / "tokenizers" / source_key(byte_level_dir, False)
    (entry / "tokenizer.json").write_text('{"version": "1.0", "truncated')
    rebuilt = load_task_tokenizer(byte_level_dir, False)
    assert rebuilt.loaded is not None
    _same(rebuilt, _transformers(byte_level_dir))
    assert load_task_tokenizer(byte_level_dir, False).loaded is None  # whole again


def test_nothing_is_kept_that_could_differ(byte_level_dir, tmp_path, monkeypatch):
    """A rendering of a template that reads the clock is made every time; a tokenizer whose pipeline alone does
    not give its ids is used as transformers builds it, and nothing is kept."""
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(tmp_path / "cache"))
    _set_template(byte_level_dir, "{{ strftime_now('%Y') }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    tok = load_task_tokenizer(byte_level_dir, False)
    tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert not tok.renders
    shutil.rmtree(tmp_path / "cache")

    def wrong_ids(self, text, add_special_tokens=True):
        return pt._Encoded([0])

    monkeypatch.setattr(PromptTokenizer, "__call__", wrong_ids)
    real = load_task_tokenizer(byte_level_dir, False)
    assert not isinstance(real, PromptTokenizer)
    assert not (tmp_path / "cache" / "tokenizers").exists() or not any((tmp_path / "cache" / "tokenizers").iterdir())


@pytest.mark.slow
def test_preparing_prompts_imports_neither_torch_nor_transformers(tmp_path):
    """A gated checkpoint's tokenizer (whose config transformers knows only through longctx's registration of
    the gated model) in a second `ruler prepare`, two tasks in two worker processes: -X importtime lists every
    module the process and its workers import."""
    env = {**user_environment(), "LONGCTX_CACHE_DIR": str(tmp_path / "cache"), "TQDM_DISABLE": "1"}

    def prepare(out: str) -> str:
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "longctx", "ruler", "prepare", "--tokenizer",
                            str(ROOT / "checkpoints" / "tiny-gated"), "--lengths", "4k", "--tasks",
                            "niah_single_1,niah_single_2", "--samples", "2", "--workers", "2", "--data-dir",
                            str(FIXTURE_DATA), "-o", str(tmp_path / out)], capture_output=True, text=True, env=env,
                           check=False)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stderr

    def imported(stderr: str) -> set[str]:
        return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}

    assert {"torch", "transformers"} <= imported(prepare("first"))  # the first load builds it with transformers
    second = imported(prepare("second"))
    # the listing covers the workers too (the generators' modules are imported there only; `importlib.import_module`
    # itself is not timed, the imports it runs are)
    assert "longctx.cli.main" in second and "ruler_tasks.sentences" in second
    assert not {"torch", "transformers", "nltk"} & second
    assert os.listdir(tmp_path / "second" / "4096") == os.listdir(tmp_path / "first" / "4096")
