"""Seeds as a recipe axis (`sweep:`): every model runs once per seed from the first swept stage on, the stages
before it once; the grid is planned, shown by --dry-run, reused on a rerun, and compared across seeds."""

import json

import pytest
from test_recipes import RECIPES, run, write

from longctx.recipe.load import load_recipe
from longctx.recipe.plan import plan

QUICK = RECIPES / "tiny-ablations-quick.yaml"
DROP = {m: None for m in ("headwise", "head-shared", "value-elementwise", "input-independent", "ns-sigmoid")}


def _sweep_recipe(tmp_path, sweep, **more):
    """tiny-ablations-quick's baseline and elementwise models, with `sweep`."""
    return write(tmp_path / "sweep.yaml", {"base": str(QUICK), "models": DROP, "sweep": sweep,
                                           "compare": {"baseline": "baseline"}, **more})


def test_the_grid_forks_at_the_first_swept_stage(tmp_path):
    recipe = load_recipe(_sweep_recipe(tmp_path, {"seeds": [0, 1, 2], "stages": ["pretrain"]}))
    steps = plan(recipe, tmp_path / "out")
    assert [(s.stage, s.model, s.seed) for s in steps if s.model and s.model.startswith("baseline")] == [
        ("init", "baseline", None),
        *[(stage, f"baseline-seed{i}", i) for i in range(3) for stage in ("pretrain", "ruler", "sinks")]]
    seeded = {s.model: s for s in steps if s.stage == "pretrain"}
    assert [seeded[f"elementwise-seed{i}"].jobs[0].seed for i in range(3)] == [0, 1, 2]
    # every seed trains from the one shared init, into its own folder
    assert {str(s.inputs[0]) for s in seeded.values() if s.group == "elementwise"} == {
        str(tmp_path / "out" / "elementwise" / "init" / "elementwise-init")}
    assert seeded["baseline-seed1"].outputs == [tmp_path / "out" / "baseline-seed1" / "pretrain" /
                                                "baseline-seed1-pretrain"]
    # the sinks stage keeps its own seed (held-out text): only the swept stages take the sweep's
    assert {s.jobs[0].seed for s in steps if s.stage == "sinks"} == {1}
    compare = steps[-1].jobs[0]
    assert compare.replicates == {f"{m}-pretrain": [str(tmp_path / "out" / f"{m}-seed{i}" / "ruler" /
                                                        f"{m}-seed{i}-pretrain") for i in range(3)]
                                  for m in ("baseline", "elementwise")}
    assert compare.baseline == compare.replicates["baseline-pretrain"][0]


def test_init_in_the_sweep_makes_every_stage_per_seed(tmp_path):
    recipe = load_recipe(_sweep_recipe(tmp_path, {"seeds": "3,4"}))  # default: init and the training stages
    assert recipe.sweep.stages == ["init", "pretrain"]
    steps = plan(recipe, tmp_path / "out")
    inits = [s for s in steps if s.stage == "init"]
    assert [(s.model, s.jobs[0].seed) for s in inits] == [("baseline-seed3", 3), ("baseline-seed4", 4),
                                                          ("elementwise-seed3", 3), ("elementwise-seed4", 4)]


def test_dry_run_shows_the_whole_grid(tmp_path):
    r = run(_sweep_recipe(tmp_path, {"seeds": [0, 1, 2], "stages": ["pretrain"]}), "--dry-run", "-o",
            tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert ("2 models (baseline, elementwise) x 3 seeds (0, 1, 2: pretrain and what follows run once per seed)"
            in r.output)
    for m in ("baseline", "elementwise"):
        assert r.output.count(f"init for {m}:") == 1
        for i in range(3):
            assert f"pretrain for {m}-seed{i}: not run yet" in r.output
            assert f"output:   {tmp_path / 'out' / f'{m}-seed{i}' / 'ruler' / f'{m}-seed{i}-pretrain'}" in r.output


@pytest.mark.parametrize("sweep,message", [
    ({"stages": ["pretrain"]}, "sweep.seeds is required"),
    ({"seeds": [0, 0]}, "sweep.seeds names a seed twice"),
    ({"seeds": [-1]}, "sweep.seeds is invalid: -1 is not in the range 0<=x<=4294967295"),
    ({"seeds": [0], "stages": ["yarn"]}, "sweep.stages names 'yarn', not a stage of this recipe with a seed"),
    ({"seeds": [0], "stages": ["extend"]}, "sweep.stages names 'extend', not a stage of this recipe with a seed"),
    ({"seeds": [0], "colour": 1}, "unknown key 'sweep.colour'"),
])
def test_a_bad_sweep_is_one_line_exit_2(sweep, message, tmp_path):
    r = run(_sweep_recipe(tmp_path, sweep), "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.output
    assert not (tmp_path / "out").exists()


def test_a_seed_name_that_is_already_a_model_is_refused(tmp_path):
    recipe = write(tmp_path / "clash.yaml", {
        "base": str(QUICK), "models": {**DROP, "elementwise-seed1": {"init": {"preset": "tiny",
                                                                             "attention": "baseline"}}},
        "sweep": {"seeds": [0, 1]}})
    r = run(recipe, "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "sweep.seeds make the model name 'elementwise-seed1', which is already a model" \
        in r.stderr, r.output


@pytest.mark.slow
def test_a_sweep_runs_compares_across_seeds_and_reuses_what_is_done(tmp_path):
    recipe = _sweep_recipe(tmp_path, {"seeds": [0, 1], "stages": ["pretrain"]})
    r = run(recipe, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "### Across 2 seeds" in r.output and "Verdict, elementwise-pretrain vs baseline-pretrain over 2 seeds" \
        in r.output
    doc = json.loads((tmp_path / "out" / "compare" / "compare.json").read_text())["seeds"]
    assert list(doc["groups"]) == ["baseline-pretrain", "elementwise-pretrain"]
    assert doc["groups"]["elementwise-pretrain"]["runs"] == ["elementwise-seed0-pretrain", "elementwise-seed1-pretrain"]
    assert set(doc["groups"]["elementwise-pretrain"]["sinks"]) == {"first_token_attention", "m_act", "gate_mean",
                                                                   "perplexity"}
    # a rerun skips every stage; a third seed runs that seed's stages (and the comparison) only
    again = run(recipe, "-o", tmp_path / "out")
    assert again.exit_code == 0 and "\nrun " not in again.output and again.output.count("skip ") == 15, again.output
    more = run(_sweep_recipe(tmp_path, {"seeds": [0, 1, 2], "stages": ["pretrain"]}), "-o", tmp_path / "out")
    assert more.exit_code == 0, more.output
    ran = [line.split(" (")[0] for line in more.output.splitlines() if line.startswith("run ")]
    assert ran == [f"run {stage} for {m}-seed2" for m in ("baseline", "elementwise")
                   for stage in ("pretrain", "ruler", "sinks")] + ["run compare"], ran
