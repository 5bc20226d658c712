"""Reading and validating a recipe: YAML -> `Recipe`, before anything runs.

A wrong key or type is one line naming the file and the key path (`recipes/x.yaml: extend.lr must be a
number > 0, got 'fast'`). Relative paths in a recipe count from the recipe file that writes them;
`base: other.yaml` starts from another recipe and overrides its keys (the base's own relative paths still
count from the base file, so a variant may live anywhere).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.checkpoint.hub import cached_file, parse_hub_id
from longctx.core.errors import InputError, SettingError
from longctx.core.kinds import CheckpointPath, did_you_mean
from longctx.core.parse import LimitError, check_size, load_yaml, loads
from longctx.core.settings import Settings
from longctx.recipe.sections import (CHECKPOINT_STAGES, MODEL_SECTIONS, MODEL_STAGES, SOURCES, STAGE_SECTIONS,
                                     TRAIN_STAGES, LauncherSettings)

TOP_KEYS = ("description", "base", "models", "launcher", *STAGE_SECTIONS)
# A model name names folders (`<out>/<name>/<stage>/<name>-<stage>`, and a writer's temporary
# `.<name>-<stage>.tmp-<host>-<pid>-<random>` beside them) and must leave room in a file name's 255 bytes.
MAX_NAME = 64
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}")
# How many recipes may build on each other through `base:` (a real chain is two or three long).
MAX_BASES = 32
# A recipe is a few kilobytes; anything near this is not one.
MAX_RECIPE_BYTES = 1 << 20


@dataclass
class Model:
    name: str
    source: str  # init | convert | checkpoint
    settings: Settings | None  # InitSettings or ConvertSettings
    checkpoint: Path | None = None  # the local checkpoint of `checkpoint:` models


@dataclass
class Recipe:
    path: Path
    models: list[Model]
    stages: dict[str, Settings]  # stage -> its section, in the order of MODEL_STAGES + compare
    launcher: LauncherSettings
    description: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def last_checkpoint_stage(self) -> str:
        return next((s for s in reversed(CHECKPOINT_STAGES) if s in self.stages), "model")


def _fail(file: str, where: str, what: str) -> InputError:
    return InputError(f"{file}: {where} {what}")


# --- sections ---------------------------------------------------------------------------------------


def _keys(cls: type[Settings]) -> dict[str, Any]:
    """A section's recipe keys: key -> field name, or group key -> {key -> field name}."""
    out: dict[str, Any] = {}
    for f, spec in cls.specs():
        if spec.recipe:
            key = spec.key or f.name
            if spec.group:
                out.setdefault(spec.group, {})[key] = f.name
            else:
                out[key] = f.name
    return out


def _unknown(file: str, key: str, known: dict[str, Any]) -> InputError:
    tail = key.rsplit(".", 1)[-1]
    return InputError(f"{file}: unknown key '{key}'{did_you_mean(tail, known)} (known: {', '.join(known)})")


def _anchor(cls: type[Settings], raw: Any, base: Path) -> Any:
    """`raw` (a section) with its relative local paths made absolute against `base`; values of the wrong
    type are left for the section's own parsing to report."""
    if not isinstance(raw, dict):
        return raw
    keys, out = _keys(cls), dict(raw)
    for key, value in raw.items():
        name = keys.get(key)
        if isinstance(name, dict) and isinstance(value, dict):
            out[key] = {k: cls.spec(name[k]).kind.resolve(v, base) if k in name and v is not None else v
                        for k, v in value.items()}
        elif isinstance(name, str) and value is not None:
            out[key] = cls.spec(name).kind.resolve(value, base)
    return out


def parse_section(cls: type[Settings], raw: Any, file: str, where: str, offline_data: bool = True) -> Settings:
    """The settings of one recipe section, or InputError naming the file and key path."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(file, where, f"must be a mapping of keys to values, got {raw!r}")
    keys, values = _keys(cls), {}
    for key, value in raw.items():
        name = keys.get(key)
        if name is None:
            raise _unknown(file, f"{where}.{key}", keys)
        if isinstance(name, dict):
            if not isinstance(value, dict):
                raise _fail(file, f"{where}.{key}", f"must be a mapping of keys to values, got {value!r}")
            for k, v in value.items():
                if k not in name:
                    raise _unknown(file, f"{where}.{key}.{k}", name)
                values[name[k]] = v
        else:
            values[name] = value
    try:
        section = cls(**{k: v for k, v in values.items() if v is not None})
        section.check_inputs(offline_data)
    except SettingError as e:
        raise InputError(f"{file}: {e.render(lambda n: f'{where}.{cls.key(n)}')}") from None
    return section


# --- the file and its base ------------------------------------------------------------------------


def _anchor_doc(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(raw)
    for name, cls in STAGE_SECTIONS.items():
        if name in out:
            out[name] = _anchor(cls, out[name], base)
    models = out.get("models")
    if isinstance(models, dict):
        out["models"] = {n: _anchor_model(m, base) for n, m in models.items()}
    return out


def _anchor_model(raw: Any, base: Path) -> Any:
    if not isinstance(raw, dict):
        return raw
    out = {}
    for source, value in raw.items():
        if source == "checkpoint" and value is not None:
            out[source] = CheckpointPath().resolve(value, base)
        elif source in MODEL_SECTIONS:
            out[source] = _anchor(MODEL_SECTIONS[source], value, base)
        else:
            out[source] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, mappings merged key by key (a null removes a key)."""
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_document(path: Path) -> Any:
    """The YAML document in the recipe file `path`, or InputError: unreadable, not UTF-8, over a limit of
    `load_yaml` (size, nesting, aliases), or not YAML (a key written twice included)."""
    import yaml

    try:
        data = path.read_bytes()
        check_size(len(data), MAX_RECIPE_BYTES, "the file")
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputError(f"{path}: not UTF-8 text (byte {data[e.start]:#04x} at line {line}); save the recipe "
                         "as UTF-8") from None
    except LimitError as e:
        raise InputError(f"{path}: {e}; a recipe is a few kilobytes") from None
    try:
        return load_yaml(text)
    except LimitError as e:
        raise InputError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}: not valid YAML{at} ({getattr(e, 'problem', None) or e})") from None


def read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The recipe at `path` with its base merged in and every relative path anchored to its own file;
    InputError for a base chain longer than MAX_BASES recipes."""
    if not path.is_file():
        raise InputError(f"recipe '{path}' does not exist" if not seen else f"{seen[-1]}: base '{path}' does not exist")
    raw = _read_document(path)
    if not isinstance(raw, dict):
        raise InputError(f"{path}: a recipe is a mapping of sections (models, extend, ruler, ...)")
    raw = _anchor_doc(raw, path.resolve().parent)
    if raw.get("base") is not None:
        if not isinstance(raw["base"], str):
            raise _fail(str(path), "base", f"must be a path, got {raw['base']!r}")
        base_path = (path.parent / raw["base"]).resolve()
        if base_path in seen or base_path == path.resolve():
            raise _fail(str(path), "base", f"'{raw['base']}' includes itself")
        if len(seen) + 1 >= MAX_BASES:
            first = seen[0] if seen else path
            raise _fail(str(first), "base", f"starts a chain of more than {MAX_BASES} recipes (each the base of "
                                            f"the one before); at most {MAX_BASES} may build on each other")
        raw = _merge(read_yaml(base_path, (*seen, path.resolve())), {k: v for k, v in raw.items() if k != "base"})
    return raw


# --- models ---------------------------------------------------------------------------------------------


def _model(file: str, name: Any, raw: Any, offline_data: bool) -> Model:
    where = f"models.{name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name == "compare":
        shown = repr(name) if len(str(name)) <= 80 else f"{str(name)[:40]!r}... ({len(str(name))} characters)"
        raise _fail(file, "models", f"has a bad model name {shown} (letters, digits, '_', '.', '-', at most "
                                    f"{MAX_NAME} characters; not 'compare')")
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in SOURCES:
        keys = ", ".join(map(str, raw)) if isinstance(raw, dict) else repr(raw)
        hint = did_you_mean(str(next(iter(raw))), SOURCES) if isinstance(raw, dict) and len(raw) == 1 else ""
        raise _fail(file, where, f"must have exactly one of init, convert or checkpoint, got {keys}{hint}")
    source, value = next(iter(raw.items()))
    if source == "checkpoint":
        if not isinstance(value, str) or not value.strip():
            raise _fail(file, f"{where}.checkpoint", f"must be a path, got {value!r}")
        path = Path(value)
        if parse_hub_id(value) is not None:  # fetched when its first stage runs
            return Model(name, source, None, path)
        if not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "has no config.json"
            raise _fail(file, f"{where}.checkpoint", f"'{path}' {what}: model path missing (give a local "
                                                     "transformers checkpoint directory)")
        return Model(name, source, None, path)
    settings = parse_section(MODEL_SECTIONS[source], value, file, f"{where}.{source}", offline_data)
    if source == "convert" and not Path(settings.source).is_dir() and parse_hub_id(settings.source) is None:
        raise _fail(file, f"{where}.convert.source", f"'{settings.source}' does not exist: model path missing "
                                                     "(the released checkpoint's local folder)")
    return Model(name, source, settings)


def source_length(model: Model) -> int | None:
    """The length the starting checkpoint was trained at, when it can be known before anything runs."""
    from longctx.checkpoint.rope import read_rope
    from longctx.init.presets import PRESETS

    if model.source == "init":
        return {**PRESETS[model.settings.preset], **model.settings.config}.get("max_position_embeddings")
    spec = str(model.checkpoint) if model.source == "checkpoint" else model.settings.source
    cfg_path = (cached_file(spec, "config.json") if parse_hub_id(spec) else Path(spec) / "config.json")
    if cfg_path is None:  # a Hub checkpoint not downloaded yet
        return None
    try:
        return read_rope(loads(cfg_path.read_text(encoding="utf-8"))).trained_length
    except (OSError, ValueError, AttributeError):
        return None


def trained_length(recipe: Recipe, model: Model) -> int | None:
    """The length the model is trained at before YaRN: the last training stage's, else the source's."""
    for stage in reversed(TRAIN_STAGES):
        if stage in recipe.stages:
            return recipe.stages[stage].seq_len
    return source_length(model)


def reachable_length(recipe: Recipe, model: Model) -> int | None:
    yarn = recipe.stages.get("yarn")
    trained = (yarn.original_max_position_embeddings if yarn else None) or trained_length(recipe, model)
    if trained is None:
        return None
    return int(trained * yarn.factor) if yarn else trained


def load_recipe(path: str | os.PathLike, offline_data: bool = True) -> Recipe:
    """Read and validate a recipe; InputError (one line, naming the file and key) for anything wrong.
    `offline_data` false: `hf:` data not cached while offline is left for the caller to report (--dry-run)."""
    path = Path(path)
    raw = read_yaml(path)
    file = str(path)
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        k = str(unknown[0])
        raise InputError(f"{file}: unknown key or stage '{k}'{did_you_mean(k, TOP_KEYS)} "
                         f"(known: {', '.join(TOP_KEYS)})")
    models_raw = raw.get("models")
    if not isinstance(models_raw, dict) or not models_raw:
        raise _fail(file, "models", "must map model names to init/convert/checkpoint, e.g. "
                                    "{baseline: {init: {preset: tiny, attention: baseline}}}")
    models = [_model(file, name, spec, offline_data) for name, spec in models_raw.items()]
    names = [m.name for m in models]
    # compare first: a misnamed baseline is the first thing to say; the stages keep their order
    order = ["compare", *(n for n in STAGE_SECTIONS if n != "compare")]
    parsed = {}
    for name in (n for n in order if n in raw):
        parsed[name] = parse_section(STAGE_SECTIONS[name], raw[name], file, name, offline_data)
        b = parsed[name].baseline if name == "compare" else None
        if b is not None and b not in names:
            raise _fail(file, "compare.baseline", f"'{b}' is not a model of this recipe ({', '.join(names)})"
                                                   f"{did_you_mean(b, names)}")
    stages = {name: parsed[name] for name in STAGE_SECTIONS if name in parsed}
    if not any(s in stages for s in MODEL_STAGES):
        raise InputError(f"{file}: no stage; add at least one of {', '.join(MODEL_STAGES)}")
    launcher = parse_section(LauncherSettings, raw.get("launcher"), file, "launcher")
    description = raw.get("description")
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise _fail(file, "description", f"must be a string, got {description!r}")
    recipe = Recipe(path, models, stages, launcher, description, raw)
    _check(recipe)
    return recipe


def _check(recipe: Recipe) -> None:
    """Checks across sections: names that must exist, lengths the checkpoints can reach."""
    file, st = str(recipe.path), recipe.stages
    allowed = ("model", *[s for s in CHECKPOINT_STAGES if s in st])
    for stage in ("ruler", "sinks"):
        for c in (st[stage].checkpoints or []) if stage in st else []:
            if c not in allowed:
                raise _fail(file, f"{stage}.checkpoints", f"names '{c}', not a checkpoint of this recipe "
                                                          f"(choose from {', '.join(allowed)})")
    if "compare" in st:
        if "ruler" not in st:
            raise _fail(file, "compare", "needs a ruler stage (it compares RULER runs)")
        ref = st["compare"].reference
        if ref is not None and ref not in st["ruler"].lengths:
            raise _fail(file, "compare.reference", f"{ref} is not one of ruler.lengths")
    if "ruler" in st:
        longest = st["ruler"].lengths[-1]
        for m in recipe.models:
            reach = reachable_length(recipe, m)
            if reach is not None and longest > reach:
                trained = trained_length(recipe, m)
                how = (f"yarn.factor {st['yarn'].factor:g} on the {trained}-token trained length reaches {reach}"
                       if "yarn" in st else f"{m.name} is trained at {trained} tokens and there is no yarn stage")
                raise _fail(file, "ruler.lengths", f"go up to {longest} but {how}; the largest reachable length "
                                                   f"is {reach} (lower the lengths or raise the factor)")
