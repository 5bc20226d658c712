"""RoPE settings of a checkpoint config: read both formats, write the one transformers reads.

Config formats (transformers `modeling_rope_utils.py` and vLLM `config.py` @ the pinned versions):
- transformers 5: `"rope_parameters": {"rope_type", "rope_theta", "factor", "original_max_position_embeddings", ...}`
- legacy (4.x): top-level `rope_theta` plus `rope_scaling` (`null`, or a dict with `rope_type` or `type`).
transformers 5 reads both; when both are present a non-null `rope_scaling` replaces `rope_parameters`,
and a top-level `original_max_position_embeddings` overrides the dict's (HF 5.x and vLLM alike).

YaRN in LongRoPE form: transformers' Phi3Config (and Phi4MultimodalConfig) turn rope_type "yarn" into
"longrope" when they load a config (configuration_phi3.py, "For backward compatibility"), so for those
architectures `longctx yarn` writes YaRN's exact frequencies as LongRoPE factors, and `read_rope`
recognises such a config as YaRN again (see `yarn_longrope_form`).

Per-layer-type RoPE (Gemma-3's global and local layers) is `longctx.rope.layers`; `read_rope` of such
a config is the RoPE of the layers that see the whole sequence. What transformers builds from a written config
is checked on its rotary module (`check_written_rope`, `longctx.rope.built`). The settings as a value, and
the lengths they reach, are `longctx.rope.settings`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from longctx.checkpoint.classes import config_class
from longctx.checkpoint.config_keys import check_config_types, is_int, is_number, shown
from longctx.checkpoint.load import model_config, transformers_quiet
from longctx.checkpoint.text_config import built_text_config, text_config, text_config_key, with_text_config
from longctx.core.errors import InputError, exception_line
from longctx.core.parse import loads
from longctx.core.units import parse_number
from longctx.rope.built import BuiltRope, built_rope, rope_differences
from longctx.rope.reference import yarn_attention_scaling, yarn_longrope_factors
from longctx.rope.settings import RopeSettings
from longctx.rope.types import rope_type as rope_type_of

ConfigFormat = Literal["v5", "v4", "both"]
# The keys that make a YaRN config the LongRoPE form of it (`yarn_longrope_form`).
LONGROPE_FORM_KEYS = ("short_factor", "long_factor", "attention_factor", "short_mscale", "long_mscale")

# Top-level keys whose base the config class reads in the transformers-4 form (of the layers that see the whole
# sequence), for the families that do not name it rope_theta (configuration_gpt_neox.py,
# configuration_gpt_neox_japanese.py: `rotary_emb_base`; configuration_modernbert_decoder.py: `global_rope_theta`).
BASE_KEYS = {"gpt_neox": "rotary_emb_base", "gpt_neox_japanese": "rotary_emb_base",
             "modernbert_decoder": "global_rope_theta"}


def _class_default(model_type: str | None, name: str) -> Any:
    """The class-level default of field `name` in this model type's transformers config class (None when
    transformers knows no such type or the class has no such field)."""
    return getattr(config_class(model_type), name, None)


def _default_theta(model_type: str | None) -> float | None:
    """The base transformers falls back to for this model type."""
    return _class_default(model_type, "default_theta")


def _class_original(model_type: str | None) -> int | None:
    """The default top-level original_max_position_embeddings of this model type's transformers config class
    (Phi3Config: 4096), which `standardize_rope_params` puts over the RoPE dict's; None when it has none."""
    value = _class_default(model_type, "original_max_position_embeddings")
    return value if is_int(value) else None


def _rotary_dim(cfg: dict[str, Any], rope: dict[str, Any]) -> int | None:
    """Rotated dimensions per head as transformers' RoPE initialisers and vLLM's `get_rope` count them."""
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    head_dim = cfg.get("head_dim") or (hidden // heads if is_int(heads) and is_int(hidden) else None)
    if head_dim is None:
        return None
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor")) or 1.0
    return int(head_dim * partial)


def _as_yarn(cfg: dict[str, Any], rope: RopeSettings) -> RopeSettings | None:
    """`rope` (a LongRoPE config) as the YaRN it is when `yarn_longrope_form` wrote it: identical short and
    long factors equal to YaRN's for the recorded factor, original length, base and betas, YaRN's attention
    scale in attention_factor, short_mscale and long_mscale, and max_position_embeddings = original x factor.

    Recognised by that structure rather than by a marker key: transformers warns on keys it does not know,
    and the structure is what makes the config YaRN in both engines, whoever wrote it."""
    x, s, n = rope.extra, rope.factor, rope.original_max_position_embeddings
    short, long = x.get("short_factor"), x.get("long_factor")
    if not (s and s > 1 and n and short and short == long and rope.max_position_embeddings == math.ceil(n * s)):
        return None
    scale = yarn_attention_scaling(s)
    if not all(is_number(x.get(k)) and math.isclose(x[k], scale, rel_tol=1e-6)
               for k in ("attention_factor", "short_mscale", "long_mscale")):
        return None
    dim = _rotary_dim(cfg, x)
    if dim is None or len(short) != dim // 2:
        return None
    betas = {k: x[k] for k in ("beta_fast", "beta_slow", "truncate") if k in x}
    want = yarn_longrope_factors(dim, rope.theta, s, n, **betas)
    if not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(short, want)):
        return None
    return replace(rope, rope_type="yarn", stored_type="longrope")


def yarn_longrope_form(cfg: dict[str, Any], rope: RopeSettings) -> RopeSettings:
    """YaRN `rope` in LongRoPE form, for `cfg`'s architecture: short_factor = long_factor = YaRN's
    per-pair factors (reference `yarn_longrope_factors`), and YaRN's attention scale 0.1·ln(s) + 1 as
    `attention_factor` (what transformers' `_compute_longrope_parameters` reads) and as `short_mscale` and
    `long_mscale` (what vLLM's `Phi3LongRoPEScaledRotaryEmbedding` reads; it ignores attention_factor).

    transformers uses short_factor up to the original length and long_factor beyond it, vLLM long_factor at
    every position once max_model_len exceeds the original length: equal factors make all of it YaRN."""
    extra = {k: v for k, v in rope.extra.items() if k not in LONGROPE_FORM_KEYS}
    dim = _rotary_dim(cfg, extra)
    if dim is None:
        raise InputError("config.json has neither head_dim nor hidden_size and num_attention_heads; cannot size "
                         "the LongRoPE factors that carry YaRN for this architecture")
    betas = {k: extra[k] for k in ("beta_fast", "beta_slow", "truncate") if k in extra}
    factors = yarn_longrope_factors(dim, rope.theta, rope.factor, rope.original_max_position_embeddings, **betas)
    scale = yarn_attention_scaling(rope.factor)
    extra.update(short_factor=factors, long_factor=list(factors), attention_factor=scale, short_mscale=scale,
                 long_mscale=scale)
    return replace(rope, rope_type="yarn", stored_type="longrope", extra=extra)


# Layer types whose layers attend to a window of the sequence only: RoPE changes for long context (YaRN, a new
# base) apply to the other layer types (transformers' `layer_types` labels).
SHORT_LAYER_TYPES = ("sliding_attention", "chunked_attention")


def nested_rope_keys(cfg: dict[str, Any]) -> list[str]:
    """The layer types of a config.json dict's per-layer-type `rope_parameters` ({"full_attention": {...},
    "sliding_attention": {...}}, as transformers 5 writes Gemma-3's), [] for a flat one."""
    params = cfg.get("rope_parameters")
    if not isinstance(params, dict):
        return []
    return [k for k, v in params.items() if isinstance(v, dict) or (v is None and k.endswith("attention"))]


def long_layer_type(types: list[str], model_type: Any = None) -> str:
    """Of per-layer RoPE `types`, the one whose layers see the whole sequence: full_attention; for a config
    class that labels its RoPE dicts otherwise, its first label (DeepseekV4Config `_rope_type_labels`: "main", the
    attention's); else the first that does not attend to a window only."""
    if "full_attention" in types:
        return "full_attention"
    labels = _class_default(model_type, "_rope_type_labels") or ()
    return next((t for t in (*labels, *types) if t in types and t not in SHORT_LAYER_TYPES), types[0])


def base_key(model_type: Any) -> str:
    """The top-level key this model type's config class reads the RoPE base from (transformers-4 form)."""
    return BASE_KEYS.get(model_type, "rope_theta")


def read_rope(cfg: dict[str, Any], source: str = "config.json") -> RopeSettings:
    """RoPE settings from a raw config.json dict, resolved the way transformers 5 resolves them; for a config
    with per-layer-type RoPE those of the layers that see the whole sequence (`long_layer_type`;
    `longctx.rope.layers` has every type), of its language model for a composite config
    (`text_config`). InputError naming `source` (the file the dict came from) when a value has the wrong type."""
    check_config_types(cfg, source)
    if text_config_key(cfg) is not None:
        cfg = text_config(cfg)
        check_config_types(cfg, source)
    params = cfg.get("rope_parameters")
    legacy = cfg.get("rope_scaling")
    nested = nested_rope_keys(cfg)
    if nested:
        chosen = [k for k in nested if params[k] is not None] or nested
        # config classes update the global layers' dict with a legacy rope_scaling (Gemma3TextConfig)
        long = long_layer_type(chosen, cfg.get("model_type"))
        rope = {**(params[long] or {}), **(legacy if isinstance(legacy, dict) else {})}
        return parse_rope(cfg, rope, "v5", source, nested=True)
    if isinstance(legacy, dict) and legacy:
        rope, fmt = dict(legacy), "v4"
    elif isinstance(params, dict) and params:
        rope, fmt = dict(params), "v5"
    else:
        rope, fmt = {}, "v4" if base_key(cfg.get("model_type")) in cfg or "rope_scaling" in cfg else "v5"
    return parse_rope(cfg, rope, fmt, source)


def parse_rope(cfg: dict[str, Any], rope: dict[str, Any], fmt: str, source: str = "config.json", *,
               nested: bool = False, base: Any = None, default_key: str = "global") -> RopeSettings:
    """The RoPE settings of the RoPE dict `rope` of config `cfg` (format `fmt`), its base defaulting to `base`,
    then the top-level base key, then the model type's default (`default_key` of a per-layer default). A
    `nested` (per-layer-type) dict takes no top-level original length, as `standardize_rope_params`."""
    rope = dict(rope)
    rope_type = rope.pop("rope_type", None) or rope.pop("type", None) or "default"
    rope.pop("type", None)
    theta = rope.pop("rope_theta", None)
    if theta is None:
        theta = base if base is not None else cfg.get(base_key(cfg.get("model_type")))
    theta_is_default = theta is None
    if theta is None:
        theta = _default_theta(cfg.get("model_type"))
        if isinstance(theta, dict):  # per-layer defaults (Gemma3TextConfig: {"global": 1e6, "local": 1e4})
            theta = theta.get(default_key)
        if theta is None:
            raise InputError(
                f"config has no RoPE base (rope_parameters / rope_theta) and model_type "
                f"'{cfg.get('model_type')}' has no known default; add "
                '"rope_parameters": {"rope_type": "default", "rope_theta": <base>} to config.json'
            )
    try:
        theta = parse_number(theta)
    except ValueError as e:
        raise InputError(f"'{source}': rope_theta: {e}") from None

    max_pos = cfg.get("max_position_embeddings")
    factor = rope.pop("factor", None)
    original = rope.pop("original_max_position_embeddings", None)
    top = None if nested else cfg.get("original_max_position_embeddings")
    record = rope_type_of(rope_type)
    if record.original == "pretrained":
        if top is None and not nested:
            top = _class_original(cfg.get("model_type"))  # a config class field wins even at its default
        original = top if top is not None else original if original is not None else max_pos
    elif record.original == "recorded":
        # transformers does not read it for these types, but where a config records it, it is the original
        original = top if top is not None else original
    settings = RopeSettings(
        rope_type=rope_type,
        theta=theta,
        max_position_embeddings=max_pos,
        factor=float(factor) if factor is not None else None,
        original_max_position_embeddings=int(original) if original is not None else None,
        extra=rope,
        config_format=fmt,
        theta_is_default=theta_is_default,
    )
    if record.may_hold_yarn:
        return _as_yarn(cfg, settings) or settings
    return settings


def stored_form(cfg: dict[str, Any]) -> ConfigFormat:
    """The form of the RoPE keys of config.json dict `cfg`: "v5" (`rope_parameters`), "v4" (the base key and
    `rope_scaling`), "both"; a config with neither (its class default applies) counts as both, so that what is
    written from it reaches every reader that read it."""
    v5 = isinstance(cfg.get("rope_parameters"), dict) and bool(cfg["rope_parameters"])
    v4 = base_key(cfg.get("model_type")) in cfg or "rope_scaling" in cfg
    return "both" if v5 == v4 else "v5" if v5 else "v4"


def _head_dim_left_none(cfg: dict[str, Any]) -> int | None:
    """hidden_size // num_attention_heads where config.json has no head_dim and the model type's config class
    leaves it None (MixtralConfig, MiniMaxConfig; MinistralConfig and the Hunyuan configs too), else None. Their
    attention then rotates that many dimensions, but transformers' dynamic, yarn and longrope initialisers read
    `getattr(config, "head_dim", hidden_size // num_attention_heads)`, which is None there
    (modeling_rope_utils.py @ 5.19): written out, every initialiser sizes the RoPE as the attention does."""
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    cls = config_class(cfg.get("model_type"))
    if cfg.get("head_dim") is not None or not (is_int(heads) and is_int(hidden) and heads > 0) or cls is None:
        return None
    if not hasattr(cls, "head_dim") or cls.head_dim is not None:
        return None
    try:  # a class may fill it in from hidden_size and num_attention_heads (LlamaConfig does)
        with transformers_quiet():
            built = cls(hidden_size=hidden, num_attention_heads=heads)
    except Exception:  # noqa: BLE001 - a class that wants more to build: check_written_rope builds the config
        return None
    return hidden // heads if getattr(built, "head_dim", 0) is None else None


def write_rope(cfg: dict[str, Any], rope: RopeSettings, config_format: ConfigFormat | None = None) -> dict[str, Any]:
    """A copy of `cfg` whose RoPE fields and max_position_embeddings say exactly `rope`.

    Every old RoPE field is removed first (a stale top-level `original_max_position_embeddings` would
    override the dict in transformers 5 and vLLM). It is written again, equal to the dict's, where the
    model's config class has it as a field (Phi3Config), whose default would otherwise win. `config_format`
    [default: the form `cfg` has, `stored_form`]: "v5" is what the pinned transformers writes; "v4" is for
    transformers 4.x readers (the base under the key the model type's config class reads, `BASE_KEYS`); "both"
    writes both (they agree). `rope.stored_type` is the rope_type written (LongRoPE form of YaRN). A scaled RoPE
    of a config whose class leaves head_dim None gets head_dim written (`_head_dim_left_none`). A composite
    config gets it written in its language model's part (`text_config`), the rest kept.
    """
    if text_config_key(cfg) is not None:
        return with_text_config(cfg, write_rope(text_config(cfg), rope, config_format))
    config_format = config_format or stored_form(cfg)
    out = copy.deepcopy(cfg)
    base = base_key(cfg.get("model_type"))
    for key in ("rope_parameters", "rope_scaling", "rope_theta", "original_max_position_embeddings", base):
        out.pop(key, None)
    if rope.max_position_embeddings is not None:
        out["max_position_embeddings"] = int(rope.max_position_embeddings)
    stored = rope_type_of(rope.stored_type or rope.rope_type)
    if (stored.original == "pretrained" and rope.original_max_position_embeddings is not None
            and _class_original(cfg.get("model_type")) is not None):
        out["original_max_position_embeddings"] = int(rope.original_max_position_embeddings)
    params = rope_dict(rope)
    head_dim = _head_dim_left_none(cfg) if stored.scaled else None
    if head_dim is not None:
        out["head_dim"] = head_dim
    if config_format in ("v5", "both"):
        out["rope_parameters"] = params
    if config_format in ("v4", "both"):
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        out[base] = rope.theta
        out["rope_scaling"] = scaling if scaling != {"rope_type": "default"} else None
    return out


def rope_dict(rope: RopeSettings) -> dict[str, Any]:
    """`rope` as the RoPE dict transformers 5 reads: {"rope_type" (as stored), "rope_theta", "factor",
    "original_max_position_embeddings", ...its other keys}."""
    out: dict[str, Any] = {"rope_type": rope.stored_type or rope.rope_type, "rope_theta": rope.theta}
    if rope.factor is not None:
        out["factor"] = float(rope.factor)  # transformers warns on a non-float factor
    if rope.original_max_position_embeddings is not None:
        out["original_max_position_embeddings"] = int(rope.original_max_position_embeddings)
    out.update(rope.extra)
    return out


def reference_params(rope: RopeSettings) -> dict[str, Any]:
    """The parameters whose RoPE `rope` asks for, for `longctx.rope.built.reference_rope`: its dict, with
    YaRN in LongRoPE form as the YaRN it is (the factors and scales are what the reference computes)."""
    out = rope_dict(rope)
    out["rope_type"] = rope.rope_type
    if rope.stored_type is not None:  # YaRN in LongRoPE form
        for key in LONGROPE_FORM_KEYS:
            out.pop(key, None)
    return out


def set_rope_base(cfg: dict[str, Any], base: float, max_length: int,
                  config_format: ConfigFormat | None = None) -> tuple[dict[str, Any], RopeSettings]:
    """The config half of `extend`: a new RoPE base (ABF) and maximum length.

    A position-independent scaling (llama3, linear, dynamic; proportional's partial rotation) is kept as it is, with
    the new base under it: Llama 3.x is trained with its llama3 scaling on. YaRN and LongRoPE are refused: their
    frequencies were chosen for the old base and the length they name (longctx yarn scales the extended checkpoint
    instead).
    """
    new = rebased(read_rope(cfg), base, max_length)
    return write_rope(cfg, new, config_format), new


def rebased(rope: RopeSettings, base: float, max_length: int, layers: str = "this checkpoint") -> RopeSettings:
    """`rope` with base `base` and max_position_embeddings `max_length` (`set_rope_base`); InputError for a type
    whose frequencies were fitted to its base and length (`RopeType.rebase_refusal`: YaRN, LongRoPE), `layers`
    naming whose RoPE it is in the message."""
    record = rope.type_record
    if record.rebase_refusal is not None:
        raise InputError(record.rebase_refusal.format(whose=layers, name=rope.rope_type, display=record.display,
                                                    base=rope.theta, factor=rope.factor or 0,
                                                    original=rope.original_max_position_embeddings))
    return dataclasses.replace(rope, theta=parse_number(base), max_position_embeddings=int(max_length))


def _same(a: Any, b: Any) -> bool:
    if is_number(a) and is_number(b):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def _read_differently(params: dict[str, Any], expected: RopeSettings) -> list[str]:
    """What the built config's RoPE dict `params` says differently from `expected`: 'factor 4.0 (written 2.0)'."""
    stored = expected.stored_type or expected.rope_type
    has_original = rope_type_of(stored).original == "pretrained"
    want = {"rope_type": stored, "rope_theta": expected.theta, "factor": expected.factor,
            "original length": expected.original_max_position_embeddings if has_original else None,
            **expected.extra}
    got = {"rope_type": params.get("rope_type", "default"), "rope_theta": params.get("rope_theta"),
           "factor": params.get("factor"),
           "original length": params.get("original_max_position_embeddings") if has_original else None,
           **{k: params.get(k) for k in expected.extra}}
    return [f"{k} {shown(got[k])} (written {shown(v)})" for k, v in want.items()
            if (v is not None or k == "rope_type") and not _same(got[k], v)]


def check_written_rope(written: str | os.PathLike | dict[str, Any], expected: RopeSettings | Mapping[str, RopeSettings],
                       source: str | None = None, *, trust_remote_code: bool = False,
                       checkpoint: str | os.PathLike | None = None) -> dict[str, BuiltRope]:
    """InputError (one line) unless transformers, building a config from `written` (a checkpoint folder or a
    config.json dict) as every loader does, gets the RoPE `expected` says (one for every layer, or one per layer
    type): first the RoPE dict it reads (rope_type as stored, rope_theta, factor, original length, every other
    key of `expected.extra`) and max_position_embeddings, then what the rotary module of the model it builds
    computes for every layer type that applies RoPE: inv_freq and attention scaling against the reference of the
    asked RoPE (`longctx.rope.built`). `source` names the config in the message [default: the folder's
    config.json, or "config.json"]. A dict is built by the config class of `checkpoint` (the folder it is for)
    when that ships code and `trust_remote_code`. Returns the built RoPE per layer type (`BuiltRope`).

    Config classes may rewrite what a config.json says (Phi3Config turns "yarn" into "longrope"), put their
    own defaults over it (Phi3Config's top-level original_max_position_embeddings, default 4096) or ignore it
    (Gemma3TextConfig ignores a flat rope_parameters)."""
    if isinstance(written, dict):
        cfg, folder = written, None
    else:
        folder = Path(written)
        cfg = loads((folder / "config.json").read_text(encoding="utf-8"))  # what longctx itself wrote
    label = source or (str(folder / "config.json") if folder is not None else "config.json")
    what = f"longctx cannot write this RoPE for model_type '{cfg.get('model_type')}'"
    built = _built_config(cfg if folder is None else folder, checkpoint, trust_remote_code, label, what)
    per_type = dict(expected) if isinstance(expected, Mapping) else None
    diff = _read_back_differently(built, expected, per_type)
    if diff:
        raise InputError(f"'{label}': transformers' {type(built).__name__} reads {', '.join(diff)}; {what}")
    try:
        rope = built_rope(built, trust_remote_code)
    except InputError as e:
        raise InputError(f"'{label}': {e}; {what}") from None
    asked = {lt: reference_params(per_type[lt] if per_type else expected) for lt in rope
             if per_type is None or lt in per_type}
    wrong = rope_differences(rope, asked, getattr(built_text_config(built), "max_position_embeddings", None))
    if wrong:
        raise InputError(f"'{label}': the model transformers builds from it computes {'; '.join(wrong)}; {what}")
    return rope


def _built_config(written: Path | dict[str, Any], checkpoint: str | os.PathLike | None, trust_remote_code: bool,
                  label: str, what: str) -> Any:
    """The config transformers builds from the folder or config.json dict `written` (a dict by the config class
    of `checkpoint`)."""
    try:
        if isinstance(written, Path):
            return model_config(written, trust_remote_code=trust_remote_code)
        # a copy: config classes edit the RoPE dict they are given (Phi3Config sets its rope_type)
        return model_config(checkpoint or ".", copy.deepcopy(written), trust_remote_code=trust_remote_code)
    except InputError as e:
        if e.__context__ is None:
            raise  # longctx's own refusal (code the checkpoint ships, not trusted): it says what to do
        raise InputError(f"'{label}': transformers cannot build a config from what longctx wrote "
                         f"({exception_line(e.__context__)}); {what}") from None


def _read_back_differently(built: Any, expected: RopeSettings | Mapping[str, RopeSettings],
                           per_type: dict[str, RopeSettings] | None) -> list[str]:
    """What the built config reads differently from `expected` (`per_type`: it per layer type): its RoPE dict per
    layer type, or its one, and the max_position_embeddings of the layers that see the whole sequence (of the
    language model's part of a composite config)."""
    built = built_text_config(built)
    params = getattr(built, "rope_parameters", None) or {}
    if per_type:
        long = per_type[long_layer_type(list(per_type))]
        diff = [f"{lt} {d}" for lt, rope in per_type.items() for d in _read_differently(params.get(lt) or {}, rope)]
    else:
        long, diff = expected, _read_differently(params, expected)
    max_pos = getattr(built, "max_position_embeddings", None)
    if long.max_position_embeddings is not None and not _same(max_pos, long.max_position_embeddings):
        diff.append(f"max_position_embeddings {shown(max_pos)} (written {long.max_position_embeddings})")
    return diff
