"""`longctx compare` with statistics over real runs: paired differences on the same prompts (checked by their
hashes), the unpaired fallback, point differences without predictions, intervals, compare.json and the
paper's Table 5 layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.report import stats
from longctx.report.compare import compare as compare_runs
from longctx.report.results import load_results
from longctx.report.samples import run_samples
from longctx.report.settings import CompareSettings

# every test compares the real RULER runs of the `runs` fixture (~20 s on 2 cores)
pytestmark = pytest.mark.slow

TASKS = "vt,fwe"


def compare(runs, **settings):
    return compare_runs(CompareSettings(runs=[str(r) for r in runs], **settings))


def _ruler(checkpoint: Path, out: Path, lengths: list[int], tasks: str, seed: int) -> None:
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import RulerRunSettings
    from longctx.report.run import write_report

    run_ruler(RulerRunSettings(checkpoint=str(checkpoint), lengths=lengths, output=str(out), tasks=tasks, samples=4,
                               seed=seed, backend="hf"), progress=False)
    write_report(out, plot=False)


def _answer(out: Path, right: dict[tuple[int, str], list[int]]) -> None:
    """Make the predictions of the given samples right (every reference in the answer): random tiny models
    score 0 everywhere, and a difference of zeros would test nothing."""
    for (L, task), indices in right.items():
        path = out / "pred" / str(L) / f"{task}.jsonl"
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        for rec in recs:
            if rec["index"] in indices:
                rec["pred"] = " ".join(rec["outputs"])
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, reference_tokenizer_dir):
    """Real RULER runs (4 samples per task): `a` (checkpoint m0) and `b` (checkpoint m1) on the same prompts
    (task seed 42, vt + fwe at 1K); `c` (m0) on other prompts (task seed 7, vt at 1K and 2K). b's and c's
    answers are partly made right, and their runs resumed, which rescores them from their predictions."""
    from longctx.init.presets import write_tiny_qwen3

    root = tmp_path_factory.mktemp("cmpstats")
    with pytest.MonkeyPatch.context() as mp:  # the fingerprint cache stays in the test session's folder
        mp.setenv("LONGCTX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        m0 = write_tiny_qwen3(root / "m0", reference_tokenizer_dir, seed=0, max_position_embeddings=4096)
        m1 = write_tiny_qwen3(root / "m1", reference_tokenizer_dir, seed=1, max_position_embeddings=4096)
        plan = {"a": (m0, [1024], TASKS, 42, {}),
                "b": (m1, [1024], TASKS, 42, {(1024, "vt"): [0, 1, 2, 3], (1024, "fwe"): [0, 1, 2]}),
                "c": (m0, [1024, 2048], "vt", 7, {(1024, "vt"): [0], (2048, "vt"): [1, 2]})}
        for name, (ckpt, lengths, tasks, seed, right) in plan.items():
            _ruler(ckpt, root / name, lengths, tasks, seed)
            if right:
                _answer(root / name, right)
                _ruler(ckpt, root / name, lengths, tasks, seed)
    return {name: root / name for name in plan}


def test_same_prompts_are_paired_sample_by_sample(runs):
    a, b = load_results(runs["a"]), load_results(runs["b"])
    assert b["per_length"][1024] != a["per_length"][1024]  # not a difference of zeros
    c = compare([runs["a"], runs["b"]], baseline=runs["a"])
    e = c.differences["baseline"]["m1"]
    assert (e["against"], e["method"]) == ("m0", "paired") and list(c.differences["baseline"]) == ["m1"]
    d, overall = e["per_length"][1024], e["overall"]
    assert d["paired"] and overall["paired"] and d["pairs"] == overall["pairs"] == 4 * 2
    assert d["mean"] == pytest.approx(b["per_length"][1024] - a["per_length"][1024], abs=1e-6)
    assert overall["mean"] == pytest.approx(d["mean"], abs=1e-6)
    # b is right on 7 of its 8 samples and a on none: every bootstrap resample is above 0, and the sign-flip test
    # is exact over 2^7 patterns, of which only all-plus and all-minus are as extreme
    assert d["significant"] and d["lo"] > 0 and d["p"] == pytest.approx(2 / 2 ** 7, abs=1e-4)
    cell = f"{d['mean']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}] p={d['p']:.2g}"
    assert "### Paired differences vs m0" in c.markdown
    assert f"| Run | 1K | Overall |\n| --- | --- | --- |\n| m1 | {cell} | {cell} |" in c.markdown
    assert not any("different prompts" in n or "point differences" in n for n in c.notes)


def test_a_run_against_itself_is_zero_and_not_significant(runs, tmp_path):
    copy = tmp_path / "b-copy"
    shutil.copytree(runs["b"], copy)
    c = compare([runs["b"], copy], baseline=runs["b"])
    assert c.names == ["m1 (b)", "m1 (b-copy)"]
    e = c.differences["baseline"]["m1 (b-copy)"]
    for d in (e["per_length"][1024], e["overall"]):
        assert (d["mean"], d["p"], d["significant"], d["paired"]) == (0, 1, False, True)
        # 4 samples a run: the interval says how little they tell, never a point
        assert d["lo"] < 0 < d["hi"] and d["lo"] == -d["hi"]
    cell = f"+0.00 [{-d['hi']:+.2f}, {d['hi']:+.2f}] p=1 ns"
    assert f"| m1 (b-copy) | {cell} | {cell} |" in c.markdown
    assert "ns: not significant (the interval spans 0, or p >= 0.05)" in c.markdown


def test_other_prompts_fall_back_to_unpaired_and_no_predictions_to_points(runs, tmp_path):
    c = compare([runs["c"]], baseline=runs["b"])  # task seed 7 vs 42: the prompt hashes differ
    e = c.differences["baseline"]["m0"]
    d = e["per_length"][1024]
    assert e["method"] == "unpaired" and not d["paired"] and e["overall"]["paired"] is False
    # the test reassigns each task's samples between the runs
    assert 0 < d["p"] <= 1 and d["p"] == e["overall"]["p"]
    b, cr = load_results(runs["b"]), load_results(runs["c"])
    assert d["mean"] == pytest.approx(cr["scores"]["vt"][1024] - b["scores"]["vt"][1024], abs=1e-6)
    assert any("m0 vs m1: different prompts at vt 1K" in n and "unpaired" in n for n in c.notes)
    assert "unpaired: the runs answered different prompts" in c.markdown and " unpaired" in c.markdown
    # a run directory without its predictions: point differences, said
    bare = tmp_path / "bare"
    shutil.copytree(runs["b"], bare)
    shutil.rmtree(bare / "pred")
    shutil.rmtree(bare / "tasks")
    c = compare([bare], baseline=runs["a"])
    e = c.differences["baseline"]["m1"]
    a = load_results(runs["a"])
    assert e["method"] == "point" and e["per_length"][1024]["lo"] is None
    assert e["overall"]["mean"] == pytest.approx(b["per_length"][1024] - a["per_length"][1024], abs=1e-6)
    assert any(n.startswith("m1 vs m0: point differences only") for n in c.notes)


def test_intervals_are_the_runs_own_or_recomputed_for_the_shared_tasks(runs):
    b, cr = load_results(runs["b"]), load_results(runs["c"])
    own = b["intervals"]["per_length"][1024]
    c = compare([runs["a"], runs["b"]], intervals=True)
    assert c.intervals["m1"][1024] == own
    assert f"{b['per_length'][1024]:.2f} ± {(own['hi'] - own['lo']) / 2:.2f}" in c.rows[1][1]
    assert "±: half the width of the score's 95% interval" in c.markdown
    # with c, only vt is shared: b's 1K score is its vt score, so its interval is that of its vt samples
    c = compare([runs["b"], runs["c"]], intervals=True)
    vt = run_samples(runs["b"], b)["vt"][1024].scores
    assert c.per_length["m1"][1024] == b["scores"]["vt"][1024] != b["per_length"][1024]
    assert c.intervals["m1"][1024] == stats.interval([vt]).as_dict() != own
    assert c.intervals["m0"] == {L: cr["intervals"]["per_length"][L] for L in (1024, 2048)}


def test_an_older_results_json_interval_is_recomputed(runs, tmp_path):
    # written before intervals named their method: a percentile bootstrap that may be a point
    old = shutil.copytree(runs["b"], tmp_path / "old")
    doc = json.loads((old / "results.json").read_text())
    doc["intervals"]["per_length"]["1024"] = {"se": 0.0, "lo": 50.0, "hi": 50.0}
    (old / "results.json").write_text(json.dumps(doc))
    c = compare([runs["a"], old], intervals=True)
    assert c.intervals["m1"][1024] == load_results(runs["b"])["intervals"]["per_length"][1024]
    assert c.intervals["m1"][1024]["method"] in (stats.KORN_GRAUBARD, stats.BETA_BOUND)


def test_table5_layout_with_a_declared_parent(runs):
    b, cr = load_results(runs["b"]), load_results(runs["c"])
    parent_1k, child_1k, child_2k = b["scores"]["vt"][1024], cr["scores"]["vt"][1024], cr["scores"]["vt"][2048]
    c = compare([runs["b"], runs["c"]], layout="table5", parents={"m0": "m1"})
    assert c.parents == {"m0": "m1"} and c.layout == "table5"
    table, legend = c.markdown.split("\n\n")[:2]
    assert table == "\n".join([
        "| Run | 1K | 2K |",
        "| --- | --- | --- |",
        f"| m1 | {parent_1k:.2f} | – |",
        f"| m0 | {child_1k:.2f} ({child_1k - parent_1k:+.2f}) | {child_2k:.2f} |"])
    assert legend == ("Scores: mean of 1 RULER task per length; in brackets, a YaRN run's score minus its parent's at "
                      "that length (m0: parent m1); '–': a length the run does not have.")
    assert child_1k - parent_1k == -75.0  # what the answers made right give: not a trivial bracket
    # the parent difference has its statistics, unpaired (other prompts), over the one length both have
    scores = [[[run_samples(runs[r], load_results(runs[r]))["vt"][1024].scores]] for r in ("c", "b")]
    d = stats.unpaired_difference(*scores)
    cell = f"{d.mean:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}] p={d.p:.2g} unpaired" + ("" if d.significant else " ns")
    assert f"### Paired differences vs parent\n\n| Run | Parent | 1K | Overall |\n| --- | --- | --- | --- |\n" \
           f"| m0 | m1 | {cell} | {cell} |" in c.markdown
    assert "Avg." not in c.markdown and "Δ" not in c.markdown


def test_unknown_parent_is_one_line(runs):
    with pytest.raises(InputError) as e:
        compare([runs["b"], runs["c"]], layout="table5", parents={"m0": "m11"})
    assert str(e.value) == "--parent names 'm11', which is not one of the runs (m1, m0); did you mean 'm1'?"
    r = CliRunner().invoke(cli, ["compare", str(runs["b"]), str(runs["c"]), "--layout", "table5",
                                 "--parent", "m0=base"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--parent names 'base'" in r.stderr, r.output


def test_compare_json(runs, tmp_path):
    out = tmp_path / "cmp"
    c = compare([runs["a"], runs["b"]], baseline=runs["a"], output=out)
    assert sorted(p.name for p in c.files) == ["compare.csv", "compare.json", "compare.md", "compare.png"]
    doc = json.loads((out / "compare.json").read_text())
    assert set(doc) >= {"format", "runs", "lengths", "tasks", "per_length", "intervals", "differences", "method"}
    assert doc["format"] == "longctx-compare/1" and doc["method"] == json.loads(json.dumps(stats.METHOD))
    assert [r["name"] for r in doc["runs"]] == ["m0", "m1"] and doc["baseline"] == "m0"
    assert doc["per_length"] == {"m0": {"1024": c.per_length["m0"][1024]}, "m1": {"1024": c.per_length["m1"][1024]}}
    assert doc["intervals"]["m1"]["1024"] == load_results(runs["b"])["intervals"]["per_length"][1024]
    d = doc["differences"]["baseline"]["m1"]
    assert d["method"] == "paired" and d["per_length"]["1024"] == c.differences["baseline"]["m1"]["per_length"][1024]
    assert (out / "compare.md").read_text() == c.markdown + "\n"
