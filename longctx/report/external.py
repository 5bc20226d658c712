"""RULER results in the files other tools write and read: lm-eval's results JSON and NVIDIA RULER's summary.csv.

Written by `longctx export RUN --format lm-eval|ruler`, read back (point scores only) by `longctx compare`, so a
published lm-eval or RULER result sits beside a longctx run.

- lm-eval (`lm_eval --output_path`, EleutherAI/lm-evaluation-harness `lm_eval/tasks/ruler`): one JSON file;
  `results[<task>]["<length>,none"]` is the score at that length on a 0-1 scale (`"<length>_stderr,none"` its
  standard error), task names as lm-eval's `ruler` group names them (`niah_*` as they are, `ruler_vt`,
  `ruler_cwe`, `ruler_fwe`, `ruler_qa_squad`, `ruler_qa_hotpot`), the group `ruler` the mean over tasks
  (lm-eval's `aggregate_metric_list`, not weighted by size). A file may carry the group alone (a published
  table): then only per-length means are known.
- RULER (`scripts/eval/evaluate.py` @ c3f5e3b): per length a `summary.csv` written by pandas from the rows
  `Tasks,<task>...`, `Score,<0-100>...`, `Nulls,<empty>/<samples>...` (so its first line is the column numbers
  0..N); RULER keeps one per length in `<length>/pred/`, here `OUT/<length>/summary.csv`.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from longctx.core.clock import utc_timestamp
from longctx.core.errors import InputError, ref
from longctx.core.files import check_apart, check_output, file_in_the_way, make_output, read_own, write_atomic
from longctx.core.locks import OutputLock, check_link
from longctx.core.parse import loads
from longctx.report.results import (
    RESULTS_FILE,
    RESULTS_FORMAT,
    THRESHOLD,
    Results,
    aggregate,
    load_results,
    per_length_means,
)
from longctx.report.ruler_files import read_summary, ruler_files, summary_files, upstream_order
from longctx.report.samples import sample_answers
from ruler_tasks.registry import TASKS

GROUP = "ruler"
# longctx's task names (RULER's synthetic.yaml) -> lm-eval's
LM_EVAL_NAMES = {"vt": "ruler_vt", "cwe": "ruler_cwe", "fwe": "ruler_fwe", "qa_1": "ruler_qa_squad",
                 "qa_2": "ruler_qa_hotpot"}
_FROM_LM_EVAL = {v: k for k, v in LM_EVAL_NAMES.items()}
NOTE = ("scores follow NVIDIA RULER's metrics (scripts/eval/synthetic/constants.py): string_match_part counts a "
        "sample when any reference is in the prediction; lm-eval's ruler tasks average the matched fraction "
        "instead, so its own string_match_part numbers can be lower")
_KEY = re.compile(r"^(\d+),none$")
_STDERR = re.compile(r"^(\d+)_stderr,none$")


def _lm_eval_name(task: str) -> str:
    return LM_EVAL_NAMES.get(task, task)


def _unit(v: float | None) -> float | None:
    return None if v is None else round(v / 100, 6)


def lm_eval_json(r: Results) -> dict[str, Any]:
    """lm-eval's results JSON for the run `r`."""
    intervals = r.get("intervals") or {}
    se_cells = intervals.get("scores") or {}
    se_lengths = intervals.get("per_length") or {}
    results: dict[str, dict[str, Any]] = {}
    samples: dict[str, dict[str, int]] = {}
    for t in r["tasks"]:
        name = _lm_eval_name(t)
        entry: dict[str, Any] = {"alias": name}
        for L in r["lengths"]:
            if r["scores"][t].get(L) is None:
                continue
            cell = (se_cells.get(t) or {}).get(L)
            entry[f"{L},none"] = _unit(r["scores"][t][L])
            entry[f"{L}_stderr,none"] = _unit(cell["se"]) if cell else "N/A"
        results[name] = entry
        # lm-eval counts the documents of every length together (`n-samples`, `sample_len`)
        total = sum(n for L, n in r["samples"][t].items() if n and r["scores"][t].get(L) is not None)
        if total:
            samples[name] = {"original": total, "effective": total}
    group: dict[str, Any] = {"alias": GROUP}
    for L in r["lengths"]:
        if r["per_length"].get(L) is None:
            continue
        cell = se_lengths.get(L)
        group[f"{L},none"] = _unit(r["per_length"][L])
        group[f"{L}_stderr,none"] = _unit(cell["se"]) if cell else "N/A"
    results[GROUP] = group
    names = [_lm_eval_name(t) for t in r["tasks"]]
    model = r["model"]
    return {"results": results, "groups": {GROUP: group}, "group_subtasks": {GROUP: names},
            "versions": {_lm_eval_name(t): r["task_versions"].get(t) for t in r["tasks"]},
            "n-samples": samples, "higher_is_better": {n: {str(L): True for L in r["lengths"]} for n in names},
            "config": {"model": f"longctx-{r['backend'].get('name', '?')}",
                       "model_args": f"pretrained={model.get('path') or model.get('name')}"},
            "model_name": model.get("name"), "date": r.get("created"),
            "longctx": {"note": NOTE, "upstream": r.get("upstream"), "fingerprint": model.get("fingerprint")}}


def export_run(r: Results, fmt: str, out: Path, run_dir: Path | None = None) -> list[Path]:
    """Write `r` in format `fmt` to `out` (lm-eval: a JSON file; ruler: a folder of <length>/ files, the
    predictions of `run_dir` giving each length's submission.csv)."""
    if fmt == "lm-eval":
        write_atomic(out, json.dumps(lm_eval_json(r), indent=2) + "\n")
        return [out]

    def answers(task: str, length: int) -> list[str] | None:
        found = None if run_dir is None else sample_answers(run_dir, task, length, r["samples"][task][length] or 0)
        return None if found is None else found.preds

    files = []
    for rel, text in ruler_files(r, answers).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        files.append(write_atomic(out / rel, text))
    return files


def _from_scores(name: str, source: str, *, path: Path, scores: dict[str, dict[int, float | None]],
                 nulls: dict[str, dict[int, int | None]], samples: dict[str, dict[int, int | None]],
                 lengths: list[int], per_length: dict[int, float | None] | None = None) -> Results:
    """A `Results` of point scores from another tool's file (no predictions, no intervals)."""
    tasks = list(scores)
    per_length = per_length if per_length is not None else per_length_means(scores, lengths, tasks)
    return Results(format=RESULTS_FORMAT, model={"name": name, "path": str(path), "source": source},
                   backend={"name": source}, sampling={}, template={}, upstream="", task_set="", lengths=lengths,
                   tasks=tasks, metrics={t: TASKS[t].metric if t in TASKS else "" for t in tasks}, scores=scores,
                   nulls=nulls, samples=samples, per_length=per_length, **aggregate(per_length), threshold=THRESHOLD,
                   seeds={}, versions={}, task_versions={}, timings={}, created=utc_timestamp())


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _lm_eval_cells(path: Path, name: str, entry: dict[str, Any]) -> dict[int, float | None]:
    """length -> score 0-100 of one task (or group) of an lm-eval results file; None where lm-eval wrote -1 (its
    ruler tasks' "no samples at this length", `common_utils.aggregate_metrics`). InputError for any other value
    that is not a score 0-1, and for a standard error that is neither a number >= 0 nor "N/A"."""
    cells: dict[int, float | None] = {}
    for key, v in entry.items():
        if (m := _KEY.match(key)) is not None:
            if _number(v) and v == -1:
                cells[int(m.group(1))] = None
            elif _number(v) and 0 <= v <= 1:
                cells[int(m.group(1))] = round(v * 100, 2)
            else:
                raise InputError(f"'{path}': results.{name}[\"{key}\"] is {json.dumps(v)}; expected a score from 0 "
                                 "to 1, or -1 (lm-eval's \"no samples at this length\")")
        elif _STDERR.match(key) and not (v == "N/A" or (_number(v) and v >= 0)):
            raise InputError(f"'{path}': results.{name}[\"{key}\"] is {json.dumps(v)}; expected a standard error "
                             ">= 0 or \"N/A\"")
    return cells


def _per_length_samples(doc: dict[str, Any], task: str, cells: dict[int, float | None]) -> dict[int, int | None]:
    """The samples behind each score of `task`. lm-eval's `n-samples` counts the documents evaluated over all
    lengths (its ruler tasks make the same number per length, 500): split evenly over the scored lengths, and
    unknown (None) where they do not divide evenly (a `--limit` that stopped inside a length)."""
    counts = doc.get("n-samples") if isinstance(doc.get("n-samples"), dict) else {}
    entry = counts.get(LM_EVAL_NAMES.get(task, task))
    effective = entry.get("effective") if isinstance(entry, dict) else None
    scored = [L for L, v in cells.items() if v is not None]
    each = effective // len(scored) if _number(effective) and scored and effective % len(scored) == 0 else None
    return {L: each if v is not None else None for L, v in cells.items()}


def read_lm_eval(path: Path) -> Results:
    try:
        doc = loads(path.read_text(encoding="utf-8"))
        results = doc["results"]
        if not isinstance(results, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):  # ValueError: not JSON, or over a parse limit
        raise InputError(f"'{path}' is not an lm-eval results file (a JSON object with 'results')") from None
    scores: dict[str, dict[int, float | None]] = {}
    group: dict[int, float | None] = {}
    for name, entry in results.items():
        if not isinstance(entry, dict):
            raise InputError(f"'{path}': results.{name} is {type(entry).__name__}; expected an object of "
                             "'<metric>,<filter>' values")
        cells = _lm_eval_cells(path, name, entry)
        if not cells:
            continue
        if name == GROUP:
            group = cells
        else:
            scores[_FROM_LM_EVAL.get(name, name)] = cells
    if not scores and not group:
        raise InputError(f"'{path}' has no RULER scores (no '<length>,none' entries under 'results')")
    lengths = sorted({L for cells in scores.values() for L in cells} | set(group))
    for cells in scores.values():
        for L in lengths:
            cells.setdefault(L, None)
    samples = {t: _per_length_samples(doc, t, scores[t]) for t in scores}
    nulls = {t: {L: None for L in lengths} for t in scores}
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    args = str(config.get("model_args") or "")
    name = doc.get("model_name") or (re.search(r"pretrained=([^,]+)", args) or [None, None])[1] or path.stem
    # a group-only file (a published table) knows the per-length means and nothing else
    return _from_scores(str(name), "lm-eval", path=path, scores=scores, nulls=nulls, samples=samples, lengths=lengths,
                        per_length={L: group.get(L) for L in lengths} if group and not scores else None)


def read_ruler(path: Path) -> Results:
    """A folder of `<length>/` folders of RULER summaries (`longctx.report.ruler_files.summary_files`)."""
    found = {}
    for child in path.iterdir() if path.is_dir() else []:
        if child.is_dir() and child.name.isdigit():
            files = summary_files(child)
            if len(files) > 1:
                raise InputError(f"'{child}' holds {len(files)} RULER summaries ({', '.join(f.name for f in files)}); "
                                 "keep the one to compare")
            if files:
                found[int(child.name)] = files[0]
    if not found:
        raise InputError(f"'{path}' holds no RULER results (<length>/summary.csv or summary-<task>.csv, in it or "
                         "in its pred/)")
    lengths = sorted(found)
    per = {L: read_summary(found[L]) for L in lengths}
    tasks = upstream_order(list(dict.fromkeys(t for L in lengths for t in per[L].scores)))
    cell = lambda field: {t: {L: getattr(per[L], field).get(t) for L in lengths} for t in tasks}
    return _from_scores(path.name, "ruler", path=path, scores=cell("scores"), nulls=cell("nulls"),
                        samples=cell("samples"), lengths=lengths)


def load_run(path: str | os.PathLike) -> tuple[Results, Path | None]:
    """A run to compare and, when it is a longctx run directory, that directory (its predictions give intervals
    and paired differences): a longctx run directory (results.json), an lm-eval results file, or a folder of
    RULER summary.csv files."""
    p = Path(path)
    if p.is_dir() and (p / RESULTS_FILE).is_file():
        return load_results(p), p
    if p.is_file() and p.suffix == ".json":
        return read_lm_eval(p), None
    if p.is_dir() and any(c.is_dir() and c.name.isdigit() for c in p.iterdir()):
        return read_ruler(p), None
    return load_results(p), p  # its own message: what is missing


EXPORT_KIND = "ruler-export"  # its `longctx.core.files` output marker (a folder of summary.csv files)


def export(s) -> list[Path]:
    """`longctx export` (`s`: ExportSettings): the run's results in another tool's format; refusals before any
    file is written. The output (a file, or a folder of summary.csv files) is locked while it is written, and
    never is (nor holds, nor lies in) the run it is made from."""
    run, out = Path(s.run), Path(s.output)
    results = load_results(run)
    if s.format != "lm-eval":
        with check_output(out, EXPORT_KIND, inputs=[("run", run)]):
            make_output(out, EXPORT_KIND)
            return export_run(results, s.format, out, run)
    check_link(out, "-o")
    if out.is_dir():
        raise InputError(f"-o '{out}' is a folder; lm-eval results are one JSON file: give a file path")
    found = file_in_the_way(out.parent)
    if found is not None:
        raise InputError(f"-o '{out}' lies under '{found}', which is a file, not a folder; choose another -o")
    check_apart(out, [("run", run), ("run's results", run / RESULTS_FILE)])
    with OutputLock(out, "output"):
        if out.exists() and not s.overwrite:
            raise s.error(f"'{out}' exists; pass {ref('overwrite')} to replace it")
        if out.exists() and not _an_export(out):
            raise s.error(f"'{out}' exists and is not an lm-eval export longctx wrote; {ref('overwrite')} replaces "
                          "only those: choose another -o")
        out.parent.mkdir(parents=True, exist_ok=True)
        return export_run(results, s.format, out)


def _an_export(path: Path) -> bool:
    """Whether the file `path` is an lm-eval results file `export` wrote (its "longctx" entry says so)."""
    data = read_own(path, 1 << 26)
    try:
        doc = loads(data.decode("utf-8")) if data is not None else None
    except (ValueError, UnicodeDecodeError):
        return False
    mark = doc.get("longctx") if isinstance(doc, dict) else None
    return isinstance(mark, dict) and mark.get("note") == NOTE
