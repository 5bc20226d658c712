"""Results other tools read, exactly as they write them, and the files of those tools read back with every malformed
one refused: `longctx export --format ruler` against the files NVIDIA RULER's own evaluate.py wrote for the same
predictions (tests/data/ruler_export, made by its make.py), and `compare` over RULER's and lm-eval's layouts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_report import _predictions, _scores_doc

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.eval.scoring import score_predictions
from longctx.report.external import load_run
from longctx.report.run import write_report
from ruler_tasks.registry import TASKS

FIXTURE = Path(__file__).parent / "data" / "ruler_export"
sys.path.insert(0, str(FIXTURE))
from samples import ASKED, SAMPLES  # noqa: E402


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _sample_run(tmp_path: Path) -> Path:
    """A longctx run directory of `samples.SAMPLES`: task files, predictions and the scores the runner would give
    them, its tasks asked in `ASKED`'s order."""
    d = tmp_path / "run"
    d.mkdir()
    doc = _scores_doc("tiny", "fp", {t: {L: 0.0 for L in SAMPLES if t in SAMPLES[L]} for t in ASKED})
    doc["scores"] = []
    for L, tasks in SAMPLES.items():
        for t in ASKED:
            if t not in tasks:
                continue
            _predictions(d, L, t, tasks[t])
            s = score_predictions([p for p, _ in tasks[t]], [r for _, r in tasks[t]], TASKS[t].metric)
            doc["scores"].append({"task": t, "length": L, "metric": TASKS[t].metric, "score": s.score,
                                  "nulls": s.nulls, "samples": s.samples})
    (d / "scores.json").write_text(json.dumps(doc))
    write_report(d, plot=False)
    return d


def test_ruler_export_is_byte_for_byte_what_upstreams_evaluate_writes(tmp_path):
    out = tmp_path / "exported"
    r = run("export", _sample_run(tmp_path), "--format", "ruler", "-o", out)
    assert r.exit_code == 0, r.output
    expected = FIXTURE / "expected"
    want = sorted(p.relative_to(expected).as_posix() for p in expected.rglob("*.csv"))
    got = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.csv"))
    # synthetic.yaml's order, not --tasks'; a length of one task has summary-<task>.csv; a submission per length
    assert got == want == ["4096/submission.csv", "4096/summary.csv", "8192/submission.csv", "8192/summary-vt.csv"]
    for rel in want:
        assert (out / rel).read_bytes() == (expected / rel).read_bytes(), rel


def test_compare_reads_upstreams_own_folders_single_and_multi_task(tmp_path):
    """Upstream's layout (<length>/pred/), its single-task summary-<task>.csv among them."""
    for L in SAMPLES:
        (tmp_path / "ruler" / str(L) / "pred").mkdir(parents=True)
        for f in (FIXTURE / "expected" / str(L)).glob("summary*.csv"):
            (tmp_path / "ruler" / str(L) / "pred" / f.name).write_bytes(f.read_bytes())
    back, run_dir = load_run(tmp_path / "ruler")
    assert run_dir is None and back["tasks"] == ["niah_single_1", "vt", "qa_1"]
    assert back["scores"]["vt"] == {4096: 50.0, 8192: 50.0} and back["scores"]["qa_1"] == {4096: 66.67, 8192: None}
    assert back["nulls"]["vt"] == {4096: 1, 8192: 0} and back["samples"]["vt"] == {4096: 3, 8192: 2}


GOOD = "0,1,2\nTasks,vt,qa_1\nScore,50.0,66.67\nNulls,1/3,0/3\n"
MALFORMED = [
    ("0,1,2\nTasks,vt,qa_1,cwe\nScore,50.0,66.67\nNulls,1/3,0/3\n", "its Tasks row has 3 values where the header has 2"),
    ("0,1,2\nTasks,vt,qa_1\nScore,50.0,66.67,12\nNulls,1/3,0/3\n", "its Score row has 3 values where the header has 2"),
    ("0,1,2\nTasks,vt,qa_1\nScore,50.0\nNulls,1/3,0/3\n", "its Score row has 1 values where the header has 2"),
    ("0,1,2\nTasks,vt,vt\nScore,50.0,66.67\nNulls,1/3,0/3\n", "the Tasks row names vt more than once"),
    ("0,1,2\nTasks,vt,qa_1\nScore,50.0,lots\nNulls,1/3,0/3\n", "the Score of qa_1 is 'lots', not a number"),
    ("0,1,2\nTasks,vt,qa_1\nScore,50.0,1250\nNulls,1/3,0/3\n", "the Score of qa_1 is 1250; RULER's scores are 0-100"),
    ("0,1,2\nTasks,vt,qa_1\nScore,-0.3,1\nNulls,1/3,0/3\n", "the Score of vt is -0.3; RULER's scores are 0-100"),
    ("0,1,2\nTasks,vt,qa_1\nScore,50.0,nan\nNulls,1/3,0/3\n", "the Score of qa_1 is nan; RULER's scores are 0-100"),
    ("0,1,2\nTasks,vt,qa_1\nScore,50.0,66.67\nNulls,4/3,0/3\n", "the Nulls of vt is '4/3'; expected <empty>/<predictions>"),
    ("0,1,2\nTasks,vt,qa_1\nScore,50.0,66.67\n", "after the header it has the rows ['Tasks', 'Score']; expected"),
    ("Tasks,vt,qa_1\nScore,50.0,66.67\nNulls,1/3,0/3\n", "its first line should be the column numbers"),
]


@pytest.mark.parametrize("text, message", MALFORMED, ids=[m for _, m in MALFORMED])
def test_a_malformed_summary_is_one_line_naming_the_file_and_the_row(tmp_path, text, message):
    (tmp_path / "r" / "4096").mkdir(parents=True)
    (tmp_path / "r" / "4096" / "summary.csv").write_text(text)
    with pytest.raises(InputError) as e:
        load_run(tmp_path / "r")
    assert str(e.value).startswith(f"'{tmp_path / 'r' / '4096' / 'summary.csv'}' is not a RULER summary (")
    assert message in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "r" / "4096" / "summary.csv").write_text(GOOD)
    assert load_run(tmp_path / "r")[0]["scores"] == {"vt": {4096: 50.0}, "qa_1": {4096: 66.67}}


def test_summaries_that_contradict_their_folder_are_refused(tmp_path):
    L = tmp_path / "r" / "4096"
    L.mkdir(parents=True)
    (L / "summary-vt.csv").write_text(GOOD)
    with pytest.raises(InputError, match=r"a summary-vt.csv holds that one task, this one holds \['vt', 'qa_1'\]"):
        load_run(tmp_path / "r")
    (L / "summary-vt.csv").write_text("0,1\nTasks,vt\nScore,50.0\nNulls,1/3\n")
    (L / "summary.csv").write_text(GOOD)
    with pytest.raises(InputError, match=r"holds 2 RULER summaries \(summary-vt.csv, summary.csv\); keep the one"):
        load_run(tmp_path / "r")


def _lm_eval_file(tmp_path: Path, entry: dict) -> Path:
    f = tmp_path / "lm-eval.json"
    f.write_text(json.dumps({"results": {"ruler_vt": {"alias": "ruler_vt", **entry}}}))
    return f


def test_lm_evals_minus_one_is_no_samples_and_na_no_stderr(tmp_path):
    """Real lm-eval ruler runs write -1 for a length with no samples (`common_utils.aggregate_metrics`) and "N/A"
    for a standard error it did not compute."""
    f = _lm_eval_file(tmp_path, {"4096,none": 0.5, "4096_stderr,none": "N/A", "8192,none": -1,
                                 "8192_stderr,none": "N/A"})
    back, _ = load_run(f)
    assert back["scores"]["vt"] == {4096: 50.0, 8192: None} and back["per_length"] == {4096: 50.0, 8192: None}


LM_EVAL_BAD = [
    ({"4096,none": 12.5}, '"4096,none"] is 12.5; expected a score from 0 to 1, or -1'),
    ({"4096,none": -0.3}, '"4096,none"] is -0.3; expected a score from 0 to 1'),
    ({"4096,none": "0.5"}, '"4096,none"] is "0.5"; expected a score from 0 to 1'),
    ({"4096,none": True}, '"4096,none"] is true; expected a score'),
    ({"4096,none": None}, '"4096,none"] is null; expected a score'),
    ({"4096,none": 0.5, "4096_stderr,none": "big"}, '"4096_stderr,none"] is "big"; expected a standard error'),
    ({"4096,none": 0.5, "4096_stderr,none": -1}, '"4096_stderr,none"] is -1; expected a standard error >= 0'),
]


@pytest.mark.parametrize("entry, message", LM_EVAL_BAD, ids=[m for _, m in LM_EVAL_BAD])
def test_an_lm_eval_value_out_of_range_or_not_a_number_is_refused(tmp_path, entry, message):
    f = _lm_eval_file(tmp_path, entry)
    with pytest.raises(InputError) as e:
        load_run(f)
    assert str(e.value).startswith(f"'{f}': results.ruler_vt[") and message in str(e.value)


def test_the_fixture_is_what_its_checksums_say():
    import hashlib

    for line in (FIXTURE / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((FIXTURE / name).read_bytes()).hexdigest() == digest, name


LM_EVAL = Path(__file__).parent / "data" / "lm_eval"


def test_compare_reads_what_real_lm_eval_wrote():
    """Files real lm-eval (tests/data/lm_eval/VERSION) wrote for its ruler tasks: two lengths of two documents
    each (n-samples counts all four), and `--limit 2`, where the 8192 metric is not written at all."""
    both, _ = load_run(LM_EVAL / "results-two-lengths.json")
    assert both["model"]["source"] == "lm-eval" and both["tasks"] == ["niah_single_1", "vt"]
    assert both["scores"] == {"niah_single_1": {4096: 0.0, 8192: 0.0}, "vt": {4096: 0.0, 8192: 0.0}}
    assert both["samples"]["vt"] == {4096: 2, 8192: 2}
    limited, _ = load_run(LM_EVAL / "results-limit-2.json")
    assert limited["lengths"] == [4096] and limited["samples"]["niah_single_1"] == {4096: 2}
    # the per-sample files mark the length a document is not of with -1, as the results do for a length without one
    rows = [json.loads(line) for line in (LM_EVAL / "samples-ruler_vt.jsonl").read_text().splitlines()]
    assert [(r["doc_id"], r["4096"], r.get("8192")) for r in rows] == [(0, 0.0, None), (1, 0.0, None),
                                                                      (500, -1.0, 0.0), (501, -1.0, 0.0)]


def test_the_lm_eval_fixture_is_what_its_checksums_say():
    import hashlib

    for line in (LM_EVAL / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((LM_EVAL / name).read_bytes()).hexdigest() == digest, name
