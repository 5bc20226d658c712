"""Per-sample scores of a RULER run directory, from its files: what intervals and paired comparisons use.

For each (task, length) the first `samples` lines of `tasks/<length>/<task>.jsonl` (the file run.json records)
give the references and each prompt's sha256, and each sample's prediction is the first line of
`pred/<length>/<task>.jsonl` made from that prompt (its `prompt_sha256`); a prediction line's own `outputs`
are never read. A sample without such a prediction leaves the cell without per-sample scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.parse import loads
from longctx.eval.binding import RUN_FILE, TASKS_DIR
from longctx.eval.predictions import read_predictions, read_task_lines
from longctx.eval.scoring import sample_scores
from longctx.report.results import Results, intervals_problem


@dataclass(frozen=True)
class Cell:
    """One (task, length) of a run: per sample (in sample order) its score 0-100 and its prompt's sha256."""

    scores: list[float]
    prompts: list[str]


@dataclass(frozen=True)
class Answers:
    """The first samples of one (task, length) of a run: per sample its prediction, its references (from the
    task file) and its prompt's sha256."""

    preds: list[str]
    refs: list[list[str]]
    prompts: list[str]


def _recorded(run: Path) -> dict:
    """run.json's sha256 per task file ("<length>/<task>.jsonl"); empty when there is no readable run.json."""

    try:
        files = loads((run / RUN_FILE).read_bytes()).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


def sample_answers(run_dir: str | Path, task: str, length: int, n: int,
                   recorded: dict | None = None) -> Answers | None:
    """The first `n` samples of `task` at `length` in the run directory, each with the prediction made from
    its task line's prompt; None when one has none, or the task file is missing or shorter. InputError when
    the task file is not the one run.json records (`recorded`: run.json's "files", read when not given)."""
    run = Path(run_dir)
    rel = f"{length}/{task}.jsonl"
    path = run / TASKS_DIR / rel
    if not path.is_file():
        return None
    recorded = _recorded(run) if recorded is None else recorded
    lines = read_task_lines(path, recorded.get(rel))[:n]
    if len(lines) < n:
        return None
    prompts = [t.prompt_sha256 for t in lines]
    preds = read_predictions(run / "pred" / str(length) / f"{task}.jsonl", prompts)
    if len(preds) < n:
        return None
    return Answers([preds[i]["pred"] for i in range(n)], [t.outputs for t in lines], prompts)


def run_samples(run_dir: str | Path, results: Results) -> dict[str, dict[int, Cell]] | None:
    """task -> length -> Cell for every scored (task, length) of `results` (the run's results.json); None when
    the directory does not hold every prediction made from its task line's prompt (e.g. results made by
    another tool). InputError when a task file is not the one run.json records."""
    run = Path(run_dir)
    recorded = _recorded(run)
    out: dict[str, dict[int, Cell]] = {}
    for t in results["tasks"]:
        for L in results["lengths"]:
            n = results["samples"][t].get(L)
            if not n:
                continue
            answers = sample_answers(run, t, L, n, recorded)
            if answers is None:
                return None
            out.setdefault(t, {})[L] = Cell(sample_scores(answers.preds, answers.refs, results["metrics"][t]),
                                            answers.prompts)
    return out


def scored_samples(run_dir: str | Path, results: Results) -> tuple[dict[str, dict[int, Cell]] | None, str | None]:
    """(`run_samples`, None) when the run's predictions give exactly its scores, else (None, why not) — what
    intervals and paired differences may be computed from."""
    try:
        samples = run_samples(run_dir, results)
    except InputError as e:  # a task file that is not the one the run recorded
        return None, str(e)
    except (ValueError, KeyError, TypeError) as e:  # a prediction file another tool wrote, an unknown metric
        return None, f"its predictions could not be scored one by one ({e.__class__.__name__}: {e})"
    if samples is None:
        return None, "its run directory does not hold every prediction made from its task file's prompts"
    problem = intervals_problem(results, samples)
    return (None, f"its predictions do not give its scores ({problem})") if problem else (samples, None)
