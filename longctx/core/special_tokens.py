"""What a tokenizer adds to a text by itself, read off the tokenizer (any object called like a transformers
tokenizer): shared by the prompts of `ruler_tasks`, extend's stream packing and the `sinks` windows."""

from __future__ import annotations

from typing import Any


def special_tokens_added(tokenizer: Any) -> int:
    """How many tokens the tokenizer adds to a text by itself (a BOS, usually 0 or 1)."""
    with_special = tokenizer("a").input_ids
    without = tokenizer("a", add_special_tokens=False).input_ids
    return max(0, len(with_special) - len(without))


def leading_bos(tokenizer: Any) -> int | None:
    """The BOS id the tokenizer puts before every text, or None when it adds none: what a prompt, a `sinks` window
    and a `stream`-packed training sequence begin with."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None or not special_tokens_added(tokenizer):
        return None
    return bos if tokenizer("a").input_ids[:1] == [bos] else None
