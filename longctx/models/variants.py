"""The attention variants of the gated-attention family by name, and how a config says which one it is.

A variant is a named row of the paper's gate design space (`longctx.models.gates.NAMED`: `baseline`,
`elementwise`, `headwise`, `head-shared`, ...) or any gate written as `field=value,...`; its config keys are
the official code's two flags (github.com/qiuzh20/gated_attention) for its two gates and `attn_gate` otherwise.
"""

from __future__ import annotations

from typing import Any

from longctx.models.gates import LEGACY_KEYS, NAMED, gate_name, gate_of, parse_gate

VARIANTS = tuple(NAMED)


def gate_flags(variant: str) -> dict[str, Any]:
    """The config keys for an attention variant (a name or `field=value,...`); the baseline's are the official
    flags, both false. InputError names what is wrong."""
    spec = parse_gate(variant)
    return {key: False for key in LEGACY_KEYS.values()} if spec is None else spec.as_config()


def attention_variant(config: Any) -> str:
    """The variant of a config.json dict or a config object: a name of `NAMED`, or the gate's fields."""
    return gate_name(gate_of(config))


def attention_label(variant: str) -> str:
    """How `longctx info` and result files name a variant: baseline, gated-elementwise, gated-headwise, ..."""
    return variant if variant == "baseline" else f"gated-{variant}"
