"""Recipes (`recipes/*.yaml`) and `longctx run`: validation, dry runs, one-line errors, skipping and resume."""

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import require_vllm

from longctx.cli.main import cli
from longctx.eval.settings import RulerRunSettings
from longctx.recipe.load import load_recipe
from longctx.recipe.run import MARKER, run_recipe

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def run(*args):
    return CliRunner().invoke(cli, ["run", *map(str, args)])


def write(path, doc):
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def local_variant(recipe: Path, tmp_path: Path) -> Path:
    """`recipe` with every model path it needs but that is not here replaced: released folders by empty
    temp dirs, shipped checkpoints by `init`-made tiny models (as the brief's test recipe does)."""
    from longctx.recipe.load import read_yaml

    models = {}
    for name, spec in read_yaml(recipe)["models"].items():
        if "convert" in spec and not Path(spec["convert"]["source"]).is_dir():
            (tmp_path / name).mkdir()
            models[name] = {"convert": {"source": str(tmp_path / name)}}
        elif "checkpoint" in spec and not (recipe.parent / spec["checkpoint"]).is_dir():
            attention = "baseline" if name == "baseline" else "elementwise"
            models[name] = {"checkpoint": None, "init": {"preset": "tiny", "attention": attention,
                                                        "match_params": attention != "baseline"}}
    return write(tmp_path / f"local-{recipe.name}", {"base": str(recipe), "models": models})


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_validates(recipe, tmp_path):
    r = load_recipe(local_variant(recipe, tmp_path))
    assert r.models and r.stages
    assert "ruler" in r.stages and "compare" in r.stages


def test_every_recipe_key_is_commented():
    for recipe in RECIPES.glob("*.yaml"):
        for n, line in enumerate(recipe.read_text().splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#") and not line.rstrip().endswith(":"):
                assert "#" in line or line.startswith("description:") or line.lstrip().startswith("- "), \
                    f"{recipe.name}:{n} has no comment: {line}"


def test_paper_recipe_dry_run_prints_the_plan_and_launch_lines(tmp_path):
    r = run(RECIPES / "paper-1.7b.yaml", "-o", tmp_path / "out", "--dry-run")
    assert r.exit_code == 0, r.output
    out = r.output
    assert "accelerate launch --num_processes 8 --num_machines 1 -m longctx extend" in out
    assert "--rope-base 1000000 --short-data hf:HuggingFaceFW/fineweb-edu --short-fraction 0.4 --tokens 80000000000" \
        in out
    assert "--seq-len 32768" in out and "factor=4.0" in out and "original_max_position_embeddings=32768" in out
    assert '"yarn": [4096, 8192, 16384, 32768, 65536, 131072]' in out and '"extend": [4096, 8192, 16384, 32768]' in out
    assert out.count("run    ") == 13  # 6 stages x 2 models + compare, nothing run before
    assert not (tmp_path / "out").exists()


def test_released_recipe_plans_with_its_models_not_downloaded(tmp_path, monkeypatch):
    """Its sources are Hub ids: --dry-run plans it with nothing cached (reading the cache only, never the
    network), saying how to fetch each."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    r = run(RECIPES / "released-1b.yaml", "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert ("input  models.baseline.convert.source: QwQZh/gated_attention/1B_baseline is not in the local Hugging "
            "Face cache; its stage downloads it, or fetch it first: hf download QwQZh/gated_attention --include "
            "'1B_baseline/*'") in r.output
    assert r.output.count("convert.source: QwQZh/gated_attention/") == 3
    assert ("input  extend.data: hf:emozilla/pg19 is not in the local Hugging Face cache; its stage downloads it, "
            "or fetch it first: hf download --repo-type dataset emozilla/pg19") in r.output
    assert "run    convert for headwise" in r.output and not (tmp_path / "out").exists()
    r = run(local_variant(RECIPES / "released-1b.yaml", tmp_path), "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "run    convert for elementwise" in r.output and "accelerate launch" in r.output
    assert "torchrun" not in r.output


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_every_shipped_recipe_plans_offline_with_nothing_cached(recipe, tmp_path, monkeypatch):
    """--dry-run plans each shipped recipe offline with an empty cache, listing every Hub input and hf: dataset
    it would need with the command that fetches it; a real run refuses the first of them at once."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = run(RECIPES / recipe, "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    from longctx.recipe.load import load_recipe
    from longctx.recipe.plan import recipe_data

    hf_data = {spec for _, spec in recipe_data(load_recipe(RECIPES / recipe, offline_data=False))
               if spec.startswith("hf:")}
    for spec in hf_data:
        assert f"{spec} is not in the local Hugging Face cache; its stage downloads it, or fetch it first: hf " \
               f"download --repo-type dataset {spec.removeprefix('hf:').split(':')[0]}" in r.output
    if hf_data:
        r = run(RECIPES / recipe, "-o", tmp_path / "out")
        assert r.exit_code == 2 and "not in the local Hugging Face cache and HF_HUB_OFFLINE=1" in r.stderr
        assert not (tmp_path / "out").exists()


def test_torchrun_and_multi_machine_launch_lines(tmp_path):
    recipe = write(tmp_path / "r.yaml", {
        "base": str(RECIPES / "paper-1.7b.yaml"),
        "launcher": {"launcher": "torchrun", "num_processes": 16, "num_machines": 2, "machine_rank": 1,
                     "main_process_ip": "10.0.0.1"}})
    r = run(recipe, "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "torchrun --nnodes 2 --nproc_per_node 8 --node_rank 1 --master_addr 10.0.0.1 --master_port 29500 " \
           "-m longctx extend" in r.output


def test_a_base_recipes_paths_count_from_the_base_file(tmp_path):
    """A variant elsewhere inherits the base's relative paths as the base meant them; its own count from itself."""
    (tmp_path / "base" / "ckpt").mkdir(parents=True)
    (tmp_path / "base" / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "base" / "docs.txt").write_text("a document\n")
    (tmp_path / "variant" / "mine").mkdir(parents=True)
    (tmp_path / "variant" / "mine" / "notes.txt").write_text("held-out text\n")  # sinks data is checked at load
    write(tmp_path / "base" / "r.yaml", {
        "models": {"baseline": {"checkpoint": "ckpt"}},
        "extend": {"seq_len": "2k", "data": "docs.txt,synthetic:niah", "steps": 2},
        "ruler": {"lengths": "1k,2k", "tasks": "vt", "data_dir": "ruler-data"}, "compare": {}})
    variant = write(tmp_path / "variant" / "v.yaml", {"base": "../base/r.yaml", "sinks": {"data": "mine"}})
    r = load_recipe(variant)
    assert r.models[0].checkpoint == tmp_path / "base" / "ckpt"
    assert r.stages["extend"].data == [str(tmp_path / "base" / "docs.txt"), "synthetic:niah"]
    assert r.stages["ruler"].data_dir == str(tmp_path / "base" / "ruler-data")
    assert r.stages["sinks"].data == str(tmp_path / "variant" / "mine")


def test_an_init_tokenizer_directory_counts_from_the_recipe_file(tmp_path):
    """`init.tokenizer` is reference, bpe or a directory; the directory is a path like any other (from the
    recipe's folder, or from the base's for a base recipe's models), the two names stay names."""
    (tmp_path / "base" / "tok").mkdir(parents=True)
    (tmp_path / "base" / "tok" / "tokenizer.json").write_text("{}")
    base = write(tmp_path / "base" / "r.yaml", {"models": {
        "baseline": {"init": {"preset": "tiny", "attention": "baseline", "tokenizer": "tok"}},
        "gated": {"init": {"preset": "tiny", "attention": "elementwise", "tokenizer": "bpe"}}},
        "yarn": {"factor": 2}})
    r = load_recipe(base)
    assert [m.settings.tokenizer for m in r.models] == [str(tmp_path / "base" / "tok"), "bpe"]
    (tmp_path / "variant").mkdir()
    variant = write(tmp_path / "variant" / "v.yaml", {"base": "../base/r.yaml"})
    assert load_recipe(variant).models[0].settings.tokenizer == str(tmp_path / "base" / "tok")


TINY = {"baseline": {"init": {"preset": "tiny", "attention": "baseline"}}}
SMALL = {"models": TINY, "yarn": {"factor": 4}, "ruler": {"lengths": "1k", "tasks": "vt"}}


@pytest.mark.parametrize("doc, message", [
    ({"models": TINY, "yarn": {"factor": 4}, "extnd": {}}, "unknown key or stage 'extnd'; did you mean 'extend'?"),
    ({"models": TINY, "yarn": {"factr": 4}}, "unknown key 'yarn.factr'; did you mean 'factor'?"),
    ({"models": TINY, "extend": {"rope_base": 1e6, "seq_len": "8k", "data": ["synthetic:mixed"], "steps": 2,
                                 "lr": "fast"}}, "extend.lr must be a number > 0, got 'fast'"),
    ({"models": TINY, "extend": {"rope_base": 1e6, "seq_len": "8q", "data": ["synthetic:mixed"], "steps": 2}},
     "extend.seq_len is invalid: '8q' in '8q' is not a length"),
    ({"models": {"gated": {"checkpoint": "./no/such/dir"}}, "yarn": {"factor": 4}},
     "models.gated.checkpoint '{tmp}/no/such/dir' does not exist: model path missing"),
    ({"models": {"gated": {"init": {"preset": "tiny", "attention": "elementwise"}, "checkpoint": "x"}},
      "yarn": {"factor": 4}}, "models.gated must have exactly one of init, convert or checkpoint"),
    ({"models": TINY, "yarn": {"factor": 4}, "ruler": {"lengths": "4k,32k"}},
     "ruler.lengths go up to 32768 but yarn.factor 4 on the 4096-token trained length reaches 16384; "
     "the largest reachable length is 16384"),
    ({"models": TINY, "ruler": {"lengths": "4k,8k"}},
     "baseline is trained at 4096 tokens and there is no yarn stage; the largest reachable length is 4096"),
    ({"models": TINY, "ruler": {"lengths": "512,1k"}}, "needs at least 1024 tokens"),
    ({"models": {"baseline": {"init": {"preset": "tiny", "attention": "baseline", "tokenizer": "bpee"}}},
      "yarn": {"factor": 4}},
     "models.baseline.init.tokenizer '{tmp}/bpee' is neither reference nor bpe nor an existing tokenizer directory"),
    ({"models": TINY, "ruler": {"lengths": "1k"}, "compare": {"baseline": "basline"}},
     "compare.baseline 'basline' is not a model of this recipe (baseline); did you mean 'baseline'?"),
    ({"models": {"gated": {"init": {"preset": "tiny", "attention": "elementwise", "tie_embeddings": "no"}}},
      "yarn": {"factor": 4}}, "models.gated.init.tie_embeddings must be true or false, got 'no'"),
    ({"models": TINY, "yarn": {"factor": 4}, "ruler": {"lengths": "1k", "backend": "vlm"}},
     "ruler.backend must be one of vllm, openai, hf, got 'vlm'; did you mean 'vllm'?"),
    pytest.param({"models": TINY, "yarn": {"factor": 4},
                  "ruler": {"lengths": "1k", "tasks": "vt", "backend_options": {"engine_args": {"max_num_seq": 8}}}},
                 "ruler.backend_options.engine_args max_num_seq: vLLM's EngineArgs has no such field; did you mean "
                 "'max_num_seqs'?", marks=pytest.mark.slow),  # imports vLLM (~7 s)
    ({"models": TINY, "yarn": {"factor": 4}, "ruler": {"lengths": "1k", "tasks": "vt", "chat_template_kwargs": "{no"}},
     "ruler.chat_template_kwargs must be a JSON object"),
    ({"models": TINY, "yarn": {"factor": 4}, "ruler": {"lengths": "1k", "tasks": "vt", "think_tokens": 512}},
     "ruler.think_tokens is for thinking chat models; add ruler.template chat"),
    # a model's own keys: `skip` and a stage's section (docs/run.md, "A model that differs from the rest")
    ({**SMALL, "models": {"baseline": {**TINY["baseline"], "skip": ["yran"]}}},
     "models.baseline.skip names 'yran', not a stage of this recipe (choose from yarn, ruler); did you mean 'yarn'?"),
    ({**SMALL, "models": {"baseline": {**TINY["baseline"], "skip": "yarn"}}},
     "models.baseline.skip must be a list of stage names, got 'yarn'"),
    ({**SMALL, "models": {"baseline": {**TINY["baseline"], "rulr": {"samples": 2}}}},
     "unknown key 'models.baseline.rulr'; did you mean 'ruler'?"),
    ({**SMALL, "models": {"baseline": {**TINY["baseline"], "ruler": {"samples": "many"}}}},
     "models.baseline.ruler.samples is invalid: 'many' is not a valid integer"),
    ({**SMALL, "models": {"baseline": {**TINY["baseline"], "skip": ["yarn"], "yarn": {"factor": 2}}}},
     "models.baseline both skips yarn and sets its keys; keep one"),
    ({**SMALL, "ruler": {**SMALL["ruler"], "checkpoints": ["yarn"]},
      "models": {"baseline": {**TINY["baseline"], "skip": ["yarn"]}}},
     "models.baseline.skip leaves ruler nothing to evaluate (ruler.checkpoints: yarn); set "
     "models.baseline.ruler.checkpoints"),
    ({**SMALL, "models": {"baseline": {**TINY["baseline"], "ruler": {"checkpoints": ["extend"]}}}},
     "models.baseline.ruler.checkpoints names 'extend', not a checkpoint baseline goes through (choose from model, "
     "yarn)"),
    ({**SMALL, "models": {"baseline": {**TINY["baseline"], "ruler": {"lengths": "32k"}}}},
     "ruler.lengths go up to 32768 but yarn.factor 4 on the 4096-token trained length reaches 16384"),
])
def test_bad_recipe_is_one_line_exit_2(doc, message, tmp_path):
    recipe = write(tmp_path / "bad.yaml", doc)
    r = run(recipe, "--dry-run", "-o", tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and r.output.startswith(f"Error: {recipe}: ")
    assert message.format(tmp=tmp_path) in r.output
    assert not (tmp_path / "out").exists()


def test_from_a_stage_whose_input_is_missing(tmp_path):
    recipe = write(tmp_path / "r.yaml", SMALL)
    r = run(recipe, "--from", "yarn", "-o", tmp_path / "out")
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert f"--from yarn: its input {tmp_path}/out/baseline/init/baseline-init (yarn for baseline) does not exist" \
           in r.output
    r = run(recipe, "--from", "sinks", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "has no sinks stage" in r.output


def statuses(result):
    return {(s.model, s.stage): s.status for s in result.steps}


@pytest.mark.slow
def test_run_skips_what_is_done_and_reruns_what_changed(tmp_path):
    """A tiny end-to-end recipe: init -> extend -> yarn -> ruler (hf) -> sinks -> compare, run three times."""
    pytest.importorskip("longctx.extend.loop")
    doc = {"models": {"baseline": {"init": {"preset": "tiny", "attention": "baseline"}},
                      "gated": {"init": {"preset": "tiny", "attention": "elementwise", "match_params": True,
                                         "tie_embeddings": False}}},
           "extend": {"rope_base": "1e6", "seq_len": "2k", "data": ["synthetic:mixed"], "steps": 2,
                      "tokens_per_step": 2048, "lr": "1e-3"},
           "yarn": {"factor": 2},
           "ruler": {"lengths": "1k,2k", "tasks": "niah_single_1", "samples": 1, "backend": "hf",
                     "checkpoints": ["yarn"]},
           "compare": {"reference": "1k", "baseline": "baseline"}}
    try:
        import longctx.sinks  # noqa: F401

        doc["sinks"] = {"tokens": 1024, "length": "1k"}
    except ImportError:
        pass
    recipe = write(tmp_path / "r.yaml", doc)
    out = tmp_path / "out"
    logs = []
    first = run_recipe(recipe, out, log=logs.append)
    assert set(statuses(first).values()) == {"run"}
    assert "| baseline-yarn |" in first.comparison and "Training loss:" in first.comparison
    assert (out / "compare" / "compare.md").is_file() and (out / "compare" / "loss.md").is_file()
    ckpt = out / "gated" / "yarn" / "gated-yarn"
    assert json.loads((ckpt / "config.json").read_text())["rope_parameters"]["original_max_position_embeddings"] == 2048
    # init.tie_embeddings: false gives the gated model its own output matrix, kept through training and YaRN
    from safetensors import safe_open

    for model, tied in (("baseline", True), ("gated", False)):
        yarned = out / model / "yarn" / f"{model}-yarn"
        assert json.loads((yarned / "config.json").read_text())["tie_word_embeddings"] is tied
        with safe_open(yarned / "model.safetensors", "pt") as f:
            assert ("lm_head.weight" in f.keys()) is not tied
    marker = json.loads((out / "gated" / "extend" / MARKER).read_text())
    assert marker["complete"] and marker["settings"]["seq_len"] == 2048
    if "sinks" in doc:
        assert (out / "gated" / "ruler" / "gated-yarn" / "sinks.json").is_file()

    logs.clear()
    again = run_recipe(recipe, out, log=logs.append)
    assert set(statuses(again).values()) == {"skip"}
    assert "skip extend for gated: up to date" in logs
    assert again.comparison == first.comparison

    # a changed setting reruns that stage and the later ones only
    if "sinks" in doc:
        doc["sinks"]["tokens"] = 2048
    else:
        doc["compare"]["reference"] = "2k"
    write(recipe, doc)
    changed = statuses(run_recipe(recipe, out, log=logs.append))
    assert changed[("gated", "extend")] == changed[("baseline", "yarn")] == changed[("gated", "ruler")] == "skip"
    assert changed[(None, "compare")] == "run"
    if "sinks" in doc:
        assert changed[("gated", "sinks")] == changed[("baseline", "sinks")] == "run"
        assert json.loads((out / "gated" / "sinks" / "gated-yarn" / "sinks.json").read_text())["settings"][
            "tokens"] == 2048

    start = "sinks" if "sinks" in doc else "compare"
    rerun = statuses(run_recipe(recipe, out, from_stage=start, log=logs.append))
    assert rerun[("gated", "ruler")] == "skip"
    assert rerun[("gated" if start == "sinks" else None, start)] == rerun[(None, "compare")] == "run"


def test_interrupted_stage_resumes(tmp_path, monkeypatch):
    """A stage that started with the same settings but did not finish is resumed, not redone from scratch;
    the stages before it are skipped. (Stand-in stage bodies: this tests only the bookkeeping.)"""
    import longctx.recipe.run as pipeline

    recipe = write(tmp_path / "r.yaml", SMALL)
    out = tmp_path / "out"
    calls = []

    def stand_in(recipe, step, log, interrupt=True):
        calls.append((step.stage, step.status))
        if step.stage == "yarn" and interrupt:
            raise InterruptedError
        for p in step.outputs:
            p.mkdir(parents=True, exist_ok=True)
            (p / "config.json").write_text("{}")

    monkeypatch.setattr(pipeline, "_input_fingerprint", lambda path: str(path))
    monkeypatch.setattr(pipeline, "_execute", stand_in)
    with pytest.raises(InterruptedError):
        run_recipe(recipe, out, log=lambda _: None)
    assert json.loads((out / "baseline" / "init" / MARKER).read_text())["complete"]
    assert not json.loads((out / "baseline" / "yarn" / MARKER).read_text())["complete"]
    calls.clear()
    monkeypatch.setattr(pipeline, "_execute", lambda r, s, log: stand_in(r, s, log, interrupt=False))
    result = run_recipe(recipe, out, log=lambda _: None)
    assert calls == [("yarn", "resume"), ("ruler", "run")]
    assert statuses(result)[("baseline", "init")] == "skip"


def test_changed_setting_reruns_that_stage_and_the_later_ones(tmp_path, monkeypatch):
    """Bookkeeping only (stand-in stage bodies): a new yarn factor reruns yarn and ruler, not init."""
    import longctx.recipe.run as pipeline

    def stand_in(recipe, step, log):
        for p in step.outputs:
            p.mkdir(parents=True, exist_ok=True)
            (p / "config.json").write_text("{}")

    monkeypatch.setattr(pipeline, "_input_fingerprint", lambda path: str(path))
    monkeypatch.setattr(pipeline, "_execute", stand_in)
    doc = json.loads(json.dumps(SMALL))
    recipe = write(tmp_path / "r.yaml", doc)
    assert set(statuses(run_recipe(recipe, tmp_path / "out", log=lambda _: None)).values()) == {"run"}
    doc["yarn"]["factor"] = 2
    write(recipe, doc)
    assert statuses(run_recipe(recipe, tmp_path / "out", log=lambda _: None)) == {
        ("baseline", "init"): "skip", ("baseline", "yarn"): "run", ("baseline", "ruler"): "run"}


@pytest.mark.slow
def test_recipe_engine_args_and_chat_settings_are_typed_like_the_command_line(tmp_path):
    """`ruler.backend_options.engine_args` reaches the ruler settings typed by vLLM's rules, as --engine-arg
    does; the chat settings are the command line's."""
    require_vllm()
    recipe = write(tmp_path / "r.yaml", {**SMALL, "ruler": {
        "lengths": "1k", "tasks": "vt", "template": "chat", "system_prompt": "Be brief.",
        "chat_template_kwargs": {"enable_thinking": False},
        "backend_options": {"engine_args": {"max_num_seqs": "16", "enable_prefix_caching": "false",
                                            "hf_overrides": {"rope_theta": 10000}}}}})
    s = load_recipe(recipe).stages["ruler"]
    # typed when the vllm backend is made (the settings hold them as given: building settings imports no vLLM)
    typed = s.backend_options().typed_engine_args()
    assert typed == {"max_num_seqs": 16, "enable_prefix_caching": False, "hf_overrides": {"rope_theta": 10000}}
    assert (s.system_prompt, s.chat_template_kwargs) == ("Be brief.", {"enable_thinking": False})
    cli = RulerRunSettings(checkpoint="c", output="o", lengths=[1024], tasks=["vt"],
                           engine_args=["max_num_seqs=16", "enable_prefix_caching=false",
                                        'hf_overrides={"rope_theta": 10000}'])
    assert cli.backend_options().typed_engine_args() == typed


def test_a_model_may_skip_stages_and_set_its_own_keys(tmp_path):
    """`models.<name>.skip` and `models.<name>.<stage>`: one model is YaRN-scaled as it is, the other extended first;
    each evaluation runs once, with the model's own keys where it has them, and the rest is the recipe's."""
    from longctx.recipe.plan import plan

    tiny = {"init": {"preset": "tiny", "attention": "baseline"}}
    recipe = write(tmp_path / "r.yaml", {
        "models": {"plain": {**tiny, "skip": ["extend"]},
                   "extended": {**tiny, "ruler": {"checkpoints": ["yarn"], "samples": 2}}},
        "extend": {"rope_base": "1e6", "seq_len": "2k", "data": ["synthetic:mixed"], "steps": 2},
        "yarn": {"factor": 2},
        "ruler": {"lengths": "1k,4k", "tasks": "vt", "samples": 1, "backend": "hf", "checkpoints": ["model", "yarn"]},
        "sinks": {"tokens": 1024, "length": "1k", "checkpoints": ["extend", "yarn"]},
        "compare": {"baseline": "plain"}})
    steps = {(s.model, s.stage): s for s in plan(load_recipe(recipe), tmp_path / "out")}
    assert list(steps) == [("plain", "init"), ("plain", "yarn"), ("plain", "ruler"), ("plain", "sinks"),
                           ("extended", "init"), ("extended", "extend"), ("extended", "yarn"),
                           ("extended", "ruler"), ("extended", "sinks"), (None, "compare")]
    # the plain model's YaRN starts from the model itself, at its trained length (4k: the tiny preset's)
    assert steps["plain", "yarn"].inputs == [tmp_path / "out/plain/init/plain-init"]
    assert steps["plain", "yarn"].settings["original_max_position_embeddings"] == 4096
    assert steps["extended", "yarn"].settings["original_max_position_embeddings"] == 2048
    # evaluations: the plain model as it is and its YaRN copy; the extended one only its YaRN copy, with its samples
    assert [p.name for p in steps["plain", "ruler"].outputs] == ["plain-model", "plain-yarn"]
    assert [p.name for p in steps["extended", "ruler"].outputs] == ["extended-yarn"]
    assert [j.samples for j in steps["plain", "ruler"].jobs] == [1, 1]
    assert [j.samples for j in steps["extended", "ruler"].jobs] == [2]
    # sinks.checkpoints without the stage plain skips
    assert [p.name for p in steps["plain", "sinks"].outputs] == ["plain-yarn"]
    assert [p.name for p in steps["extended", "sinks"].outputs] == ["extended-extend", "extended-yarn"]
    assert steps[None, "compare"].settings["baseline"] == str(tmp_path / "out/plain/ruler/plain-yarn")
    # a variant's `base:` merge keeps a model's own keys and may change one
    variant = write(tmp_path / "v.yaml", {"base": "r.yaml", "models": {"extended": {"ruler": {"samples": 3}}}})
    r = load_recipe(variant)
    extended = next(m for m in r.models if m.name == "extended")
    assert extended.stages["ruler"].samples == 3 and extended.stages["ruler"].checkpoints == ["yarn"]
    assert r.stages["ruler"].samples == 1
