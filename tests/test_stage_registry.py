"""A stage is one module and one registry line (`longctx.recipe.stages.STAGES`): a throwaway evaluation stage,
defined here and registered with one line, gets its recipe section, its place in the plan, `--from`, its stage
hash and its messages from the stage interface alone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from longctx.core.errors import InputError, ref
from longctx.core.kinds import LocalPath, Names, Text
from longctx.core.settings import Settings, setting
from longctx.recipe import stages
from longctx.recipe.load import load_recipe
from longctx.recipe.plan import plan
from longctx.recipe.run import RunSettings, run_recipe
from longctx.recipe.stage import CheckpointStage, ComparisonStage, EvaluationStage, SourceStage, Stage


@dataclass(frozen=True)
class CountSettings(Settings):
    """The settings of one job of the throwaway stage: count a checkpoint's weight files."""

    checkpoint: str | None = setting(None, Text(), "Checkpoint.", recipe=False)
    output: str | None = setting(None, LocalPath(directory=True), "Output folder.", recipe=False)
    label: str = setting("none", Text(), "A label written beside the count.")

    def check(self) -> None:
        if self.label == "bad":
            raise self.error(f"{ref('label')} must not be 'bad'")


@dataclass(frozen=True)
class CountSection(CountSettings):
    checkpoints: list[str] | None = setting(None, Names(), "Which checkpoints to count.")


class CountStage(EvaluationStage):
    name = "count"
    section = CountSection
    job = CountSettings

    def run(self, step, ctx):
        from longctx.checkpoint.weights import weight_files

        for job in step.jobs:
            out = Path(job.output)
            out.mkdir(parents=True)
            files = weight_files(Path(job.checkpoint))
            (out / "count.json").write_text(json.dumps({"label": job.label, "weight_files": len(files)}))
            ctx.log(f"counted {job.checkpoint}")


@pytest.fixture
def with_count(monkeypatch):
    """The registry with the throwaway stage: one line, before the comparison."""
    entries = dict(stages.STAGES)
    compare = entries.pop("compare")
    monkeypatch.setattr(stages, "STAGES", {**entries, "count": f"{__name__}:CountStage", "compare": compare})


def _recipe(tmp_path: Path, checkpoint: Path, **count) -> Path:
    doc = {"models": {"tiny": {"checkpoint": str(checkpoint)}},
           "yarn": {"factor": 2},
           "count": {"label": "first", "checkpoints": ["model", "yarn"], **count}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_every_registered_stage_is_one_of_the_four_kinds():
    kinds = (SourceStage, CheckpointStage, EvaluationStage, ComparisonStage)
    for name, stage in stages.stages().items():
        assert isinstance(stage, Stage) and stage.name == name
        assert sum(isinstance(stage, k) for k in kinds) == 1, name
        assert issubclass(stage.section, Settings) and issubclass(stage.job, Settings)


def test_a_registered_stage_has_a_section_a_plan_and_from(with_count, tmp_path, tiny_checkpoint):
    recipe = load_recipe(_recipe(tmp_path, tiny_checkpoint))
    assert recipe.stages["count"].label == "first"
    steps = {s.label: s for s in plan(recipe, tmp_path / "out")}
    count = steps["count for tiny"]
    assert count.outputs == [tmp_path / "out" / "tiny" / "count" / "tiny-model",
                             tmp_path / "out" / "tiny" / "count" / "tiny-yarn"]
    assert count.inputs == [tiny_checkpoint, tmp_path / "out" / "tiny" / "yarn" / "tiny-yarn"]
    assert count.settings == {"label": "first", "checkpoints": ["model", "yarn"]}
    assert RunSettings(recipe="r.yaml", from_stage="count").from_stage == "count"


@pytest.mark.parametrize("section,message", [
    ({"labl": "x"}, "unknown key 'count.labl'; did you mean 'label'?"),
    ({"label": "bad"}, "count.label must not be 'bad'"),
    ({"checkpoints": ["extend"]}, "count.checkpoints names 'extend', not a checkpoint of this recipe"),
])
def test_a_registered_stage_is_refused_by_its_recipe_keys(with_count, tmp_path, tiny_checkpoint, section, message):
    with pytest.raises(InputError, match="r.yaml: " + message.replace("?", r"\?").replace("(", r"\(")):
        load_recipe(_recipe(tmp_path, tiny_checkpoint, **section))


def test_without_its_line_the_stage_is_an_unknown_key(tmp_path, tiny_checkpoint):
    with pytest.raises(InputError, match="unknown key or stage 'count'"):
        load_recipe(_recipe(tmp_path, tiny_checkpoint))


@pytest.mark.slow
def test_a_registered_stage_runs_is_skipped_and_reruns_when_changed(with_count, tmp_path, tiny_checkpoint):
    out, said = tmp_path / "out", []

    def statuses(result):
        return {s.label: s.status for s in result.steps}

    first = run_recipe(_recipe(tmp_path, tiny_checkpoint), out, log=said.append)
    assert statuses(first) == {"yarn for tiny": "run", "count for tiny": "run"}
    written = json.loads((out / "tiny" / "count" / "tiny-yarn" / "count.json").read_text())
    assert written == {"label": "first", "weight_files": 1}
    assert f"counted {tiny_checkpoint}" in said
    assert statuses(run_recipe(_recipe(tmp_path, tiny_checkpoint), out, log=said.append)) == {
        "yarn for tiny": "skip", "count for tiny": "skip"}
    changed = run_recipe(_recipe(tmp_path, tiny_checkpoint, label="second"), out, log=said.append)
    assert statuses(changed) == {"yarn for tiny": "skip", "count for tiny": "run"}
    again = run_recipe(_recipe(tmp_path, tiny_checkpoint, label="second"), out, from_stage="count", log=said.append)
    assert statuses(again) == {"yarn for tiny": "skip", "count for tiny": "run"}
    assert json.loads((out / "tiny" / "count" / "tiny-model" / "count.json").read_text())["label"] == "second"
