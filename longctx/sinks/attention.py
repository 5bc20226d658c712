"""The measurements of `longctx sinks` during an ordinary forward, without an attention matrix.

First-token attention comes from transformers' attention-function interface: `register_attention()` registers
`sinks_attention_forward` as the implementation "longctx_sinks", and a model loaded with it hands every attention
layer's query (B, H, L, D) and key (B, KV, L, D) to that function exactly as it would hand them to SDPA: after the
layer's own projections, QK-norm (if any) and RoPE (YaRN's attention scaling included, as it sits in cos/sin),
whatever the architecture. So nothing here knows an architecture, and the layer's scaling, logit soft-cap and
sliding window come in the same call. The function computes p(token 0 | query i) = exp(s_i0 - logsumexp_{j visible}
s_ij) for chunks of queries (GQA: each query head uses its KV head) and then returns what transformers' own backend
returns, so the forward is the model's: SDPA, or the model's eager attention for a layer with logit soft-capping,
which SDPA cannot apply (transformers' SDPA path silently drops the cap). Memory: one layer's q and k in fp32 and
one score chunk.

M-Act and the gate statistics come from forward hooks on the decoder layers and on `gate_score`
(`longctx.models.gated_qwen3`), reduced to sums as the forward goes, so nothing per layer outlives the layer.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

from longctx.checkpoint.text_config import built_text_config
from longctx.core.errors import InputError
from longctx.models.gates import GateSpec, gate_of
from longctx.models.variants import attention_variant
from longctx.sinks.schema import GATE_BINS

ATTN_IMPLEMENTATION = "longctx_sinks"  # the name the attention function is registered under in transformers
SCORE_BUDGET_BYTES = 256 * 2**20  # fp32 scores of one query chunk (all heads, all windows of a batch)
# Attention-function arguments that change the softmax in ways first_token_probs does not model
_UNMODELLED = {"s_aux": "learned sink logits (s_aux)", "position_bias": "an additive position bias"}

_active: Collector | None = None  # the collector the registered function feeds; None: it only runs the backend


def first_token_probs(query, key, scaling: float, chunk: int | None = None, *, softcap: float | None = None,
                      window: int | None = None):
    """p(token 0 | query i) of causal softmax attention, without materialising the L x L matrix.

    query (B, H, L, D) and key (B, KV, L, D), both after QK-norm and RoPE (as the attention backend
    receives them); H a multiple of KV (query head h uses KV head h // (H/KV), transformers'
    `repeat_kv`). Scores s = q.k * scaling, soft-capped to softcap * tanh(s / softcap) when `softcap` is
    given (Gemma 2), are computed in fp32 for `chunk` queries at a time against the keys they may see:
    p = exp(s_i0 - logsumexp_j s_ij). With a sliding `window`, query i sees key j iff 0 <= i - j < window
    (transformers' `sliding_window_causal_mask_function`): a query i < window sees all of 0..i, exactly as
    under full attention, and a query i >= window does not see token 0, so its probability is 0 and no
    scores are computed for it. Returns (B, H, L) fp32.

    Memory beyond q and k: fp32 copies of q and k (B*L*(H+KV)*D*4 bytes) plus ~2 score buffers of
    B*H*chunk*L*4 bytes; `chunk` defaults to the largest that keeps one buffer under 256 MiB.
    """
    import torch

    b, h, n, d = query.shape
    kv = key.shape[1]
    if chunk is None:
        chunk = max(1, min(n, SCORE_BUDGET_BYTES // (4 * b * h * n)))
    if window is not None and window < 1:
        raise ValueError(f"sliding window {window}: a query must see at least itself (window >= 1)")
    q = query.float().reshape(b, kv, h // kv, n, d)
    k = key.float().unsqueeze(2)  # (B, KV, 1, L, D): broadcast over the query heads of each group
    out = q.new_zeros(b, kv, h // kv, n)
    pos = torch.arange(n, device=q.device)
    sees_token_0 = n if window is None else min(n, window)  # queries 0..sees_token_0-1
    for start in range(0, sees_token_0, chunk):
        stop = min(sees_token_0, start + chunk)
        scores = torch.matmul(q[..., start:stop, :], k[..., :stop, :].transpose(-1, -2)) * scaling
        if softcap is not None:
            scores.div_(softcap).tanh_().mul_(softcap)
        scores.masked_fill_(pos[None, :stop] > pos[start:stop, None], float("-inf"))
        out[..., start:stop] = torch.exp(scores[..., 0] - torch.logsumexp(scores, dim=-1))
    return out.reshape(b, h, n)


def register_attention() -> str:
    """Register `sinks_attention_forward` (and SDPA's masks) under ATTN_IMPLEMENTATION; returns that name,
    for `from_pretrained(..., attn_implementation=...)`. Idempotent."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, sinks_attention_forward)
    # transformers builds no mask at all for an implementation without a mask function, which would turn
    # sliding-window layers into full ones; the SDPA forward this delegates to takes SDPA's masks.
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION


def sinks_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, **kwargs):
    """transformers' attention-function signature: feeds the active Collector, then returns the backend's output
    (`sdpa_attention_forward`, or the model's `eager_attention_forward` for a soft-capped layer)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    softcap = kwargs.get("softcap")
    # the kwarg is what the layer's mask was built with (config.sliding_window for Mistral, which keeps no attribute)
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    if _active is not None:
        _active.attention(module, query, key, scaling, softcap, window, kwargs)
    if softcap is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    mask = _additive_mask(attention_mask, query, key, window)
    return _eager_attention(type(module))(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                          **kwargs)


def _backend(softcap: float | None) -> str:
    """The transformers attention implementation whose computation the forward runs for a layer."""
    return "sdpa" if softcap is None else "eager"


@functools.cache
def _eager_attention(cls):
    """The `eager_attention_forward` of the modeling file that defines `cls` (or a base class) and applies `softcap`."""

    for c in cls.__mro__:
        fn = getattr(sys.modules.get(c.__module__), "eager_attention_forward", None)
        if fn is not None and "softcap" in inspect.signature(fn).parameters:
            return fn
    raise InputError(f"{cls.__name__} soft-caps its attention logits, which SDPA cannot do, and its modeling file has "
                     "no eager_attention_forward that applies the cap; longctx sinks cannot run this model")


def _additive_mask(mask, query, key, window: int | None):
    """The float mask (0 where a key is seen, the dtype's minimum elsewhere) that eager attention adds to its scores,
    as transformers' `eager_mask` makes it, from SDPA's mask: boolean, or None for plain causal attention (and for a
    sliding window no shorter than the keys), where SDPA relies on `is_causal`."""
    import torch

    if mask is not None and mask.dtype != torch.bool:
        return mask
    if mask is None:
        q_len, kv_len = query.shape[2], key.shape[2]
        i = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]  # query positions among the keys
        j = torch.arange(kv_len, device=query.device)[None, :]
        mask = (j <= i) if window is None else (j <= i) & (i - j < window)
        mask = mask[None, None]
    return torch.where(mask, torch.tensor(0.0, device=mask.device, dtype=query.dtype), torch.finfo(query.dtype).min)


def decoder(model):
    """The language model's decoder stack of `model` (embeddings, `layers`, final norm): its `base_model`, of a
    composite model (Gemma-3's vision-language one) the language model inside it (`get_decoder`, transformers'
    own lookup)."""
    get = getattr(model, "get_decoder", None)
    try:
        found = get() if callable(get) else None
    except Exception:  # noqa: BLE001 - transformers raises for models it has no rule for
        found = None
    return found if found is not None and hasattr(found, "layers") else model.base_model


class Collector:
    """Sums of every layer's measurements as the forward goes, for a model loaded with
    attn_implementation=ATTN_IMPLEMENTATION; one collector is active at a time, from construction to `close()`."""

    def __init__(self, model, chunk: int | None):
        global _active
        import torch

        self.torch, self.chunk = torch, chunk
        layers = list(decoder(model).layers)
        config = built_text_config(model.config)
        self.n_layers, self.heads = len(layers), config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.model_name = type(model).__name__
        device = next(model.parameters()).device
        self.fta_sum = torch.zeros(self.n_layers, self.heads, dtype=torch.float64, device=device)
        self.fta_count = [0] * self.n_layers  # query positions counted per head (windows x (L-1))
        # per layer, as the attention function saw it: backend, sliding window, logit soft-cap
        self.attn_settings: list[dict[str, Any] | None] = [None] * self.n_layers
        self.m_act: list[list] = [[] for _ in layers]  # per layer: per-window maxima (tensors)
        self.variant = attention_variant(model.config)
        spec = gate_of(model.config)
        self.scored = spec is not None and spec.kind == "gate"  # a parameter-free non-linearity has no scores
        # the heads the recorded scores have, and whose they are
        self.gate_heads, self.gate_heads_are = (spec.scored_heads(self.heads, self.kv_heads) if self.scored
                                                else (0, None))
        self.gate_reported = gate_reported(spec)
        if self.scored:
            z = lambda dt: torch.zeros(self.n_layers, self.gate_heads, dtype=dt, device=device)
            self.g_sum, self.g_n = z(torch.float64), z(torch.int64)
            self.g_01, self.g_05 = z(torch.int64), z(torch.int64)
            self.g_hist = torch.zeros(self.n_layers, self.gate_heads, GATE_BINS, dtype=torch.int64, device=device)
        self.handles = []
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_hook(lambda _m, _i, out, i=i: self._layer_output(i, out)))
            if self.scored:
                self.handles.append(layer.self_attn.gate_score.register_forward_hook(
                    lambda _m, _i, out, i=i: self._gate(i, out)))
        _active = self

    def close(self):
        global _active
        for h in self.handles:
            h.remove()
        if _active is self:
            _active = None

    def attention(self, module, query, key, scaling: float | None, softcap: float | None, window: int | None,
                  kwargs: dict[str, Any]):
        """One layer's call of the attention function: add its first-token probabilities to the sums."""
        name = type(module).__name__
        i = getattr(module, "layer_idx", None)
        if not isinstance(i, int) or not 0 <= i < self.n_layers:
            raise InputError(f"{name} has layer_idx {i!r}, not a layer of the {self.n_layers} in its decoder's layers; "
                             "longctx sinks needs each attention module's layer index")
        for arg, what in _UNMODELLED.items():
            if kwargs.get(arg) is not None:
                raise InputError(f"{name} adds {what} to its attention scores, which longctx sinks does not model; "
                                 "it measures plain causal softmax attention")
        if not kwargs.get("is_causal", getattr(module, "is_causal", True)):
            raise InputError(f"{name} attends bidirectionally; longctx sinks measures causal decoders")
        if query.shape[2] != key.shape[2] or query.shape[1] != self.heads:
            raise InputError(f"{name} of layer {i} got {query.shape[1]} query heads x {query.shape[2]} positions "
                             f"against {key.shape[2]} keys; longctx sinks needs {self.heads} heads over the window")
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling  # what SDPA and eager then use
        p = first_token_probs(query, key, scaling, self.chunk, softcap=softcap, window=window)
        self.fta_sum[i] += p[:, :, 1:].sum(dim=(0, 2), dtype=self.torch.float64)
        self.fta_count[i] += p.shape[0] * (p.shape[2] - 1)
        self.attn_settings[i] = {"attn_implementation": _backend(softcap), "sliding_window": window,
                                 "softcap": softcap}

    def check_seen(self):
        """InputError unless every layer went through the attention function (after a forward)."""
        missing = [i for i, n in enumerate(self.fta_count) if n == 0]
        if missing:
            raise InputError(f"{self.model_name} did not call transformers' attention-function interface in layer(s) "
                             f"{', '.join(map(str, missing))}; longctx sinks reads models whose attention goes "
                             "through it (attn_implementation)")

    def attention_settings(self) -> dict[str, Any]:
        """What the forward computed, for sinks.json's settings: the transformers attention implementation it ran
        (one name when every layer agrees, else one per layer), and per layer the sliding window (null: full causal
        attention) and the attention logit soft-cap (null: none) that the numbers include."""
        self.check_seen()
        layers = [s or {} for s in self.attn_settings]
        impl = [s["attn_implementation"] for s in layers]
        return {"attn_implementation": impl[0] if len(set(impl)) == 1 else impl,
                "sliding_window": [s["sliding_window"] for s in layers],
                "attn_logit_softcapping": [s["softcap"] for s in layers]}

    def _layer_output(self, i: int, out):
        hidden = out[0] if isinstance(out, tuple) else out
        self.m_act[i].append(hidden.detach().abs().amax(dim=(1, 2)).float())

    def _gate(self, i: int, out):
        torch = self.torch
        scores = out.detach().float()
        scores = scores.reshape(*scores.shape[:2], self.gate_heads, -1)  # (B, L, heads, D or 1)
        for h in range(self.gate_heads):  # one head at a time bounds the histogram's index buffer
            x = scores[:, :, h]
            self.g_sum[i, h] += x.sum(dtype=torch.float64)
            self.g_n[i, h] += x.numel()
            self.g_01[i, h] += (x < 0.1).sum()
            self.g_05[i, h] += (x < 0.5).sum()
            bins = (x * GATE_BINS).long().clamp_(0, GATE_BINS - 1).flatten()
            self.g_hist[i, h] += torch.bincount(bins, minlength=GATE_BINS)

    def summary(self) -> dict[str, Any]:
        torch = self.torch
        self.check_seen()
        counts = torch.tensor(self.fta_count, dtype=torch.float64, device=self.fta_sum.device)
        fta_heads = (self.fta_sum / counts[:, None]).cpu()
        maxima = [torch.cat(m).cpu() for m in self.m_act]
        out: dict[str, Any] = {
            "first_token_attention": fta_heads.mean(dim=1).tolist(),
            "first_token_attention_per_head": fta_heads.tolist(),
            "m_act": [m.mean().item() for m in maxima],
            "m_act_max": [m.max().item() for m in maxima],
            "gate": None,
        }
        out["gate_reported"] = self.gate_reported
        if self.scored:
            s, n, b01, b05, hist = (t.cpu() for t in (self.g_sum, self.g_n, self.g_01, self.g_05, self.g_hist))
            per_head = {"mean": s / n, "median": _hist_median(hist), "below_0_1": b01 / n, "below_0_5": b05 / n}
            layer = {"mean": s.sum(1) / n.sum(1), "median": _hist_median(hist.sum(1)),
                     "below_0_1": b01.sum(1) / n.sum(1), "below_0_5": b05.sum(1) / n.sum(1)}
            total = {"mean": s.sum() / n.sum(), "median": _hist_median(hist.sum((0, 1))),
                     "below_0_1": b01.sum() / n.sum(), "below_0_5": b05.sum() / n.sum()}
            out["gate"] = {"variant": self.variant, "heads": self.gate_heads_are,
                           **{k: v.tolist() for k, v in layer.items()},
                           "per_head": {k: v.tolist() for k, v in per_head.items()}}
            out["gate_total"] = {k: float(v) for k, v in total.items()}
        return out


def gate_reported(spec: GateSpec | None) -> str | None:
    """What sinks.json's gate statistics are for this gate (None: no gate)."""
    if spec is None:
        return None
    if spec.kind != "gate":
        return (f"no gate scores: the parameter-free {spec.kind} non-linearity at G1 has none (first-token attention "
                "and M-Act as for any model)")
    bounded = spec.activation in ("sigmoid", "ns-sigmoid")
    what = (f"the {spec.activation} scores {'multiplying' if spec.form == 'multiplicative' else 'added to'} the "
            f"{spec.position} tensor, as applied (a head-shared gate's mean over heads)")
    if spec.form == "additive":
        return what + (": an added term, not a scaling, so the shares below 0.1 and 0.5 say how much is added, not "
                       "how sparse")
    if not bounded:
        return what + f": {spec.activation} is not bounded to [0, 1], so the median is of the scores clamped to [0, 1]"
    return what + ": in [0, 1], so the shares below 0.1 and 0.5 are the gate's sparsity (the paper's Fig. 5)"


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
