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
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from longctx.core.errors import InputError
from longctx.core.units import parse_number

ConfigFormat = Literal["v5", "v4", "both"]
# RoPE types transformers implements (ROPE_INIT_FUNCTIONS, plus "default").
KNOWN_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# Types whose `original_max_position_embeddings` is the pre-extension training length and which transformers
# fills from max_position_embeddings when absent (`standardize_rope_params`).
_TYPES_WITH_ORIGINAL = ("yarn", "longrope", "llama3")
# The keys that make a YaRN config the LongRoPE form of it (`yarn_longrope_form`).
LONGROPE_FORM_KEYS = ("short_factor", "long_factor", "attention_factor", "short_mscale", "long_mscale")


@dataclass(frozen=True)
class RopeSettings:
    """What a config says about positions, normalised over both config formats."""

    rope_type: str
    theta: int | float
    max_position_embeddings: int | None
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    # Other keys of the RoPE dict (beta_fast, beta_slow, truncate, partial_rotary_factor, ...).
    extra: dict[str, Any] = field(default_factory=dict)
    config_format: str = "v5"
    theta_is_default: bool = False  # the config has no base; this is the model class default
    # The rope_type config.json stores when it is not `rope_type`: "longrope" for YaRN in LongRoPE form.
    stored_type: str | None = None

    @property
    def trained_length(self) -> int | None:
        """Length the model was trained at before any context scaling: the original length of yarn, llama3
        and longrope; of dynamic NTK the recorded original, else max_position_embeddings (the length
        transformers' `_compute_dynamic_ntk_parameters` and vLLM's `DynamicNTKScalingRotaryEmbedding` scale
        from); of linear only a recorded original (configs write max_position_embeddings before or after the
        factor: None when unknown)."""
        if self.rope_type in (*_TYPES_WITH_ORIGINAL, "linear"):
            return self.original_max_position_embeddings
        if self.rope_type == "dynamic":
            return self.original_max_position_embeddings or self.max_position_embeddings
        return self.max_position_embeddings

    @property
    def scaling_factor(self) -> float | None:
        """The context factor: `factor`, or for LongRoPE without one max_position_embeddings / original, as
        transformers' `_compute_longrope_parameters` takes it."""
        if self.factor is not None or self.rope_type != "longrope":
            return self.factor
        if self.max_position_embeddings and self.original_max_position_embeddings:
            return self.max_position_embeddings / self.original_max_position_embeddings
        return None

    @property
    def context_length(self) -> int | None:
        """Longest sequence (prompt + generation) the checkpoint can be evaluated at.

        For YaRN this is original × factor: vLLM sizes its cos/sin cache by it (and before
        vllm#56446 derived max_model_len from it, ignoring max_position_embeddings).
        """
        if self.rope_type == "yarn" and self.original_max_position_embeddings and self.factor:
            return math.ceil(self.original_max_position_embeddings * self.factor)
        return self.max_position_embeddings


# --- types of the config keys longctx reads ------------------------------------------------------
# transformers 5 checks config fields with strict dataclasses (huggingface_hub `strict`), but only when a
# model is built, and vLLM and longctx's own arithmetic read the raw JSON before that: a string where a
# number belongs would surface as a TypeError deep inside. JSON null means "not set" for every key here,
# as in transformers' config classes.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is a bool, never a count


def _is_number(v: Any) -> bool:
    # Python's json module reads NaN and Infinity, which no length or base can be.
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_STRING = ("a string", lambda v: isinstance(v, str))
_BOOL = ("true or false", lambda v: isinstance(v, bool))
_NUMBER = ("a number", _is_number)
_POSITIVE = ("a number > 0", lambda v: _is_number(v) and v > 0)
_COUNT = ("a whole number > 0", lambda v: _is_int(v) and v > 0)
_WHOLE = ("a whole number >= 0", lambda v: _is_int(v) and v >= 0)
_NUMBERS = ("a list of numbers", lambda v: isinstance(v, list) and all(_is_number(x) for x in v))
_OBJECT = ("an object or null", lambda v: isinstance(v, dict))

# Keys of a RoPE dict (`rope_parameters`, `rope_scaling`): transformers' `RopeParameters` and its
# per-type validators in modeling_rope_utils.py.
ROPE_KEY_TYPES = {
    "rope_type": _STRING, "type": _STRING, "rope_theta": _POSITIVE, "factor": _POSITIVE,
    "original_max_position_embeddings": _COUNT, "partial_rotary_factor": _POSITIVE,
    "beta_fast": _NUMBER, "beta_slow": _NUMBER, "attention_factor": _NUMBER, "mscale": _NUMBER,
    "mscale_all_dim": _NUMBER, "low_freq_factor": _NUMBER, "high_freq_factor": _NUMBER, "truncate": _BOOL,
    "short_factor": _NUMBERS, "long_factor": _NUMBERS,
}
# Top-level keys: those longctx reads itself (RoPE, lengths, the gate flags of
# `longctx.models.variants`, the dtype) and the shape every loader builds the model from.
CONFIG_KEY_TYPES = {
    "model_type": _STRING, "dtype": _STRING, "torch_dtype": _STRING,
    "architectures": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "rope_parameters": _OBJECT, "rope_scaling": _OBJECT, "rope_theta": _POSITIVE,
    "partial_rotary_factor": _POSITIVE, "max_position_embeddings": _COUNT, "original_max_position_embeddings": _COUNT,
    "vocab_size": _COUNT, "hidden_size": _COUNT, "intermediate_size": _COUNT, "num_hidden_layers": _COUNT,
    "num_attention_heads": _COUNT, "num_key_value_heads": _COUNT, "head_dim": _COUNT, "sliding_window": _COUNT,
    "max_window_layers": _WHOLE, "tie_word_embeddings": _BOOL, "use_sliding_window": _BOOL,
    "headwise_attn_output_gate": _BOOL, "elementwise_attn_output_gate": _BOOL,
}


def _shown(value: Any) -> str:
    """A config value as the message shows it: a string quoted, anything else as JSON writes it (true, null)."""
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_config_types(cfg: dict[str, Any], source: str = "config.json") -> None:
    """InputError naming `source`, the key and the type it needs when a config key longctx or a model loader
    reads has a value of the wrong type, e.g. `'ckpt/config.json': rope_scaling.factor must be a number > 0,
    got 'abc'`."""

    def check(key: str, value: Any, spec: tuple[str, Any]) -> None:
        expected, ok = spec
        if value is not None and not ok(value):
            raise InputError(f"'{source}': {key} must be {expected}, got {_shown(value)}")

    for key, spec in CONFIG_KEY_TYPES.items():
        check(key, cfg.get(key), spec)
    for group in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(group)
        for key, value in (rope or {}).items():
            if isinstance(value, dict):  # per-layer-type parameters (read_rope says longctx does not support them)
                for inner, v in value.items():
                    if inner in ROPE_KEY_TYPES:
                        check(f"{group}.{key}.{inner}", v, ROPE_KEY_TYPES[inner])
            elif key in ROPE_KEY_TYPES:
                check(f"{group}.{key}", value, ROPE_KEY_TYPES[key])


def _class_default(model_type: str | None, name: str) -> Any:
    """The class-level default of field `name` in this model type's transformers config class (None when
    transformers knows no such type or the class has no such field)."""
    if not model_type:
        return None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return getattr(CONFIG_MAPPING[model_type], name, None)
    except KeyError:
        return None


def _default_theta(model_type: str | None) -> float | None:
    """The base transformers falls back to for this model type."""
    return _class_default(model_type, "default_theta")


def _class_original(model_type: str | None) -> int | None:
    """The default top-level original_max_position_embeddings of this model type's transformers config class
    (Phi3Config: 4096), which `standardize_rope_params` puts over the RoPE dict's; None when it has none."""
    value = _class_default(model_type, "original_max_position_embeddings")
    return value if _is_int(value) else None


def _rotary_dim(cfg: dict[str, Any], rope: dict[str, Any]) -> int | None:
    """Rotated dimensions per head as transformers' RoPE initialisers and vLLM's `get_rope` count them."""
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    head_dim = cfg.get("head_dim") or (hidden // heads if _is_int(heads) and _is_int(hidden) else None)
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
    from longctx.checkpoint.yarn_reference import (  # torch: only when needed
        yarn_attention_scaling,
        yarn_longrope_factors,
    )

    scale = yarn_attention_scaling(s)
    if not all(_is_number(x.get(k)) and math.isclose(x[k], scale, rel_tol=1e-6)
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
    from longctx.checkpoint.yarn_reference import yarn_attention_scaling, yarn_longrope_factors

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


def read_rope(cfg: dict[str, Any], source: str = "config.json") -> RopeSettings:
    """RoPE settings from a raw config.json dict, resolved the way transformers 5 resolves them; InputError
    naming `source` (the file the dict came from) when a value has the wrong type."""
    check_config_types(cfg, source)
    params = cfg.get("rope_parameters")
    legacy = cfg.get("rope_scaling")
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        raise InputError(
            "this config has per-layer-type rope_parameters "
            f"({', '.join(k for k, v in params.items() if isinstance(v, dict))}); longctx supports one RoPE for "
            "all layers"
        )
    if isinstance(legacy, dict) and legacy:
        rope, fmt = dict(legacy), "v4"
    elif isinstance(params, dict) and params:
        rope, fmt = dict(params), "v5"
    else:
        rope, fmt = {}, "v4" if "rope_theta" in cfg or "rope_scaling" in cfg else "v5"

    rope_type = rope.pop("rope_type", None) or rope.pop("type", None) or "default"
    rope.pop("type", None)
    theta = rope.pop("rope_theta", None)
    if theta is None:
        theta = cfg.get("rope_theta")
    theta_is_default = theta is None
    if theta is None:
        theta = _default_theta(cfg.get("model_type"))
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
    top = cfg.get("original_max_position_embeddings")
    if rope_type in _TYPES_WITH_ORIGINAL:
        if top is None:
            top = _class_original(cfg.get("model_type"))  # a config class field wins even at its default
        original = top if top is not None else original if original is not None else max_pos
    elif rope_type in ("linear", "dynamic"):
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
    if rope_type == "longrope":
        return _as_yarn(cfg, settings) or settings
    return settings


def write_rope(cfg: dict[str, Any], rope: RopeSettings, config_format: ConfigFormat = "v5") -> dict[str, Any]:
    """A copy of `cfg` whose RoPE fields and max_position_embeddings say exactly `rope`.

    Every old RoPE field is removed first (a stale top-level `original_max_position_embeddings` would
    override the dict in transformers 5 and vLLM). It is written again, equal to the dict's, where the
    model's config class has it as a field (Phi3Config), whose default would otherwise win. "v5" is what the
    pinned transformers writes; "v4" is for transformers 4.x readers; "both" writes both (they agree).
    `rope.stored_type` is the rope_type written (LongRoPE form of YaRN).
    """
    out = copy.deepcopy(cfg)
    for key in ("rope_parameters", "rope_scaling", "rope_theta", "original_max_position_embeddings"):
        out.pop(key, None)
    if rope.max_position_embeddings is not None:
        out["max_position_embeddings"] = int(rope.max_position_embeddings)
    rope_type = rope.stored_type or rope.rope_type
    if (rope_type in _TYPES_WITH_ORIGINAL and rope.original_max_position_embeddings is not None
            and _class_original(cfg.get("model_type")) is not None):
        out["original_max_position_embeddings"] = int(rope.original_max_position_embeddings)
    scaling: dict[str, Any] = {}
    if rope.factor is not None:
        scaling["factor"] = float(rope.factor)  # transformers warns on a non-float factor
    if rope.original_max_position_embeddings is not None:
        scaling["original_max_position_embeddings"] = int(rope.original_max_position_embeddings)
    scaling.update(rope.extra)
    if config_format in ("v5", "both"):
        out["rope_parameters"] = {"rope_type": rope_type, "rope_theta": rope.theta, **scaling}
    if config_format in ("v4", "both"):
        out["rope_theta"] = rope.theta
        out["rope_scaling"] = {"rope_type": rope_type, **scaling} if rope_type != "default" else None
    return out


def set_rope_base(cfg: dict[str, Any], base: float, max_length: int,
                  config_format: ConfigFormat = "v5") -> tuple[dict[str, Any], RopeSettings]:
    """The config half of `extend`: a new RoPE base (ABF) and maximum length.

    A position-independent scaling (llama3, linear, dynamic) is kept as it is, with the new base under it:
    Llama 3.x is trained with its llama3 scaling on. YaRN and LongRoPE are refused: their frequencies were
    chosen for the old base and the length they name (longctx yarn scales the extended checkpoint instead).
    """
    rope = read_rope(cfg)
    if rope.rope_type == "yarn":
        raise InputError(f"this checkpoint is YaRN-scaled (factor {rope.factor:g} from original length "
                         f"{rope.original_max_position_embeddings}); extend the checkpoint before YaRN, then scale "
                         "the result with longctx yarn")
    if rope.rope_type not in ("default", "llama3", "linear", "dynamic"):
        raise InputError(f"this checkpoint uses RoPE type '{rope.rope_type}', whose per-dimension factors were fitted "
                         f"for base {rope.theta:g}; a new base would invalidate them: extend a checkpoint without it, "
                         "then scale the result with longctx yarn")
    new = dataclasses.replace(rope, theta=parse_number(base), max_position_embeddings=int(max_length))
    return write_rope(cfg, new, config_format), new




def yarn_command(checkpoint: str | os.PathLike, rope: RopeSettings, longest: int) -> str:
    """The `longctx yarn` command line whose result covers `longest` tokens: the factor (a power of two) from
    the original length `yarn` will use, `--rescale` when the checkpoint is scaled already, and for linear
    scaling without a recorded original length `--original-max-position-embeddings` with the length the
    config claims (max_position_embeddings)."""
    base, flag = rope.trained_length, ""
    if base is None and rope.rope_type == "linear" and rope.max_position_embeddings:
        base = rope.max_position_embeddings
        flag = f" --original-max-position-embeddings {base}"
    base = base or rope.context_length or longest
    factor = max(2, 2 ** math.ceil(math.log2(longest / base)))
    rescale = " --rescale" if rope.rope_type != "default" else ""
    return f"longctx yarn {shlex.quote(os.fspath(checkpoint))} --factor {factor}{rescale}{flag}"


def check_context(checkpoint: Path, rope: RopeSettings, longest: int) -> None:
    """InputError when `longest` tokens (prompt + generation) are beyond what the checkpoint can do; the
    message says which `longctx yarn` would make room (`yarn_command`)."""
    ctx = rope.context_length
    if ctx is None or longest <= ctx:
        return
    raise InputError(f"length {longest} is beyond what '{checkpoint}' can do (context length {ctx} tokens, prompt + "
                     f"generation); extend it first: {yarn_command(checkpoint, rope, longest)}")


def _rope_fields(rope_type: str, theta: Any, factor: Any, original: Any, max_pos: Any) -> dict[str, Any]:
    return {"rope_type": rope_type, "rope_theta": theta, "factor": factor, "original length": original,
            "max_position_embeddings": max_pos}


def _same(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def check_written_rope(written: str | os.PathLike | dict[str, Any], expected: RopeSettings,
                       source: str | None = None, *, trust_remote_code: bool = False,
                       checkpoint: str | os.PathLike | None = None) -> None:
    """InputError (one line) unless transformers, building a config from `written` (a checkpoint folder or a
    config.json dict) as every loader does, gets the RoPE `expected` says: rope_type (as stored), rope_theta,
    factor, original length, max_position_embeddings, and every other key of `expected.extra`. `source`
    names the config in the message [default: the folder's config.json, or "config.json"]. A dict is built by
    the config class of `checkpoint` (the folder it is for) when that ships code and `trust_remote_code`.

    Config classes may rewrite what a config.json says (Phi3Config turns "yarn" into "longrope") or put their
    own defaults over it (Phi3Config's top-level original_max_position_embeddings, default 4096)."""
    from transformers.utils import logging as hf_logging

    from longctx.checkpoint.load import _one_line, model_config
    from longctx.core.parse import loads

    if isinstance(written, dict):
        cfg, folder = written, None
    else:
        folder = Path(written)
        cfg = loads((folder / "config.json").read_text(encoding="utf-8"))  # what longctx itself wrote
    label = source or (str(folder / "config.json") if folder is not None else "config.json")
    what = f"longctx cannot write this RoPE for model_type '{cfg.get('model_type')}'"
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its warnings (unknown keys vLLM reads, token ids) would repeat at every load
    try:
        if folder is not None:
            built = model_config(folder, trust_remote_code=trust_remote_code)
        else:  # a copy: config classes edit the RoPE dict they are given (Phi3Config sets its rope_type)
            built = model_config(checkpoint or ".", copy.deepcopy(cfg), trust_remote_code=trust_remote_code)
    except InputError as e:
        if e.__context__ is None:
            raise  # longctx's own refusal (code the checkpoint ships, not trusted): it says what to do
        raise InputError(f"'{label}': transformers cannot build a config from what longctx wrote "
                         f"({_one_line(e.__context__)}); {what}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    params = getattr(built, "rope_parameters", None) or {}
    stored = expected.stored_type or expected.rope_type
    has_original = stored in _TYPES_WITH_ORIGINAL
    want = _rope_fields(stored, expected.theta, expected.factor,
                        expected.original_max_position_embeddings if has_original else None,
                        expected.max_position_embeddings)
    got = _rope_fields(params.get("rope_type", "default"), params.get("rope_theta"), params.get("factor"),
                       params.get("original_max_position_embeddings") if has_original else None,
                       getattr(built, "max_position_embeddings", None))
    want.update(expected.extra)
    got.update({k: params.get(k) for k in expected.extra})
    diff = [f"{k} {_shown(got[k])} (written {_shown(v)})" for k, v in want.items()
            if (v is not None or k == "rope_type") and not _same(got[k], v)]
    if diff:
        raise InputError(f"'{label}': transformers' {type(built).__name__} reads {', '.join(diff)}; {what}")
