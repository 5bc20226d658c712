"""`results.json`: the typed results schema of a RULER run, its aggregation, and the run's report files.

A run directory's `scores.json` (written by `longctx.eval`) becomes `results.json` (the schema below),
`results.md`, `results.csv` and `results.png`. Reads only result files.

Aggregation follows NVIDIA/RULER's README @ c3f5e3b: per length the unweighted mean of the tasks run at
that length; `Avg.` the mean over lengths; `wAvg (inc)` weights 1..n/sum and `wAvg (dec)` n..1/sum over
the lengths in ascending order; effective length the longest length whose mean is >= 85.6
(Llama2-7B-chat at 4K). Every number is 0-100 and rounded to 2 decimals.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

from longctx.checkpoint.describe import ModelInfo
from longctx.core.clock import utc_timestamp
from longctx.core.errors import InputError
from longctx.core.files import read_versioned_json

RESULTS_FORMAT = "longctx-ruler-results/1"
SCORES_FILE = "scores.json"
RESULTS_FILE = "results.json"
THRESHOLD = 85.6  # Llama2-7B-chat at 4K: RULER's effective-length threshold


class Results(TypedDict):
    """`results.json`. Length keys are ints in Python and decimal strings in the JSON file;
    a (task, length) that was not run is None/null, never -1."""

    format: str
    model: ModelInfo
    backend: dict[str, Any]
    sampling: dict[str, Any]
    template: dict[str, Any]
    upstream: str
    task_set: str
    lengths: list[int]
    tasks: list[str]
    metrics: dict[str, str]  # task -> string_match_all | string_match_part
    scores: dict[str, dict[int, float | None]]  # task -> length -> 0..100
    nulls: dict[str, dict[int, int | None]]  # task -> length -> empty predictions
    samples: dict[str, dict[int, int | None]]  # task -> length -> predictions scored
    per_length: dict[int, float | None]  # mean over the tasks run at that length
    avg: float | None
    wavg_inc: float | None
    wavg_dec: float | None
    threshold: float
    effective_length: int | None
    seeds: dict[str, int | None]
    versions: dict[str, str | None]
    task_versions: dict[str, str]
    timings: dict[str, float | int | None]
    created: str



def mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


def aggregate(per_length: dict[int, float | None], threshold: float = THRESHOLD) -> dict[str, Any]:
    """Avg, wAvg(inc/dec) and effective length from per-length means (lengths not run are None)."""
    ordered = [(L, per_length[L]) for L in sorted(per_length) if per_length[L] is not None]
    values = [v for _, v in ordered]
    n = len(values)
    total = n * (n + 1) / 2
    inc = round(sum((i + 1) * v for i, v in enumerate(values)) / total, 2) if n else None
    dec = round(sum((n - i) * v for i, v in enumerate(values)) / total, 2) if n else None
    passing = [L for L, v in ordered if v >= threshold]
    return {"avg": mean(values), "wavg_inc": inc, "wavg_dec": dec,
            "effective_length": max(passing) if passing else None}


def per_length_means(scores: dict[str, dict[int, float | None]], lengths: list[int],
                     tasks: list[str] | None = None) -> dict[int, float | None]:
    tasks = list(scores) if tasks is None else tasks
    return {L: mean([scores[t][L] for t in tasks if scores[t].get(L) is not None]) for L in lengths}


def _int_keys(d: dict) -> dict:
    return {int(k): v for k, v in d.items()}


def build_results(scores_doc: dict[str, Any]) -> Results:
    """results.json content from a run's scores.json content."""
    lengths = sorted(int(L) for L in scores_doc["lengths"])
    tasks = list(scores_doc["tasks"])
    scores = {t: {L: None for L in lengths} for t in tasks}
    nulls = {t: {L: None for L in lengths} for t in tasks}
    samples = {t: {L: None for L in lengths} for t in tasks}
    metrics: dict[str, str] = {}
    for row in scores_doc["scores"]:
        t, L = row["task"], int(row["length"])
        scores[t][L], nulls[t][L], samples[t][L] = row["score"], row["nulls"], row["samples"]
        metrics[t] = row["metric"]
    per_length = per_length_means(scores, lengths, tasks)
    return Results(
        format=RESULTS_FORMAT, model=scores_doc["model"], backend=scores_doc["backend"],
        sampling=scores_doc["sampling"], template=scores_doc["template"], upstream=scores_doc["upstream"],
        task_set=scores_doc["task_set"], lengths=lengths, tasks=tasks, metrics=metrics, scores=scores,
        nulls=nulls, samples=samples, per_length=per_length, **aggregate(per_length), threshold=THRESHOLD,
        seeds=scores_doc["seeds"], versions=scores_doc["versions"], task_versions=scores_doc["task_versions"],
        timings=scores_doc["timings"], created=utc_timestamp(),
    )


def to_json(results: Results) -> dict:
    out = dict(results)
    for key in ("scores", "nulls", "samples"):
        out[key] = {t: {str(L): v for L, v in row.items()} for t, row in results[key].items()}
    out["per_length"] = {str(L): v for L, v in results["per_length"].items()}
    return out


def load_results(run_dir: str | os.PathLike) -> Results:
    """A run directory's results.json with int length keys, or InputError saying what is missing."""
    path = Path(run_dir) / RESULTS_FILE
    if not Path(run_dir).is_dir():
        raise InputError(f"'{run_dir}' is not a directory (give a run directory written by 'longctx ruler')")
    if not path.is_file():
        raise InputError(f"'{run_dir}' has no {RESULTS_FILE} (not a finished 'longctx ruler' run; "
                         f"finish it with 'longctx ruler CKPT ... -o {run_dir}')")
    doc = read_versioned_json(path, RESULTS_FORMAT, "results")
    for key in ("scores", "nulls", "samples"):
        doc[key] = {t: _int_keys(row) for t, row in doc[key].items()}
    doc["per_length"] = _int_keys(doc["per_length"])
    return doc  # type: ignore[return-value]
