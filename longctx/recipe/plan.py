"""The plan of a recipe: every stage of every model, then compare, each with its directory, its settings
(what its stage hash covers), its inputs and outputs, and the verb settings it runs.

Each stage writes into `<out>/<model>/<stage>/` (compare: `<out>/compare/`). Checkpoints are
`<stage dir>/<model>-<stage>/` and RULER/sinks runs `<stage dir>/<model>-<evaluated stage>/`, so tables
name them well.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.checkpoint.hub import parse_hub_id
from longctx.core.errors import InputError
from longctx.core.settings import Settings
from longctx.eval.settings import RulerRunSettings
from longctx.init.settings import TOKENIZER_CHOICES
from longctx.recipe.load import Model, Recipe, reachable_length, source_length, trained_length
from longctx.recipe.sections import CHECKPOINT_STAGES, TRAIN_STAGES
from longctx.report.settings import CompareSettings
from longctx.sinks.settings import SinksSettings


@dataclass
class Step:
    model: str | None  # None: compare (across models)
    stage: str
    dir: Path  # the stage directory, holding stage.json
    settings: dict[str, Any]  # what the stage hash covers (besides the inputs)
    inputs: list[Path]
    outputs: list[Path]
    jobs: list[Settings] = field(default_factory=list)  # the verb settings the stage runs, one per output
    status: str = ""  # run | resume | skip
    reason: str = ""
    launch: list[str] | None = None  # multi-process training: the command line shown (and run)

    @property
    def label(self) -> str:
        return f"{self.stage} for {self.model}" if self.model else self.stage


def section_record(s: Settings) -> dict[str, Any]:
    """The settings a recipe section holds (without the paths the plan supplies), as the stage's marker records
    them and its hash covers: a value that may hold a secret (a URL) redacted."""
    return {f.name: spec.kind.recorded(getattr(s, f.name)) for f, spec in s.specs() if spec.recipe}


def as_job(section: Settings, cls: type[Settings], **changes: Any) -> Settings:
    """`section` (a recipe section, possibly with recipe-only keys) as the verb settings `cls` with `changes`."""
    names = {f.name for f, _ in cls.specs()}
    values = {f.name: getattr(section, f.name) for f, spec in section.specs() if spec.recipe and f.name in names}
    return cls(**{**values, **changes})


def _stage_lengths(recipe: Recipe, model: Model, checkpoint_stage: str) -> list[int]:
    """The RULER lengths the checkpoint of `checkpoint_stage` can be evaluated at."""
    st = recipe.stages
    if checkpoint_stage == "yarn":
        reach = reachable_length(recipe, model)
    elif checkpoint_stage in TRAIN_STAGES:
        reach = st[checkpoint_stage].seq_len
    else:
        reach = source_length(model)
    return [L for L in st["ruler"].lengths if reach is None or L <= reach]


def _checkpoint_steps(recipe: Recipe, m: Model, mdir: Path, ckpts: dict[str, Path]) -> list[Step]:
    steps = []
    if m.source != "checkpoint":
        d = mdir / m.source
        inputs = [Path(m.settings.source)] if m.source == "convert" else []
        job = dataclasses.replace(m.settings, output=str(ckpts["model"]), overwrite=True)
        steps.append(Step(m.name, m.source, d, section_record(m.settings), inputs, [ckpts["model"]], [job]))
    prev = ckpts["model"]
    for stage in CHECKPOINT_STAGES:
        if stage not in recipe.stages:
            continue
        d = mdir / stage
        ckpts[stage] = d / f"{m.name}-{stage}"
        changes: dict[str, Any] = {"checkpoint": str(prev), "output": str(ckpts[stage])}
        if stage == "yarn":
            changes["overwrite"] = True
            trained = trained_length(recipe, m)
            if recipe.stages["yarn"].original_max_position_embeddings is None and trained:
                changes["original_max_position_embeddings"] = trained
        job = dataclasses.replace(recipe.stages[stage], **changes)
        step = Step(m.name, stage, d, section_record(job), [prev], [ckpts[stage]], [job])
        if stage in TRAIN_STAGES and recipe.launcher.num_processes > 1:
            step.launch = launch_command(recipe, job)[0]
        steps.append(step)
        prev = ckpts[stage]
    return steps


def _evaluation_steps(recipe: Recipe, m: Model, mdir: Path, ckpts: dict[str, Path]) -> list[Step]:
    st = recipe.stages
    default = [recipe.last_checkpoint_stage()]
    evaluated = (st["ruler"].checkpoints or default) if "ruler" in st else default
    steps = []
    for stage, cls in (("ruler", RulerRunSettings), ("sinks", SinksSettings)):
        if stage not in st:
            continue
        which = st[stage].checkpoints or evaluated
        d = mdir / stage
        outputs = [d / f"{m.name}-{c}" for c in which]
        record = {k: v for k, v in section_record(st[stage]).items() if k != "checkpoints"}
        changes = {c: {"checkpoint": str(ckpts[c]), "output": str(out)} for c, out in zip(which, outputs)}
        if stage == "ruler":
            record["lengths"] = {c: _stage_lengths(recipe, m, c) for c in which}
            for c, lengths in record["lengths"].items():
                if not lengths:
                    raise InputError(f"{recipe.path}: ruler.lengths: none is within what the {c} checkpoint of "
                                     f"{m.name} can do; add shorter lengths or drop {c} from ruler.checkpoints")
                changes[c]["lengths"] = lengths
        jobs = [as_job(st[stage], cls, **changes[c]) for c in which]
        steps.append(Step(m.name, stage, d, {**record, "checkpoints": which}, [ckpts[c] for c in which], outputs,
                          jobs))
    return steps


def recipe_inputs(recipe: Recipe) -> list[tuple[str, Path]]:
    """(recipe key, path) of the files a recipe takes from outside its run."""
    found = []
    for m in recipe.models:
        where = f"models.{m.name}"
        if m.source == "checkpoint":
            found.append((f"{where}.checkpoint", m.checkpoint))
        elif m.source == "convert":
            found.append((f"{where}.convert.source", Path(m.settings.source)))
        elif m.settings.tokenizer not in TOKENIZER_CHOICES:
            found.append((f"{where}.init.tokenizer", Path(m.settings.tokenizer)))
    return found


def recipe_data(recipe: Recipe) -> list[tuple[str, str]]:
    """(recipe key, spec) of the data a recipe's stages read: training data, sinks text, RULER sources."""
    found = []
    for stage, section in recipe.stages.items():
        for key in ("data", "short_data", "essay", "squad", "hotpotqa"):
            value = getattr(section, key, None)
            found += [(f"{stage}.{key}", spec) for spec in (value if isinstance(value, list) else [value]) if spec]
    return found


def _check_inputs_outside(recipe: Recipe, out: Path) -> None:
    """A stage that runs again first removes its folder: an input inside the run's output would go with it."""
    root = out.resolve()
    for key, path in recipe_inputs(recipe):
        if parse_hub_id(str(path)) is None and path.resolve().is_relative_to(root):
            raise InputError(f"{recipe.path}: {key} '{path}' lies inside this run's output folder '{out}', whose "
                             "stage folders a rerun replaces; move it out of there or choose another -o")


def plan(recipe: Recipe, out: Path) -> list[Step]:
    """Every stage of every model, then compare; InputError when an input lies inside `out`."""
    _check_inputs_outside(recipe, out)
    steps: list[Step] = []
    ruler_runs: dict[str, list[Path]] = {}
    for m in recipe.models:
        mdir = out / m.name
        ckpts = {"model": m.checkpoint if m.source == "checkpoint" else mdir / m.source / f"{m.name}-{m.source}"}
        steps += _checkpoint_steps(recipe, m, mdir, ckpts)
        for step in _evaluation_steps(recipe, m, mdir, ckpts):
            steps.append(step)
            if step.stage == "ruler":
                ruler_runs[m.name] = step.outputs
    if "compare" in recipe.stages:
        c = recipe.stages["compare"]
        runs = [r for rs in ruler_runs.values() for r in rs]
        baseline = str(ruler_runs[c.baseline][-1]) if c.baseline else None
        train_logs = [str(s.outputs[0]) for s in steps if s.stage in TRAIN_STAGES]
        job = CompareSettings(runs=[str(r) for r in runs], baseline=baseline, reference=c.reference,
                              output=str(out / "compare"), layout=c.layout, intervals=c.intervals)
        settings = {"reference": c.reference, "baseline": baseline, "train_logs": train_logs, "layout": c.layout,
                    "intervals": c.intervals}
        steps.append(Step(None, "compare", out / "compare", settings, runs, [out / "compare"], [job]))
    return steps


def machine_rank(recipe: Recipe) -> int:
    rank = recipe.launcher.machine_rank
    return rank if rank is not None else int(os.environ.get("MACHINE_RANK", "0"))


def launch_command(recipe: Recipe, job: Settings, resume: bool = False) -> tuple[list[str], list[str]]:
    """(the command line shown, the one run) of a multi-process training job: `accelerate launch ... -m
    longctx extend ...` or `torchrun ... -m longctx extend ...`, the job's arguments derived from its settings."""
    ln = recipe.launcher
    machines, procs, rank = ln.num_machines, ln.num_processes, machine_rank(recipe)
    if ln.launcher == "accelerate":
        head = ["--num_processes", str(procs), "--num_machines", str(machines)]
        if machines > 1:
            head += ["--machine_rank", str(rank), "--main_process_ip", ln.main_process_ip,
                     "--main_process_port", str(ln.main_process_port)]
        shown, run = ["accelerate", "launch"], [sys.executable, "-m", "accelerate.commands.launch"]
    else:
        head = ["--nnodes", str(machines), "--nproc_per_node", str(procs // machines)]
        if machines > 1:
            head += ["--node_rank", str(rank), "--master_addr", ln.main_process_ip,
                     "--master_port", str(ln.main_process_port)]
        shown, run = ["torchrun"], [sys.executable, "-m", "torch.distributed.run"]
    tail = [*head, "-m", "longctx", "extend", *dataclasses.replace(job, resume=resume).to_args()]
    return [*shown, *tail], [*run, *tail]
