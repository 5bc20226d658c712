"""Results schema, tables (Markdown in RULER's README layout, CSV), plots, and `compare`.

Reads only result files: a run directory's `scores.json` (written by `longctx.eval`) becomes
`results.json` (the typed schema below), `results.md`, `results.csv` and `results.png`;
`compare` reads `results.json` of several run directories.

Aggregation follows RULER's README (shared/reference/ruler.md §3): per length the unweighted mean of
the tasks run at that length; `Avg.` the mean over lengths; `wAvg (inc)` weights 1..n/sum and
`wAvg (dec)` n..1/sum over the lengths in ascending order; effective length the longest length whose
mean is >= 85.6 (Llama2-7B-chat at 4K). Every number is 0-100 and rounded to 2 decimals.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from longctx.errors import InputError

RESULTS_FORMAT = "longctx-ruler-results/1"
SCORES_FILE = "scores.json"
RESULTS_FILE = "results.json"
THRESHOLD = 85.6  # Llama2-7B-chat at 4K: RULER's effective-length threshold


class ModelInfo(TypedDict, total=False):
    checkpoint: str
    name: str
    fingerprint: str
    architecture: str | None
    attention: str | None
    rope_type: str | None
    yarn_factor: float | None
    context_length: int | None  # longest prompt + generation the checkpoint supports ("claimed")
    trained_length: int | None  # length before any context scaling
    parent_fingerprint: str | None  # the checkpoint this one was derived from by `longctx yarn`


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


# --- aggregation ----------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
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
    return {"avg": _mean(values), "wavg_inc": inc, "wavg_dec": dec,
            "effective_length": max(passing) if passing else None}


def per_length_means(scores: dict[str, dict[int, float | None]], lengths: list[int],
                     tasks: list[str] | None = None) -> dict[int, float | None]:
    tasks = list(scores) if tasks is None else tasks
    return {L: _mean([scores[t][L] for t in tasks if scores[t].get(L) is not None]) for L in lengths}


# --- files ----------------------------------------------------------------------------------------


def _int_keys(d: dict) -> dict:
    return {int(k): v for k, v in d.items()}


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


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
        timings=scores_doc["timings"], created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def _to_json(results: Results) -> dict:
    out = dict(results)
    for key in ("scores", "nulls", "samples"):
        out[key] = {t: {str(L): v for L, v in row.items()} for t, row in results[key].items()}
    out["per_length"] = {str(L): v for L, v in results["per_length"].items()}
    return out


def read_versioned_json(path: Path, fmt: str, kind: str) -> dict:
    """A JSON object whose "format" is `fmt`, or InputError naming what `path` is not."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise InputError(f"{path} is not a longctx {kind} file (format {fmt})")
    return doc


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


@dataclass
class Report:
    results: Results
    files: list[Path] = field(default_factory=list)
    markdown: str = ""
    notes: list[str] = field(default_factory=list)


def write_report(run_dir: str | os.PathLike, plot: bool = True) -> Report:
    """Turn `run_dir/scores.json` into results.json, results.md, results.csv and results.png."""
    run = Path(run_dir)
    try:
        scores_doc = json.loads((run / SCORES_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"'{run}' has no readable {SCORES_FILE} ({e.__class__.__name__}); run 'longctx ruler' first") from None
    results = build_results(scores_doc)
    rep = Report(results)
    write_atomic(run / RESULTS_FILE, json.dumps(_to_json(results), indent=2) + "\n")
    rep.markdown = summary_markdown([results]) + "\n\n" + task_markdown(results)
    write_atomic(run / "results.md", rep.markdown + "\n")
    write_atomic(run / "results.csv", task_csv(results))
    rep.files += [run / RESULTS_FILE, run / "results.md", run / "results.csv"]
    if plot:
        try:
            plot_results(results, run / "results.png")
            rep.files.append(run / "results.png")
        except InputError as e:
            rep.notes.append(f"no plot: {e}")
    return rep


# --- tables ---------------------------------------------------------------------------------------


def length_label(L: int) -> str:
    if L % (1024 * 1024) == 0:
        return f"{L // (1024 * 1024)}M"
    return f"{L // 1024}K" if L % 1024 == 0 else str(L)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def summary_markdown(runs: list[Results]) -> str:
    """RULER README layout: Models | Claimed Length | Effective Length | lengths... | Avg. | wAvg. (inc) | wAvg. (dec)."""
    lengths = sorted({L for r in runs for L in r["lengths"]})
    head = ["Models", "Claimed Length", "Effective Length", *map(length_label, lengths),
            "Avg.", "wAvg. (inc)", "wAvg. (dec)"]
    lines = [markdown_row(head), markdown_row(["---"] * len(head))]
    for r in runs:
        claimed = r["model"].get("context_length")
        eff = r["effective_length"]
        lines.append(markdown_row([
            r["model"].get("name", "?"), length_label(claimed) if claimed else "-",
            f"<{length_label(min(r['lengths']))}" if eff is None else length_label(eff),
            *[_fmt(r["per_length"].get(L)) for L in lengths], _fmt(r["avg"]), _fmt(r["wavg_inc"]),
            _fmt(r["wavg_dec"])]))
    return "\n".join(lines)


def task_markdown(r: Results) -> str:
    """One row per task (its metric, a score per length), then the per-length mean; nulls when any."""
    lengths = r["lengths"]
    head = ["Task", "Metric", *map(length_label, lengths)]
    lines = [markdown_row(head), markdown_row(["---"] * len(head))]
    for t in r["tasks"]:
        lines.append(markdown_row([t, r["metrics"].get(t, "-"), *[_fmt(r["scores"][t].get(L)) for L in lengths]]))
    lines.append(markdown_row(["**mean**", "", *[_fmt(r["per_length"].get(L)) for L in lengths]]))
    null_cells = [sum(r["nulls"][t].get(L) or 0 for t in r["tasks"]) for L in lengths]
    if any(null_cells):
        totals = [sum(r["samples"][t].get(L) or 0 for t in r["tasks"]) for L in lengths]
        lines.append(markdown_row(["nulls", "", *[f"{n}/{m}" for n, m in zip(null_cells, totals)]]))
    return "\n".join(lines)


def task_csv(r: Results) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["task", "metric", *r["lengths"]])
    for t in r["tasks"]:
        w.writerow([t, r["metrics"].get(t, ""), *["" if r["scores"][t].get(L) is None else r["scores"][t][L]
                                                   for L in r["lengths"]]])
    w.writerow(["mean", "", *["" if r["per_length"].get(L) is None else r["per_length"][L] for L in r["lengths"]]])
    return buf.getvalue()


# --- plots ----------------------------------------------------------------------------------------


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("plots need matplotlib: pip install 'longctx[plot]'") from None
    return plt


def _plot_lines(series: list[tuple[str, list[int], list[float | None], dict]], title: str, out: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    all_lengths = sorted({L for _, ls, _, _ in series for L in ls})
    for label, ls, vs, style in series:
        pts = [(L, v) for L, v in zip(ls, vs) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **style)
    ax.set_xscale("log", base=2)
    ax.set_xticks(all_lengths, [length_label(L) for L in all_lengths])
    ax.minorticks_off()
    ax.axhline(THRESHOLD, color="grey", linestyle="--", linewidth=1, label=f"threshold {THRESHOLD}")
    ax.set_ylim(0, 100)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("RULER score")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def plot_results(r: Results, out: str | os.PathLike) -> Path:
    """Score vs length (log2 x-axis): one thin line per task, the mean thick, the 85.6 threshold dashed."""
    L = r["lengths"]
    series = [(t, L, [r["scores"][t].get(x) for x in L], {"linewidth": 0.8, "alpha": 0.6, "markersize": 2})
              for t in r["tasks"]]
    series.append(("mean", L, [r["per_length"].get(x) for x in L], {"linewidth": 2.5, "color": "black"}))
    _plot_lines(series, f"RULER: {r['model'].get('name', '?')}", Path(out))
    return Path(out)


# --- compare --------------------------------------------------------------------------------------


@dataclass
class Comparison:
    names: list[str]
    lengths: list[int]
    tasks: list[str]
    reference: int
    per_length: dict[str, dict[int, float | None]]
    columns: list[str]
    rows: list[list[str]]
    notes: list[str]
    markdown: str = ""
    files: list[Path] = field(default_factory=list)
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)  # run name -> its sinks.json (longctx sinks)


def _unique_names(runs: list[Results], dirs: list[Path]) -> list[str]:
    names = [r["model"].get("name") or d.name for r, d in zip(runs, dirs)]
    if len(set(names)) < len(names):
        names = [f"{n} ({d.name})" for n, d in zip(names, dirs)]
    if len(set(names)) < len(names):
        names = [str(d) for d in dirs]
    return names


def _shared_sample_scores(runs: list[Results], dirs: list[Path], names: list[str], tasks: list[str],
                          have: dict[str, list[int]], notes: list[str]) -> dict[str, dict[str, dict[int, Any]]]:
    """Per run, task scores by length; where runs scored a (task, length) on different sample counts,
    the larger runs are rescored on the first N samples (N = the smallest count) from their predictions,
    when those are the same samples (same references) as the smallest run's. Else the table notes it."""
    from longctx.eval.predictions import read_predictions
    from longctx.eval.scoring import score_predictions

    scores = {n: {t: dict(r["scores"][t]) for t in tasks} for n, r in zip(names, runs)}
    rescored, unequal = [], []
    for t in tasks:
        for L in sorted({L for ls in have.values() for L in ls}):
            members = [(n, r, d) for n, r, d in zip(names, runs, dirs) if L in have[n]]
            counts = {n: r["samples"][t][L] for n, r, _ in members}
            if len(set(counts.values())) < 2:
                continue
            n_min = min(counts.values())
            preds = {n: read_predictions(d / "pred" / str(L) / f"{t}.jsonl") for n, _, d in members}
            firsts = {n: [p.get(i) for i in range(n_min)] for n, p in preds.items()}
            refs = [[None if rec is None else rec["outputs"] for rec in f] for f in firsts.values()]
            if any(None in x for x in refs) or any(x != refs[0] for x in refs):
                unequal.append(f"{t} {length_label(L)} ({', '.join(f'{n}: {c}' for n, c in counts.items())})")
                continue
            for n, r, _ in members:
                if counts[n] > n_min:
                    f = firsts[n]
                    scores[n][t][L] = score_predictions([rec["pred"] for rec in f], [rec["outputs"] for rec in f],
                                                        r["metrics"][t]).score
            rescored.append(f"{t} {length_label(L)}: first {n_min}")
    if rescored:
        notes.append("sample counts differ; scored on the samples every run has: " + "; ".join(rescored))
    if unequal:
        notes.append("sample counts differ and the runs' predictions do not share their first samples, so these "
                     "cells are each run's own samples: " + "; ".join(unequal))
    return scores


def compare(run_dirs: list[str | os.PathLike], baseline: str | os.PathLike | None = None,
            reference: int | None = None, out_dir: str | os.PathLike | None = None,
            sinks: Sequence[str | os.PathLike] = ()) -> Comparison:
    """One table: a row per run, a column per length any run has ('-' where a run lacks it), Avg. over
    the lengths every run has, degradation vs a reference length, and the mean per-length difference
    vs the run's parent (when it is the YaRN child of another run) and vs a baseline run. Runs are
    compared on the tasks they share and, where sample counts differ, on the samples they share.

    When runs have `longctx sinks` results (`<run_dir>/sinks.json`, or a sinks.json/directory in
    `sinks`, matched to a run by checkpoint fingerprint), first-token attention, M-Act and gate-mean
    columns follow ('-' for a run without them, 'no gate' for a baseline)."""
    from longctx.sinks import COMPARE_COLUMNS, compare_cells, plot_sinks, sinks_for_runs  # sinks.json files only

    dirs = [Path(d) for d in run_dirs]
    if baseline is not None and Path(baseline) not in dirs:
        dirs.append(Path(baseline))
    if not dirs:
        raise InputError("give at least one run directory")
    runs = [load_results(d) for d in dirs]
    names = _unique_names(runs, dirs)
    notes: list[str] = []
    tasks = [t for t in runs[0]["tasks"] if all(t in r["tasks"] for r in runs)]
    if not tasks:
        raise InputError("these runs share no task; nothing to compare")
    all_tasks = sorted({t for r in runs for t in r["tasks"]})
    if len(all_tasks) != len(tasks):
        notes.append(f"compared on the {len(tasks)} tasks every run has ({', '.join(tasks)}); "
                     f"left out: {', '.join(t for t in all_tasks if t not in tasks)}")
    # A run's lengths are those with a score for every shared task. Columns are all of them (a parent
    # evaluated up to its trained length sits beside its YaRN child that goes further); averages and
    # differences between runs use only the lengths both sides have.
    have = {n: [L for L in r["lengths"] if all(r["scores"][t].get(L) is not None for t in tasks)]
            for n, r in zip(names, runs)}
    lengths = sorted({L for ls in have.values() for L in ls})
    if not lengths:
        raise InputError("no run has a length with scores for every shared task; nothing to compare")
    shared = [L for L in lengths if all(L in ls for ls in have.values())]
    scores = _shared_sample_scores(runs, dirs, names, tasks, have, notes)
    per_length = {n: {L: (per_length_means(scores[n], [L], tasks)[L] if L in have[n] else None) for L in lengths}
                  for n in names}
    if reference is None:
        trained = [r["model"].get("trained_length") for r in runs]
        limit = min((t for t in trained if t), default=None)
        pool = shared or lengths
        below = [L for L in pool if limit is None or L <= limit]
        reference = max(below) if below else pool[0]
    elif reference not in lengths:
        raise InputError(f"--reference {reference} is not a length any run has with every shared task "
                         f"(lengths: {', '.join(map(str, lengths))})")
    later = [L for L in lengths if L > reference]
    by_fp = {r["model"].get("fingerprint"): n for n, r in zip(names, runs)}
    base_name = names[dirs.index(Path(baseline))] if baseline is not None else None
    avg_over = shared if shared else None
    if avg_over is not None and avg_over != lengths:
        notes.append(f"Avg. is over the lengths every run has ({', '.join(map(length_label, avg_over))}); "
                     "'-': a length the run does not have")
    elif avg_over is None:
        notes.append("the runs share no length: Avg. is over each run's own lengths, not comparable across runs")

    def avg(n: str) -> float | None:
        return _mean([per_length[n][L] for L in (avg_over or have[n])])

    def gap(n: str, other: str) -> str:
        """Mean per-length difference against another run, over the lengths both have."""
        both = [L for L in lengths if per_length[n][L] is not None and per_length[other][L] is not None]
        return f"{_mean([per_length[n][L] - per_length[other][L] for L in both]):+.2f}" if both else "-"

    def delta(n: str, L: int) -> float | None:
        pl = per_length[n]
        return None if pl[L] is None or pl[reference] is None else round(pl[L] - pl[reference], 2)

    columns = ["Run", *map(length_label, lengths), "Avg.",
               *[f"Δ{length_label(L)} vs {length_label(reference)}" for L in later]]
    parents = {n: by_fp.get(r["model"].get("parent_fingerprint")) for n, r in zip(names, runs)}
    if any(parents.values()):
        columns.append("Δ vs parent")
    if base_name is not None:
        columns.append(f"Δ vs {base_name}")
    rows = []
    for n in names:
        row = [n, *[_fmt(per_length[n][L]) for L in lengths], _fmt(avg(n)),
               *["-" if delta(n, L) is None else f"{delta(n, L):+.2f}" for L in later]]
        if any(parents.values()):
            p = parents[n]
            row.append(f"{gap(n, p)} ({p})" if p else "")
        if base_name is not None:
            row.append(gap(n, base_name))
        rows.append(row)
    sink_docs, sink_notes = sinks_for_runs(runs, dirs, sinks)
    notes += sink_notes
    if any(sink_docs):
        columns += COMPARE_COLUMNS
        for row, doc in zip(rows, sink_docs):
            row += compare_cells(doc)
    cmp = Comparison(names, lengths, tasks, reference, per_length, columns, rows, notes,
                     sinks={n: d for n, d in zip(names, sink_docs) if d is not None})
    lines = [markdown_row(columns), markdown_row(["---"] * len(columns)), *map(markdown_row, rows)]
    lines.append("")
    lines.append(f"Scores: mean of {len(tasks)} RULER tasks per length; ΔL vs {length_label(reference)}: the run's "
                 f"score at L minus its score at the reference length {length_label(reference)}; Δ vs another run: "
                 "the mean per-length difference over the lengths both have.")
    if cmp.sinks:
        lines.append("First-token attn, M-Act, Gate mean: 'longctx sinks' averages over layers (from sinks.json).")
    lines += [f"Note: {x}" for x in notes]
    cmp.markdown = "\n".join(lines)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "compare.md", cmp.markdown + "\n")
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        sink_keys = ["first_token_attention", "m_act", "gate_mean"] if cmp.sinks else []
        w.writerow(["run", *lengths, "avg", *[f"delta_{L}_vs_{reference}" for L in later], *sink_keys])
        for n in names:
            pl = per_length[n]
            averages = cmp.sinks[n]["averages"] if n in cmp.sinks else {}
            w.writerow([n, *["" if pl[L] is None else pl[L] for L in lengths], avg(n),
                        *["" if delta(n, L) is None else delta(n, L) for L in later],
                        *["" if averages.get(k) is None else averages[k] for k in sink_keys]])
        write_atomic(out / "compare.csv", buf.getvalue())
        cmp.files += [out / "compare.md", out / "compare.csv"]
        try:
            _plot_lines([(n, lengths, [per_length[n][L] for L in lengths], {}) for n in names],
                        f"RULER ({len(tasks)} tasks)", out / "compare.png")
            cmp.files.append(out / "compare.png")
            if cmp.sinks:
                cmp.files.append(plot_sinks(list(cmp.sinks.values()), out / "compare-sinks.png", list(cmp.sinks)))
        except InputError as e:
            cmp.notes.append(f"no plot: {e}")
    return cmp
