"""The attention variants of the gated-attention family and how a config says which one it is.

The config keys are the official code's (`headwise_attn_output_gate`, `elementwise_attn_output_gate`;
github.com/qiuzh20/gated_attention); neither set means the baseline (plain Qwen3).
"""

from __future__ import annotations

from typing import Any

from longctx.core.errors import InputError

VARIANTS = ("baseline", "elementwise", "headwise")


def gate_flags(variant: str) -> dict[str, bool]:
    """The config keys for an attention variant name."""
    if variant not in VARIANTS:
        raise InputError(f"unknown attention variant '{variant}'; choose one of {', '.join(VARIANTS)}")
    return {"elementwise_attn_output_gate": variant == "elementwise",
            "headwise_attn_output_gate": variant == "headwise"}


def attention_variant(config: Any) -> str:
    """'baseline', 'elementwise' or 'headwise' of a config: a config.json dict or a config object."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    if get("headwise_attn_output_gate"):
        return "headwise"
    if get("elementwise_attn_output_gate"):
        return "elementwise"
    return "baseline"


def attention_label(variant: str) -> str:
    """How `longctx info` and result files name a variant: baseline, gated-elementwise, gated-headwise."""
    return variant if variant == "baseline" else f"gated-{variant}"
