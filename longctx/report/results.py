"""`results.json`: the typed results schema of a RULER run, its aggregation, and the run's report files.

A run directory's `scores.json` (written by `longctx.eval`) becomes `results.json` (the schema below),
`results.md`, `results.csv` and `results.png`. Reads only result files.

Aggregation follows NVIDIA/RULER's README @ c3f5e3b: per length the unweighted mean of the tasks run at
that length; `Avg.` the mean over lengths; `wAvg (inc)` weights 1..n/sum and `wAvg (dec)` n..1/sum over
the lengths in ascending order; effective length the longest length whose mean is >= 85.6
(Llama2-7B-chat at 4K). Every number is 0-100 and rounded to 2 decimals.

`intervals` (added by `with_intervals` from the run's per-sample scores, null when the run directory does not
hold them): per (task, length) and per length mean the standard error and 95% interval of `stats`, and the
method and seed they were computed with.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict

from longctx.core.clock import utc_timestamp
from longctx.core.errors import InputError
from longctx.core.files import read_versioned_json
from longctx.core.parse import loads
from longctx.core.secrets import redact_url
from longctx.info.describe import ModelInfo
from longctx.report import stats

RESULTS_FORMAT = "longctx-ruler-results/1"
SCORES_FILE = "scores.json"
RESULTS_FILE = "results.json"
THRESHOLD = 85.6  # Llama2-7B-chat at 4K: RULER's effective-length threshold


class Intervals(TypedDict):
    """`results.json`'s "intervals": {"se", "lo", "hi"} (`stats.Interval.as_dict`) per cell and per length."""

    method: dict[str, Any]  # stats.METHOD: how se and the interval were computed, and the seed
    scores: dict[str, dict[int, dict[str, float] | None]]  # task -> length -> se/lo/hi of its score
    per_length: dict[int, dict[str, float] | None]  # length -> se/lo/hi of the mean over tasks


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
    intervals: NotRequired[Intervals | None]  # absent in results.json files written before intervals existed


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


def _number(v: Any) -> bool:
    """A number or null (a score, a count, a mean)."""
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _length(v: Any) -> bool:
    if isinstance(v, str):
        v = int(v) if v.isdigit() else None
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _names(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, str) and x for x in v)


_SCORES_KEYS = ("model", "backend", "sampling", "template", "upstream", "task_set", "seeds", "versions",
                "task_versions", "timings")


def _scores_problem(doc: Any) -> str | None:
    """What a scores.json lacks that `build_results` reads (None: nothing)."""
    if not isinstance(doc, dict):
        return "it is not a JSON object"
    missing = [k for k in ("lengths", "tasks", "scores", *_SCORES_KEYS) if k not in doc]
    if missing:
        return f"it has no {', '.join(repr(k) for k in missing)}"
    if not isinstance(doc["lengths"], list) or not doc["lengths"] or not all(map(_length, doc["lengths"])):
        return "'lengths' is not a list of lengths"
    if not _names(doc["tasks"]):
        return "'tasks' is not a list of task names"
    if not isinstance(doc["model"], dict):
        return "'model' is not an object"
    if not isinstance(doc["scores"], list):
        return "'scores' is not a list"
    lengths = {int(L) for L in doc["lengths"]}
    for i, row in enumerate(doc["scores"]):
        if not (isinstance(row, dict) and row.get("task") in doc["tasks"] and _length(row.get("length"))
                and int(row["length"]) in lengths and isinstance(row.get("metric"), str)
                and all(k in row and _number(row[k]) for k in ("score", "nulls", "samples"))):
            return f"'scores' row {i} is not a task, length, metric, score, nulls and samples of this run"
    return None


def _results_problem(doc: dict) -> str | None:
    """What a results.json lacks that `load_results`' readers (compare, the tables) read (None: nothing)."""
    missing = [k for k in ("model", "lengths", "tasks", "metrics", "scores", "nulls", "samples", "per_length",
                           "avg", "wavg_inc", "wavg_dec", "effective_length") if k not in doc]
    if missing:
        return f"it has no {', '.join(repr(k) for k in missing)}"
    if not isinstance(doc["model"], dict):
        return "'model' is not an object"
    lengths, tasks = doc["lengths"], doc["tasks"]
    if not isinstance(lengths, list) or not lengths or not all(isinstance(L, int) and _length(L) for L in lengths):
        return "'lengths' is not a list of lengths"
    if not _names(tasks):
        return "'tasks' is not a list of task names"
    if not isinstance(doc["metrics"], dict) or not all(isinstance(doc["metrics"].get(t), str) for t in tasks):
        return "'metrics' does not name the metric of every task"
    for key in ("scores", "nulls", "samples"):
        table = doc[key]
        if not isinstance(table, dict):
            return f"'{key}' is not an object"
        for t in tasks:
            row = table.get(t)
            if not isinstance(row, dict) or not all(_length(k) and _number(v) for k, v in row.items()):
                return f"'{key}' has no row of numbers by length for task {t}"
            if any(str(L) not in row for L in lengths):
                return f"'{key}' of task {t} lacks a length of 'lengths'"
    pl = doc["per_length"]
    if not isinstance(pl, dict) or not all(_length(k) and _number(v) for k, v in pl.items()):
        return "'per_length' is not numbers by length"
    if not all(_number(doc[k]) for k in ("avg", "wavg_inc", "wavg_dec", "effective_length")):
        return "'avg', 'wavg_inc', 'wavg_dec' and 'effective_length' are not numbers or null"
    return _intervals_problem(doc.get("intervals"))


def _bounds(v: Any) -> bool:
    return v is None or (isinstance(v, dict) and all(k in v and v[k] is not None and _number(v[k])
                                                      for k in ("se", "lo", "hi")))


def _by_length(v: Any) -> bool:
    return isinstance(v, dict) and all(_length(k) and _bounds(b) for k, b in v.items())


def _intervals_problem(iv: Any) -> str | None:
    """What a results.json's optional 'intervals' lacks (None: nothing, or no intervals)."""
    if iv is None:
        return None
    if not (isinstance(iv, dict) and isinstance(iv.get("method"), dict) and isinstance(iv.get("scores"), dict)
            and all(_by_length(row) for row in iv["scores"].values()) and _by_length(iv.get("per_length"))):
        return "'intervals' is not se/lo/hi by task and length, per length, and a method"
    return None


def read_scores(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run directory's scores.json (written by `longctx ruler`), or InputError naming the file and what it
    lacks."""
    path = Path(run_dir) / SCORES_FILE
    try:
        doc = loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise InputError(f"'{run_dir}' has no readable {SCORES_FILE} ({e.__class__.__name__}); "
                         "run 'longctx ruler' first") from None
    problem = _scores_problem(doc)
    if problem is not None:
        raise InputError(f"{path} is incomplete or corrupt: {problem}; rerun the 'longctx ruler' command that "
                         "made it to write it again")
    return doc


def _redacted(backend: Any) -> Any:
    """A scores.json's backend settings with the endpoint URL redacted (scores.json files written before URLs
    were redacted hold it as given, credentials included)."""

    if isinstance(backend, dict) and isinstance(backend.get("base_url"), str):
        return {**backend, "base_url": redact_url(backend["base_url"])}
    return backend


def build_results(scores_doc: dict[str, Any]) -> Results:
    """results.json content from a run's scores.json content (as `read_scores` checked it)."""
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
        format=RESULTS_FORMAT, model=scores_doc["model"], backend=_redacted(scores_doc["backend"]),
        sampling=scores_doc["sampling"], template=scores_doc["template"], upstream=scores_doc["upstream"],
        task_set=scores_doc["task_set"], lengths=lengths, tasks=tasks, metrics=metrics, scores=scores,
        nulls=nulls, samples=samples, per_length=per_length, **aggregate(per_length), threshold=THRESHOLD,
        seeds=scores_doc["seeds"], versions=scores_doc["versions"], task_versions=scores_doc["task_versions"],
        timings=scores_doc["timings"], created=utc_timestamp(),
    )


class _Scored(Protocol):
    scores: Sequence[float]  # per sample, 0-100 (`samples.Cell`)


Samples = Mapping[str, Mapping[int, _Scored]]  # task -> length -> per-sample scores (`samples.run_samples`)
ROUNDING = 0.005  # a task's score is its sample mean rounded to 2 decimals


def intervals_problem(results: Results, samples: Samples) -> str | None:
    """Why `samples` do not describe `results`' scores (None: they do): a scored (task, length) without
    per-sample scores, or whose sample mean is not its score (predictions changed after scoring)."""
    for t in results["tasks"]:
        for L in results["lengths"]:
            score = results["scores"][t].get(L)
            if score is None:
                continue
            cell = samples.get(t, {}).get(L)
            if cell is None or not cell.scores:
                return f"{t} at {L} has no per-sample scores"
            m = sum(cell.scores) / len(cell.scores)
            if abs(m - score) > ROUNDING + 1e-9:
                return f"the predictions of {t} at {L} score {m:.2f}, not the {score:.2f} of {SCORES_FILE}"
    return None


def _bounds_of(iv: stats.Interval, shown: float) -> dict[str, float]:
    # widened by the score's rounding (at most ROUNDING per task) so that lo <= score <= hi holds for the
    # rounded score the tables show, not only for the unrounded mean
    d = iv.as_dict()
    return {**d, "lo": min(d["lo"], shown), "hi": max(d["hi"], shown)}


def with_intervals(results: Results, samples: Samples | None) -> Results:
    """`results` with "intervals" from the run's per-sample scores (`samples.run_samples`); null intervals when
    `samples` is None. A length's mean gets an interval only when every task was scored at it.
    ValueError when `intervals_problem` finds a problem."""
    if samples is None:
        return Results(**{**results, "intervals": None})  # type: ignore[typeddict-item]
    problem = intervals_problem(results, samples)
    if problem is not None:
        raise ValueError(problem)
    tasks, lengths = results["tasks"], results["lengths"]
    scores: dict[str, dict[int, dict[str, float] | None]] = {t: {} for t in tasks}
    for t in tasks:
        for L in lengths:
            score = results["scores"][t].get(L)
            scores[t][L] = None if score is None else _bounds_of(stats.interval([samples[t][L].scores]), score)
    per_length: dict[int, dict[str, float] | None] = {}
    for L in lengths:
        every = all(results["scores"][t].get(L) is not None for t in tasks)
        shown = results["per_length"].get(L)
        per_length[L] = (_bounds_of(stats.interval([samples[t][L].scores for t in tasks]), shown)
                         if every and shown is not None else None)
    iv = Intervals(method=dict(stats.METHOD), scores=scores, per_length=per_length)
    return Results(**{**results, "intervals": iv})  # type: ignore[typeddict-item]


def to_json(results: Results) -> dict:
    out = dict(results)
    for key in ("scores", "nulls", "samples"):
        out[key] = {t: {str(L): v for L, v in row.items()} for t, row in results[key].items()}
    out["per_length"] = {str(L): v for L, v in results["per_length"].items()}
    iv = results.get("intervals")
    if iv is not None:
        out["intervals"] = {**iv, "scores": {t: {str(L): v for L, v in row.items()} for t, row in iv["scores"].items()},
                            "per_length": {str(L): v for L, v in iv["per_length"].items()}}
    return out


def load_results(run_dir: str | os.PathLike) -> Results:
    """A run directory's results.json with int length keys, or InputError saying what is missing."""
    path = Path(run_dir) / RESULTS_FILE
    if not Path(run_dir).is_dir():
        raise InputError(f"'{run_dir}' is not a directory (give a run directory written by 'longctx ruler')")
    if not path.is_file():
        raise InputError(f"'{run_dir}' has no {RESULTS_FILE} (not a finished 'longctx ruler' run; "
                         f"finish it with 'longctx ruler CKPT ... -o {shlex.quote(str(run_dir))}')")
    doc = read_versioned_json(path, RESULTS_FORMAT, "results")
    problem = _results_problem(doc)
    if problem is not None:
        raise InputError(f"{path} is incomplete or corrupt: {problem}; rerun the 'longctx ruler' command that "
                         f"made {run_dir} to write it again")
    for key in ("scores", "nulls", "samples"):
        doc[key] = {t: _int_keys(row) for t, row in doc[key].items()}
    doc["per_length"] = _int_keys(doc["per_length"])
    iv = doc.get("intervals")
    if iv is not None:
        iv["scores"] = {t: _int_keys(row) for t, row in iv["scores"].items()}
        iv["per_length"] = _int_keys(iv["per_length"])
    return doc  # type: ignore[return-value]
