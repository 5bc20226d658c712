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
from collections.abc import Sequence
from dataclasses import dataclass

_NON_PRINTABLE = re.compile(r"[\x00-\x1f]")
METRICS = ("string_match_all", "string_match_part")


def postprocess_pred(predict_str: str) -> str:
    predict_str = predict_str.strip()
    return _NON_PRINTABLE.sub("\n", predict_str).strip()


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    score = sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref)
                 for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    score = sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref])
                 for pred, ref in zip(preds, refs)]) / len(preds) * 100
    return round(score, 2)


_METRIC_FNS = {"string_match_all": string_match_all, "string_match_part": string_match_part}


def sample_scores(raw_preds: Sequence[str], refs: Sequence[Sequence[str]], metric: str) -> list[float]:
    """Each sample's score (0-100) under `metric`, post-processed as upstream: their mean is the task's score
    before rounding (what intervals and paired differences are computed from)."""
    if metric not in _METRIC_FNS:
        raise ValueError(f"unknown metric '{metric}' (known: {', '.join(METRICS)})")
    out = []
    for raw, ref in zip(raw_preds, refs):
        pred = postprocess_pred(raw).lower()
        hits = [1.0 if r.lower() in pred else 0.0 for r in ref]
        out.append((sum(hits) / len(hits) if metric == "string_match_all" else max(hits)) * 100)
    return out


@dataclass(frozen=True)
class TaskScore:
    score: float | None  # 0-100, 2 decimals; None when there is no prediction
    nulls: int  # empty predictions after post-processing
    samples: int


def score_predictions(raw_preds: Sequence[str], refs: Sequence[Sequence[str]], metric: str) -> TaskScore:
    """Score one (task, length): raw predictions and their reference lists, with upstream's metric."""
    if metric not in _METRIC_FNS:
        raise ValueError(f"unknown metric '{metric}' (known: {', '.join(METRICS)})")
    if len(raw_preds) != len(refs):
        raise ValueError(f"{len(raw_preds)} predictions but {len(refs)} reference lists")
    preds = [postprocess_pred(p) for p in raw_preds]
    nulls = sum(len(p) == 0 for p in preds)
    if not preds:
        return TaskScore(None, 0, 0)
    return TaskScore(_METRIC_FNS[metric](preds, refs), nulls, len(preds))
