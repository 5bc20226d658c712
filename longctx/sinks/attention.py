"""The measurements of `longctx sinks` during an ordinary forward, without an attention matrix.

Hooks take each layer's queries and keys after QK-norm (q_norm/k_norm outputs), apply the layer's own
RoPE from the cos/sin the layer receives (YaRN's attention scaling is already inside cos/sin, so inside
q and k, exactly as in the model), and compute p(token 0 | query i) = exp(s_i0 - logsumexp_{j<=i} s_ij),
s = q.k * scaling, for chunks of queries (GQA: each query head uses its KV head). Memory: one layer's
q and k and one score chunk, whatever the attention backend.
"""

from __future__ import annotations

from typing import Any

from longctx.models.variants import attention_variant
from longctx.sinks.schema import GATE_BINS

SCORE_BUDGET_BYTES = 256 * 2**20  # fp32 scores of one query chunk (all heads, all windows of a batch)


def first_token_probs(query, key, scaling: float, chunk: int | None = None):
    """p(token 0 | query i) of causal softmax attention, without materialising the L x L matrix.

    query (B, H, L, D) and key (B, KV, L, D), both after QK-norm and RoPE (as the attention backend
    receives them); H a multiple of KV (query head h uses KV head h // (H/KV), transformers'
    `repeat_kv`). Scores are computed in fp32 for `chunk` queries at a time against the keys they may
    see (j <= i): p = exp(s_i0 - logsumexp_{j<=i} s_ij). Returns (B, H, L) fp32.

    Memory beyond q and k: fp32 copies of q and k (B*L*(H+KV)*D*4 bytes) plus ~2 score buffers of
    B*H*chunk*L*4 bytes; `chunk` defaults to the largest that keeps one buffer under 256 MiB.
    """
    import torch

    b, h, n, d = query.shape
    kv = key.shape[1]
    if chunk is None:
        chunk = max(1, min(n, SCORE_BUDGET_BYTES // (4 * b * h * n)))
    q = query.float().reshape(b, kv, h // kv, n, d)
    k = key.float().unsqueeze(2)  # (B, KV, 1, L, D): broadcast over the query heads of each group
    out = q.new_empty(b, kv, h // kv, n)
    pos = torch.arange(n, device=q.device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        scores = torch.matmul(q[..., start:stop, :], k[..., :stop, :].transpose(-1, -2)) * scaling
        scores.masked_fill_(pos[None, :stop] > pos[start:stop, None], float("-inf"))
        out[..., start:stop] = torch.exp(scores[..., 0] - torch.logsumexp(scores, dim=-1))
    return out.reshape(b, h, n)


class Collector:
    """Forward hooks on a Qwen3-architecture decoder stack that reduce each layer's tensors to sums
    as the forward goes, so nothing per layer outlives the layer (memory: one layer's q and k)."""

    def __init__(self, model, chunk: int | None):
        import torch
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

        self.torch, self.rope, self.chunk = torch, apply_rotary_pos_emb, chunk
        layers = list(model.base_model.layers)
        attn = layers[0].self_attn
        self.n_layers, self.heads = len(layers), attn.config.num_attention_heads
        self.kv_heads = attn.config.num_key_value_heads
        device = next(model.parameters()).device
        self.fta_sum = torch.zeros(self.n_layers, self.heads, dtype=torch.float64, device=device)
        self.fta_count = 0  # query positions counted per head (windows x (L-1))
        self.m_act: list[list] = [[] for _ in layers]  # per layer: per-window maxima (tensors)
        self.variant = attention_variant(model.config)
        if self.variant != "baseline":
            z = lambda dt: torch.zeros(self.n_layers, self.heads, dtype=dt, device=device)  # noqa: E731
            self.g_sum, self.g_n = z(torch.float64), z(torch.int64)
            self.g_01, self.g_05 = z(torch.int64), z(torch.int64)
            self.g_hist = torch.zeros(self.n_layers, self.heads, GATE_BINS, dtype=torch.int64, device=device)
        self._qk: dict[str, Any] = {}
        self.handles = []
        for i, layer in enumerate(layers):
            a = layer.self_attn
            self.handles += [
                a.q_norm.register_forward_hook(lambda _m, _i, out: self._qk.__setitem__("q", out)),
                a.k_norm.register_forward_hook(lambda _m, _i, out: self._qk.__setitem__("k", out)),
                a.register_forward_hook(lambda m, _a, kw, _o, i=i: self._attention(i, m, kw), with_kwargs=True),
                layer.register_forward_hook(lambda _m, _i, out, i=i: self._layer_output(i, out)),
            ]
            if self.variant != "baseline":
                self.handles.append(a.gate_score.register_forward_hook(lambda _m, _i, out, i=i: self._gate(i, out)))

    def close(self):
        for h in self.handles:
            h.remove()

    def _attention(self, i: int, module, kwargs):
        # q_norm/k_norm outputs are (B, L, heads, D); the attention transposes them to (B, heads, L, D)
        # before RoPE, and so do we: the same function on the same cos/sin gives the same q and k.
        q, k = self._qk.pop("q").transpose(1, 2), self._qk.pop("k").transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        q, k = self.rope(q, k, cos, sin)
        p = first_token_probs(q, k, module.scaling, self.chunk)
        self.fta_sum[i] += p[:, :, 1:].sum(dim=(0, 2), dtype=self.torch.float64)
        if i == 0:
            self.fta_count += p.shape[0] * (p.shape[2] - 1)

    def _layer_output(self, i: int, out):
        hidden = out[0] if isinstance(out, tuple) else out
        self.m_act[i].append(hidden.detach().abs().amax(dim=(1, 2)).float())

    def _gate(self, i: int, out):
        torch = self.torch
        scores = out.detach().float()
        scores = scores.reshape(*scores.shape[:2], self.heads, -1)  # (B, L, heads, D or 1)
        for h in range(self.heads):  # one head at a time bounds the histogram's index buffer
            x = scores[:, :, h]
            self.g_sum[i, h] += x.sum(dtype=torch.float64)
            self.g_n[i, h] += x.numel()
            self.g_01[i, h] += (x < 0.1).sum()
            self.g_05[i, h] += (x < 0.5).sum()
            bins = (x * GATE_BINS).long().clamp_(0, GATE_BINS - 1).flatten()
            self.g_hist[i, h] += torch.bincount(bins, minlength=GATE_BINS)

    def summary(self) -> dict[str, Any]:
        torch = self.torch
        fta_heads = (self.fta_sum / self.fta_count).cpu()
        maxima = [torch.cat(m).cpu() for m in self.m_act]
        out: dict[str, Any] = {
            "first_token_attention": fta_heads.mean(dim=1).tolist(),
            "first_token_attention_per_head": fta_heads.tolist(),
            "m_act": [m.mean().item() for m in maxima],
            "m_act_max": [m.max().item() for m in maxima],
            "gate": None,
        }
        if self.variant != "baseline":
            s, n, b01, b05, hist = (t.cpu() for t in (self.g_sum, self.g_n, self.g_01, self.g_05, self.g_hist))
            per_head = {"mean": s / n, "median": _hist_median(hist), "below_0_1": b01 / n, "below_0_5": b05 / n}
            layer = {"mean": s.sum(1) / n.sum(1), "median": _hist_median(hist.sum(1)),
                     "below_0_1": b01.sum(1) / n.sum(1), "below_0_5": b05.sum(1) / n.sum(1)}
            total = {"mean": s.sum() / n.sum(), "median": _hist_median(hist.sum((0, 1))),
                     "below_0_1": b01.sum() / n.sum(), "below_0_5": b05.sum() / n.sum()}
            out["gate"] = {"variant": self.variant, **{k: v.tolist() for k, v in layer.items()},
                           "per_head": {k: v.tolist() for k, v in per_head.items()}}
            out["gate_total"] = {k: float(v) for k, v in total.items()}
        return out


def _hist_median(hist):
    """Median of values in [0, 1] from counts in GATE_BINS equal bins (last dim), linear within a bin."""
    import torch

    hist = hist.double()
    cum = hist.cumsum(-1)
    half = cum[..., -1:] / 2
    idx = torch.searchsorted(cum.contiguous(), half).clamp_(max=hist.shape[-1] - 1)
    below = torch.where(idx > 0, cum.gather(-1, (idx - 1).clamp(min=0)), torch.zeros_like(half))
    inside = hist.gather(-1, idx).clamp(min=1)
    return ((idx + (half - below) / inside) / hist.shape[-1]).squeeze(-1)
