"""RoPE settings of a checkpoint config: read both formats, write the one transformers reads.

Config formats (transformers `modeling_rope_utils.py` and vLLM `config.py` @ the pinned versions):
- transformers 5: `"rope_parameters": {"rope_type", "rope_theta", "factor", "original_max_position_embeddings", ...}`
- legacy (4.x): top-level `rope_theta` plus `rope_scaling` (`null`, or a dict with `rope_type` or `type`).
transformers 5 reads both; when both are present a non-null `rope_scaling` replaces `rope_parameters`,
and a top-level `original_max_position_embeddings` overrides the dict's (HF 5.x and vLLM alike).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from longctx.core.errors import InputError
from longctx.core.units import parse_number

ConfigFormat = Literal["v5", "v4", "both"]
# RoPE types transformers implements (ROPE_INIT_FUNCTIONS, plus "default").
KNOWN_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# Types whose `original_max_position_embeddings` is the pre-extension training length.
_TYPES_WITH_ORIGINAL = ("yarn", "longrope", "llama3")


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

    @property
    def trained_length(self) -> int | None:
        """Length the model was trained at before any context scaling."""
        if self.rope_type in _TYPES_WITH_ORIGINAL:
            return self.original_max_position_embeddings
        return self.max_position_embeddings

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


def _default_theta(model_type: str | None) -> float | None:
    """The base transformers falls back to for this model type (None when it knows no such type)."""
    if not model_type:
        return None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return getattr(CONFIG_MAPPING[model_type], "default_theta", None)
    except KeyError:
        return None


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
    if rope_type in _TYPES_WITH_ORIGINAL:
        top = cfg.get("original_max_position_embeddings")
        original = top if top is not None else original if original is not None else max_pos
    return RopeSettings(
        rope_type=rope_type,
        theta=theta,
        max_position_embeddings=max_pos,
        factor=float(factor) if factor is not None else None,
        original_max_position_embeddings=int(original) if original is not None else None,
        extra=rope,
        config_format=fmt,
        theta_is_default=theta_is_default,
    )


def write_rope(cfg: dict[str, Any], rope: RopeSettings, config_format: ConfigFormat = "v5") -> dict[str, Any]:
    """A copy of `cfg` whose RoPE fields and max_position_embeddings say exactly `rope`.

    Every old RoPE field is removed first (a stale top-level `original_max_position_embeddings` would
    override the dict in transformers 5 and vLLM). "v5" is what the pinned transformers writes;
    "v4" is for transformers 4.x readers; "both" writes both (they agree).
    """
    out = copy.deepcopy(cfg)
    for key in ("rope_parameters", "rope_scaling", "rope_theta", "original_max_position_embeddings"):
        out.pop(key, None)
    if rope.max_position_embeddings is not None:
        out["max_position_embeddings"] = int(rope.max_position_embeddings)
    scaling: dict[str, Any] = {}
    if rope.factor is not None:
        scaling["factor"] = float(rope.factor)  # transformers warns on a non-float factor
    if rope.original_max_position_embeddings is not None:
        scaling["original_max_position_embeddings"] = int(rope.original_max_position_embeddings)
    scaling.update(rope.extra)
    if config_format in ("v5", "both"):
        out["rope_parameters"] = {"rope_type": rope.rope_type, "rope_theta": rope.theta, **scaling}
    if config_format in ("v4", "both"):
        out["rope_theta"] = rope.theta
        out["rope_scaling"] = {"rope_type": rope.rope_type, **scaling} if rope.rope_type != "default" else None
    return out


def set_rope_base(cfg: dict[str, Any], base: int | float, max_length: int,
                  config_format: ConfigFormat = "v5") -> tuple[dict[str, Any], RopeSettings]:
    """The config half of `extend`: a new RoPE base (ABF) and maximum length on an unscaled config."""
    rope = read_rope(cfg)
    if rope.rope_type != "default":
        raise InputError(
            f"this checkpoint uses RoPE type '{rope.rope_type}'; raise the base on the unscaled checkpoint "
            "(before YaRN), or remove the scaling from config.json first"
        )
    new = RopeSettings("default", parse_number(base), int(max_length), extra=rope.extra)
    return write_rope(cfg, new, config_format), new




def check_context(checkpoint: Path, rope: RopeSettings, longest: int) -> None:
    """InputError when `longest` tokens (prompt + generation) are beyond what the checkpoint can do; the
    message says which `longctx yarn` would make room."""
    ctx = rope.context_length
    if ctx is None or longest <= ctx:
        return
    base = rope.trained_length or ctx
    factor = 2 ** math.ceil(math.log2(longest / base))
    rescale = " --rescale" if rope.rope_type == "yarn" else ""
    raise InputError(f"length {longest} is beyond what '{checkpoint}' can do (context length {ctx} tokens, prompt + "
                     f"generation); extend it first: longctx yarn {checkpoint} --factor {factor}{rescale}")
