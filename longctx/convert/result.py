"""What `longctx convert` reports, whatever the source layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ConvertResult:
    output: Path
    source: Path
    attention: str  # the attention variant written: baseline (no gate), elementwise, headwise
    architecture: str
    parameters: int
    kv_groups: int  # query heads per KV head
