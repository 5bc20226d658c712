"""`longctx export RUN --format lm-eval|ruler` read back by small readers that follow the documented formats,
and by `longctx compare`'s `load_run` (results of other tools as runs)."""

from __future__ import annotations

import csv
import json

from click.testing import CliRunner
from test_report import _run, _scores_doc

from longctx.cli.main import cli
from longctx.report.external import NOTE, load_run

PER_TASK = {"niah_single_1": {4096: 100.0, 8192: 80.0}, "vt": {4096: 90.0, 8192: 60.0},
            "qa_1": {4096: 55.5, 8192: 41.25}}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_lm_eval_export_is_lm_evals_results_shape_and_reads_back(tmp_path):
    d, _ = _run(tmp_path, "run", _scores_doc("tiny", "fp", PER_TASK))
    out = tmp_path / "exported" / "results.json"
    r = run("export", d, "--format", "lm-eval", "-o", out)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    # lm-eval's names, "<length>,none" keys, 0-1 scale; the group is the unweighted mean over tasks
    assert set(doc["results"]) == {"niah_single_1", "ruler_vt", "ruler_qa_squad", "ruler"}
    assert doc["results"]["ruler_vt"]["4096,none"] == 0.9 and doc["results"]["ruler_qa_squad"]["8192,none"] == 0.4125
    assert doc["results"]["ruler"]["8192,none"] == 0.6042  # the run's per-length mean, 60.42
    assert doc["group_subtasks"] == {"ruler": ["niah_single_1", "ruler_vt", "ruler_qa_squad"]}
    assert doc["n-samples"]["ruler_vt"] == {"original": 20, "effective": 20}  # lm-eval's: over all lengths
    assert doc["longctx"]["note"] == NOTE and "any reference" in NOTE
    back, run_dir = load_run(out)
    assert run_dir is None and back["model"]["name"] == "tiny" and back["model"]["source"] == "lm-eval"
    assert back["scores"] == PER_TASK and back["per_length"] == load_run(d)[0]["per_length"]
    assert back["samples"]["vt"][4096] == 10
    # an existing file is replaced only when asked; a folder is not a file
    assert run("export", d, "--format", "lm-eval", "-o", out).exit_code == 2
    assert run("export", d, "--format", "lm-eval", "-o", out, "--overwrite").exit_code == 0
    r = run("export", d, "--format", "lm-eval", "-o", tmp_path)
    assert r.exit_code == 2 and "is a folder" in r.output and r.output.count("\n") == 1
    # --overwrite replaces an export, never a file of the user's that happens to be there
    mine = tmp_path / "notes.json"
    mine.write_text('{"results": {}}\n')
    r = run("export", d, "--format", "lm-eval", "-o", mine, "--overwrite")
    assert r.exit_code == 2 and "exists and is not an lm-eval export longctx wrote; --overwrite replaces only those" \
        in r.output and r.output.count("\n") == 1, r.output
    assert mine.read_text() == '{"results": {}}\n'


def test_ruler_export_is_rulers_summary_csv_and_reads_back(tmp_path):
    d, _ = _run(tmp_path, "run", _scores_doc("tiny", "fp", PER_TASK))
    out = tmp_path / "ruler"
    r = run("export", d, "--format", "ruler", "-o", out)
    assert r.exit_code == 0, r.output
    # pandas' DataFrame(rows).to_csv(index=False): the column numbers, then Tasks / Score / Nulls
    assert (out / "4096" / "summary.csv").read_text() == (
        "0,1,2,3\nTasks,niah_single_1,vt,qa_1\nScore,100.0,90.0,55.5\nNulls,1/10,1/10,1/10\n")
    rows = list(csv.reader((out / "8192" / "summary.csv").open()))
    assert dict(zip(rows[1][1:], map(float, rows[2][1:]))) == {t: s[8192] for t, s in PER_TASK.items()}
    back, run_dir = load_run(out)
    assert run_dir is None and back["scores"] == PER_TASK and back["nulls"]["vt"] == {4096: 1, 8192: 1}
    # RULER's own layout: <length>/pred/summary.csv
    own = tmp_path / "own"
    (own / "4096" / "pred").mkdir(parents=True)
    (own / "4096" / "pred" / "summary.csv").write_text("0,1\nTasks,vt\nScore,87.5\nNulls,0/500\n")
    back, _ = load_run(own)
    assert back["scores"] == {"vt": {4096: 87.5}} and back["samples"]["vt"][4096] == 500


def test_export_refusals_are_one_line(tmp_path):
    d, _ = _run(tmp_path, "run", _scores_doc("tiny", "fp", PER_TASK))
    (tmp_path / "afile").write_text("x")
    for args, message in [
            ([tmp_path / "none", "--format", "ruler", "-o", tmp_path / "o"],
             "is not a directory (give a run directory"),
            ([d, "--format", "csv", "-o", tmp_path / "o"], "unknown format 'csv'; choose one of lm-eval, ruler"),
            ([d, "--format", "ruler", "-o", tmp_path / "afile"], "is a file, not a folder"),
            ([d, "--format", "lm-eval", "-o", tmp_path / "afile" / "r.json"], "which is a file, not a folder"),
            ([d, "--format", "ruler", "-o", d / "inside"], "lies inside the run")]:
        r = run("export", *args)
        assert r.exit_code == 2 and message in r.output and r.output.count("\n") == 1, (args, r.output)


def test_the_papers_table5_from_published_results(tmp_path):
    """The Gated Attention paper's Table 5, typed in as lm-eval group results (tests/data/table5), rendered in
    the table5 layout: the YaRN runs' differences to their 32k parents in brackets."""
    from pathlib import Path

    from longctx.report.compare import compare
    from longctx.report.settings import CompareSettings

    data = Path(__file__).parent / "data" / "table5"
    runs = [str(data / f"{n}.json") for n in ("baseline-32k", "gate-32k", "baseline-yarn", "gate-yarn")]
    c = compare(CompareSettings(runs=runs, layout="table5", parents={"Baseline + YaRN": "Baseline (32k)",
                                                                     "SDPA-Gate + YaRN": "SDPA-Gate (32k)"}))
    table = "\n".join(c.markdown.split("\n")[:6])
    assert table == (
        "| Run | 4K | 8K | 16K | 32K | 64K | 128K |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
        "| Baseline (32k) | 88.89 | 85.88 | 83.15 | 79.50 | – | – |\n"
        "| SDPA-Gate (32k) | 90.56 | 87.11 | 84.61 | 79.77 | – | – |\n"
        "| Baseline + YaRN | 82.90 (-5.99) | 71.52 (-14.36) | 61.23 (-21.92) | 37.94 (-41.56) | 37.51 | 31.65 |\n"
        "| SDPA-Gate + YaRN | 88.13 (-2.43) | 80.01 (-7.10) | 76.74 (-7.87) | 72.88 (-6.89) | 66.60 | 58.82 |")
    assert "per-length means only" in c.markdown and "point differences only" in c.markdown
    # the default layout over the same files: Avg. over the lengths every run has
    d = compare(CompareSettings(runs=runs, reference=4096))
    assert "| SDPA-Gate + YaRN | 88.13 | 80.01 | 76.74 | 72.88 | 66.60 | 58.82 | 79.44 |" in d.markdown
