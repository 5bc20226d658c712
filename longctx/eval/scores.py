"""A run directory's scores: each (task, length) it holds whole scored from its predictions, and scores.json, the
same whether the predictions were made in one run (`longctx.eval.runner`) or by shards put together
(`longctx.eval.shards`).

Scoring also writes each prediction file in its canonical form: one line per sample, in the task file's line
order, only predictions of the task line's prompt (`write_predictions`). An engine finishes requests in the order
its batches allow, and shards finish theirs apart; the canonical file is the same bytes however they came.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import versions
from longctx.core.hashing import hash_json
from longctx.eval.binding import SAMPLING
from longctx.eval.predictions import TaskLine, predictions_text, read_predictions, write_predictions
from longctx.eval.scoring import score_predictions
from longctx.eval.thinking import THINK_END
from ruler_tasks.constants import UPSTREAM_COMMIT

SCORES_FORMAT = "longctx-ruler-scores/1"
SCORES_FILE = "scores.json"


def score_rows(out: Path, specs, task_lines: dict[tuple[int, str], list[TaskLine]]) -> list[dict[str, Any]]:
    """Per (task, length): the predictions made from its task lines' prompts, scored against the task lines'
    references (never a prediction line's `outputs`); each prediction file left in its canonical form."""
    rows = []
    metric = {s.name: s.metric for s in specs}
    for (L, task), lines in task_lines.items():
        path = out / "pred" / str(L) / f"{task}.jsonl"
        preds = read_predictions(path, [t.prompt_sha256 for t in lines])
        if len(preds) != len(lines):
            raise RuntimeError(f"{L}/{task}: {len(preds)} predictions for {len(lines)} samples")
        ordered = [preds[i] for i in range(len(lines))]
        if path.read_bytes() != predictions_text(ordered).encode("utf-8"):
            write_predictions(path, ordered)
        sc = score_predictions([p["pred"] for p in ordered], [t.outputs for t in lines], metric[task])
        rows.append({"task": task, "length": L, "metric": metric[task], "score": sc.score, "nulls": sc.nulls,
                     "samples": sc.samples})
        if any("thinking_closed" in p for p in ordered):
            rows[-1]["unfinished_thinking"] = sum(not p.get("thinking_closed", True) for p in ordered)
    return rows


def scores_document(*, binding: dict[str, Any], run: dict[str, Any], template: Any, rows: list[dict[str, Any]],
                    ran: Any, timings: dict[str, Any], held: list[tuple[int, str]], specs) -> dict[str, Any]:
    """The content of scores.json: every (length, task) the run directory holds whole (`held`), from the run's
    `binding` and run.json (`run`)."""
    rels = [f"{length}/{task}.jsonl" for length, task in held]
    task_set = hash_json({**{k: binding[k] for k in ("tokenizer", "seed", "samples", "template")},
                          "files": {rel: run["files"][rel] for rel in rels}})
    think_tokens = binding.get("think_tokens")
    sampling = SAMPLING if not think_tokens else {
        **SAMPLING, "think_tokens": think_tokens, "max_tokens": "tokens_to_generate of each task + think_tokens",
        "answer": f"the text after the last {THINK_END} (an unfinished thought answers nothing)"}
    return {"format": SCORES_FORMAT, "model": run["model"], "backend": {**run["backend"], "ran": ran},
            "sampling": sampling, "template": template,
            "upstream": f"NVIDIA/RULER@{UPSTREAM_COMMIT}", "task_set": task_set,
            "lengths": sorted({length for length, _ in held}), "tasks": [t.name for t in specs], "scores": rows,
            "seeds": {"tasks": binding["seed"], "engine": 0}, "versions": versions(),
            "task_versions": {t.name: t.version for t in specs}, "timings": timings}
