"""The layouts `longctx convert --from` reads, one entry each. A layout is a module with `convert(settings) ->
ConvertResult` and, when its SOURCE is no checkpoint folder, `trained_length(source) -> int | None` (what a recipe
plans lengths with); a new layout is such a module and an entry here."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from longctx.convert.result import ConvertResult


@dataclass(frozen=True)
class Layout:
    module: str
    words: str  # what SOURCE is, for --help

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


LAYOUTS: dict[str, Layout] = {
    "official": Layout("longctx.convert.official", "the paper's released checkpoints (QwQZh/gated_attention: widened "
                                                   "q_proj), a folder or Hub id"),
    "gguf": Layout("longctx.convert.gguf", "a llama.cpp GGUF file (or a folder holding one), de-quantized to float32 "
                                           "by transformers' GGUF loader"),
}


def convert_checkpoint(s) -> ConvertResult:
    """Convert `s.source` from the layout `s.layout` into a checkpoint at `s.output`."""
    return LAYOUTS[s.layout].load().convert(s)
