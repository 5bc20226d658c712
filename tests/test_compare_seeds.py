"""`longctx compare --replicates`: runs of one model with different seeds, compared as one model (the mean over
seeds with its interval across seeds, differences paired seed by seed, the sinks values, the verdict)."""

import json

import pytest
from test_report import _run, _scores_doc
from test_sinks import _fake_sinks

from longctx.core.errors import SettingError
from longctx.report.compare import compare
from longctx.report.seeds import across_seeds, paired_across_seeds
from longctx.report.settings import CompareSettings


def _sweep(tmp_path, scores: dict[str, list[tuple[float, float]]], fta: dict[str, list[float]] | None = None):
    """Runs `<model><seed>` with vt at 4K and 8K as `scores[model][seed]`, each with a sinks.json whose first-token
    attention is `fta[model][seed]`; returns (run dirs by model, settings' replicates)."""
    dirs: dict[str, list] = {}
    for model, seeds in scores.items():
        for i, (s4, s8) in enumerate(seeds):
            fp = f"fp-{model}{i}"
            d, _ = _run(tmp_path, f"{model}{i}", _scores_doc(f"{model}-seed{i}", fp, {"vt": {4096: s4, 8192: s8}}))
            if fta is not None:
                gate = None if model == "baseline" else 0.2
                (d / "sinks.json").write_text(json.dumps(_fake_sinks(fp, d.name, fta[model][i], 10.0 + i, gate)))
            dirs.setdefault(model, []).append(d)
    return dirs, {m: [str(d) for d in ds] for m, ds in dirs.items()}


def test_a_gated_model_better_on_every_seed_is_supported(tmp_path):
    dirs, groups = _sweep(tmp_path, {"baseline": [(50.0, 20.0), (54.0, 25.0), (47.0, 18.0)],
                                     "gated": [(60.0, 45.0), (66.0, 52.0), (58.0, 47.0)]},
                          fta={"baseline": [0.40, 0.45, 0.38], "gated": [0.05, 0.04, 0.06]})
    c = compare(CompareSettings(runs=[str(d) for ds in dirs.values() for d in ds], baseline=str(dirs["baseline"][0]),
                                replicates=groups, reference=4096, output=str(tmp_path / "cmp")))
    base, gated = c.seed_groups
    assert (base.name, gated.name, c.seed_baseline) == ("baseline", "gated", "baseline")
    # the interval is across_seeds of the seeds' own scores (t with 2 degrees of freedom)
    want = across_seeds([(60 + 45) / 2, (66 + 52) / 2, (58 + 47) / 2])
    assert gated.overall == want and gated.per_length[8192] == across_seeds([45.0, 52.0, 47.0])
    d = c.seed_differences["gated"]
    assert d.per_length[8192] == paired_across_seeds([45.0, 52.0, 47.0], [20.0, 25.0, 18.0])
    assert d.sinks["first_token_attention"].mean == pytest.approx(-0.36)
    assert "### Across 3 seeds" in c.markdown and "### Across seeds: paired differences vs baseline" in c.markdown
    verdict = next(line for line in c.markdown.splitlines() if line.startswith("Verdict, gated vs baseline"))
    assert "the sweep supports a higher RULER score overall" in verdict
    assert "the sweep supports that it degrades less from 4K to 8K" in verdict
    assert "the sweep supports less attention on the first token (a weaker sink)" in verdict
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())["seeds"]
    assert doc["groups"]["gated"]["runs"] == ["gated-seed0", "gated-seed1", "gated-seed2"]
    assert doc["differences"]["gated"]["per_length"]["8192"]["significant"] is True
    assert doc["verdict"] == [verdict]


def test_each_run_is_compared_with_its_own_seeds_baseline(tmp_path):
    """With seed groups that hold the baseline, the per-run differences pair seed i with the baseline's seed i (as
    the section across seeds does), not every run with the baseline's first seed; the baseline's own seeds are
    each their seed's baseline, so none is compared with another."""
    dirs, groups = _sweep(tmp_path, {"baseline": [(50.0, 20.0), (54.0, 25.0), (47.0, 18.0)],
                                     "gated": [(60.0, 45.0), (66.0, 52.0), (58.0, 47.0)]})
    c = compare(CompareSettings(runs=[str(d) for ds in dirs.values() for d in ds], baseline=str(dirs["baseline"][0]),
                                replicates=groups, reference=4096, output=str(tmp_path / "cmp")))
    assert c.baseline_of == {f"{m}-seed{i}": f"baseline-seed{i}" for m in ("baseline", "gated") for i in range(3)}
    assert {n: d.against for n, d in c.against_baseline.items()} == {f"gated-seed{i}": f"baseline-seed{i}"
                                                                    for i in range(3)}
    assert c.against_baseline["gated-seed1"].per_length[8192].mean == pytest.approx(52.0 - 25.0)
    assert "### Paired differences vs baseline, seed by seed" in c.markdown
    assert "| gated-seed2 | baseline-seed2 |" in c.markdown
    assert c.columns[-1] == "Δ vs baseline (same seed)"
    row = {r[0]: r[-1] for r in c.rows}
    assert row["gated-seed1"] == f"{((66 + 52) - (54 + 25)) / 2:+.2f}" and row["baseline-seed2"] == "+0.00"
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert doc["differences"]["baseline"]["gated-seed0"]["against"] == "baseline-seed0"
    # without replicates every run is compared with the one baseline run, as before
    plain = compare(CompareSettings(runs=[str(d) for ds in dirs.values() for d in ds],
                                    baseline=str(dirs["baseline"][0]), reference=4096))
    assert plain.baseline_of == {} and set(plain.against_baseline) == {"baseline-seed1", "baseline-seed2",
                                                                         "gated-seed0", "gated-seed1", "gated-seed2"}
    assert "### Paired differences vs baseline-seed0" in plain.markdown


def test_seeds_that_disagree_support_nothing(tmp_path):
    dirs, groups = _sweep(tmp_path, {"baseline": [(50.0, 20.0), (30.0, 35.0), (47.0, 18.0)],
                                     "gated": [(60.0, 15.0), (28.0, 30.0), (45.0, 25.0)]},
                          fta={"baseline": [0.40, 0.10, 0.30], "gated": [0.35, 0.20, 0.20]})
    c = compare(CompareSettings(runs=[str(d) for ds in dirs.values() for d in ds], baseline=str(dirs["baseline"][0]),
                                replicates=groups, reference=4096))
    verdict = next(line for line in c.markdown.splitlines() if line.startswith("Verdict, gated vs baseline"))
    assert "it does not support a difference in RULER score overall" in verdict
    assert "it does not support a difference in degradation from 4K to 8K" in verdict
    assert "it does not support a difference in first-token attention" in verdict
    assert "the interval spans 0" in verdict


@pytest.mark.parametrize("replicates,message", [
    ({"gated": ["nowhere"]}, "compare.replicates gated names 'nowhere', which is not one of the runs"),
    ({"a": ["baseline-seed0"], "b": ["baseline-seed0"]}, "puts the run 'baseline-seed0' in both a and b"),
    ({"a": ["baseline-seed0", "baseline-seed1"], "b": ["gated-seed0"]}, "gives groups of 1 and 2 runs"),
])
def test_bad_replicates_are_one_line(replicates, message, tmp_path):
    dirs, _ = _sweep(tmp_path, {"baseline": [(50.0, 20.0), (54.0, 25.0)], "gated": [(60.0, 45.0), (66.0, 52.0)]})
    with pytest.raises(SettingError) as e:
        compare(CompareSettings(runs=[str(d) for ds in dirs.values() for d in ds], replicates=replicates))
    assert message in str(e.value).replace("--replicates", "compare.replicates") and "\n" not in str(e.value)
