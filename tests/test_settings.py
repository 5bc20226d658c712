"""One settings type per verb: the command line, the recipe section and the multi-process launch line are all
derived from it, so each field works in all three, and errors name what the user wrote."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from longctx.cli.main import cli
from longctx.cli.options import settings_from_params
from longctx.convert.settings import ConvertSettings
from longctx.core.errors import SettingError
from longctx.core.kinds import Choice
from longctx.eval.settings import MergeSettings, PrepareSettings, RulerRunSettings
from longctx.extend.settings import ExtendSettings
from longctx.info.describe import InfoSettings
from longctx.init.settings import InitSettings
from longctx.recipe.load import load_recipe, parse_section
from longctx.recipe.plan import plan
from longctx.recipe.run import RunSettings
from longctx.recipe.sections import model_sections, stage_sections
from longctx.report.settings import CompareSettings, ExportSettings
from longctx.sinks.settings import SinksSettings
from longctx.yarn.settings import YarnSettings

STAGE_SECTIONS, MODEL_SECTIONS = stage_sections(), model_sections()

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
COMMANDS = {("info",): InfoSettings, ("yarn",): YarnSettings, ("init",): InitSettings, ("convert",): ConvertSettings,
            ("run",): RunSettings, ("sinks",): SinksSettings, ("extend",): ExtendSettings,
            ("compare",): CompareSettings, ("export",): ExportSettings, ("ruler", "prepare"): PrepareSettings,
            ("ruler", "run"): RulerRunSettings, ("ruler", "merge"): MergeSettings}
# Every field of every settings type set away from its default somewhere here: a new field without a sample
# fails test_samples_cover_every_field, so the round trips below cover it.
SAMPLES = {
    InfoSettings: [dict(checkpoint="ckpt", json=True, trust_remote_code=True)],
    YarnSettings: [dict(checkpoint="ckpt", factor=4.0, original_max_position_embeddings=32768, output="out",
                        rescale=True, overwrite=True, beta_fast=16.0, beta_slow=2.0, truncate=False,
                        config_format="both", trust_remote_code=True)],
    InitSettings: [dict(output="out", preset="paper-1.7b", attention="elementwise", tokenizer="bpe", vocab_size=1024,
                        bpe_corpus=__file__, bpe_bos=True, match_params=True, dtype="bfloat16", seed=3, tie_embeddings=False,
                        config={"max_position_embeddings": 256, "rope_parameters": {"rope_theta": 5e5}},
                        overwrite=True, trust_remote_code=True)],
    ConvertSettings: [dict(source="released", output="out", overwrite=True),
                      dict(source="model.gguf", output="out", layout="gguf")],
    RunSettings: [dict(recipe="r.yaml", output="out", from_stage="ruler", dry_run=True)],
    SinksSettings: [dict(checkpoint="ckpt", data="synthetic:niah", tokens=8192, length=1024, output="out",
                         batch_size=2, chunk=64, dtype="float32", device="cpu", seed=1, plot=False,
                         trust_remote_code=True, name="Gated 1.7B")],
    ExtendSettings: [
        dict(checkpoint="ckpt", seq_len=32768, packing="whole", data=["synthetic:mixed", "hf:org/long"], rope_base=1e6,
             short_data=["synthetic:vt"], short_fraction=0.4, tokens=80 * 10**9, tokens_per_step=4 * 2**20,
             micro_batch_size=2, lr=3e-5, warmup_fraction=0.05, min_lr_ratio=0.2, weight_decay=0.01, beta2=0.99,
             grad_clip=0.5, save_every=100, seed=7, dtype="bfloat16", gradient_checkpointing=False, cp_size=2,
             cache_dir="cache", output="out", resume=True, overwrite=True, trust_remote_code=True,
             attention="flex_attention", peak_tflops=989.4, tokenize_workers=16),
        dict(checkpoint="ckpt", seq_len=512, data=["synthetic:mixed"], steps=10, output="out")],
    CompareSettings: [dict(runs=["a", "b"], baseline="a", reference=4096, output="out", sinks=["a/sinks.json"],
                           layout="table5", intervals=True, parents={"b": "a"}, replicates={"m": ["a", "b"]})],
    ExportSettings: [dict(run="run", format="ruler", output="out", overwrite=True)],
    MergeSettings: [dict(run_dir="run", shard_dirs=["run/shards/1-of-2", "elsewhere/2-of-2"], plot=False,
                         intervals=True)],
    PrepareSettings: [dict(tokenizer="tok", lengths=[4096, 8192], tasks=["vt", "cwe"], samples=3, seed=1,
                           template="chat", data_dir="data", essay="essay.json", squad="squad.json",
                           hotpotqa="hf:org/hotpotqa", output="out", system_prompt="Be brief.",
                           chat_template_kwargs={"enable_thinking": False}, trust_remote_code=True, workers=3)],
    RulerRunSettings: [dict(checkpoint="ckpt", lengths=[4096], tasks=["vt"], samples=3, seed=1, template="chat",
                            data_dir="data", essay="e.json", squad="s.json", hotpotqa="h.json", output="out",
                            workers=2, backend="vllm", dtype="bfloat16", tensor_parallel_size=2, data_parallel_size=2,
                            gpu_memory_utilization=0.5, kv_cache_memory=8 * 10**9, enforce_eager=True,
                            plot=False, intervals=True, trust_remote_code=True, system_prompt="Be brief.", name="m",
                            chat_template_kwargs={"enable_thinking": True}, think_tokens=1024,
                            engine_args={"max_num_seqs": 16, "kv_cache_dtype": "fp8",
                                         "hf_overrides": {"rope_theta": 1e6}}),
                       dict(checkpoint="ckpt", lengths=[4096], output="out", backend="openai",
                            base_url="http://127.0.0.1:8000/v1", model="served", concurrency=2,
                            trust_served_model=True, request_timeout=30.0, max_retries=1, shard="2/4"),
                       dict(checkpoint="ckpt", lengths=[4096], output="out", backend="openai",
                            base_url=["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"]),
                       dict(checkpoint="ckpt", lengths=[4096], output="out", backend="hf", dtype="float32",
                            device="cpu")],
}


def _command(path: tuple[str, ...]):
    cmd = cli
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _from_command_line(path: tuple[str, ...], cls, args: list[str]):
    ctx = _command(path).make_context(path[-1], list(args))
    return settings_from_params(cls, ctx.params)


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_samples_cover_every_field(cls):
    for f, spec in cls.specs():
        fixed = isinstance(spec.kind, Choice) and len(spec.kind.choices) == 1
        assert fixed or any(f.name in sample and sample[f.name] != cls.default(f.name) for sample in SAMPLES[cls]), \
            f"{cls.__name__}.{f.name} has no non-default sample"


@pytest.mark.parametrize("path", list(COMMANDS), ids=" ".join)
def test_the_command_line_is_the_settings_type(path):
    """Every field has its flag (or argument), nothing else is an option, and every sample survives
    settings -> command line -> settings."""
    cls = COMMANDS[path]
    assert {p.name for p in _command(path).params} == {f.name for f, spec in cls.specs() if spec.cli}
    for sample in SAMPLES[cls]:
        s = cls(**sample)
        assert _from_command_line(path, cls, s.to_args()) == s, s.to_args()


def _section_doc(s) -> dict:
    """The recipe section that holds `s`'s recipe fields (keys nested under their groups)."""
    doc: dict = {}
    for f, spec in s.specs():
        if spec.recipe and getattr(s, f.name) != s.default(f.name):
            (doc.setdefault(spec.group, {}) if spec.group else doc)[spec.key or f.name] = getattr(s, f.name)
    return doc


@pytest.mark.parametrize("name", [*STAGE_SECTIONS, *MODEL_SECTIONS])
def test_the_recipe_section_is_the_settings_type(name):
    cls = STAGE_SECTIONS.get(name) or MODEL_SECTIONS[name]
    verb = next((c for c in SAMPLES if issubclass(cls, c)), None)
    for sample in SAMPLES.get(verb, [{}]):
        recipe_only = {f.name: f.default for f, spec in cls.specs() if not spec.recipe}
        s = cls(**{k: v for k, v in sample.items() if k in {f.name for f, _ in cls.specs()}})
        expected = dataclasses.replace(s, **recipe_only)
        assert parse_section(cls, yaml.safe_load(yaml.safe_dump(_section_doc(s))), "r.yaml", name) == expected


def _uncommented(recipe: Path, tmp_path: Path) -> Path:
    """`recipe` with every documented-but-commented key (`  # key: value  # ...`) turned on."""
    text = re.sub(r"^(\s+)# ([a-z_0-9]+: )", r"\1\2", recipe.read_text(), flags=re.M)
    out = tmp_path / recipe.name
    out.write_text(text)
    return out


def test_every_recipe_key_is_documented_and_works(tmp_path):
    """paper-1.7b.yaml (released-1b.yaml for convert) documents every key of every section, and with all of
    them switched on it still loads."""
    paper = _uncommented(RECIPES / "paper-1.7b.yaml", tmp_path)
    raw = yaml.safe_load(paper.read_text())
    documented = {name: raw.get(name) or {} for name in STAGE_SECTIONS}
    documented["init"] = raw["models"]["baseline"]["init"]
    released = yaml.safe_load((RECIPES / "released-1b.yaml").read_text())
    documented["convert"] = released["models"]["baseline"]["convert"]
    for name, cls in {**STAGE_SECTIONS, **MODEL_SECTIONS}.items():
        for f, spec in cls.specs():
            if spec.recipe:
                key, section = spec.key or f.name, documented[name]
                where = section.get(spec.group, {}) if spec.group else section
                assert key in where, f"{name}.{cls.key(f.name)} is not documented in the shipped recipes"
    recipe = load_recipe(paper)
    assert recipe.launcher.num_processes == 8 and recipe.stages["extend"].cp_size == 1


def test_launch_lines_parse_back_to_the_stage_settings(tmp_path):
    """A multi-process run passes its settings on as `longctx extend` options: every key, nothing lost."""
    recipe = load_recipe(_uncommented(RECIPES / "paper-1.7b.yaml", tmp_path))
    steps = [s for s in plan(recipe, tmp_path / "out") if s.stage in ("pretrain", "extend")]
    assert len(steps) == 4 and all(s.launch for s in steps)
    for s in steps:
        args = s.launch[s.launch.index("extend") + 1:]
        assert _from_command_line(("extend",), ExtendSettings, args) == s.jobs[0]


def test_errors_name_the_flag_on_the_command_line_and_the_key_in_a_recipe(tmp_path):
    r = CliRunner().invoke(cli, ["ruler", "ckpt", "--lengths", "1k", "-o", "x", "--kv-cache-memory", "lots"])
    assert r.exit_code == 2 and r.stderr.startswith("Error: --kv-cache-memory is invalid: 'lots' is not a count")
    with pytest.raises(Exception) as e:
        parse_section(STAGE_SECTIONS["ruler"], {"lengths": "1k", "backend_options": {"kv_cache_memory": "lots"}},
                      "r.yaml", "ruler")
    assert str(e.value).startswith("r.yaml: ruler.backend_options.kv_cache_memory is invalid: 'lots' is not a count")
    # a check across settings names every setting it is about, in either form
    with pytest.raises(SettingError) as e:
        ExtendSettings(checkpoint="c", seq_len=512, data=["synthetic:mixed"], output="o")
    assert str(e.value) == "give exactly one of --tokens (e.g. 80B) and --steps"
    with pytest.raises(Exception) as e:
        parse_section(ExtendSettings, {"seq_len": 512, "data": "synthetic:mixed"}, "r.yaml", "pretrain")
    assert str(e.value) == "r.yaml: give exactly one of pretrain.tokens (e.g. 80B) and pretrain.steps"


def test_library_values_parse_once_and_stay_parsed():
    """Parsing is idempotent: a settings object rebuilt from its own values is equal (what replace() does)."""
    for cls, samples in SAMPLES.items():
        for sample in samples:
            s = cls(**sample)
            assert dataclasses.replace(s) == s and cls(**s.record()) == s
    assert ExtendSettings(**SAMPLES[ExtendSettings][1], rope_base="1e6").rope_base == 1000000


def test_all_tasks_by_name():
    s = RulerRunSettings(checkpoint="c", lengths="4k", output="o", tasks="all")
    assert s.tasks == ["all"] and RulerRunSettings(checkpoint="c", lengths="4k", output="o").tasks is None


@pytest.mark.slow
def test_an_error_while_a_stage_runs_names_the_recipe_key(tmp_path):
    """What only the verb can check (here: config keys transformers cannot build) is named as the recipe wrote it."""
    from longctx.core.errors import InputError
    from longctx.recipe.run import run_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"models": {"b": {"init": {"preset": "tiny", "attention": "baseline",
                                                                "config": {"hidden_size": -3}}}},
                                      "yarn": {"factor": 2}}))
    with pytest.raises(InputError, match=r"r\.yaml: init for b: models\.b\.init\.config does not give a model"):
        run_recipe(recipe, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out" / "b" / "init" / "b-init").exists()
