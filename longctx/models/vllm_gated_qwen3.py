"""Gated-attention Qwen3 (`GatedQwen3ForCausalLM`) for vLLM; imported only inside vLLM (see plugin.py).

Ported from vLLM 0.32's `vllm/model_executor/models/qwen3.py`: fused QKV (`QKVParallelLinear`),
per-head q/k RMSNorm, `get_rope`, vLLM `Attention`, and Qwen2's decoder stack and weight loader.
The only change is the gate of Qiu et al. 2025 (`longctx.models.gates`: any point of the paper's design
space), computed from the same normed input as q/k/v with the arithmetic the transformers model uses
(`longctx.models.gate_math`), in the activation dtype:
- G1 (sdpa): on the attention output before `o_proj`; G4 (query) on q and G3 (key) on k after their norms
  and RoPE; G2 (value) on v before `attn`, so the KV cache holds the gated keys/values the transformers
  model caches; G5 (dense) on the `o_proj` output;
- the parameter-free SiLU and per-head RMSNorm at G1.
How each position shards under tensor parallelism is in `GatedQwen3Attention._make_gate`. Baseline
checkpoints are plain `Qwen3ForCausalLM` and never reach this file.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import CacheConfig, VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
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

from longctx.models.gate_math import GateScore, apply_gate
from longctx.models.gates import GateSpec, gate_of


class GatedQwen3Attention(Qwen3Attention):
    """vLLM's Qwen3Attention plus a gate of the design space (`GateSpec`), applied where the spec puts it."""

    def __init__(self, *, gate: GateSpec | None, hidden_size: int, qkv_bias: bool = False,
                 quant_config: QuantizationConfig | None = None, prefix: str = "", **kwargs) -> None:
        super().__init__(hidden_size=hidden_size, qkv_bias=qkv_bias, quant_config=quant_config, prefix=prefix,
                         **kwargs)
        self.gate = gate
        if qkv_bias:  # transformers' Qwen3 `attention_bias` also covers o_proj (vLLM's Qwen3 drops it)
            self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, hidden_size, bias=True,
                                            quant_config=quant_config, prefix=f"{prefix}.o_proj")
        if gate is not None and gate.kind == "rmsnorm":
            self.head_norm = RMSNorm(self.head_dim, eps=kwargs.get("rms_norm_eps", 1e-6))
        elif gate is not None and gate.kind == "gate":
            self._make_gate(gate, hidden_size, qkv_bias, quant_config, prefix)

    def _make_gate(self, gate: GateSpec, hidden_size: int, bias: bool, quant_config, prefix: str) -> None:
        """The gate's weights, laid out so that each tensor-parallel rank holds the scores of its own heads: a
        head-specific gate of query heads is column-parallel like q (whole heads per shard), one of key/value
        heads like k/v while they are split (replicated and sliced to the rank's head when tp > kv heads); a
        head-shared gate needs every head's scores for their mean and a G5 gate the whole hidden state, so both
        are replicated. Input-independent scores are replicated and sliced the same way."""
        tp_size, tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        per_head = self.head_dim if gate.granularity == "elementwise" else 1
        total = gate.position_heads(self.total_num_heads, self.total_num_kv_heads)
        if gate.position == "dense":  # replicated whole: the hidden state
            local = first = 0
        elif gate.head_kind == "query":
            local, first = self.num_heads, tp_rank * self.num_heads
        else:
            local = self.num_kv_heads
            first = tp_rank * local if total >= tp_size else tp_rank // (tp_size // total)
        width = gate.width(self.total_num_heads, self.total_num_kv_heads, self.head_dim, hidden_size)
        split = gate.position != "dense" and gate.heads == "specific" and (gate.head_kind == "query"
                                                                           or total >= tp_size)
        whole = gate.position == "dense" or gate.heads == "shared" or tp_size == 1
        self.gate_slice = None if whole or (split and gate.source == "input") else (first * per_head,
                                                                                     local * per_head)
        if gate.source == "free":
            self.gate_logits = nn.Parameter(torch.zeros(width), requires_grad=False)
        elif split:
            self.g_proj = ColumnParallelLinear(hidden_size, width, bias=bias, quant_config=quant_config,
                                               prefix=f"{prefix}.g_proj")
        else:
            self.g_proj = ReplicatedLinear(hidden_size, width, bias=bias, quant_config=quant_config,
                                           prefix=f"{prefix}.g_proj")
        self.gate_score = GateScore(gate.activation, total if gate.heads == "shared" else 0)

    def _gated(self, y: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """`y` (tokens, heads * head_dim, or hidden at G5) through the gate, its scores from `hidden_states`."""
        gate = self.gate
        if gate.kind == "silu":
            return nn.functional.silu(y)
        if gate.kind == "rmsnorm":
            return self.head_norm(y.view(y.shape[0], -1, self.head_dim)).view(y.shape)
        if gate.source == "input":
            logits, _ = self.g_proj(hidden_states)
        else:
            logits = self.gate_logits.to(hidden_states.dtype).expand(hidden_states.shape[0], -1)
        if self.gate_slice is not None:
            start, width = self.gate_slice
            logits = logits[:, start:start + width]
        scores = self.gate_score(logits)
        if gate.position == "dense":  # y is the hidden state, which need not split into head_dim pieces
            return apply_gate(gate, y, scores, self.head_dim)
        return apply_gate(gate, y.view(y.shape[0], -1, self.head_dim), scores, self.head_dim).view(y.shape)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        gate = self.gate
        at = None if gate is None else (gate.position if gate.kind == "gate" else "sdpa")
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q_by_head = self.q_norm(q.view(*q.shape[:-1], q.shape[-1] // self.head_dim, self.head_dim))
        q = q_by_head.view(q.shape)
        k_by_head = self.k_norm(k.view(*k.shape[:-1], k.shape[-1] // self.head_dim, self.head_dim))
        k = k_by_head.view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        # G2-G4 gate what attention reads (the cache keeps gated keys and values), after the norms and RoPE
        if at == "query":
            q = self._gated(q, hidden_states)
        elif at == "key":
            k = self._gated(k, hidden_states)
        elif at == "value":
            v = self._gated(v, hidden_states)
        attn_output = self.attn(q, k, v)
        if at == "sdpa":
            attn_output = self._gated(attn_output, hidden_states)
        output, _ = self.o_proj(attn_output)
        if at == "dense":
            output = self._gated(output, hidden_states)
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
            gate=gate_of(config),
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
        gate_of(config)  # InputError (a ValueError) when the gate keys are malformed or ask for two gates
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
