"""Shared machinery of the generators: context, RULER's length search and retry loop, record format."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ruler_tasks.counting import TokenCounter
from ruler_tasks.errors import RulerInputError
from ruler_tasks.templates import ModelTemplate
from ruler_tasks.text import Part

# Upstream's retry loop (`while True: try ... except: used -= incremental`) never ends when a sample
# cannot fit even at the smallest size; we stop after this many failed draws at that size.
MAX_RETRIES_AT_MIN = 200
# Exceptions upstream's bare `except:` turns into a retry (raised by the sample builder itself).
RETRYABLE = (ValueError, IndexError, KeyError, AssertionError)


@dataclass
class GenContext:
    task: str
    args: dict
    max_seq_length: int
    num_samples: int
    seed: int
    counter: TokenCounter
    template: ModelTemplate
    tokens_to_generate: int
    data: dict = field(default_factory=dict)  # source name -> DataSource
    model_template_token: int = 0
    english_words: list | None = None
    stats: dict = field(default_factory=dict)

    def __post_init__(self):
        # RULER seeds the global RNGs at import; private instances give the same streams.
        self.rng = random.Random(self.seed)
        self.nprng = np.random.RandomState(self.seed)

    def count(self, parts: Sequence[Part]) -> int:
        return self.counter.count(parts)


def binary_search(ctx: GenContext, probe: Callable[[int], int], lower: int, upper: int, default: int) -> int:
    """RULER's midpoint search: largest size whose probe total fits `max`, else `default`."""
    best = None
    probes = 0
    limit = ctx.max_seq_length - ctx.model_template_token
    while lower <= upper:
        mid = (lower + upper) // 2
        total = probe(mid)
        probes += 1
        if total <= limit:
            best = mid
            lower = mid + 1
        else:
            upper = mid - 1
    ctx.stats.setdefault("search", []).append({"probes": probes, "result": best if best is not None else default})
    return best if best is not None else default


def fit_sample(ctx: GenContext, build: Callable[[int], Any], size: int, incremental: int,
               max_len: int | None = None) -> tuple[Any, int]:
    """RULER's per-sample loop: draw at `size`; while the prompt is too long, step down and redraw.

    `build(size)` returns `(parts, extra)`; the result is `((parts, extra), length)` where length is
    `count(parts) + tokens_to_generate`.
    """
    limit = (ctx.max_seq_length if max_len is None else max_len) - ctx.model_template_token
    used = size
    failures_at_min = 0
    while True:
        try:
            out = build(used)
            length = ctx.count(out[0]) + ctx.tokens_to_generate
            if length > limit:
                raise AssertionError(f"{length} exceeds max_seq_length.")
            return out, length
        except RulerInputError:
            raise
        except RETRYABLE:
            if used > incremental:
                used -= incremental
                ctx.stats["retries"] = ctx.stats.get("retries", 0) + 1
            else:
                failures_at_min += 1
                if failures_at_min >= MAX_RETRIES_AT_MIN:
                    raise RulerInputError(
                        f"task {ctx.task}: no sample fits in {ctx.max_seq_length} tokens even at the smallest size "
                        f"(upstream RULER would loop forever); use a larger length") from None


def split_answer_prefix(text: str, answer_prefix_template: str) -> tuple[str, str]:
    """RULER: `input` ends where `rfind(answer_prefix[:10])` starts; the rest is `answer_prefix`."""
    i = text.rfind(answer_prefix_template[:10])
    return text[:i], text[i:]


def record(index: int, text: str, outputs, length: int, ctx: GenContext, answer_prefix_template: str) -> dict:
    inp, prefix = split_answer_prefix(text, answer_prefix_template)
    return {
        "index": index,
        "input": inp,
        "outputs": outputs,
        "length": length,
        "length_w_model_temp": length + ctx.model_template_token,
        "answer_prefix": prefix,
    }


SampleIter = Iterator[dict]
