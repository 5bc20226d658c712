"""What a backend is asked to complete, and how it reports each answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    key: Any  # the runner's identifier (length, task, index)
    prompt: str
    max_tokens: int


# on_result(request, text, prompt_tokens or None)
OnResult = Callable[[Request, str, "int | None"], None]
