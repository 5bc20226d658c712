"""RULER scoring, exactly as upstream (NVIDIA/RULER `scripts/eval/evaluate.py` and
`scripts/eval/synthetic/constants.py` @ c3f5e3b).

- post-processing: `strip()`, every control character `[\\x00-\\x1f]` -> `\\n`, `strip()` again;
  nothing else (no punctuation or article removal);
- `string_match_all`: per sample the fraction of references that are case-insensitive substrings of
  the prediction, averaged over samples, x100, `round(, 2)`;
- `string_match_part`: per sample 1 if *any* reference is a substring (upstream's any-match, not
  lm-eval's fraction), averaged, x100, `round(, 2)`;
- nulls: predictions that are empty after post-processing.
The expressions below keep upstream's order of operations so the floats (and their rounding) agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_NON_PRINTABLE = re.compile(r"[\x00-\x1f]")


@dataclass(frozen=True)
class Metric:
    """A RULER metric: a sample's score from its hits (1.0 or 0.0 per reference, whether it is a case-insensitive
    substring of the prediction), averaged over samples, x100, `round(, 2)`."""

    name: str
    per_sample: Callable[[list[float]], float]  # hits -> the sample's score in [0, 1]


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("string_match_all", lambda hits: sum(hits) / len(hits)),  # the share of references found
    Metric("string_match_part", max),  # any reference found (upstream's any-match, not lm-eval's fraction)
)}


def metric_of(name: str) -> Metric:
    """The metric `name`; ValueError naming the known ones for any other."""
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric '{name}' (known: {', '.join(METRICS)})") from None


def postprocess_pred(predict_str: str) -> str:
    predict_str = predict_str.strip()
    return _NON_PRINTABLE.sub("\n", predict_str).strip()


def _hits(pred: str, ref: Sequence[str]) -> list[float]:
    return [1.0 if r.lower() in pred.lower() else 0.0 for r in ref]


def _score(preds: Sequence[str], refs: Sequence[Sequence[str]], metric: Metric) -> float:
    # upstream's order of operations, so the floats (and their rounding) agree
    score = sum([metric.per_sample(_hits(pred, ref)) for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    return _score(preds, refs, METRICS["string_match_all"])


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    return _score(preds, refs, METRICS["string_match_part"])


def sample_scores(raw_preds: Sequence[str], refs: Sequence[Sequence[str]], metric: str) -> list[float]:
    """Each sample's score (0-100) under `metric`, post-processed as upstream: their mean is the task's score
    before rounding (what intervals and paired differences are computed from)."""
    m = metric_of(metric)
    return [m.per_sample(_hits(postprocess_pred(raw), ref)) * 100 for raw, ref in zip(raw_preds, refs)]


@dataclass(frozen=True)
class TaskScore:
    score: float | None  # 0-100, 2 decimals; None when there is no prediction
    nulls: int  # empty predictions after post-processing
    samples: int


def score_predictions(raw_preds: Sequence[str], refs: Sequence[Sequence[str]], metric: str) -> TaskScore:
    """Score one (task, length): raw predictions and their reference lists, with upstream's metric."""
    m = metric_of(metric)
    if len(raw_preds) != len(refs):
        raise ValueError(f"{len(raw_preds)} predictions but {len(refs)} reference lists")
    preds = [postprocess_pred(p) for p in raw_preds]
    nulls = sum(len(p) == 0 for p in preds)
    if not preds:
        return TaskScore(None, 0, 0)
    return TaskScore(_score(preds, refs, m), nulls, len(preds))
