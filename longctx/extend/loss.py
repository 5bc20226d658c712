"""Chunked cross-entropy: the LM-head projection and the loss, a chunk of tokens at a time.

At 32,768 tokens a full-vocabulary fp32 logits tensor is 32,768 x 151,936 x 4 B = 19.9 GB per sequence
(Qwen3's vocabulary). Here each chunk's logits live only inside `torch.utils.checkpoint`: the
forward keeps the loss, the backward recomputes the chunk's logits, so at most one chunk of logits
(and its gradient) exists at a time. Same idea as ProLong's `LOGIT_BLOCK_SIZE=2048` and TRL's
`loss_type="chunked_nll"`; the value equals transformers' `ForCausalLMLoss` given `shift_labels`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # transformers' label for "nothing to predict here"
DEFAULT_CHUNK_TOKENS = 2048


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()  # fp32 for the softmax even when the model runs in bf16
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, shift_labels: torch.Tensor,
                          chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Sum over tokens of -log p(shift_labels[t] | hidden[t]) with logits = hidden @ weight.T.

    `hidden` is [..., hidden_size], `shift_labels` the matching [...] (already shifted, IGNORE_INDEX
    where nothing is predicted). Returns an fp32 scalar *sum*: the caller divides by the number of
    predicted tokens of the whole optimizer step, so the loss is token-averaged over micro-batches and
    ranks rather than averaged per micro-batch.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    y = shift_labels.reshape(-1)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, h.shape[0], chunk_tokens):
        stop = start + chunk_tokens
        total = total + checkpoint(_chunk_loss_sum, h[start:stop], weight, y[start:stop], use_reentrant=False)
    return total
