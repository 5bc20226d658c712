"""The types of the config.json keys longctx reads, checked before anything uses them.

transformers 5 checks config fields with strict dataclasses (huggingface_hub `strict`), but only when a
model is built, and vLLM and longctx's own arithmetic read the raw JSON before that: a string where a
number belongs would surface as a TypeError deep inside. JSON null means "not set" for every key here,
as in transformers' config classes.
"""

from __future__ import annotations

import json
import math
from typing import Any

from longctx.core.errors import InputError


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is a bool, never a count


def is_number(v: Any) -> bool:
    # Python's json module reads NaN and Infinity, which no length or base can be.
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_STRING = ("a string", lambda v: isinstance(v, str))
_BOOL = ("true or false", lambda v: isinstance(v, bool))
_NUMBER = ("a number", is_number)
_POSITIVE = ("a number > 0", lambda v: is_number(v) and v > 0)
_COUNT = ("a whole number > 0", lambda v: is_int(v) and v > 0)
_WHOLE = ("a whole number >= 0", lambda v: is_int(v) and v >= 0)
_NUMBERS = ("a list of numbers", lambda v: isinstance(v, list) and all(is_number(x) for x in v))
_OBJECT = ("an object or null", lambda v: isinstance(v, dict))
# a count, or one per layer (Gemma3nTextConfig's intermediate_size)
_COUNTS = ("a whole number > 0 or a list of them",
           lambda v: _COUNT[1](v) or (isinstance(v, list) and bool(v) and all(_COUNT[1](x) for x in v)))

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
    "vocab_size": _COUNT, "hidden_size": _COUNT, "intermediate_size": _COUNTS, "num_hidden_layers": _COUNT,
    "num_attention_heads": _COUNT, "num_key_value_heads": _COUNT, "head_dim": _COUNT,
    # 0 is no window (Qwen2MoeConfig saves `"sliding_window": 0` with use_sliding_window false)
    "sliding_window": _WHOLE, "max_window_layers": _WHOLE, "tie_word_embeddings": _BOOL, "use_sliding_window": _BOOL,
    "headwise_attn_output_gate": _BOOL, "elementwise_attn_output_gate": _BOOL,
    # the legacy names config classes read the base and partial rotation from (GPTNeoXConfig, Gemma3TextConfig,
    # ModernBertDecoderConfig, MiniMaxM2Config: their `convert_rope_params_to_dict`)
    "rotary_emb_base": _POSITIVE, "rotary_pct": _POSITIVE, "rope_local_base_freq": _POSITIVE,
    "global_rope_theta": _POSITIVE, "local_rope_theta": _POSITIVE, "rotary_dim": _COUNT,
}


def shown(value: Any) -> str:
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
            raise InputError(f"'{source}': {key} must be {expected}, got {shown(value)}")

    for key, spec in CONFIG_KEY_TYPES.items():
        if key == "sliding_window" and cfg.get("use_sliding_window") is False:
            continue  # switched off: the config class ignores it (Qwen2, Qwen2-MoE)
        check(key, cfg.get(key), spec)
    for group in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(group)
        for key, value in (rope or {}).items():
            if isinstance(value, dict):  # per-layer-type parameters
                for inner, v in value.items():
                    if inner in ROPE_KEY_TYPES:
                        check(f"{group}.{key}.{inner}", v, ROPE_KEY_TYPES[inner])
            elif key in ROPE_KEY_TYPES:
                check(f"{group}.{key}", value, ROPE_KEY_TYPES[key])
