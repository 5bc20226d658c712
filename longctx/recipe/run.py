"""`longctx run RECIPE`: a YAML recipe names the models to compare and the stages to run on each.

    longctx run recipes/tiny-cpu.yaml [-o runs/tiny-cpu] [--from extend] [--dry-run]

Stages, in order (`longctx.recipe.stages`), for every model: the model itself (`init` a fresh checkpoint,
`convert` a released one, or a local `checkpoint`), `pretrain`, `extend`, `yarn`, `ruler`, `sinks`; then
`compare` across models. Each stage directory holds a `stage.json` marker with a hash of the stage's settings and its
inputs' fingerprints and, once the stage is complete, the sha256 of every file the stage wrote into its folder.
A stage whose marker matches, is complete and whose files are as it wrote them is skipped, one that was
interrupted resumes, and a changed setting, a changed input or a changed file (edited, added or removed by
hand) reruns that stage and every later one.

A stage folder holds only what its stage writes: rerunning a stage replaces its folder, so a file found there
that the stage did not write (one the user put there) is refused in one line, before anything runs, never
deleted; longctx's own bookkeeping (the marker, ownership marks, locks, writers' temporaries) is not counted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from longctx.checkpoint.directory import fingerprint
from longctx.checkpoint.hub import cached_file, download_command, parse_hub_id
from longctx.core.clock import utc_timestamp
from longctx.core.errors import InputError, SettingError, ref
from longctx.core.files import check_output, make_output, write_json
from longctx.core.hashing import hash_json
from longctx.core.kinds import Bool, Choice, LocalPath, did_you_mean
from longctx.core.settings import REQUIRED, Settings, setting
from longctx.data.sources import uncached_dataset
from longctx.recipe.launch import machine_rank
from longctx.recipe.load import load_recipe
from longctx.recipe.markers import (
    MARKER,
    changed_file,
    check_foreign,
    read_marker,
    stage_hashes,
)
from longctx.recipe.plan import plan, recipe_data, recipe_inputs
from longctx.recipe.stage import ComparisonStage, RunContext, Step
from longctx.recipe.stages import stage, stage_names
from longctx.recipe.types import Recipe

__all__ = ["MARKER", "RunSettings", "default_output", "run_recipe", "stage_key"]
RECIPE_KIND = "recipe run"  # the output folder's `longctx.core.files` marker


@dataclass(frozen=True)
class RunSettings(Settings):
    recipe: str = setting(REQUIRED, LocalPath(), "Recipe to run (recipes/*.yaml).", cli="argument")
    output: str | None = setting(None, LocalPath(directory=True), "Output folder [default: runs/<recipe name>].",
                                 short="-o")
    from_stage: str | None = setting(None, Choice(stage_names, "stage"),
                                     "Rerun from this stage on; the stages before it must have run.", flag="--from")
    dry_run: bool = setting(False, Bool(), "Print the plan (settings, outputs, run/skip, launch lines); run nothing.")

    def output_path(self) -> str:
        return str(default_output(self.recipe, self.output))


def default_output(recipe: str | os.PathLike, output: str | os.PathLike | None) -> Path:
    """A recipe run's output folder: `output`, else runs/<recipe name>."""
    return Path(output) if output is not None else Path("runs") / Path(recipe).stem


def _local_input(path: Path) -> Path | None:
    """The folder an input is: itself, or for a Hub id its snapshot in the local cache (None: not there yet;
    the stage that reads it downloads it)."""
    if parse_hub_id(str(path)) is None:
        return path if path.exists() else None
    # a checkpoint has a config.json; a repo that only holds a tokenizer (init.tokenizer), its tokenizer config
    config = cached_file(str(path), "config.json") or cached_file(str(path), "tokenizer_config.json")
    return config.parent if config is not None else None


def _fetchable(path: Path) -> bool:
    """An input a stage can read: a path that exists, or a Hub id (the stage downloads it)."""
    return path.exists() or parse_hub_id(str(path)) is not None


def _input_fingerprint(path: Path) -> str:
    """A checkpoint's fingerprint; for a RULER run directory, a hash of its result files; for a Hub id not
    downloaded yet, the id."""
    local = _local_input(path)
    if local is None:
        return hash_json({"hub": str(path)})
    path = local
    if (path / "config.json").is_file():
        return fingerprint(path)
    h = hashlib.sha256()
    for name in ("results.json", "sinks.json", "train_log.jsonl"):
        if (path / name).is_file():
            h.update(name.encode() + b"\0" + (path / name).read_bytes())
    return h.hexdigest()


def stage_key(step: Step) -> str:
    inputs = [_input_fingerprint(p) for p in step.inputs]
    inputs += [_input_fingerprint(p) for p in step.hashed if p.is_dir()]
    return hash_json({"stage": step.stage, "settings": step.settings, "inputs": inputs})


def _decide(step: Step, forced: str | None) -> None:
    """Set step.status: run (fresh), resume (same settings, interrupted) or skip (up to date)."""
    if forced:
        step.status, step.reason = "run", forced
        return
    marker = read_marker(step.dir)
    if marker is None:
        step.status, step.reason = "run", "not run yet"
        return
    if not all(_local_input(p) is not None for p in step.inputs):
        step.status, step.reason = "run", "its input is missing"
        return
    if marker.get("key") != stage_key(step):
        step.status, step.reason = "run", "settings or inputs changed"
    elif not marker.get("complete"):
        step.status, step.reason = "resume", "interrupted"
    elif not all(p.exists() for p in step.outputs):
        step.status, step.reason = "run", "outputs missing"
    elif (changed := changed_file(step, marker)) is not None:
        step.status, step.reason = "run", f"its files differ from what it wrote: {changed}"
    else:
        step.status, step.reason = "skip", "up to date"


def _forced(s: Step, from_stage: str | None, ran: set[str | None]) -> str | None:
    """Why `s` must run whatever its marker says: `from_stage` reached it, or an earlier stage of its model ran
    (compare: of any model)."""
    order = stage_names()
    if from_stage and order.index(s.stage) >= order.index(from_stage):
        return f"{RunSettings.flag('from_stage')} {from_stage}"
    if s.model in ran or (isinstance(stage(s.stage), ComparisonStage) and ran):
        return f"an earlier stage of {s.model or 'a model'} runs"
    return None


# --- running stages ----------------------------------------------------------------------------------


def _execute(recipe: Recipe, step: Step, log: Callable[[str], None]) -> str | None:
    """Run the step by its stage; a comparison returns the text the run ends by printing."""
    return stage(step.stage).run(step, RunContext(recipe, log))


def _in_recipe(recipe: Recipe, step: Step, e: SettingError) -> InputError:
    """A setting error raised while a stage runs, named as the recipe wrote it."""
    st = stage(step.stage)
    where = st.where(step.model)
    model = next((m for m in recipe.models if m.name in (step.model, step.group)), None)
    if model is not None and model.stages is not None and (
            model.stages.get(step.stage) is not recipe.stages.get(step.stage)):
        where = f"models.{model.name}.{where}"  # the model's own keys of the stage
    return InputError(f"{recipe.path}: {step.label}: {e.render(lambda n: f'{where}.{st.section.key(n)}')}")


# --- the run --------------------------------------------------------------------------------------


def _describe(step: Step) -> str:
    """The step's settings that differ from the verb's defaults (plus the plan's own keys)."""
    cls = type(step.jobs[0]) if step.jobs else None
    names = {f.name for f, _ in cls.specs()} if cls is not None else set()
    hidden = stage(step.stage).unshown
    shown = {k: v for k, v in step.settings.items()
             if k not in hidden and not (k in names and v == cls.default(k))}
    return " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in shown.items())


@dataclass(frozen=True)
class RecipeResult:
    out: Path
    steps: list[Step]  # with their status (run, resume, skip) and reason
    comparison: str | None  # the final table (None for a dry run)


def _check_from(recipe: Recipe, steps: list[Step], from_stage: str | None) -> None:
    if from_stage is None:
        return
    known = stage_names()
    if from_stage not in known:
        raise SettingError(f"{ref('from_stage')} {from_stage}: unknown stage{did_you_mean(from_stage, known)} "
                           f"(stages: {', '.join(known)})", RunSettings)
    present = {s.stage for s in steps}
    if from_stage not in present:
        raise SettingError(f"{ref('from_stage')} {from_stage}: {recipe.path} has no {from_stage} stage "
                           f"(its stages: {', '.join(dict.fromkeys(s.stage for s in steps))})", RunSettings)
    for s in steps:
        missing = [p for p in s.inputs if not _fetchable(p)] if s.stage == from_stage else []
        if missing:
            raise SettingError(f"{ref('from_stage')} {from_stage}: its input {missing[0]} ({s.label}) does not "
                               f"exist; run the earlier stages first (without {ref('from_stage')})", RunSettings)


def _decide_all(steps: list[Step], from_stage: str | None) -> None:
    """Set every step's status as the run will find it; InputError when a stage that runs again would replace
    a file the user put in its folder."""
    ran: set[str | None] = set()
    for s in steps:
        _decide(s, _forced(s, from_stage, ran))
        if s.status != "skip":
            ran.add(s.model)
    for s in steps:
        check_foreign(s)


def _dry_run(recipe: Recipe, steps: list[Step], from_stage: str | None, log: Callable[[str], None]) -> None:
    for key, path in recipe_inputs(recipe):
        hub = parse_hub_id(str(path))
        if hub is not None and _local_input(path) is None:
            log(f"input  {key}: {path} is not in the local Hugging Face cache; its stage downloads it, or "
                f"fetch it first: {download_command(*hub, tokenizer_only=key.endswith('.init.tokenizer'))}")
    for key, spec in recipe_data(recipe):
        command = uncached_dataset(spec)
        if command is not None:
            log(f"input  {key}: {spec} is not in the local Hugging Face cache; its stage downloads it, or "
                f"fetch it first: {command}")
    _decide_all(steps, from_stage)
    for s in steps:
        log(f"{s.status:<6} {s.label}: {s.reason}")
        log(f"       settings: {_describe(s)}")
        log(f"       output:   {', '.join(map(str, s.outputs))}")
        if s.launch:
            log(f"       launch:   {shlex.join(s.launch)}")


def _run_steps(recipe: Recipe, out: Path, steps: list[Step], from_stage: str | None,
               log: Callable[[str], None]) -> str | None:
    """Run the steps that are not up to date; `out` (the recipe's output folder) is made and marked when the
    first of them starts, so a refusal before that leaves nothing behind."""
    comparison = None
    ran: set[str | None] = set()
    rank = machine_rank(recipe)
    for s in steps:
        if rank != 0:  # the other machines only join the multi-process training runs of machine rank 0
            if s.launch is not None:
                log(f"machine rank {rank}: {s.label}")
                _execute(recipe, s, log)
            continue
        _decide(s, _forced(s, from_stage, ran))
        if s.status == "skip":
            log(f"skip {s.label}: up to date")
            if isinstance(stage(s.stage), ComparisonStage):
                comparison = stage(s.stage).text(s)
            continue
        ran.add(s.model)
        missing = [p for p in s.inputs if not _fetchable(p)]
        if missing:
            raise InputError(f"{s.label}: input {missing[0]} does not exist")
        log(f"{s.status} {s.label} ({s.reason}) -> {s.dir}")
        # the key fingerprints the inputs, which refuses a bad one: before the stage folder is touched
        marker = {"stage": s.stage, "model": s.model, "key": stage_key(s), "settings": s.settings,
                  "inputs": [str(p) for p in s.inputs], "outputs": [str(p) for p in s.outputs], "complete": False,
                  "started": utc_timestamp()}
        if s.status == "run" and s.dir.exists():
            check_foreign(s)
            shutil.rmtree(s.dir)
        if rank == 0:
            make_output(out, RECIPE_KIND)
        s.dir.mkdir(parents=True, exist_ok=True)
        if s.dir in s.outputs:  # the stage folder is its output (a comparison's): marked as the verb marks it
            make_output(s.dir, stage(s.stage).output_kind)
        write_json(s.dir / MARKER, marker)
        t = time.time()
        try:
            text = _execute(recipe, s, log)
        except SettingError as e:
            raise _in_recipe(recipe, s, e) from None
        write_json(s.dir / MARKER, {**marker, "complete": True, "seconds": round(time.time() - t, 1),
                                    "files": stage_hashes(s.dir)})
        if text is not None:
            comparison = text
    return comparison


def run_recipe(path: str | os.PathLike, out_dir: str | os.PathLike | None = None, from_stage: str | None = None,
               dry_run: bool = False, log: Callable[[str], None] = print) -> RecipeResult:
    """Run (or with dry_run, only plan) a recipe into `out_dir` [default: runs/<recipe name>]."""
    recipe = load_recipe(path, offline_data=not dry_run)
    out = default_output(path, out_dir)
    steps = plan(recipe, out)
    _check_from(recipe, steps, from_stage)
    for s in steps:
        if s.dir.exists() and read_marker(s.dir) is None and any(s.dir.iterdir()):
            raise InputError(f"'{s.dir}' exists and was not written by 'longctx run'; choose another -o")
    sweep = recipe.sweep
    seeds = (f" x {len(sweep.seeds)} seeds ({', '.join(map(str, sweep.seeds))}: {', '.join(sweep.stages)} and what "
             "follows run once per seed)" if sweep else "")
    log(f"recipe {recipe.path}: {len(recipe.models)} models ({', '.join(m.name for m in recipe.models)}){seeds}, "
        f"stages {', '.join(n for n in stage_names() if any(s.stage == n for s in steps))}; output {out}")
    if dry_run:
        _dry_run(recipe, steps, from_stage, log)
        return RecipeResult(out, steps, None)
    with contextlib.ExitStack() as held:
        if machine_rank(recipe) == 0:
            # checked, owned and locked as every verb's output (an older run's folder: one a stage wrote in)
            held.enter_context(check_output(out, RECIPE_KIND,
                                            legacy=lambda d: any(read_marker(s.dir) is not None for s in steps)))
            _decide_all(steps, from_stage)  # refuses before anything runs
        t0 = time.time()
        comparison = _run_steps(recipe, out, steps, from_stage, log)
    if comparison:
        log("")
        log(comparison)
    log(f"\ndone in {time.time() - t0:.0f} s; files in {out}:")
    width = max((len(s.label) for s in steps), default=0)
    for s in steps:
        log(f"  {s.label:<{width}} {', '.join(map(str, s.outputs))}")
    return RecipeResult(out, steps, comparison)
