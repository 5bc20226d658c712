"""The gate arithmetic both model implementations share (transformers' `gated_qwen3` and vLLM's
`vllm_gated_qwen3`): activations, the scores module hooks read, and how scores scale or shift a tensor."""

from __future__ import annotations

import torch
from torch import nn

from longctx.models.gates import GateSpec

ACTIVATIONS = {"sigmoid": torch.sigmoid, "silu": nn.functional.silu, "identity": lambda x: x,
               "ns-sigmoid": lambda x: 0.5 + 0.5 * torch.sigmoid(x)}


class GateScore(nn.Module):
    """act(gate logits), averaged over the heads for a head-shared gate; a module of its own so hooks can read
    (or replace) the scores as they are applied: (..., width), or (..., width / heads) when shared."""

    def __init__(self, activation: str = "sigmoid", shared_heads: int = 0):
        super().__init__()
        self.activation, self.shared_heads = activation, shared_heads

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        scores = ACTIVATIONS[self.activation](logits)
        if self.shared_heads:
            scores = scores.view(*scores.shape[:-1], self.shared_heads, -1).mean(dim=-2)
        return scores


def apply_gate(spec: GateSpec, y: torch.Tensor, scores: torch.Tensor, head_dim: int) -> torch.Tensor:
    """`y` scaled (multiplicative) or shifted (additive) by `scores` (`GateScore`'s output). `y` is (..., heads,
    head_dim), its scores (..., heads * head_dim | heads) or, shared, (..., head_dim | 1); or, at G5, `y` is
    (..., hidden) as its scores."""
    if spec.position != "dense":
        per_head = head_dim if spec.granularity == "elementwise" else 1
        scores = scores.view(*scores.shape[:-1], 1 if spec.heads == "shared" else -1, per_head)
    return y * scores if spec.form == "multiplicative" else y + scores
