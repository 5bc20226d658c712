"""transformers' config classes by model type, longctx's gated family registered with them."""

from __future__ import annotations

from typing import Any


def config_class(model_type: Any) -> Any:
    """transformers' config class of `model_type` (or longctx's gated family's); None when it knows no such type."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    import longctx.models.gated_qwen3  # noqa: F401  (registers the gated family with the Auto classes)

    try:
        return CONFIG_MAPPING[model_type] if isinstance(model_type, str) and model_type else None
    except KeyError:
        return None


def known_model_type(model_type: Any) -> bool:
    """Whether transformers has a config class of its own (or longctx's gated family) for `model_type`."""
    return config_class(model_type) is not None
