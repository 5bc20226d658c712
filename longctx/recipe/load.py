"""Reading and validating a recipe: YAML -> `Recipe`, before anything runs.

A wrong key or type is one line naming the file and the key path (`recipes/x.yaml: extend.lr must be a
number > 0, got 'fast'`). Relative paths in a recipe count from the recipe file that writes them;
`base: other.yaml` starts from another recipe and overrides its keys (the base's own relative paths still
count from the base file, so a variant may live anywhere).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from longctx.checkpoint.hub import parse_hub_id
from longctx.core.errors import InputError, SettingError
from longctx.core.kinds import CheckpointPath, did_you_mean
from longctx.core.parse import LimitError, check_size, load_yaml
from longctx.core.settings import Settings
from longctx.recipe.sections import (
    CHECKPOINT_SOURCE,
    model_sections,
    model_stages,
    sources,
    stage_sections,
)
from longctx.recipe.stage import Lengths, checkpoint_trained_length
from longctx.recipe.stages import (
    checkpoint_stages,
    comparison_stages,
    evaluation_stages,
    source_stages,
    stages,
)
from longctx.recipe.types import LauncherSettings, Model, Recipe, SweepSettings, model_recipe, seed_name

# The recipe's own top-level keys; the others are its stages' sections.
OWN_KEYS = ("description", "base", "models", "launcher", "sweep")
# A model name names folders (`<out>/<name>/<stage>/<name>-<stage>`, and a writer's temporary
# `.<name>-<stage>.tmp-<host>-<pid>-<random>` beside them) and must leave room in a file name's 255 bytes.
MAX_NAME = 64
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}")
# How many recipes may build on each other through `base:` (a real chain is two or three long).
MAX_BASES = 32
# A recipe is a few kilobytes; anything near this is not one.
MAX_RECIPE_BYTES = 1 << 20


def last_checkpoint_stage(recipe: Recipe) -> str:
    """The recipe's last checkpoint stage ("model": it has none), what evaluations evaluate by default."""
    return next((s for s in reversed(checkpoint_stages()) if s in recipe.stages), "model")


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
    for name, cls in stage_sections().items():
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
    sections = model_sections()
    for source, value in raw.items():
        if source == CHECKPOINT_SOURCE and value is not None:
            out[source] = CheckpointPath().resolve(value, base)
        elif source in sections:
            out[source] = _anchor(sections[source], value, base)
        elif source in stage_sections():
            out[source] = _anchor(stage_sections()[source], value, base)
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


# A model entry's keys besides its source: the stages of the recipe it does not go through.
SKIP = "skip"


def _model(file: str, name: Any, raw: Any, offline_data: bool) -> Model:
    """The model `name` of the recipe: its source (the entry's one key of init, convert, checkpoint); its own
    `skip` and stage keys are read by `_own_sections` once the recipe's sections are."""
    where = f"models.{name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name == "compare":
        shown = repr(name) if len(str(name)) <= 80 else f"{str(name)[:40]!r}... ({len(str(name))} characters)"
        raise _fail(file, "models", f"has a bad model name {shown} (letters, digits, '_', '.', '-', at most "
                                    f"{MAX_NAME} characters; not 'compare')")
    known = sources()
    given = [k for k in raw if k in known] if isinstance(raw, dict) else []
    if len(given) != 1:
        keys = ", ".join(map(str, raw)) if isinstance(raw, dict) else repr(raw)
        others = [str(k) for k in raw if k != SKIP and k not in model_stages()] if isinstance(raw, dict) else []
        hint = did_you_mean(others[0], known) if not given and len(others) == 1 else ""
        one_of = f"{', '.join(known[:-1])} or {known[-1]}"
        raise _fail(file, where, f"must have exactly one of {one_of}, got {keys}{hint}")
    own = (SKIP, *model_stages())
    for key in raw:
        if key not in known and key not in own:
            raise _unknown(file, f"{where}.{key}", {k: None for k in (*known, *own)})
    source, value = given[0], raw[given[0]]
    if source == CHECKPOINT_SOURCE:
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
    stage = source_stages()[source]
    settings = parse_section(stage.section, value, file, f"{where}.{source}", offline_data)
    stage.check_model(settings, file, f"{where}.{source}")
    return Model(name, source, settings)


def _own_sections(file: str, raw: dict[str, Any], model: Model, sections: dict[str, Settings],
                  offline_data: bool) -> dict[str, Settings] | None:
    """The stage sections `model` goes through when its entry says otherwise than the recipe (None when it does
    not): the stages in `skip` left out, with the checkpoints they make dropped from what evaluations evaluate;
    a stage's keys under the model's entry set over the recipe's (a stage the recipe lacks is the model's alone)."""
    entry = raw["models"][model.name]
    where = f"models.{model.name}"
    skip = entry.get(SKIP) or []
    mine = [name for name in model_stages() if name in entry]
    if not skip and not mine:
        return None
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        raise _fail(file, f"{where}.{SKIP}", f"must be a list of stage names, got {skip!r}")
    for name in skip:
        if name not in sections or name not in model_stages():
            have = [n for n in sections if n in model_stages()]
            raise _fail(file, f"{where}.{SKIP}", f"names '{name}', not a stage of this recipe (choose from "
                                                 f"{', '.join(have)}){did_you_mean(name, have)}")
        if name in mine:
            raise _fail(file, where, f"both skips {name} and sets its keys; keep one")
    kinds = stage_sections()
    own: dict[str, Settings] = {}
    for name in kinds:
        if name in skip:
            continue
        if name in mine:
            merged = _merge(raw.get(name) or {}, entry[name] or {})
            own[name] = parse_section(kinds[name], merged, file, f"{where}.{name}", offline_data)
        elif name in sections:
            own[name] = sections[name]
    for name in evaluation_stages():
        which = own[name].checkpoints if name in own else None
        if name in mine or not which:
            continue
        kept = [c for c in which if c not in skip]
        if not kept:
            raise _fail(file, f"{where}.{SKIP}", f"leaves {name} nothing to evaluate ({name}.checkpoints: "
                                                 f"{', '.join(which)}); set {where}.{name}.checkpoints")
        own[name] = dataclasses.replace(own[name], checkpoints=kept)
    if not any(n in own for n in model_stages()):
        raise _fail(file, f"{where}.{SKIP}", "skips every stage; drop the model or a name from it")
    return own


def source_length(model: Model) -> int | None:
    """The length the starting checkpoint was trained at, when it can be known before anything runs."""
    if model.source == CHECKPOINT_SOURCE:
        return checkpoint_trained_length(str(model.checkpoint))
    return source_stages()[model.source].trained_length(model.settings)


def model_lengths(recipe: Recipe, model: Model) -> dict[str, Lengths]:
    """What each checkpoint of `model` can do (its source's, "model", then each checkpoint stage's in order), as
    far as it can be known before anything runs."""
    src = source_length(model)
    out = {"model": Lengths(src, src)}
    before = out["model"]
    own = model_recipe(recipe, model).stages
    for name, stage in checkpoint_stages().items():
        if name in own:
            before = out[name] = stage.lengths(own[name], before)
    return out


def top_keys() -> tuple[str, ...]:
    return (*OWN_KEYS, *stage_sections())


def _sections(raw: dict[str, Any], file: str, names: list[str], offline_data: bool) -> dict[str, Settings]:
    """The stage sections of the recipe, in stage order; comparisons are read (and checked against the model
    names) first: a misnamed baseline is the first thing to say."""
    comparisons = comparison_stages()
    sections = stage_sections()
    parsed = {}
    for name in sorted((n for n in sections if n in raw), key=lambda n: n not in comparisons):
        parsed[name] = parse_section(sections[name], raw[name], file, name, offline_data)
        if name in comparisons:
            comparisons[name].check_section(parsed[name], names, file)
    return {name: parsed[name] for name in sections if name in parsed}


def load_recipe(path: str | os.PathLike, offline_data: bool = True) -> Recipe:
    """Read and validate a recipe; InputError (one line, naming the file and key) for anything wrong.
    `offline_data` false: `hf:` data not cached while offline is left for the caller to report (--dry-run)."""
    path = Path(path)
    raw = read_yaml(path)
    file = str(path)
    known = top_keys()
    unknown = [k for k in raw if k not in known]
    if unknown:
        k = str(unknown[0])
        raise InputError(f"{file}: unknown key or stage '{k}'{did_you_mean(k, known)} (known: {', '.join(known)})")
    models_raw = raw.get("models")
    if not isinstance(models_raw, dict) or not models_raw:
        raise _fail(file, "models", f"must map model names to {'/'.join(sources())}, e.g. "
                                    "{baseline: {init: {preset: tiny, attention: baseline}}}")
    models = [_model(file, name, spec, offline_data) for name, spec in models_raw.items()]
    sections = _sections(raw, file, [m.name for m in models], offline_data)
    for m in models:
        m.stages = _own_sections(file, raw, m, sections, offline_data)
    if not any(s in sections for s in model_stages()):
        raise InputError(f"{file}: no stage; add at least one of {', '.join(model_stages())}")
    launcher = parse_section(LauncherSettings, raw.get("launcher"), file, "launcher")
    description = raw.get("description")
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise _fail(file, "description", f"must be a string, got {description!r}")
    recipe = Recipe(path, models, sections, launcher, description, raw)
    recipe.sweep = _sweep(raw.get("sweep"), recipe)
    _check(recipe)
    return recipe


def seeded_stages(recipe: Recipe) -> list[str]:
    """The stages of `recipe` that have a `seed` a sweep can set, in stage order (a model source first)."""
    have = {m.source for m in recipe.models} | {n for m in recipe.models for n in model_recipe(recipe, m).stages}
    sections = {**{n: s.section for n, s in source_stages().items()}, **stage_sections()}
    return [n for n in stages() if n in have and "seed" in {f.name for f, _ in sections[n].specs()}]


def _sweep(raw: Any, recipe: Recipe) -> SweepSettings | None:
    """The recipe's seed sweep, its stages resolved (default: init and the training stages); InputError for a
    stage that is not one of the recipe's with a seed, or replicate names that would be too long."""
    if raw is None:
        return None
    file = str(recipe.path)
    sweep = parse_section(SweepSettings, raw, file, "sweep")
    seeded = seeded_stages(recipe)
    default = [n for n in seeded if n in source_stages() or stages()[n].trains]
    chosen = sweep.stages if sweep.stages is not None else default
    for name in chosen:
        if name not in seeded:
            raise _fail(file, "sweep.stages", f"names '{name}', not a stage of this recipe with a seed (choose from "
                                              f"{', '.join(seeded) or 'none: no stage here has one'})"
                                              f"{did_you_mean(name, seeded)}")
    if not chosen:
        raise _fail(file, "sweep", "has no stage to set the seed of: this recipe has no init or training stage; "
                                   f"name the stages in sweep.stages (of {', '.join(seeded) or 'none'})")
    names = {m.name for m in recipe.models}
    made = [seed_name(m.name, seed) for m in recipe.models for seed in sweep.seeds]
    longest = max(made, key=len)
    if len(longest) > MAX_NAME:
        raise _fail(file, "sweep.seeds", f"make the model name '{longest}' ({len(longest)} characters), over "
                                         f"{MAX_NAME}; shorten the model names")
    clash = next((n for n in made if n in names), None)
    if clash is not None:
        raise _fail(file, "sweep.seeds", f"make the model name '{clash}', which is already a model of this recipe; "
                                         "rename that model")
    return SweepSettings(seeds=sweep.seeds, stages=[n for n in seeded if n in chosen])


def _check(recipe: Recipe) -> None:
    """Checks across sections: the checkpoints an evaluation names exist, then each stage's own (comparisons
    first)."""
    file = str(recipe.path)
    for m in recipe.models:
        st = model_recipe(recipe, m).stages
        allowed = ("model", *[s for s in checkpoint_stages() if s in st])
        for name in evaluation_stages():
            for c in (st[name].checkpoints or []) if name in st else []:
                if c not in allowed:
                    where, of = ((f"models.{m.name}.{name}", f"{m.name} goes through") if m.stages is not None
                                 else (name, "of this recipe"))
                    raise _fail(file, f"{where}.checkpoints", f"names '{c}', not a checkpoint {of} (choose from "
                                                              f"{', '.join(allowed)})")
    comparisons = comparison_stages()
    present = {n for m in recipe.models for n in model_recipe(recipe, m).stages} | set(recipe.stages)
    for name, stage in sorted(stages().items(), key=lambda item: item[0] not in comparisons):
        if name in present:
            stage.check(recipe)
