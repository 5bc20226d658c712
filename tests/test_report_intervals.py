"""Uncertainty in a RULER run's report: results.json's intervals from a real tiny run's predictions, the
`score ± half-width` tables, results.csv's se/lo/hi rows, the interval band of the plots, older results.json
files without intervals, and the sinks plot's whole-number layer ticks."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import shutil

import pytest

from longctx.eval.runner import run_ruler
from longctx.eval.settings import RulerRunSettings
from longctx.report import stats
from longctx.report.results import RESULTS_FILE, load_results, to_json, with_intervals
from longctx.report.run import write_report
from longctx.report.samples import Cell, run_samples
from longctx.report.tables import fmt_pm, summary_markdown, task_csv, task_markdown

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="the plot extra (matplotlib) is not installed")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, reference_tokenizer_dir):
    """A real hf run of a tiny random Qwen3: 1K, vt and niah_single_1, 4 samples each (scores.json only)."""
    from longctx.init.presets import write_tiny_qwen3

    root = tmp_path_factory.mktemp("intervals")
    ckpt = write_tiny_qwen3(root / "tiny", reference_tokenizer_dir, max_position_embeddings=2048)
    out = root / "run"
    run_ruler(RulerRunSettings(checkpoint=str(ckpt), lengths=[1024], output=str(out), tasks="vt,niah_single_1",
                               samples=4, backend="hf"), progress=False)
    return out


def _copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "run")


@pytest.mark.slow
def test_a_real_run_has_an_interval_for_every_cell_and_length(tiny_run, tmp_path):
    d = _copy(tiny_run, tmp_path)
    rep = write_report(d, plot=HAS_MATPLOTLIB)
    assert not [n for n in rep.notes if "intervals" in n]
    r = load_results(d)
    iv = r["intervals"]
    assert iv["method"] == stats.METHOD and iv["method"]["seed"] == stats.SEED
    assert set(iv["scores"]) == {"vt", "niah_single_1"} and list(iv["per_length"]) == [1024]
    cells = run_samples(d, r)
    for t in r["tasks"]:
        b, score = iv["scores"][t][1024], r["scores"][t][1024]
        assert set(b) == {"se", "lo", "hi", "method"} and 0 <= b["lo"] <= score <= b["hi"] <= 100 and b["se"] >= 0
        assert b["lo"] < b["hi"] and b["method"] in (stats.CLOPPER_PEARSON, stats.BETA_BOUND)
        # the per-sample scores intervals are computed from are those of the score (up to its rounding)
        cell = cells[t][1024]
        assert len(cell.scores) == 4 and abs(sum(cell.scores) / 4 - score) <= 0.005
    m = iv["per_length"][1024]
    assert m["lo"] <= r["per_length"][1024] <= m["hi"]
    raw = json.loads((d / RESULTS_FILE).read_text())
    assert list(raw["intervals"]["scores"]["vt"]) == ["1024"] and list(raw["intervals"]["per_length"]) == ["1024"]
    # results.md shows them only when asked; results.csv always carries them
    assert "±" not in rep.markdown
    rows = list(csv.reader(io.StringIO((d / "results.csv").read_text())))
    assert rows[:4] == [["task", "metric", "1024"], ["vt", r["metrics"]["vt"], str(r["scores"]["vt"][1024])],
                        ["niah_single_1", r["metrics"]["niah_single_1"], str(r["scores"]["niah_single_1"][1024])],
                        ["mean", "", str(r["per_length"][1024])]]
    assert [row[0] for row in rows[4:]] == [f"{t} {s}" for s in ("se", "lo", "hi")
                                            for t in ("vt", "niah_single_1", "mean")]
    assert rows[5 + 3] == ["niah_single_1 lo", r["metrics"]["niah_single_1"],
                           str(iv["scores"]["niah_single_1"][1024]["lo"])]
    assert rows[-1] == ["mean hi", "", str(m["hi"])]
    if HAS_MATPLOTLIB:
        assert (d / "results.png").read_bytes()[:4] == b"\x89PNG"

    shown = write_report(d, plot=False, intervals=True)
    half = (m["hi"] - m["lo"]) / 2
    assert f"| **mean** |  | {r['per_length'][1024]:.2f} ± {half:.2f} |" in shown.markdown
    assert f" | {r['per_length'][1024]:.2f} ± {half:.2f} | {r['avg']:.2f} |" in shown.markdown  # summary row
    assert "95% interval" in (d / "results.md").read_text()


@pytest.mark.slow
def test_predictions_that_are_not_the_scores_give_no_intervals(tiny_run, tmp_path):
    d = _copy(tiny_run, tmp_path)
    score = json.loads((d / "scores.json").read_text())
    vt = next(row["score"] for row in score["scores"] if row["task"] == "vt")
    pred = d / "pred" / "1024" / "vt.jsonl"
    recs = [json.loads(x) for x in pred.read_text().splitlines()]
    for rec in recs:  # every answer right, or every answer wrong: either way not the scored predictions
        rec["pred"] = " ".join(rec["outputs"]) if vt < 50 else ""
    pred.write_text("".join(json.dumps(rec) + "\n" for rec in recs))
    rep = write_report(d, plot=False, intervals=True)
    assert load_results(d)["intervals"] is None
    said = "no intervals: its predictions do not give its scores (the predictions of vt at 1024 score"
    assert any(said in n for n in rep.notes)
    assert "Note: no intervals:" in rep.markdown and "±" not in rep.markdown
    assert len((d / "results.csv").read_text().splitlines()) == 4


def test_results_without_predictions_or_an_older_results_json(tmp_path):
    from test_report import _scores_doc

    d = tmp_path / "other-tool"
    d.mkdir()
    (d / "scores.json").write_text(json.dumps(_scores_doc("m", "fp", {"vt": {4096: 90.0, 8192: 60.0}})))
    rep = write_report(d, plot=False, intervals=True)
    assert load_results(d)["intervals"] is None and json.loads((d / RESULTS_FILE).read_text())["intervals"] is None
    assert any("no intervals: its run directory does not hold every prediction" in n for n in rep.notes)
    assert "| vt | string_match_all | 90.00 | 60.00 |" in rep.markdown
    # a results.json written before intervals existed loads, and its tables and plot series have none
    doc = json.loads((d / RESULTS_FILE).read_text())
    del doc["intervals"]
    (d / RESULTS_FILE).write_text(json.dumps(doc))
    old = load_results(d)
    assert "intervals" not in old and old["per_length"] == {4096: 90.0, 8192: 60.0}
    assert "±" not in task_markdown(old, intervals=True) + summary_markdown([old], intervals=True)
    assert len(task_csv(old).splitlines()) == 3
    # a corrupt one is said, not half-read
    doc["intervals"] = {"method": {}, "scores": {"vt": {"4096": {"se": 1.0}}}, "per_length": {}}
    (d / RESULTS_FILE).write_text(json.dumps(doc))
    from longctx.core.errors import InputError

    with pytest.raises(InputError, match="'intervals' is not se/lo/hi"):
        load_results(d)


def _results(tmp_path):
    from test_report import _scores_doc

    d = tmp_path / "hand"
    d.mkdir()
    # vt has 4K and 8K, cwe only 4K: the 8K mean is over one task of two, so it gets no interval
    (d / "scores.json").write_text(json.dumps(_scores_doc(
        "hand", "fp", {"vt": {4096: 75.0, 8192: 50.0}, "cwe": {4096: 33.33}}, samples=4)))
    return write_report(d, plot=False).results


def test_with_intervals_from_hand_made_samples_round_trips(tmp_path):
    r = _results(tmp_path)
    samples = {"vt": {4096: Cell([100, 100, 100, 0], ["a"] * 4), 8192: Cell([100, 0, 100, 0], ["b"] * 4)},
               "cwe": {4096: Cell([100 / 3] * 4, ["c"] * 4)}}
    out = with_intervals(r, samples)
    assert "intervals" not in r or r["intervals"] is None  # build_results' output is left as it was
    iv = out["intervals"]
    vt = stats.interval([[100, 100, 100, 0]])
    assert iv["scores"]["vt"][4096] == vt.as_dict() and iv["scores"]["vt"][4096]["se"] == 25.0
    assert iv["scores"]["cwe"][8192] is None and iv["per_length"][8192] is None
    # every sample 33.333... (a fraction of references, no spread): never a point, the bound of a [0, 1] score
    cwe = iv["scores"]["cwe"][4096]
    assert cwe["se"] == 0.0 and cwe["method"] == stats.BETA_BOUND and cwe["lo"] < 33.33 < cwe["hi"]
    assert cwe == stats.interval([[100 / 3] * 4]).as_dict()
    both = stats.interval([[100, 100, 100, 0], [100 / 3] * 4]).as_dict()
    assert iv["per_length"][4096] == {**both, "lo": min(both["lo"], 54.17), "hi": max(both["hi"], 54.17)}
    # to_json writes string length keys; load_results gives int keys back, as for the scores
    (tmp_path / "hand" / RESULTS_FILE).write_text(json.dumps(to_json(out)))
    assert load_results(tmp_path / "hand")["intervals"] == iv
    md = task_markdown(out, intervals=True)
    assert f"| vt | string_match_all | 75.00 ± {(vt.hi - vt.lo) / 2:.2f} | 50.00 ± " in md
    assert f"| cwe | string_match_all | 33.33 ± {(cwe['hi'] - cwe['lo']) / 2:.2f} | - |" in md
    with pytest.raises(ValueError, match="cwe at 4096 has no per-sample scores"):
        with_intervals(r, {"vt": samples["vt"]})


def test_fmt_pm():
    assert fmt_pm(87.5, {"se": 3.1, "lo": 81.25, "hi": 93.75}) == "87.50 ± 6.25"
    assert fmt_pm(87.5, None) == "87.50" and fmt_pm(None, {"se": 0, "lo": 0, "hi": 1}) == "-"


@needs_matplotlib
def test_plot_draws_the_mean_band_and_labels_the_threshold(tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from longctx.report.plots import lines_figure, plot_lines, results_series

    r = _results(tmp_path)
    r = with_intervals(r, {"vt": {4096: Cell([100, 100, 100, 0], ["a"] * 4), 8192: Cell([100, 0, 100, 0], ["b"] * 4)},
                           "cwe": {4096: Cell([100 / 3] * 4, ["c"] * 4)}})
    series = results_series(r)
    mean = series[-1]
    assert mean[0] == "mean" and mean[3]["band"][0][1] is None  # no 8K interval: no band there
    # eight runs with bands: one filled band per run, each in its line's colour; distinct colour-marker pairs
    lengths = [4096, 8192, 16384]
    runs = [(f"run {i}", lengths, [90.0 - i, 80.0 - i, 70.0 - i],
             {"band": ([85.0 - i, 75.0 - i, None], [95.0 - i, 85.0 - i, None])}) for i in range(8)]
    fig, ax = lines_figure(runs, "eight")
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("run")]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(lines) == 8 and len(bands) == 8
    assert len({(ln.get_color(), ln.get_marker()) for ln in lines}) == 8
    assert [tuple(b.get_facecolor()[0][:3]) for b in bands] == [
        tuple(__import__("matplotlib").colors.to_rgb(ln.get_color())) for ln in lines]
    assert any(t.get_text() == "threshold 85.6" for t in ax.texts)
    legend = ax.get_legend()
    assert legend is not None and legend.get_bbox_to_anchor().y0 < ax.get_window_extent().y0  # below the axes
    plt.close(fig)
    assert plot_lines(runs, "eight", tmp_path / "eight.png").read_bytes()[:4] == b"\x89PNG"


@needs_matplotlib
def test_sinks_plot_layer_ticks_are_whole_numbers():
    import matplotlib.pyplot as plt

    from longctx.report.sinks import sinks_figure

    doc = {"format": "longctx-sinks/1", "model": {"name": "two-layer", "fingerprint": "fp"}, "layers": 2,
           "first_token_attention": [0.5, 0.4], "m_act": [10.0, 100.0],
           "averages": {"first_token_attention": 0.45, "m_act": 55.0, "gate_mean": None}}
    fig, axes = sinks_figure([doc])
    fig.canvas.draw()
    for ax in axes:
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks == [0.0, 1.0]
    plt.close(fig)


@needs_matplotlib
def test_sinks_plot_fits_small_values_and_marks_attention_spread_evenly():
    """A first-token sink of a few percent is read against attention spread evenly over the window, not against 0:
    the panel fits the values and draws that level, (H_L - 1) / (L - 1), for each window length measured."""
    import math

    import matplotlib.pyplot as plt

    from longctx.report.sinks import even_first_token_share, sinks_figure

    assert even_first_token_share(2) == 0.5 and math.isclose(even_first_token_share(3), (1 / 2 + 1 / 3) / 2)
    assert math.isclose(even_first_token_share(1024), (sum(1 / k for k in range(1, 1025)) - 1) / 1023)
    docs = [{"format": "longctx-sinks/1", "model": {"name": n, "fingerprint": n}, "layers": 2,
             "first_token_attention": v, "m_act": [5.0, 6.0], "settings": {"length": 256},
             "averages": {"first_token_attention": sum(v) / 2, "m_act": 5.5, "gate_mean": None}}
            for n, v in (("baseline", [0.047, 0.012]), ("gated", [0.014, 0.015]))]
    fig, (ax1, _) = sinks_figure(docs)
    assert math.isclose(ax1.get_ylim()[1], 1.25 * 0.047)
    dashed = [line for line in ax1.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and math.isclose(dashed[0].get_ydata()[0], even_first_token_share(256))
    plt.close(fig)
