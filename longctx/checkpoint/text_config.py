"""The language model's part of a config: composite checkpoints (Gemma-3 4B and up, Llama-4, Mistral-3 and
Ministral-3, Qwen2.5-VL and Qwen3-VL, most 2025-26 releases) keep it under a key of their config.json
(`text_config`), and transformers reads their RoPE, lengths, sliding windows and layer types there
(`PreTrainedConfig.get_text_config(decoder=True)`, configuration_utils.py @ 5.19; vLLM's `get_text_config`
alike). Whatever reads or writes those settings takes that part (`text_config`) and puts it back in place
(`with_text_config`): the wrapper and the vision parts stay as they were, byte for byte.
"""

from __future__ import annotations

import copy
from typing import Any

from longctx.checkpoint.classes import config_class

# The names `get_text_config(decoder=True)` looks for, in its order.
TEXT_CONFIG_NAMES = ("decoder", "generator", "text_config")


def _sub_configs(model_type: Any) -> dict[str, Any]:
    """{name: config class} of the sub-configs of `model_type`'s transformers config class ({} when it has none
    or transformers knows no such type)."""
    return dict(getattr(config_class(model_type), "sub_configs", None) or {})


def text_config_key(cfg: dict[str, Any]) -> str | None:
    """The key of config.json dict `cfg` under which its language model's config is (None: `cfg` is the
    language model's own): the first of `TEXT_CONFIG_NAMES` that its config class has as a sub-config, or (a
    config class transformers does not know) that `cfg` holds as a dict."""
    subs = _sub_configs(cfg.get("model_type"))
    return next((n for n in TEXT_CONFIG_NAMES if n in subs or isinstance(cfg.get(n), dict)), None)


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of config.json dict `cfg` (`cfg` itself when it is one), with the model_type
    of the sub-config class filled in where the file leaves it out."""
    key = text_config_key(cfg)
    if key is None:
        return cfg
    text = dict(cfg[key]) if isinstance(cfg.get(key), dict) else {}
    if "model_type" not in text:
        model_type = getattr(_sub_configs(cfg.get("model_type")).get(key), "model_type", None)
        if isinstance(model_type, str) and model_type:
            text["model_type"] = model_type
    return text


def with_text_config(cfg: dict[str, Any], text: dict[str, Any]) -> dict[str, Any]:
    """A copy of `cfg` whose language model's config is `text` (`text` itself when `cfg` is a language model's
    own); a model_type `text_config` filled in is left out again."""
    key = text_config_key(cfg)
    if key is None:
        return text
    out = copy.deepcopy(cfg)
    old = cfg.get(key)
    if not (isinstance(old, dict) and "model_type" in old):
        text = {k: v for k, v in text.items() if k != "model_type"}
    out[key] = text
    return out


def built_text_config(built: Any) -> Any:
    """The language model's part of a transformers config object (the object itself when it is one)."""
    get = getattr(built, "get_text_config", None)
    return get(decoder=True) if callable(get) else built
