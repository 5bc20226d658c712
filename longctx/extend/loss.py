"""Chunked linear cross-entropy: the LM-head projection and the loss, a chunk of tokens at a time.

At 32,768 tokens a full-vocabulary fp32 logits tensor is 32,768 x 151,936 x 4 B = 19.9 GB per sequence
(Qwen3's vocabulary). Here at most one chunk of logits exists at a time, and the gradients with respect to the
hidden states and the LM-head weight are computed in the forward, chunk by chunk, while that chunk's logits are
there (the loss is a scalar the backward only scales): the logits are never recomputed, so the loss costs what
an unchunked one does. This is the method of liger-kernel's `LigerFusedLinearCrossEntropyFunction`
(src/liger_kernel/ops/fused_linear_cross_entropy.py), which needs Triton; ProLong's `LOGIT_BLOCK_SIZE` and TRL's
`chunked_nll` chunk the same way but recompute each chunk's logits in the backward. The value equals transformers'
`ForCausalLMLoss` given `shift_labels`, times the number of predicted tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # transformers' label for "nothing to predict here"
DEFAULT_CHUNK_TOKENS = 2048


class _LinearCrossEntropy(torch.autograd.Function):
    """sum_t -log softmax(hidden[t] @ weight.T)[labels[t]], its gradients made in the forward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int):
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        w = None  # the weight in the dtype the products run in (autocast's when it is on), cast once, not per chunk
        for start in range(0, hidden.shape[0], chunk_tokens):
            h, y = hidden[start:start + chunk_tokens], labels[start:start + chunk_tokens]
            logits = F.linear(h, weight if w is None else w)
            if w is None:
                w = weight.to(logits.dtype)
            compute_dtype = w.dtype
            logits = logits.to(torch.promote_types(compute_dtype, torch.float32))  # the softmax in fp32 at least
            predicted = y != IGNORE_INDEX
            rows = predicted.nonzero().squeeze(1)
            lse = torch.logsumexp(logits, dim=-1)
            total += (lse[rows] - logits[rows, y[rows]]).sum()
            if not (need_hidden or need_weight):
                continue
            # d(sum of the chunk's token losses) / d logits = softmax - one_hot(label); zero where nothing is
            # predicted. Made in place of the logits: one chunk-sized buffer.
            d_logits = logits.sub_(lse.unsqueeze(1)).exp_()
            d_logits[rows, y[rows]] -= 1
            d_logits[~predicted] = 0
            d_logits = d_logits.to(compute_dtype)
            if need_hidden:
                grad_hidden[start:start + chunk_tokens] = d_logits @ w
            if need_weight:
                grad_weight += d_logits.t() @ h.to(compute_dtype)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (None if grad_hidden is None else grad_hidden * grad_total.to(grad_hidden.dtype),
                None if grad_weight is None else (grad_weight * grad_total).to(ctx.weight_dtype), None, None)


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, shift_labels: torch.Tensor,
                          chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Sum over tokens of -log p(shift_labels[t] | hidden[t]) with logits = hidden @ weight.T.

    `hidden` is [..., hidden_size], `shift_labels` the matching [...] (already shifted, IGNORE_INDEX
    where nothing is predicted). Returns an fp32 scalar *sum*: the caller divides by the number of
    predicted tokens of the whole optimizer step, so the loss is token-averaged over micro-batches and
    ranks rather than averaged per micro-batch. Differentiable once (no double backward).
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    return _LinearCrossEntropy.apply(h, weight, shift_labels.reshape(-1), chunk_tokens)
