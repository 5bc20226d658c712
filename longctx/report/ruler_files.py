"""NVIDIA RULER's result files, written as its `scripts/eval/evaluate.py` @ c3f5e3b writes them and read back with
every malformed file refused.

Per length upstream scores one folder of prediction files. It goes through the tasks of `synthetic.yaml` in that
file's order (`ruler_tasks.registry.TASKS`) and writes `summary.csv`, or `summary-<task>.csv` when it scored a
single task. The summary is a pandas `DataFrame([["Tasks", ...], ["Score", ...], ["Nulls", ...]]).to_csv(
index=False)`, so its first line is the column numbers 0..N. Scores are 0-100, rounded to 2 places; Nulls are
`<empty predictions>/<predictions>`. Beside it goes `submission.csv`: `Task,ID,Prediction`, one row per prediction
in file order, the prediction post-processed as it was scored. Here a length's files are in `OUT/<length>/`.
Predictions are written in sample order, where upstream keeps its prediction file's order.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from longctx.core.errors import InputError
from longctx.eval.scoring import postprocess_pred
from longctx.report.results import Results
from ruler_tasks.registry import TASKS

SUMMARY = "summary.csv"
SUBMISSION = "submission.csv"
_SINGLE = re.compile(r"summary-(.+)\.csv")
_NULLS = re.compile(r"(\d+)/(\d+)")


def upstream_order(tasks: list[str]) -> list[str]:
    """`tasks` in synthetic.yaml's order (upstream's loop), any task it does not know after them as given."""
    return [t for t in TASKS if t in tasks] + [t for t in tasks if t not in TASKS]


def summary_name(tasks: list[str]) -> str:
    return SUMMARY if len(tasks) > 1 else f"summary-{tasks[0]}.csv"


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)  # pandas' to_csv: minimal quoting, "\n"
    return buf.getvalue()


def summary_text(r: Results, length: int, tasks: list[str]) -> str:
    scores = [float(r["scores"][t][length]) for t in tasks]  # pandas writes 100.0, not 100
    nulls = [f"{r['nulls'][t][length] or 0}/{r['samples'][t][length] or 0}" for t in tasks]
    return _csv([list(range(len(tasks) + 1)), ["Tasks", *tasks], ["Score", *scores], ["Nulls", *nulls]])


def submission_text(predictions: dict[str, list[str]]) -> str:
    """`submission.csv` of one length: task -> its predictions in sample order (their ID)."""
    rows: list[list] = [["Task", "ID", "Prediction"]]
    for task, preds in predictions.items():
        rows += [[task, i, postprocess_pred(p)] for i, p in enumerate(preds)]
    return _csv(rows)


def ruler_files(r: Results, answers: Callable[[str, int], list[str] | None]) -> dict[str, str]:
    """Relative path -> text of every file upstream writes for the run `r`: per scored length its summary and,
    when `answers(task, length)` gives every task's predictions there, its submission."""
    out = {}
    for L in r["lengths"]:
        tasks = upstream_order([t for t in r["tasks"] if r["scores"][t].get(L) is not None])
        if not tasks:
            continue
        out[f"{L}/{summary_name(tasks)}"] = summary_text(r, L, tasks)
        preds = {t: answers(t, L) for t in tasks}
        if all(p is not None for p in preds.values()):
            out[f"{L}/{SUBMISSION}"] = submission_text(preds)
    return out


@dataclass(frozen=True)
class Summary:
    """One summary file read back: per task its score (0-100), empty predictions and predictions."""

    scores: dict[str, float]
    nulls: dict[str, int]
    samples: dict[str, int]


def _refuse(path: Path, what: str) -> InputError:
    return InputError(f"'{path}' is not a RULER summary ({what})")


def _rows(path: Path) -> dict[str, list[str]]:
    """The summary's rows by name, checked for shape: a header of the column numbers, then Tasks, Score and
    Nulls, each as long as the header."""
    try:
        rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InputError(f"cannot read '{path}' ({e.__class__.__name__})") from None
    rows = [row for row in rows if row]
    if not rows or rows[0] != [str(i) for i in range(len(rows[0]))]:
        raise _refuse(path, "its first line should be the column numbers 0,1,...,N that pandas writes")
    width = len(rows[0])
    names = [row[0] for row in rows[1:]]
    if names != ["Tasks", "Score", "Nulls"]:
        raise _refuse(path, f"after the header it has the rows {names}; expected Tasks, Score and Nulls")
    for row in rows[1:]:
        if len(row) != width:
            raise _refuse(path, f"its {row[0]} row has {len(row) - 1} values where the header has {width - 1} "
                                "columns")
    return {row[0]: row[1:] for row in rows[1:]}


def read_summary(path: Path) -> Summary:
    """A summary file, every row and value checked: InputError naming the file, the row and what was expected."""
    by_name = _rows(path)
    tasks = by_name["Tasks"]
    if len(set(tasks)) != len(tasks):
        twice = sorted({t for t in tasks if tasks.count(t) > 1})
        raise _refuse(path, f"the Tasks row names {', '.join(twice)} more than once")
    single = _SINGLE.fullmatch(path.name)
    if single and tasks != [single.group(1)]:
        raise _refuse(path, f"a summary-{single.group(1)}.csv holds that one task, this one holds {tasks}")
    scores, nulls, samples = {}, {}, {}
    for t, v, n in zip(tasks, by_name["Score"], by_name["Nulls"]):
        try:
            score = float(v)
        except ValueError:
            raise _refuse(path, f"the Score of {t} is {v!r}, not a number") from None
        if not (math.isfinite(score) and 0 <= score <= 100):
            raise _refuse(path, f"the Score of {t} is {v}; RULER's scores are 0-100")
        m = _NULLS.fullmatch(n)
        if not m or int(m.group(1)) > int(m.group(2)):
            raise _refuse(path, f"the Nulls of {t} is {n!r}; expected <empty>/<predictions>, e.g. 0/500")
        scores[t], nulls[t], samples[t] = round(score, 2), int(m.group(1)), int(m.group(2))
    return Summary(scores, nulls, samples)


def summary_files(folder: Path) -> list[Path]:
    """The summary files of one length's folder (`summary.csv` or `summary-<task>.csv`, in it or in its `pred/`,
    RULER's own layout)."""
    found = []
    for where in (folder, folder / "pred"):
        if where.is_dir():
            found += sorted(p for p in where.iterdir()
                            if p.is_file() and (p.name == SUMMARY or _SINGLE.fullmatch(p.name)))
    return found
