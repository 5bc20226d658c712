"""The one model loader: a checkpoint into transformers, gated family registered, errors as one line."""

from __future__ import annotations

import os
from typing import Any

from longctx.core.errors import InputError


def load_model(path: str | os.PathLike, *, dtype: Any = "auto", device: str | None = None,
               attn_implementation: str | None = None, config: dict[str, Any] | None = None):
    """`AutoModelForCausalLM.from_pretrained(path)` in `dtype` ("auto": the checkpoint's; a name such as
    "float32"; or a torch dtype) on `device`, with `attn_implementation` [default: transformers'], and
    with `config` (a config.json dict) instead of the checkpoint's own when given."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import longctx.models.gated_qwen3  # noqa: F401  (registers the gated family with the Auto classes)

    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    kwargs: dict[str, Any] = {"dtype": torch_dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if config is not None:
        model_type = config.get("model_type")
        try:
            fields = {k: v for k, v in config.items() if k != "model_type"}
            kwargs["config"] = AutoConfig.for_model(model_type, **fields)
        except ValueError as e:
            raise InputError(f"checkpoint '{path}': unknown model_type {model_type!r} ({e})") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot load the model in '{path}': {first_line}") from None
    return model.to(device) if device is not None else model
