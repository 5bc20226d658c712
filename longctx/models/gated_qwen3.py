"""Gated attention (Qiu et al. 2025, "Gated Attention for LLMs", arXiv 2505.06708) on Qwen3, in transformers.

The gate is position G1 of the paper: `Y' = Y * sigmoid(X W_g)`, where X is the `input_layernorm`
output that also feeds q/k/v, and Y is each head's attention output before the heads are concatenated
and fed to `o_proj`. The gate gets no norm and no RoPE.

Weights are Qwen3's plus one projection per layer, `model.layers.{i}.self_attn.g_proj.weight`:
- elementwise: `[H*head_dim, hidden]`, row `h*head_dim + e` gates dimension e of head h;
- headwise:    `[H, hidden]`, row `h` gates head h.
So `q_proj` stays identical to the baseline's (the official code widens `q_proj` instead; see
`longctx.convert.official`). A config with neither flag is the baseline, i.e. plain Qwen3; `longctx init`
writes baselines as `Qwen3ForCausalLM` so vLLM runs them on its native path.

Gate scores for analysis: every attention layer has a `gate_score` submodule (sigmoid) whose output
forward hooks can read (or replace); `record_gate_scores(model)` collects them. Without hooks the
forward costs the same as an inline `torch.sigmoid`.
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

from longctx.core.errors import InputError
from longctx.models.variants import attention_variant


class GatedQwen3Config(Qwen3Config):
    """Qwen3 plus the paper's G1 output-gate flags (the official config keys). Neither flag: baseline."""

    model_type = "gated_qwen3"
    base_model_tp_plan = {**Qwen3Config.base_model_tp_plan, "layers.*.self_attn.g_proj": "colwise"}

    headwise_attn_output_gate: bool = False
    elementwise_attn_output_gate: bool = False

    def __post_init__(self, **kwargs):
        if self.headwise_attn_output_gate and self.elementwise_attn_output_gate:
            raise InputError("config asks for both headwise_attn_output_gate and elementwise_attn_output_gate; "
                             "set at most one of them (neither = baseline)")
        super().__post_init__(**kwargs)

    @property
    def attention_variant(self) -> str:
        """'baseline', 'elementwise' or 'headwise'."""
        return attention_variant(self)


def gate_width(config) -> int:
    """Rows of `g_proj` (0 for the baseline)."""
    variant = attention_variant(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"baseline": 0, "elementwise": config.num_attention_heads * head_dim,
            "headwise": config.num_attention_heads}[variant]


class GateScore(nn.Module):
    """sigmoid(gate logits); a module of its own so hooks can read or replace the gate scores."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits)


class GatedQwen3Attention(Qwen3Attention):
    def __init__(self, config: GatedQwen3Config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.variant = config.attention_variant
        width = gate_width(config)
        if width:
            self.g_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
            self.gate_score = GateScore()

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

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
        if self.variant == "elementwise":
            attn_output = attn_output * self.gate_score(self.g_proj(hidden_states)).view(hidden_shape)
        elif self.variant == "headwise":
            attn_output = attn_output * self.gate_score(self.g_proj(hidden_states)).unsqueeze(-1)

        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
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
    wins): elementwise `(b, s, H*head_dim)`, headwise `(b, s, H)`. Empty for a baseline model.
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
    "gate_width",
    "record_gate_scores",
    "register_auto_classes",
]
