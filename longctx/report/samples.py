"""Per-sample scores of a RULER run directory, from its files: what intervals and paired comparisons use.

For each (task, length) the first `samples` predictions (`pred/<length>/<task>.jsonl`, by sample number) are
scored one by one with the task's metric, and each is identified by the sha256 of the prompt it answered:
the prediction's `prompt_sha256`, or, for predictions written before it was recorded, the hash of the
matching line of `tasks/<length>/<task>.jsonl`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from longctx.eval.predictions import prompt_hash, read_predictions
from longctx.eval.scoring import sample_scores
from longctx.report.results import Results, intervals_problem


@dataclass(frozen=True)
class Cell:
    """One (task, length) of a run: per sample (in sample order) its score 0-100 and its prompt's sha256."""

    scores: list[float]
    prompts: list[str]


def _task_prompts(path: Path, n: int) -> list[str | None]:
    out: list[str | None] = [None] * n
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            for i, line in zip(range(n), f):
                row = json.loads(line)
                out[i] = prompt_hash(row["input"] + row["answer_prefix"])
    return out


def run_samples(run_dir: str | Path, results: Results) -> dict[str, dict[int, Cell]] | None:
    """task -> length -> Cell for every scored (task, length) of `results` (the run's results.json); None when
    the directory does not hold every prediction (e.g. results made by another tool)."""
    run = Path(run_dir)
    out: dict[str, dict[int, Cell]] = {}
    for t in results["tasks"]:
        for L in results["lengths"]:
            n = results["samples"][t].get(L)
            if not n:
                continue
            preds = read_predictions(run / "pred" / str(L) / f"{t}.jsonl")
            recs = [preds.get(i) for i in range(n)]
            if any(r is None for r in recs):
                return None
            hashes = [r.get("prompt_sha256") for r in recs]
            if None in hashes:
                from_tasks = _task_prompts(run / "tasks" / str(L) / f"{t}.jsonl", n)
                hashes = [h or f for h, f in zip(hashes, from_tasks)]
            if None in hashes:
                return None
            scores = sample_scores([r["pred"] for r in recs], [r["outputs"] for r in recs], results["metrics"][t])
            out.setdefault(t, {})[L] = Cell(scores, hashes)
    return out


def scored_samples(run_dir: str | Path, results: Results) -> tuple[dict[str, dict[int, Cell]] | None, str | None]:
    """(`run_samples`, None) when the run's predictions give exactly its scores, else (None, why not) — what
    intervals and paired differences may be computed from."""
    try:
        samples = run_samples(run_dir, results)
    except (ValueError, KeyError, TypeError) as e:  # a prediction file another tool wrote, an unknown metric
        return None, f"its predictions could not be scored one by one ({e.__class__.__name__}: {e})"
    if samples is None:
        return None, "its run directory does not hold every prediction and its prompt"
    problem = intervals_problem(results, samples)
    return (None, f"its predictions do not give its scores ({problem})") if problem else (samples, None)
