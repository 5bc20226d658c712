"""Gated-attention Qwen3 (`GatedQwen3ForCausalLM`) for vLLM; imported only inside vLLM (see plugin.py).

Ported from vLLM 0.32's `vllm/model_executor/models/qwen3.py`: fused QKV (`QKVParallelLinear`),
per-head q/k RMSNorm, `get_rope`, vLLM `Attention`, and Qwen2's decoder stack and weight loader.
The only change is the G1 output gate (Qiu et al. 2025): a separate column-parallel `g_proj` on the
same normed input as q/k/v, sigmoid, multiplied into each head's attention output before `o_proj`:
- elementwise: `out * sigmoid(g)`, g of width H*head_dim (head-major, so tensor-parallel shards of
  `g_proj` line up with the local heads of `attn`);
- headwise: `out.view(T, H, head_dim) * sigmoid(g)[..., None]`, g of width H.
The gate is computed in the activation dtype, as in the transformers model. Baseline checkpoints
are plain `Qwen3ForCausalLM` and never reach this file.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import CacheConfig, VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.quantization import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.interfaces import SupportsLoRA, SupportsPP
from vllm.model_executor.models.qwen2 import Qwen2MLP, Qwen2Model
from vllm.model_executor.models.qwen3 import Qwen3Attention
from vllm.model_executor.models.utils import AutoWeightsLoader, PPMissingLayer, maybe_prefix
from vllm.sequence import IntermediateTensors
from vllm.transformers_utils.config import set_default_rope_theta
from vllm.v1.attention.backend import AttentionType

from longctx.models.variants import attention_variant


class GatedQwen3Attention(Qwen3Attention):
    """vLLM's Qwen3Attention plus `g_proj`; the gate multiplies the attention output before `o_proj`."""

    def __init__(self, *, gate: str, hidden_size: int, qkv_bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "", **kwargs) -> None:
        super().__init__(hidden_size=hidden_size, qkv_bias=qkv_bias, quant_config=quant_config, prefix=prefix,
                         **kwargs)
        self.gate = gate
        if qkv_bias:  # transformers' Qwen3 `attention_bias` also covers o_proj (vLLM's Qwen3 drops it)
            self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, hidden_size, bias=True,
                                            quant_config=quant_config, prefix=f"{prefix}.o_proj")
        width = {"elementwise": self.total_num_heads * self.head_dim, "headwise": self.total_num_heads}.get(gate)
        if width is not None:
            self.g_proj = ColumnParallelLinear(hidden_size, width, bias=qkv_bias, quant_config=quant_config,
                                               prefix=f"{prefix}.g_proj")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q_by_head = self.q_norm(q.view(*q.shape[:-1], q.shape[-1] // self.head_dim, self.head_dim))
        q = q_by_head.view(q.shape)
        k_by_head = self.k_norm(k.view(*k.shape[:-1], k.shape[-1] // self.head_dim, self.head_dim))
        k = k_by_head.view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        attn_output = self.attn(q, k, v)
        if self.gate == "elementwise":
            g, _ = self.g_proj(hidden_states)
            attn_output = attn_output * torch.sigmoid(g)
        elif self.gate == "headwise":
            g, _ = self.g_proj(hidden_states)
            shape = attn_output.shape
            attn_output = (attn_output.view(*shape[:-1], self.num_heads, self.head_dim)
                           * torch.sigmoid(g).unsqueeze(-1)).view(shape)
        output, _ = self.o_proj(attn_output)
        return output


class GatedQwen3DecoderLayer(nn.Module):
    """vLLM's Qwen3DecoderLayer with the gated attention."""

    def __init__(self, config, cache_config: CacheConfig | None = None,
                 quant_config: QuantizationConfig | None = None, prefix: str = "") -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
        set_default_rope_theta(config, default_theta=1000000)
        attn_type = AttentionType.DECODER if getattr(config, "is_causal", True) else AttentionType.ENCODER_ONLY
        self.self_attn = GatedQwen3Attention(
            gate=attention_variant(config),
            hidden_size=self.hidden_size,
            num_heads=config.num_attention_heads,
            max_position=config.max_position_embeddings,
            num_kv_heads=config.num_key_value_heads,
            rms_norm_eps=config.rms_norm_eps,
            qkv_bias=getattr(config, "attention_bias", False),
            head_dim=getattr(config, "head_dim", None),
            cache_config=cache_config,
            quant_config=quant_config,
            rope_parameters=config.rope_parameters,
            prefix=f"{prefix}.self_attn",
            attn_type=attn_type,
        )
        self.mlp = Qwen2MLP(hidden_size=self.hidden_size, intermediate_size=config.intermediate_size,
                            hidden_act=config.hidden_act, quant_config=quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


@support_torch_compile(
    dynamic_arg_dims={"input_ids": 0, "positions": -1, "intermediate_tensors": 0, "inputs_embeds": 0}
)
class GatedQwen3Model(Qwen2Model):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix, decoder_layer_type=GatedQwen3DecoderLayer)


class GatedQwen3ForCausalLM(nn.Module, SupportsLoRA, SupportsPP):
    hf_to_vllm_mapper = GatedQwen3Model.hf_to_vllm_mapper  # `.g_proj` matches none of its stacked names
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    embedding_modules = {"embed_tokens": "input_embeddings", "lm_head": "output_embeddings"}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        if getattr(config, "headwise_attn_output_gate", False) and getattr(config, "elementwise_attn_output_gate",
                                                                           False):
            raise ValueError("config asks for both headwise_attn_output_gate and elementwise_attn_output_gate")
        self.config = config
        self.vllm_config = vllm_config
        self.quant_config = quant_config = vllm_config.quant_config
        self.model = GatedQwen3Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant_config=quant_config,
                                          prefix=maybe_prefix(prefix, "lm_head"))
            if config.tie_word_embeddings:
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        else:
            self.lm_head = PPMissingLayer()
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: IntermediateTensors | None = None,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights)
