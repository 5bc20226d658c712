"""`sinks.json`: the results schema of `longctx sinks` (read by `longctx.report`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from longctx.core.errors import InputError
from longctx.core.files import read_versioned_json
from longctx.info.describe import ModelInfo

SINKS_FORMAT = "longctx-sinks/1"
SINKS_FILE = "sinks.json"
SINKS_KIND = "sinks measurement"  # its `longctx.core.files` output marker
GATE_BINS = 10_000  # histogram bins over [0, 1] for the gate median (error <= 1/GATE_BINS)

DEFINITIONS = {
    "first_token_attention": "mean attention probability on token 0 over heads, query positions 1..L-1 "
                             "(position 0 excluded: it attends only to itself) and windows; per layer, "
                             "and averaged over layers; probabilities are the layer's own (after its logit "
                             "soft-cap, if any), and in a sliding-window layer a query at position >= window "
                             "cannot see token 0, so it counts as 0",
    "m_act": "max |hidden state| of each decoder layer's output (the residual stream) over tokens and "
             "channels of a window, averaged over windows (m_act_max: the max over windows); per layer, "
             "and averaged over layers",
    "gate": "gate scores as applied (after the activation; a head-shared gate's mean over heads) over tokens, "
            f"dims and windows: mean, median (from a histogram of {GATE_BINS} bins over [0, 1]), fraction below "
            "0.1 and below 0.5; per layer, per head of the gated tensor, and over all layers; null for a model "
            "without gate scores (the baseline, a parameter-free non-linearity); gate_reported says what they "
            "are for this model's gate",
    "loss": "mean next-token cross-entropy in nats over the windows' positions 1..L-1, each predicted from the "
            "tokens before it (token 0 is never predicted), and perplexity = exp(mean); null, with a note, when "
            "the model's own logits could not be reproduced from its final hidden states; held-out only on "
            "text the model was not trained on",
}


class LossResults(TypedDict):
    mean: float | None  # nats per predicted token
    perplexity: float | None
    tokens: int  # predicted tokens
    note: str | None  # why there is no loss


class GateStats(TypedDict):
    variant: str  # the attention variant (`longctx.models.variants`): elementwise, headwise, head-shared, ...
    heads: NotRequired[str]  # whose heads per_head is over: query heads, key/value heads, all heads (shared), ...
    mean: list[float]  # per layer
    median: list[float]
    below_0_1: list[float]
    below_0_5: list[float]
    per_head: dict[str, list[list[float]]]  # stat name (as above) -> [layer][head]


class SinksResults(TypedDict):
    """`sinks.json`. Per-layer lists are indexed by layer (0 = closest to the embeddings)."""

    format: str
    model: ModelInfo
    # data, tokens asked, windows, length, tokens used, BOS, batch, chunk, dtype, device; attn_implementation
    # (the transformers backend the forward ran: "sdpa", or "eager" for soft-capped layers; a per-layer list if
    # layers differ), sliding_window and attn_logit_softcapping per layer (null: none)
    settings: dict[str, Any]
    definitions: dict[str, str]
    layers: int
    heads: int
    kv_heads: int
    first_token_attention: list[float]
    first_token_attention_per_head: list[list[float]]  # [layer][head]
    m_act: list[float]
    m_act_max: list[float]
    gate: GateStats | None
    gate_reported: NotRequired[str | None]  # what the gate statistics are for this gate (None: no gate)
    # first_token_attention, m_act (means over layers); gate_mean, gate_median, gate_below_0_1,
    # gate_below_0_5 over all layers (null without a gate)
    averages: dict[str, float | None]
    loss: NotRequired[LossResults]  # absent in files written before longctx measured it
    versions: dict[str, str | None]
    timings: dict[str, float]
    created: str


def load_sinks(path: str | os.PathLike) -> SinksResults:
    """A sinks.json (or the directory holding one), or InputError saying what is wrong."""
    p = Path(path)
    if p.is_dir():
        p = p / SINKS_FILE
    if not p.is_file():
        raise InputError(f"{p} does not exist; run 'longctx sinks CKPT -o DIR' first")
    return read_versioned_json(p, SINKS_FORMAT, "sinks")  # type: ignore[return-value]
