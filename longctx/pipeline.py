"""`longctx run RECIPE`: a YAML recipe names the models to compare and the stages to run on each.

    longctx run recipes/tiny-cpu.yaml [-o runs/tiny-cpu] [--from extend] [--dry-run]

Stages, in order, for every model: the model itself (`init` a fresh checkpoint, `convert` a released
one, or a local `checkpoint`), `pretrain`, `extend`, `yarn`, `ruler`, `sinks`; then `compare` across
models. Each writes into `<out>/<model>/<stage>/` (compare: `<out>/compare/`) with a `stage.json`
marker holding a hash of the stage's settings and its inputs' fingerprints. A stage whose marker
matches and is complete is skipped, one that was interrupted resumes, and a changed setting (or a
changed input) reruns that stage and every later one. Checkpoints are `<stage dir>/<model>-<stage>/`
and RULER/sinks runs `<stage dir>/<model>-<evaluated stage>/`, so tables name them well.

Recipes are validated before anything runs: a wrong key or type is one line naming the file and the
key path (`recipes/x.yaml: extend.lr must be a number, got 'fast'`). Relative paths in a recipe are
relative to the recipe file that writes them. `base: other.yaml` starts from another recipe and overrides
its keys (the base's own relative paths still count from the base file, so a variant may live anywhere).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.errors import InputError
from longctx.models.presets import TOKENIZER_CHOICES, _did_you_mean
from longctx.params import parse_count, parse_factor, parse_lengths, parse_number

MODEL_STAGES = ("pretrain", "extend", "yarn", "ruler", "sinks")
CHECKPOINT_STAGES = ("pretrain", "extend", "yarn")
TRAIN_STAGES = ("pretrain", "extend")
SOURCES = ("init", "convert", "checkpoint")
# What `--from` accepts: the model sources that are stages of their own, then the stages in order.
FROM_STAGES = ("init", "convert", *MODEL_STAGES, "compare")
MARKER = "stage.json"
REQUIRED = object()

# Key -> (kind, default). Kinds are checked by `_coerce`; None defaults mean "the library's default".
_INIT = {"preset": ("str", REQUIRED), "attention": ("str", REQUIRED), "match_params": ("bool", False),
         "seed": ("int", 0), "tokenizer": ("tokenizer", "reference"), "vocab_size": ("int>0", 4096),
         "dtype": ("str", None), "tie_embeddings": ("bool", None)}
_CONVERT = {"source": ("path", REQUIRED), "from": ("str", "official")}
# The fields of longctx.train.loop.TrainSettings a recipe sets (checkpoint/output/resume/overwrite are the
# pipeline's). Defaults stay TrainSettings' own, so only the keys a recipe gives are passed on.
_TRAIN = {"seq_len": ("length", REQUIRED), "data": ("specs", REQUIRED), "rope_base": ("number", None),
          "short_data": ("specs", None), "short_fraction": ("fraction", None), "tokens": ("count", None),
          "steps": ("int>0", None), "tokens_per_step": ("count", None), "micro_batch_size": ("int>0", None),
          "lr": ("float>0", None), "warmup_fraction": ("fraction", None), "min_lr_ratio": ("fraction", None),
          "weight_decay": ("float>=0", None), "beta2": ("fraction", None), "grad_clip": ("float>0", None),
          "save_every": ("int>0", None), "seed": ("int", None), "dtype": ("str", None),
          "gradient_checkpointing": ("bool", None), "cp_size": ("int>0", None), "cache_dir": ("path", None)}
_LAUNCHER = {"launcher": (("accelerate", "torchrun"), "accelerate"), "num_processes": ("int>0", 1),
             "num_machines": ("int>0", 1), "machine_rank": ("int", None), "main_process_ip": ("str", None),
             "main_process_port": ("int>0", 29500)}
_YARN = {"factor": ("factor", REQUIRED), "original_max_position_embeddings": ("length", None),
         "beta_fast": ("float>0", None), "beta_slow": ("float>0", None), "truncate": ("bool", None),
         "config_format": (("v5", "v4", "both"), "v5")}
_BACKEND_OPTIONS = {"dtype": ("str", None), "tensor_parallel_size": ("int>0", None),
                    "data_parallel_size": ("int>0", None), "gpu_memory_utilization": ("fraction", None),
                    "kv_cache_memory": ("number", None), "enforce_eager": ("bool", None), "base_url": ("str", None),
                    "model": ("str", None), "concurrency": ("int>0", None), "device": ("str", None)}
_RULER = {"lengths": ("lengths", REQUIRED), "tasks": ("names", None), "samples": ("int>0", 500), "seed": ("int", 42),
          "template": (("base", "chat"), "base"), "data_dir": ("path", None), "essay": ("source", None),
          "squad": ("source", None), "hotpotqa": ("source", None), "backend": (("vllm", "openai", "hf"), "vllm"),
          "backend_options": (_BACKEND_OPTIONS, {}), "checkpoints": ("names", None), "plot": ("bool", True)}
_SINKS = {"data": ("source", None), "tokens": ("count", None), "length": ("length", None),
          "checkpoints": ("names", None)}
_COMPARE = {"reference": ("length", None), "baseline": ("str", None)}
_TOP = {"description": ("str", None), "base": ("path", None), "models": ("models", REQUIRED),
        "launcher": (_LAUNCHER, None), "pretrain": (_TRAIN, None), "extend": (_TRAIN, None), "yarn": (_YARN, None),
        "ruler": (_RULER, None), "sinks": (_SINKS, None), "compare": (_COMPARE, None)}
_KIND_WORDS = {"str": "a string", "bool": "true or false", "int": "an integer", "int>0": "an integer >= 1",
               "float>0": "a number > 0", "float>=0": "a number >= 0", "fraction": "a number from 0 to 1",
               "number": "a number > 0 (e.g. 1e6 or 1_000_000)", "count": "a count (e.g. 80B, 4M or 1e9)",
               "length": "a length (e.g. 32k or 32768)",
               "path": "a path", "source": "a path or spec string", "factor": "a number > 1 (e.g. 4)",
               "tokenizer": "reference, bpe or a tokenizer directory",
               "specs": "a data spec or a list of them (file, directory, hf:<id>, synthetic:<kind>)",
               "names": "a name or a list of names", "lengths": "lengths (e.g. 4k,8k or [4096, 8192])"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# --- loading and validation ------------------------------------------------------------------------


@dataclass
class Model:
    name: str
    source: str  # init | convert | checkpoint
    settings: dict[str, Any]
    checkpoint: Path | None = None  # the local checkpoint of `checkpoint:` models


@dataclass
class Recipe:
    path: Path
    models: list[Model]
    stages: dict[str, dict[str, Any]]  # stage -> resolved settings, in the order of MODEL_STAGES + compare
    launcher: dict[str, Any]
    description: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def last_checkpoint_stage(self) -> str:
        return next((s for s in reversed(CHECKPOINT_STAGES) if s in self.stages), "model")


def _fail(file: str, where: str, what: str) -> InputError:
    return InputError(f"{file}: {where} {what}")


def _coerce(file: str, where: str, kind: Any, value: Any, base_dir: Path) -> Any:
    """`value` checked and converted to `kind`, or InputError naming `file` and the key path `where`."""
    if isinstance(kind, dict):
        return _section(file, where, value, kind, base_dir)
    if isinstance(kind, tuple):
        if value not in kind:
            raise _fail(file, where, f"must be one of {', '.join(kind)}, got {value!r}"
                        f"{_did_you_mean(str(value), kind)}")
        return value
    bad = _fail(file, where, f"must be {_KIND_WORDS.get(kind, kind)}, got {value!r}")
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if kind in ("str", "source", "path", "tokenizer"):
        if not isinstance(value, str) or not value.strip():
            raise bad
        return _local_path(value, base_dir) if _is_local_path(kind, value) else value
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int) or (kind == "int>0" and value < 1):
            raise bad
        return value
    if kind.startswith("float") or kind == "fraction":
        if isinstance(value, str):  # YAML 1.1 reads 2e-5 (no dot) as a string
            try:
                value = float(value.replace("_", ""))
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise bad
        if (kind == "float>0" and value <= 0) or (kind == "float>=0" and value < 0) \
                or (kind == "fraction" and not 0 <= value <= 1):
            raise bad
        return value
    if isinstance(value, bool):
        raise bad
    try:
        if kind == "number":
            return parse_number(value)
        if kind == "count":
            return parse_count(value)
        if kind == "factor":
            return parse_factor(value)
        if kind in ("length", "lengths"):
            items = value if isinstance(value, list) else [value]
            if not items or not all(isinstance(v, (int, str)) for v in items):
                raise bad
            lengths = parse_lengths(",".join(str(v) for v in items))
            if kind == "length" and len(lengths) != 1:
                raise bad
            return lengths[0] if kind == "length" else lengths
    except ValueError as e:
        raise _fail(file, where, f"is invalid: {e}") from None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v.strip() for v in items):
        raise bad
    items = [v.strip() for v in items]
    return _local_specs(items, base_dir) if kind == "specs" else items


_SCHEME = re.compile(r"^[A-Za-z]{2,}:")  # hf:<id>, synthetic:<kind>: data specs that are not local paths


def _is_local_path(kind: Any, value: str) -> bool:
    return (kind == "path" or (kind == "source" and ":" not in value)
            or (kind == "tokenizer" and value not in TOKENIZER_CHOICES))


def _local_path(value: str, base_dir: Path) -> str:
    return os.path.normpath(base_dir / os.path.expanduser(value))


def _local_specs(items: list, base_dir: Path) -> list:
    """Data specs with the local paths among them resolved against `base_dir`; hf:/synthetic: specs (and
    values of the wrong type, for `_coerce` to report) stay as they are."""
    return [_local_path(v.strip(), base_dir) if isinstance(v, str) and v.strip() and not _SCHEME.match(v.strip())
            else v for v in items]


def _anchor_paths(raw: Any, spec: dict[str, tuple], base_dir: Path) -> Any:
    """`raw` (a base recipe, or one of its sections) with its relative local paths made absolute against
    `base_dir`, the base file's folder, so a recipe deriving from it elsewhere still finds them. Values
    of the wrong type are left for `_coerce` to report."""
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    for key, value in raw.items():
        kind = spec.get(key, (None,))[0]
        if key == "models" and spec is _TOP and isinstance(value, dict):
            out[key] = {name: _anchor_model(m, base_dir) for name, m in value.items()}
        elif isinstance(kind, dict):
            out[key] = _anchor_paths(value, kind, base_dir)
        elif isinstance(value, str) and value.strip() and _is_local_path(kind, value):
            out[key] = _local_path(value, base_dir)
        elif kind == "specs" and isinstance(value, (str, list)):
            out[key] = _local_specs(value.split(",") if isinstance(value, str) else value, base_dir)
    return out


def _anchor_model(raw: Any, base_dir: Path) -> Any:
    if not isinstance(raw, dict) or len(raw) != 1:
        return raw
    source, value = next(iter(raw.items()))
    if source == "checkpoint":
        return {source: _local_path(value, base_dir) if isinstance(value, str) and value.strip() else value}
    return {source: _anchor_paths(value, {"init": _INIT, "convert": _CONVERT}.get(source, {}), base_dir)}


def _section(file: str, where: str, raw: Any, spec: dict[str, tuple], base_dir: Path) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(file, where, f"must be a mapping of keys to values, got {raw!r}")
    prefix = f"{where}." if where else ""
    for key in raw:
        if key not in spec:
            raise InputError(f"{file}: unknown key '{prefix}{key}'{_did_you_mean(str(key), spec)} "
                             f"(known: {', '.join(spec)})")
    out = {}
    for key, (kind, default) in spec.items():
        if key not in raw or raw[key] is None:
            if default is REQUIRED:
                raise _fail(file, f"{prefix}{key}", "is required")
            out[key] = default
        else:
            out[key] = _coerce(file, f"{prefix}{key}", kind, raw[key], base_dir)
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, mappings merged key by key (a null removes a section)."""
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise InputError(f"recipe '{path}' does not exist" if not seen else
                         f"{seen[-1]}: base '{path}' does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}: not valid YAML{at} ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a recipe is a mapping of sections (models, extend, ruler, ...)")
    if raw.get("base") is not None:
        if not isinstance(raw["base"], str):
            raise _fail(str(path), "base", f"must be a path, got {raw['base']!r}")
        base_path = (path.parent / raw["base"]).resolve()
        if base_path in seen or base_path == path.resolve():
            raise _fail(str(path), "base", f"'{raw['base']}' includes itself")
        parent = _anchor_paths(_read_yaml(base_path, (*seen, path.resolve())), _TOP, base_path.parent)
        raw = _merge(parent, {k: v for k, v in raw.items() if k != "base"})
    return raw


def _model(file: str, name: str, raw: Any, base_dir: Path) -> Model:
    where = f"models.{name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name == "compare":
        raise _fail(file, "models", f"has a bad model name {name!r} (letters, digits, '_', '.', '-'; not 'compare')")
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in SOURCES:
        keys = ", ".join(map(str, raw)) if isinstance(raw, dict) else repr(raw)
        hint = _did_you_mean(str(next(iter(raw))), SOURCES) if isinstance(raw, dict) and len(raw) == 1 else ""
        raise _fail(file, where, f"must have exactly one of init, convert or checkpoint, got {keys}{hint}")
    source, value = next(iter(raw.items()))
    if source == "checkpoint":
        path = Path(_coerce(file, f"{where}.checkpoint", "path", value, base_dir))
        if not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "has no config.json"
            raise _fail(file, f"{where}.checkpoint", f"'{path}' {what}: model path missing (give a local "
                                                     "transformers checkpoint directory)")
        return Model(name, source, {"checkpoint": str(path)}, path)
    settings = _section(file, f"{where}.{source}", value, _INIT if source == "init" else _CONVERT, base_dir)
    if source == "convert" and not Path(settings["source"]).is_dir():
        raise _fail(file, f"{where}.convert.source", f"'{settings['source']}' does not exist: model path missing "
                                                     "(the released checkpoint's local folder)")
    if source == "init":
        from longctx.models.gated_qwen3 import gate_flags
        from longctx.models.presets import check_preset, check_tokenizer

        try:
            check_preset(settings["preset"])
            gate_flags(settings["attention"])
        except InputError as e:
            raise InputError(f"{file}: {where}.init: {e}") from None
        if settings["match_params"] and settings["attention"] == "baseline":
            raise _fail(file, f"{where}.init.match_params", "is for gated models only (attention: baseline)")
        try:
            check_tokenizer(settings["tokenizer"])
        except InputError as e:
            raise _fail(file, f"{where}.init.tokenizer", str(e)) from None
    return Model(name, source, settings)


def _source_length(model: Model) -> int | None:
    """The length the starting checkpoint was trained at, when it can be known before anything runs."""
    from longctx.rope import read_rope

    if model.source == "init":
        from longctx.models.presets import check_preset, check_tokenizer

        return check_preset(model.settings["preset"]).get("max_position_embeddings")
    cfg_path = (model.checkpoint if model.source == "checkpoint" else Path(model.settings["source"])) / "config.json"
    try:
        return read_rope(json.loads(cfg_path.read_text(encoding="utf-8"))).trained_length
    except (OSError, ValueError, AttributeError):
        return None


def trained_length(recipe: Recipe, model: Model) -> int | None:
    """The length the model is trained at before YaRN: the last training stage's, else the source's."""
    for stage in reversed(TRAIN_STAGES):
        if stage in recipe.stages:
            return recipe.stages[stage]["seq_len"]
    return _source_length(model)


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read and validate a recipe; InputError (one line, naming the file and key) for anything wrong."""
    path = Path(path)
    raw = _read_yaml(path)
    file = str(path)
    base_dir = path.resolve().parent
    unknown = [k for k in raw if k not in _TOP]
    if unknown:
        k = str(unknown[0])
        raise InputError(f"{file}: unknown key or stage '{k}'{_did_you_mean(k, _TOP)} (known: {', '.join(_TOP)})")
    models_raw = raw.get("models")
    if not isinstance(models_raw, dict) or not models_raw:
        raise _fail(file, "models", "must map model names to init/convert/checkpoint, e.g. "
                                    "{baseline: {init: {preset: tiny, attention: baseline}}}")
    models = [_model(file, name, spec, base_dir) for name, spec in models_raw.items()]
    stages = {}
    for name in (*MODEL_STAGES, "compare"):
        if name in raw:
            stages[name] = _section(file, name, raw[name], _TOP[name][0], base_dir)
    if not any(s in stages for s in MODEL_STAGES):
        raise InputError(f"{file}: no stage; add at least one of {', '.join(MODEL_STAGES)}")
    launcher = _section(file, "launcher", raw.get("launcher"), _LAUNCHER, base_dir)
    description = _coerce(file, "description", "str", raw["description"], base_dir) if raw.get("description") else None
    recipe = Recipe(path, models, stages, launcher, description, raw)
    _check_recipe(recipe)
    return recipe


def _check_recipe(recipe: Recipe) -> None:
    """Cross-key checks: stage dependencies, names that must exist, lengths YaRN can reach."""
    file, st = str(recipe.path), recipe.stages
    for stage in TRAIN_STAGES:
        if stage in st:
            s = st[stage]
            if (s["tokens"] is None) == (s["steps"] is None):
                raise _fail(file, stage, "needs exactly one of tokens or steps")
            for spec in [*s["data"], *(s["short_data"] or [])]:
                if not _SCHEME.match(spec) and not Path(spec).exists():
                    raise _fail(file, f"{stage}.data", f"'{spec}' does not exist")
                if spec.startswith("synthetic:"):
                    from longctx.train.synthetic import KINDS

                    kind = spec.split(":", 1)[1]
                    if kind not in KINDS:
                        raise _fail(file, f"{stage}.data", f"'{spec}': no built-in corpus '{kind}' (choose from "
                                                           f"{', '.join(KINDS)}){_did_you_mean(kind, KINDS)}")
    names = [m.name for m in recipe.models]
    allowed = ("model", *[s for s in CHECKPOINT_STAGES if s in st])
    for stage in ("ruler", "sinks"):
        if stage in st and st[stage]["checkpoints"] is not None:
            for c in st[stage]["checkpoints"]:
                if c not in allowed:
                    raise _fail(file, f"{stage}.checkpoints", f"names '{c}', not a checkpoint of this recipe "
                                                              f"(choose from {', '.join(allowed)})")
    if "compare" in st:
        if "ruler" not in st:
            raise _fail(file, "compare", "needs a ruler stage (it compares RULER runs)")
        b = st["compare"]["baseline"]
        if b is not None and b not in names:
            raise _fail(file, "compare.baseline", f"'{b}' is not a model of this recipe ({', '.join(names)})"
                                                   f"{_did_you_mean(b, names)}")
        ref = st["compare"]["reference"]
        if ref is not None and ref not in st["ruler"]["lengths"]:
            raise _fail(file, "compare.reference", f"{ref} is not one of ruler.lengths")
    if "ruler" in st:
        from ruler_tasks.errors import RulerInputError
        from ruler_tasks.registry import resolve_tasks

        try:
            specs = resolve_tasks(st["ruler"]["tasks"])
        except RulerInputError as e:
            raise _fail(file, "ruler.tasks", f"is invalid: {e}") from None
        for spec in specs:
            if st["ruler"]["lengths"][0] < spec.min_length:
                raise _fail(file, "ruler.lengths", f"start at {st['ruler']['lengths'][0]}, but RULER's {spec.name} "
                                                   f"needs at least {spec.min_length} tokens")
        longest = st["ruler"]["lengths"][-1]
        for m in recipe.models:
            reach = reachable_length(recipe, m)
            if reach is not None and longest > reach:
                trained = trained_length(recipe, m)
                how = (f"yarn.factor {st['yarn']['factor']:g} on the {trained}-token trained length reaches {reach}"
                       if "yarn" in st else f"{m.name} is trained at {trained} tokens and there is no yarn stage")
                raise _fail(file, "ruler.lengths", f"go up to {longest} but {how}; the largest reachable length "
                                                   f"is {reach} (lower the lengths or raise the factor)")
    procs = recipe.launcher["num_processes"]
    if procs % recipe.launcher["num_machines"]:
        raise _fail(file, "launcher.num_processes", f"({procs}) must be a multiple of num_machines")
    if recipe.launcher["num_machines"] > 1 and not recipe.launcher["main_process_ip"]:
        raise _fail(file, "launcher.main_process_ip", "is required with num_machines > 1 (machine rank 0's address)")


def reachable_length(recipe: Recipe, model: Model) -> int | None:
    trained = recipe.stages["yarn"]["original_max_position_embeddings"] if "yarn" in recipe.stages else None
    trained = trained or trained_length(recipe, model)
    if trained is None:
        return None
    return int(trained * recipe.stages["yarn"]["factor"]) if "yarn" in recipe.stages else trained


# --- the plan ----------------------------------------------------------------------------------------


@dataclass
class Step:
    model: str | None  # None: compare (across models)
    stage: str
    dir: Path  # the stage directory, holding stage.json
    settings: dict[str, Any]  # what the stage hash covers (besides the inputs)
    inputs: list[Path]
    outputs: list[Path]
    status: str = ""  # run | resume | skip
    reason: str = ""
    launch: list[str] | None = None  # multi-process training: the command line shown (and run)

    @property
    def label(self) -> str:
        return f"{self.stage} for {self.model}" if self.model else self.stage


def _given(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings a recipe gives (None: the library's default), nested option mappings included."""
    return {k: _given(v) if isinstance(v, dict) else v for k, v in settings.items()
            if v is not None and k != "checkpoints"}


def _stage_lengths(recipe: Recipe, model: Model, checkpoint_stage: str) -> list[int]:
    """The RULER lengths the checkpoint of `checkpoint_stage` can be evaluated at."""
    st = recipe.stages
    if checkpoint_stage == "yarn":
        reach = reachable_length(recipe, model)
    elif checkpoint_stage in TRAIN_STAGES:
        reach = st[checkpoint_stage]["seq_len"]
    else:
        reach = _source_length(model)
    return [L for L in st["ruler"]["lengths"] if reach is None or L <= reach]


def plan(recipe: Recipe, out: Path) -> list[Step]:
    """Every stage of every model, then compare, with its directory, settings, inputs and outputs."""
    st = recipe.stages
    steps: list[Step] = []
    ruler_runs: dict[str, list[Path]] = {}
    for m in recipe.models:
        mdir = out / m.name
        if m.source == "checkpoint":
            ckpts = {"model": m.checkpoint}
        else:
            d = mdir / m.source
            ckpts = {"model": d / f"{m.name}-{m.source}"}
            inputs = [Path(m.settings["source"])] if m.source == "convert" else []
            steps.append(Step(m.name, m.source, d, dict(m.settings), inputs, [ckpts["model"]]))
        prev = ckpts["model"]
        for stage in CHECKPOINT_STAGES:
            if stage not in st:
                continue
            d = mdir / stage
            ckpts[stage] = d / f"{m.name}-{stage}"
            settings = _given(st[stage])
            if stage == "yarn" and "original_max_position_embeddings" not in settings and trained_length(recipe, m):
                settings["original_max_position_embeddings"] = trained_length(recipe, m)
            step = Step(m.name, stage, d, settings, [prev], [ckpts[stage]])
            if stage in TRAIN_STAGES and recipe.launcher["num_processes"] > 1:
                step.launch = launch_command(recipe, step)[0]
            steps.append(step)
            prev = ckpts[stage]
        default = [recipe.last_checkpoint_stage()]
        evaluated = (st["ruler"]["checkpoints"] or default) if "ruler" in st else default
        for stage in ("ruler", "sinks"):
            if stage not in st:
                continue
            which = st[stage]["checkpoints"] or evaluated
            d = mdir / stage
            settings = {**_given(st[stage]), "checkpoints": which}
            if stage == "ruler":
                settings["lengths"] = {c: _stage_lengths(recipe, m, c) for c in which}
                for c, lengths in settings["lengths"].items():
                    if not lengths:
                        raise InputError(f"{recipe.path}: ruler.lengths: none is within what the {c} checkpoint "
                                         f"of {m.name} can do; add shorter lengths or drop {c} from "
                                         "ruler.checkpoints")
            outputs = [d / f"{m.name}-{c}" for c in which]
            if stage == "ruler":
                ruler_runs[m.name] = outputs
            steps.append(Step(m.name, stage, d, settings, [ckpts[c] for c in which], outputs))
    if "compare" in st:
        runs = [r for rs in ruler_runs.values() for r in rs]
        b = st["compare"]["baseline"]
        settings = {"reference": st["compare"]["reference"], "baseline": str(ruler_runs[b][-1]) if b else None,
                    "train_logs": [str(s.outputs[0]) for s in steps if s.stage in TRAIN_STAGES]}
        steps.append(Step(None, "compare", out / "compare", settings, runs, [out / "compare"]))
    return steps


def _train_args(step: Step) -> list[str]:
    """`longctx extend` options for a training step's settings (only the keys the recipe gives)."""
    args = [str(step.inputs[0])]
    for key, value in step.settings.items():
        opt = f"--{key.replace('_', '-')}"
        if isinstance(value, bool):
            args.append(opt if value else f"--no-{key.replace('_', '-')}")
        elif isinstance(value, list):
            for v in value:
                args += [opt, str(v)]
        else:
            args += [opt, str(value)]
    return [*args, "-o", str(step.outputs[0])]


def _check_extend_options(recipe: Recipe, step: Step) -> None:
    """Refuse recipe keys that `longctx extend` has no option for (a multi-process run passes them as options)."""
    from longctx.cli import cli

    cmd = cli.commands.get("extend")
    if cmd is None:  # running the launch line will say so
        return
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    for key, value in step.settings.items():
        opt = f"--{key.replace('_', '-')}" if not (isinstance(value, bool) and not value) \
            else f"--no-{key.replace('_', '-')}"
        if opt not in known:
            raise _fail(str(recipe.path), f"{step.stage}.{key}", f"cannot be passed to a multi-process run: "
                                                                 f"'longctx extend' has no {opt} option")


def launch_command(recipe: Recipe, step: Step, resume: bool = False) -> tuple[list[str], list[str]]:
    """(the command line shown, the one run) of a multi-process training step: `accelerate launch ... -m
    longctx extend ...` or `torchrun ... -m longctx extend ...` with the recipe's launcher settings."""
    ln = recipe.launcher
    machines, procs = ln["num_machines"], ln["num_processes"]
    rank = ln["machine_rank"] if ln["machine_rank"] is not None else int(os.environ.get("MACHINE_RANK", "0"))
    if ln["launcher"] == "accelerate":
        head = ["--num_processes", str(procs), "--num_machines", str(machines)]
        if machines > 1:
            head += ["--machine_rank", str(rank), "--main_process_ip", ln["main_process_ip"],
                     "--main_process_port", str(ln["main_process_port"])]
        shown, run = ["accelerate", "launch"], [sys.executable, "-m", "accelerate.commands.launch"]
    else:
        head = ["--nnodes", str(machines), "--nproc_per_node", str(procs // machines)]
        if machines > 1:
            head += ["--node_rank", str(rank), "--master_addr", ln["main_process_ip"],
                     "--master_port", str(ln["main_process_port"])]
        shown, run = ["torchrun"], [sys.executable, "-m", "torch.distributed.run"]
    tail = [*head, "-m", "longctx", "extend", *_train_args(step), *(["--resume"] if resume else [])]
    return [*shown, *tail], [*run, *tail]


# --- stage markers ---------------------------------------------------------------------------------


def _read_marker(d: Path) -> dict[str, Any] | None:
    try:
        m = json.loads((d / MARKER).read_text(encoding="utf-8"))
        return m if isinstance(m, dict) else None
    except (OSError, json.JSONDecodeError):
        return None


def _write_marker(d: Path, doc: dict[str, Any]) -> None:
    from longctx.report import write_atomic

    write_atomic(d / MARKER, json.dumps(doc, indent=2) + "\n")


def _input_fingerprint(path: Path) -> str:
    """A checkpoint's fingerprint; for a RULER run directory, a hash of its result files."""
    from longctx.checkpoint import fingerprint

    if (path / "config.json").is_file():
        return fingerprint(path)
    h = hashlib.sha256()
    for name in ("results.json", "sinks.json", "train_log.jsonl"):
        if (path / name).is_file():
            h.update(name.encode() + b"\0" + (path / name).read_bytes())
    return h.hexdigest()


def stage_key(step: Step) -> str:
    inputs = [_input_fingerprint(p) for p in step.inputs]
    if step.stage == "compare":  # its loss table reads the training logs
        inputs += [_input_fingerprint(Path(p)) for p in step.settings["train_logs"] if Path(p).is_dir()]
    doc = {"stage": step.stage, "settings": step.settings, "inputs": inputs}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _decide(step: Step, forced: str | None) -> None:
    """Set step.status: run (fresh), resume (same settings, interrupted) or skip (up to date)."""
    if forced:
        step.status, step.reason = "run", forced
        return
    marker = _read_marker(step.dir)
    if marker is None:
        step.status, step.reason = "run", "not run yet"
        return
    if not all(p.exists() for p in step.inputs):
        step.status, step.reason = "run", "its input is missing"
        return
    if marker.get("key") != stage_key(step):
        step.status, step.reason = "run", "settings or inputs changed"
    elif not marker.get("complete"):
        step.status, step.reason = "resume", "interrupted"
    elif not all(p.exists() for p in step.outputs):
        step.status, step.reason = "run", "outputs missing"
    else:
        step.status, step.reason = "skip", "up to date"


# --- running stages ----------------------------------------------------------------------------------


def _run_train(recipe: Recipe, step: Step, resume: bool, log: Callable[[str], None]) -> None:
    if recipe.launcher["num_processes"] > 1:
        shown, cmd = launch_command(recipe, step, resume)
        log(f"$ {shlex.join(shown)}")
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            raise RuntimeError(f"{step.label}: the launched training exited with code {rc}")
        return
    from longctx.train.loop import TrainSettings, train

    train(TrainSettings(checkpoint=str(step.inputs[0]), output=str(step.outputs[0]), resume=resume,
                        **step.settings))


def _run_ruler(recipe: Recipe, step: Step, log: Callable[[str], None]) -> None:
    from longctx.eval.runner import run_ruler
    from longctx.report import write_report

    s = step.settings
    opts = dict(s.get("backend_options") or {})
    if "kv_cache_memory" in opts:
        opts["kv_cache_memory"] = int(opts["kv_cache_memory"])
    for c, ckpt, run_dir in zip(s["checkpoints"], step.inputs, step.outputs):
        lengths = s["lengths"][c]
        log(f"ruler {run_dir.name}: lengths {', '.join(map(str, lengths))}")
        run_ruler(ckpt, lengths, run_dir, tasks=s.get("tasks"), samples=s["samples"], seed=s["seed"],
                  template=s["template"], data_dir=s.get("data_dir"), essay=s.get("essay"), squad=s.get("squad"),
                  hotpotqa=s.get("hotpotqa"), backend=s["backend"], backend_options=opts, log=log)
        rep = write_report(run_dir, plot=s["plot"])
        log(rep.markdown.split("\n\n")[0])


def _run_sinks(recipe: Recipe, step: Step, log: Callable[[str], None]) -> None:
    from longctx.sinks import analyze_sinks

    kwargs = {k: int(v) if k == "tokens" else v for k, v in step.settings.items() if k != "checkpoints"}
    ruler_dir = step.dir.parent / "ruler"
    for c, ckpt, sinks_dir in zip(step.settings["checkpoints"], step.inputs, step.outputs):
        r = analyze_sinks(ckpt, sinks_dir, **kwargs)
        log(r["markdown"].split("\n\n")[0])
        # `longctx compare` shows sink columns for RULER runs that hold a sinks.json
        run_dir = ruler_dir / sinks_dir.name
        if (run_dir / "results.json").is_file():
            shutil.copy2(sinks_dir / "sinks.json", run_dir / "sinks.json")


def _read_train_log(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("loss"), (int, float)):
            rows.append(row)
    return rows


def training_curves(checkpoints: list[Path], out: Path) -> tuple[str, list[Path], list[str]]:
    """The training loss of each checkpoint's train_log.jsonl: a Markdown table (loss.md) and loss.png."""
    logs = {c.name: _read_train_log(c / "train_log.jsonl") for c in checkpoints if (c / "train_log.jsonl").is_file()}
    if not logs:
        return "", [], []
    lines = ["| Run | steps | tokens | first loss | final loss (mean of last 10%) |", "| --- | --- | --- | --- | --- |"]
    for name, rows in logs.items():
        tail = rows[-max(1, len(rows) // 10):]
        final = sum(r["loss"] for r in tail) / len(tail)
        lines.append(f"| {name} | {rows[-1].get('step', len(rows))} | {rows[-1].get('tokens', '')} | "
                     f"{rows[0]['loss']:.4f} | {final:.4f} |")
    md = "\n".join(lines)
    (out / "loss.md").write_text(md + "\n", encoding="utf-8")
    files, notes = [out / "loss.md"], []
    try:
        from longctx.report import pyplot

        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        for name, rows in logs.items():
            ax.plot([r.get("step", i + 1) for i, r in enumerate(rows)], [r["loss"] for r in rows], label=name)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss")
        ax.set_title("training loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "loss.png")
        plt.close(fig)
        files.append(out / "loss.png")
    except InputError as e:
        notes.append(f"no loss plot: {e}")
    return md, files, notes


def _run_compare(step: Step, log: Callable[[str], None]) -> str:
    from longctx.report import compare

    s = step.settings
    compare(step.inputs, s["baseline"], s["reference"], step.outputs[0])
    for note in training_curves([Path(p) for p in s["train_logs"]], step.outputs[0])[2]:
        log(f"note: {note}")
    return comparison_text(step.outputs[0])


def comparison_text(compare_dir: Path) -> str:
    """What a run ends by printing: the comparison table, and the training losses when there was training."""
    text = (compare_dir / "compare.md").read_text(encoding="utf-8").rstrip()
    if (compare_dir / "loss.md").is_file():
        text += "\n\nTraining loss:\n\n" + (compare_dir / "loss.md").read_text(encoding="utf-8").rstrip()
    return text


def _execute(recipe: Recipe, step: Step, log: Callable[[str], None]) -> str | None:
    resume = step.status == "resume"
    if step.stage == "init":
        from longctx.models.presets import init_checkpoint

        s = step.settings
        untie = {} if s["tie_embeddings"] is None else {"tie_word_embeddings": s["tie_embeddings"]}
        init_checkpoint(step.outputs[0], s["preset"], s["attention"], s["tokenizer"], s["match_params"], s["seed"],
                        True, s["dtype"], s["vocab_size"], **untie)
    elif step.stage == "convert":
        from longctx.models.convert import convert_checkpoint

        convert_checkpoint(step.inputs[0], step.outputs[0], step.settings["from"], True)
    elif step.stage in TRAIN_STAGES:
        _run_train(recipe, step, resume, log)
    elif step.stage == "yarn":
        from longctx.rope import yarn_checkpoint

        s = step.settings
        yarn_checkpoint(step.inputs[0], s["factor"], step.outputs[0], s.get("original_max_position_embeddings"),
                        False, True, s.get("beta_fast"), s.get("beta_slow"), s.get("truncate"), s["config_format"])
    elif step.stage == "ruler":
        _run_ruler(recipe, step, log)
    elif step.stage == "sinks":
        _run_sinks(recipe, step, log)
    elif step.stage == "compare":
        return _run_compare(step, log)
    return None


def _describe(step: Step) -> str:
    s = {k: v for k, v in step.settings.items() if k != "train_logs"}
    return " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in s.items())


def run_recipe(path: str | os.PathLike, out_dir: str | os.PathLike | None = None, from_stage: str | None = None,
               dry_run: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or with dry_run, only plan) a recipe into `out_dir` [default: runs/<recipe name>].

    Returns {"out", "steps": [{model, stage, status, reason, outputs, launch}], "comparison": markdown or None}.
    """
    recipe = load_recipe(path)
    out = Path(out_dir) if out_dir is not None else Path("runs") / Path(path).stem
    steps = plan(recipe, out)
    present = {s.stage for s in steps}
    if from_stage is not None:
        if from_stage not in FROM_STAGES:
            raise InputError(f"--from {from_stage}: unknown stage{_did_you_mean(from_stage, FROM_STAGES)} "
                             f"(stages: {', '.join(FROM_STAGES)})")
        if from_stage not in present:
            raise InputError(f"--from {from_stage}: {recipe.path} has no {from_stage} stage "
                             f"(its stages: {', '.join(dict.fromkeys(s.stage for s in steps))})")
        for s in steps:
            if s.stage == from_stage:
                missing = [p for p in s.inputs if not p.exists()]
                if missing:
                    raise InputError(f"--from {from_stage}: its input {missing[0]} ({s.label}) does not exist; "
                                     "run the earlier stages first (without --from)")
    for s in steps:
        if s.dir.exists() and _read_marker(s.dir) is None and any(s.dir.iterdir()):
            raise InputError(f"'{s.dir}' exists and was not written by 'longctx run'; choose another -o")
        if s.launch is not None:
            _check_extend_options(recipe, s)

    rank = recipe.launcher["machine_rank"]
    rank = rank if rank is not None else int(os.environ.get("MACHINE_RANK", "0"))
    log(f"recipe {recipe.path}: {len(recipe.models)} models ({', '.join(m.name for m in recipe.models)}), "
        f"stages {', '.join(dict.fromkeys(s.stage for s in steps))}; output {out}")
    if dry_run:
        _plan_statuses(steps, from_stage)
        for s in steps:
            log(f"{s.status:<6} {s.label}: {s.reason}")
            log(f"       settings: {_describe(s)}")
            log(f"       output:   {', '.join(map(str, s.outputs))}")
            if s.launch:
                log(f"       launch:   {shlex.join(s.launch)}")
        return {"out": str(out), "steps": [_step_doc(s) for s in steps], "comparison": None}

    comparison = None
    ran: set[str | None] = set()
    t0 = time.time()
    for s in steps:
        if rank != 0:  # the other machines only join the multi-process training runs of machine rank 0
            if s.launch is not None:
                log(f"machine rank {rank}: {s.label}")
                _run_train(recipe, s, False, log)
            continue
        _decide(s, _forced(s, from_stage, ran))
        if s.status == "skip":
            log(f"skip {s.label}: up to date")
            if s.stage == "compare":
                comparison = comparison_text(s.outputs[0])
            continue
        ran.add(s.model)
        missing = [p for p in s.inputs if not p.exists()]
        if missing:
            raise InputError(f"{s.label}: input {missing[0]} does not exist")
        log(f"{s.status} {s.label} ({s.reason}) -> {s.dir}")
        if s.status == "run" and s.dir.exists():
            shutil.rmtree(s.dir)
        s.dir.mkdir(parents=True, exist_ok=True)
        marker = {"stage": s.stage, "model": s.model, "key": stage_key(s), "settings": s.settings,
                  "inputs": [str(p) for p in s.inputs], "outputs": [str(p) for p in s.outputs], "complete": False,
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write_marker(s.dir, marker)
        t = time.time()
        text = _execute(recipe, s, log)
        _write_marker(s.dir, {**marker, "complete": True, "seconds": round(time.time() - t, 1)})
        if text is not None:
            comparison = text
    if comparison:
        log("")
        log(comparison)
    log(f"\ndone in {time.time() - t0:.0f} s; files in {out}:")
    for s in steps:
        log(f"  {s.label:<24} {', '.join(map(str, s.outputs))}")
    return {"out": str(out), "steps": [_step_doc(s) for s in steps], "comparison": comparison}


def _forced(s: Step, from_stage: str | None, ran: set[str | None]) -> str | None:
    """Why `s` must run whatever its marker says: --from reached it, or an earlier stage of its model ran
    (compare: of any model)."""
    if from_stage and FROM_STAGES.index(s.stage) >= FROM_STAGES.index(from_stage):
        return f"--from {from_stage}"
    if s.model in ran or (s.stage == "compare" and ran):
        return f"an earlier stage of {s.model or 'a model'} runs"
    return None


def _plan_statuses(steps: list[Step], from_stage: str | None) -> None:
    """Dry run: the statuses `run_recipe` would give, without running anything."""
    ran: set[str | None] = set()
    for s in steps:
        _decide(s, _forced(s, from_stage, ran))
        if s.status != "skip":
            ran.add(s.model)


def _step_doc(s: Step) -> dict[str, Any]:
    return {"model": s.model, "stage": s.stage, "status": s.status, "reason": s.reason,
            "outputs": [str(p) for p in s.outputs], "launch": s.launch}
