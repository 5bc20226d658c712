"""results.json aggregation, tables and compare (pure Python, from hand-written result files)."""

import json

import pytest

from longctx.core.errors import InputError
from longctx.core.units import length_label
from longctx.report.compare import compare as compare_runs
from longctx.report.results import aggregate, load_results
from longctx.report.run import write_report
from longctx.report.settings import CompareSettings
from longctx.report.tables import summary_markdown


def compare(runs, **settings):
    return compare_runs(CompareSettings(runs=runs, **settings))

LENGTHS = [4096, 8192, 16384, 32768, 65536, 131072]


def test_aggregate_matches_published_rows():
    # RULER README, Llama3.1-8B-Instruct: 95.5 93.8 91.6 87.4 84.7 77.0 | 88.3 | 85.4 | 91.3, effective 32K
    a = aggregate(dict(zip(LENGTHS, [95.5, 93.8, 91.6, 87.4, 84.7, 77.0])))
    assert (a["avg"], a["wavg_inc"], a["wavg_dec"], a["effective_length"]) == (88.33, 85.38, 91.29, 32768)
    # GPT-4-1106-preview: 96.6 96.3 95.2 93.2 87.0 81.2 | 91.6 | 89.0 | 94.1, effective 64K
    g = aggregate(dict(zip(LENGTHS, [96.6, 96.3, 95.2, 93.2, 87.0, 81.2])))
    assert (round(g["avg"], 1), round(g["wavg_inc"], 1), round(g["wavg_dec"], 1)) == (91.6, 89.0, 94.1)
    assert g["effective_length"] == 65536
    # nothing passes; a length not run (None) is left out of every mean
    n = aggregate({4096: 50.0, 8192: None, 16384: 40.0})
    assert (n["avg"], n["effective_length"], n["wavg_inc"]) == (45.0, None, round((50 + 2 * 40) / 3, 2))


def _scores_doc(name, fp, per_task, samples=10, trained=32768, context=32768, parent=None, tasks=None):
    tasks = tasks or list(per_task)
    lengths = sorted({L for row in per_task.values() for L in row})
    return {
        "model": {"name": name, "fingerprint": fp, "trained_length": trained, "context_length": context,
                  "parent_fingerprint": parent},
        "backend": {"name": "vllm"}, "sampling": {"temperature": 0.0}, "template": {"name": "base"},
        "upstream": "NVIDIA/RULER@c3f5e3b", "task_set": "t" * 8, "lengths": lengths, "tasks": tasks,
        "scores": [{"task": t, "length": L, "metric": "string_match_all", "score": s, "nulls": 1, "samples": samples}
                   for t, row in per_task.items() for L, s in row.items()],
        "seeds": {"tasks": 42, "engine": 0}, "versions": {}, "task_versions": {t: "1" for t in tasks},
        "timings": {"total_s": 1.0},
    }


def _run(tmp_path, dirname, doc):
    d = tmp_path / dirname
    d.mkdir()
    (d / "scores.json").write_text(json.dumps(doc))
    return d, write_report(d)


def test_write_report_files_and_tables(tmp_path):
    d, rep = _run(tmp_path, "run", _scores_doc("tiny", "a", {"niah_single_1": {4096: 100.0, 8192: 80.0},
                                                              "vt": {4096: 90.0, 8192: 60.0}}))
    r = load_results(d)
    assert r["per_length"] == {4096: 95.0, 8192: 70.0} and r["scores"]["vt"][8192] == 60.0
    assert (r["avg"], r["effective_length"], r["threshold"]) == (82.5, 4096, 85.6)
    raw = json.loads((d / "results.json").read_text())
    assert raw["scores"]["vt"] == {"4096": 90.0, "8192": 60.0} and raw["format"] == "longctx-ruler-results/1"
    md = (d / "results.md").read_text()
    assert "| Models | Claimed Length | Effective Length | 4K | 8K | Avg. | wAvg. (inc) | wAvg. (dec) |" in md
    assert "| tiny | 32K | 4K | 95.00 | 70.00 | 82.50 | 78.33 | 86.67 |" in md
    assert "| empty predictions |  | 2 of 20 | 2 of 20 |" in md
    assert (d / "results.csv").read_text().splitlines() == [
        "task,metric,4096,8192", "niah_single_1,string_match_all,100.0,80.0", "vt,string_match_all,90.0,60.0",
        "mean,,95.0,70.0"]
    assert (d / "results.png").read_bytes()[:4] == b"\x89PNG"
    assert length_label(131072) == "128K" and length_label(3000) == "3000"
    assert summary_markdown([r]).count("\n") == 2


def test_compare_shared_tasks_lengths_parent_and_baseline(tmp_path):
    base, _ = _run(tmp_path, "base", _scores_doc(
        "base", "fp-base", {"vt": {4096: 90.0, 8192: 80.0}, "cwe": {4096: 70.0, 8192: 60.0}}))
    child, _ = _run(tmp_path, "child", _scores_doc(
        "base-yarn4x", "fp-child", {"vt": {4096: 80.0, 8192: 70.0, 16384: 50.0}}, samples=5,
        context=131072, parent="fp-base"))
    c = compare([base, child], baseline=base, output=tmp_path / "cmp")
    # every length any run has is a column; the parent has no 16K ('-'); Avg. and the run-vs-run
    # differences use the shared lengths (4K, 8K); the reference is the longest shared trained length
    assert c.tasks == ["vt"] and c.lengths == [4096, 8192, 16384] and c.reference == 8192
    assert c.per_length["base-yarn4x"] == {4096: 80.0, 8192: 70.0, 16384: 50.0}
    assert c.per_length["base"] == {4096: 90.0, 8192: 80.0, 16384: None}
    assert any("left out: cwe" in n for n in c.notes)
    assert any("Avg. is over the lengths every run has (4K, 8K)" in n for n in c.notes)
    # no predictions to rescore from: said, not hidden
    assert any("do not share their first samples" in n and "vt 4K (base: 10, base-yarn4x: 5)" in n for n in c.notes)
    assert "| Run | 4K | 8K | 16K | Avg. | Δ16K vs 8K | Δ vs parent | Δ vs base |" in c.markdown
    assert "| base-yarn4x | 80.00 | 70.00 | 50.00 | 75.00 | -20.00 | -10.00 (base) | -10.00 |" in c.markdown
    assert "| base | 90.00 | 80.00 | - | 85.00 | - |  | +0.00 |" in c.markdown
    assert (tmp_path / "cmp" / "compare.csv").read_text().splitlines()[1:] == [
        "base,90.0,80.0,,85.0,", "base-yarn4x,80.0,70.0,50.0,75.0,-20.0"]
    c2 = compare([base, child], reference=4096)
    assert "Δ8K vs 4K" in c2.markdown and "| base | 90.00 | 80.00 | - | 85.00 | -10.00 | - |  |" in c2.markdown
    assert sorted(p.name for p in c.files) == ["compare.csv", "compare.json", "compare.md", "compare.png"]
    with pytest.raises(InputError, match="is not a length any run has"):
        compare([base, child], reference=65536)
    with pytest.raises(InputError, match="has no results.json"):
        compare([base, tmp_path])


def _predictions(run_dir, length, task, rows):
    """A task file of `rows`' references (each prompt names its references, as RULER's do) and the predictions
    made from its prompts: scores come from the two together."""
    from longctx.eval.predictions import prompt_hash

    prompts = [f"Remember {' and '.join(o)}. Answer:" for _, o in rows]
    for folder, lines in [("tasks", [{"index": i, "input": prompt, "outputs": o, "length": 10, "answer_prefix": ""}
                                     for i, (prompt, (_, o)) in enumerate(zip(prompts, rows))]),
                          ("pred", [{"index": i, "pred": p, "outputs": o, "prompt_sha256": prompt_hash(prompt)}
                                    for i, (prompt, (p, o)) in enumerate(zip(prompts, rows))])]:
        d = run_dir / folder / str(length)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{task}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_compare_rescores_on_the_samples_every_run_has(tmp_path):
    """A 10-sample run against a 5-sample run: the larger one is rescored on its first 5 samples (the same
    prompts: RULER draws samples in sequence from one seed), from its predictions."""
    refs = [[f"{1000 + i}"] for i in range(10)]
    big, _ = _run(tmp_path, "big", _scores_doc("big", "fp-big", {"vt": {4096: 50.0}}, samples=10))
    _predictions(big, 4096, "vt", [(r[0] if i < 5 else "no", r) for i, r in enumerate(refs)])  # first 5 right
    small, _ = _run(tmp_path, "small", _scores_doc("small", "fp-small", {"vt": {4096: 60.0}}, samples=5))
    _predictions(small, 4096, "vt", [(r[0] if i < 3 else "no", r) for i, r in enumerate(refs[:5])])
    c = compare([big, small])
    assert c.per_length["big"] == {4096: 100.0} and c.per_length["small"] == {4096: 60.0}
    assert any("scored on the samples every run has: vt 4K: first 5" in n for n in c.notes)
    # references come from the task file: references edited into the prediction lines change nothing
    pred = big / "pred" / "4096" / "vt.jsonl"
    pred.write_text("".join(json.dumps({**json.loads(line), "outputs": ["zzz"]}) + "\n"
                            for line in pred.read_text().splitlines()))
    assert compare([big, small]).per_length["big"] == {4096: 100.0}
    # other samples (different references): not rescored, and the note says why
    _predictions(small, 4096, "vt", [(r[0], [r[0] + "x"]) for r in refs[:5]])
    c = compare([big, small])
    assert c.per_length["big"] == {4096: 50.0} and any("do not share their first samples" in n for n in c.notes)
