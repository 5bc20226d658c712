"""Gated attention (Qiu et al. 2025, "Gated Attention for LLMs", arXiv 2505.06708) on Qwen3, in transformers.

The default gate is position G1 of the paper: `Y' = Y * sigmoid(X W_g)`, where X is the `input_layernorm`
output that also feeds q/k/v, and Y is each head's attention output before the heads are concatenated
and fed to `o_proj`. The gate gets no norm and no RoPE. Every other point of the paper's design space
(positions G2-G5, headwise, head-shared, additive, other activations, input-independent scores, and the
parameter-free SiLU and per-head RMSNorm) is a `GateSpec` (`longctx.models.gates`), applied by `_gated`.

Weights are Qwen3's plus, per layer, what the gate needs: `model.layers.{i}.self_attn.g_proj.weight` for a gate
from X (head-major: row `h*head_dim + e` gates dimension e of head h, row `h` head h when headwise; the heads are
the query heads at G1/G4 and the key/value heads at G2/G3; `hidden` rows at G5), `self_attn.gate_logits` for an
input-independent one, `self_attn.head_norm.weight` for the RMSNorm. So `q_proj` stays identical to the
baseline's (the official code widens `q_proj` instead; see `longctx.convert.official`). A config with no gate is
the baseline, i.e. plain Qwen3; `longctx init` writes baselines as `Qwen3ForCausalLM` so vLLM runs them on its
native path.

Gate scores for analysis: every gated attention layer has a `gate_score` submodule (the activation, and the mean
over heads of a head-shared gate) whose output forward hooks can read (or replace); `record_gate_scores(model)`
collects them. Without hooks the forward costs the same as an inline activation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    ALL_ATTENTION_FUNCTIONS,
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3MLP,
    Qwen3Model,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    eager_attention_forward,
)

from longctx.models.gate_math import GateScore, apply_gate
from longctx.models.gates import GateSpec, gate_of
from longctx.models.variants import attention_variant


class GatedQwen3Config(Qwen3Config):
    """Qwen3 plus a gate of the paper's design space (`longctx.models.gates`): the official G1 output-gate flags,
    or an `attn_gate` object for any other point of it. No gate: baseline."""

    model_type = "gated_qwen3"
    base_model_tp_plan = {**Qwen3Config.base_model_tp_plan, "layers.*.self_attn.g_proj": "colwise"}

    headwise_attn_output_gate: bool = False
    elementwise_attn_output_gate: bool = False
    attn_gate: dict | None = None

    def __post_init__(self, **kwargs):
        spec = gate_of(self)  # InputError when the gate keys are malformed or ask for two gates
        super().__post_init__(**kwargs)
        if spec is not None and (spec.heads == "shared" or spec.position == "dense"):
            # a head-shared gate needs every head's scores for their mean, a G5 one the whole hidden state: their
            # g_proj stays whole on every rank (transformers' tensor parallelism), like vLLM's
            self.base_model_tp_plan = {k: v for k, v in self.base_model_tp_plan.items() if not k.endswith("g_proj")}

    @property
    def gate(self) -> GateSpec | None:
        return gate_of(self)

    @property
    def attention_variant(self) -> str:
        """The gate's name ('baseline', 'elementwise', 'headwise', ... or its fields)."""
        return attention_variant(self)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def gate_width(config) -> int:
    """Outputs of the gate's projection (or of its free scores); 0 for the baseline and the parameter-free
    non-linearities."""
    spec = gate_of(config)
    if spec is None:
        return 0
    return spec.width(config.num_attention_heads, config.num_key_value_heads, _head_dim(config), config.hidden_size)


class GatedQwen3Attention(Qwen3Attention):
    def __init__(self, config: GatedQwen3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.gate = spec = gate_of(config)
        if spec is None:
            return
        if spec.kind == "rmsnorm":
            self.head_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        elif spec.kind == "gate":
            width = gate_width(config)
            if spec.source == "input":
                self.g_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
            else:  # input-independent: learnt scores, zero-initialised (Table 4 row 6)
                self.gate_logits = nn.Parameter(torch.zeros(width))
            shared = spec.position_heads(config.num_attention_heads, config.num_key_value_heads)
            self.gate_score = GateScore(spec.activation, shared if spec.heads == "shared" else 0)

    def _gated(self, y: torch.Tensor, x: torch.Tensor, heads_first: bool = False) -> torch.Tensor:
        """`y` through the gate, scores computed from `x` (b, s, hidden). `y` is (b, s, heads, head_dim),
        (b, heads, s, head_dim) when `heads_first`, or (b, s, hidden) after o_proj."""
        spec = self.gate
        if spec.kind == "silu":
            return nn.functional.silu(y)
        if spec.kind == "rmsnorm":
            return self.head_norm(y)
        logits = self.g_proj(x) if spec.source == "input" else self.gate_logits.expand(*x.shape[:-1], -1)
        scores = self.gate_score(logits)
        if heads_first:
            return apply_gate(spec, y.transpose(1, 2), scores, self.head_dim).transpose(1, 2)
        return apply_gate(spec, y, scores, self.head_dim)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        spec = self.gate
        at = None if spec is None else (spec.position if spec.kind == "gate" else "sdpa")

        query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        # G2-G4 gate what attention reads (and what the cache keeps), after the norms and RoPE
        if at == "query":
            query_states = self._gated(query_states, hidden_states, heads_first=True)
        elif at == "key":
            key_states = self._gated(key_states, hidden_states, heads_first=True)
        elif at == "value":
            value_states = self._gated(value_states, hidden_states, heads_first=True)

        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)

        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        # attn_output: (b, s, H, head_dim) for every attention backend
        if at == "sdpa":
            attn_output = self._gated(attn_output, hidden_states)

        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        if at == "dense":
            attn_output = self._gated(attn_output, hidden_states)
        return attn_output, attn_weights


class GatedQwen3DecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: GatedQwen3Config, layer_idx: int):
        nn.Module.__init__(self)  # Qwen3DecoderLayer.__init__ with the gated attention
        self.hidden_size = config.hidden_size
        self.self_attn = GatedQwen3Attention(config=config, layer_idx=layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class GatedQwen3PreTrainedModel(Qwen3PreTrainedModel):
    config: GatedQwen3Config
    config_class = GatedQwen3Config
    _no_split_modules = ["GatedQwen3DecoderLayer"]
    _can_record_outputs = {"hidden_states": GatedQwen3DecoderLayer, "attentions": GatedQwen3Attention}


class GatedQwen3Model(GatedQwen3PreTrainedModel, Qwen3Model):
    def __init__(self, config: GatedQwen3Config):
        GatedQwen3PreTrainedModel.__init__(self, config)  # Qwen3Model.__init__ with the gated layers
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [GatedQwen3DecoderLayer(config, layer_idx) for layer_idx in range(config.num_hidden_layers)]
        )
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.has_sliding_layers = "sliding_attention" in self.config.layer_types
        self.post_init()


class GatedQwen3ForCausalLM(GatedQwen3PreTrainedModel, Qwen3ForCausalLM):
    def __init__(self, config: GatedQwen3Config):
        GatedQwen3PreTrainedModel.__init__(self, config)  # Qwen3ForCausalLM.__init__ with the gated model
        self.model = GatedQwen3Model(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


@contextlib.contextmanager
def record_gate_scores(model: nn.Module, detach: bool = True) -> Iterator[dict[int, torch.Tensor]]:
    """Collect sigmoid gate scores per layer while the block runs.

    Yields a dict `{layer_idx: scores}`, filled by each forward inside the block (the last forward
    wins): `GateScore`'s output, e.g. elementwise `(b, s, H*head_dim)`, headwise `(b, s, H)`. Empty for a
    baseline model and the parameter-free non-linearities.
    """
    scores: dict[int, torch.Tensor] = {}
    handles = []
    for module in model.modules():
        if isinstance(module, GatedQwen3Attention) and hasattr(module, "gate_score"):
            def hook(_mod, _inp, out, idx=module.layer_idx):
                scores[idx] = out.detach() if detach else out
            handles.append(module.gate_score.register_forward_hook(hook))
    try:
        yield scores
    finally:
        for h in handles:
            h.remove()


def causal_lm_class(config) -> type:
    """`GatedQwen3ForCausalLM` for a gated config, transformers' `Qwen3ForCausalLM` otherwise."""
    return GatedQwen3ForCausalLM if isinstance(config, GatedQwen3Config) else Qwen3ForCausalLM


def gate_parameter_count(config) -> int:
    """Parameters the gate adds to the model `config` describes (0 for plain Qwen3 and the baseline), counted on
    models built on the meta device."""
    if not isinstance(config, GatedQwen3Config) or config.gate is None:
        return 0
    plain = Qwen3Config(**{k: v for k, v in config.to_dict().items() if k not in ("attn_gate", "model_type")})
    with torch.device("meta"):
        gated, baseline = GatedQwen3ForCausalLM(config), Qwen3ForCausalLM(plain)
    return sum(p.numel() for p in gated.parameters()) - sum(p.numel() for p in baseline.parameters())


def register_auto_classes() -> None:
    """Register the config and model with transformers' Auto classes (idempotent)."""

    for register in (lambda: AutoConfig.register(GatedQwen3Config.model_type, GatedQwen3Config),
                     lambda: AutoModel.register(GatedQwen3Config, GatedQwen3Model),
                     lambda: AutoModelForCausalLM.register(GatedQwen3Config, GatedQwen3ForCausalLM)):
        with contextlib.suppress(ValueError):  # already registered
            register()


register_auto_classes()  # whoever imports this module gets the Auto classes (idempotent)

__all__ = [
    "GateScore",
    "GatedQwen3Config",
    "GatedQwen3ForCausalLM",
    "GatedQwen3Model",
    "causal_lm_class",
    "gate_parameter_count",
    "gate_width",
    "record_gate_scores",
    "register_auto_classes",
]
