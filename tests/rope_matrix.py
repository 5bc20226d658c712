"""The RoPE matrix: every causal-LM architecture of the installed transformers whose model applies RoPE, as
transformers saves it, and the Hub layouts of the families whose configs carry RoPE in legacy or per-layer keys;
with the oracle the tests hold longctx to, written apart from longctx's own code.

- `rope_model_types()`: the architectures, found in transformers itself (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`):
  a model type is RoPE-bearing when the modeling module of its causal-LM class defines a text rotary module
  (a class named `*RotaryEmbedding`, not `*VisionRotaryEmbedding`: transformers' own naming, which the
  `modular_*.py` converter keeps), and the tiny model built from its config holds one. What the rule leaves
  out, and why, is `excluded_model_types()`.
- `MatrixEntry` / `entries()`: one entry per such model type (its config class's defaults, made tiny, saved with
  `save_pretrained`) and per Hub layout (`HUB_LAYOUTS`, a config.json as the Hub has it, and the same config
  as transformers saves it again after reading it: `<name>-saved`).
- `rotary_oracle(config)`: what transformers' rotary modules of that config compute, per layer type
  (inv_freq, attention scaling, the standardised RoPE parameters), and the softmax scale of its attention
  layers: the modules are found by building the model on the meta device, then built again on the CPU.
- `rope_inv_freq` / `yarn_inv_freq`: RoPE's frequencies from its parameters in float64, after the papers
  (RoPE: Su et al. arXiv 2104.09864; position interpolation: Chen et al. arXiv 2306.15595; YaRN: Peng et al.
  arXiv 2309.00071 §3.2-3.4, with DeepSeek-V2's mscale / mscale_all_dim, arXiv 2405.04434 and its
  modeling_deepseek.py `yarn_get_mscale`), not longctx.rope.reference (which longctx itself uses to
  write LongRoPE-form YaRN), so a mistake shared by longctx's writer and its reference cannot pass.
- `render_architecture_table()`: the architecture table of docs/architectures.md, from the matrix.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

TRAINED_LENGTH = 256
MAX_PARAMETERS = 20_000_000  # a config left at its real size would fill the memory (and the disk)
SLIDING_WINDOW = 128
# Every config class's own defaults, made tiny where the class has the parameter (vLLM's CPU attention wants
# head_dim 64; a vocabulary of 512 keeps 100+ checkpoints small, the Hub layouts have the tokenizer's 32000).
TINY: dict[str, Any] = {
    "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512, "max_position_embeddings": TRAINED_LENGTH,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": SLIDING_WINDOW,
    "moe_intermediate_size": 64, "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "shared_expert_intermediate_size": 64, "kv_lora_rank": 64, "q_lora_rank": 64, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 32, "v_head_dim": 64,
}
# Model types whose config needs more than TINY to build a tiny model with a rotary module (a layer pattern
# that holds an attention layer in 2 layers, a sub-config sized to match, a constraint of the config class).
OVERRIDES: dict[str, dict[str, Any]] = {
    "gemma3n_text": {"num_kv_shared_layers": 0, "layer_types": ["sliding_attention", "full_attention"],
                     "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 512,
                     "activation_sparsity_pattern": [0.0, 0.0], "laurel_rank": 8, "altup_num_inputs": 2},
    "gemma4_text": {"num_kv_shared_layers": 0, "layer_types": ["sliding_attention", "full_attention"],
                    "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 512},
    "gemma4_unified_text": {"num_kv_shared_layers": 0, "layer_types": ["sliding_attention", "full_attention"],
                            "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 512},
    "granitemoehybrid": {"position_embedding_type": "rope", "layer_types": ["mamba", "attention"],
                         "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 16},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"], "lru_width": 256, "attention_window_size": 128},
    "zaya": {"num_experts_per_tok": 1},
    # XiaomiMiMo/MiMo-V2-Flash: 0.334 of a 192-wide head, 64 dimensions, rotate (of a 64-wide one: 21, odd)
    "mimo_v2_flash": {"head_dim": 192, "v_head_dim": 128},
    "longcat_flash": {"num_layers": 2, "ffn_hidden_size": 256, "expert_ffn_hidden_size": 64, "zero_expert_num": 2},
    "moshi": {"audio_vocab_size": 64, "ffn_dim": 256,
              "depth_decoder_config": {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1,
                                       "num_key_value_heads": 1, "head_dim": 64, "ffn_dim": 64,
                                       "audio_vocab_size": 64, "vocab_size": 512, "num_codebooks": 8}},
    "phi4_multimodal": {"vision_config": {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
                                          "num_attention_heads": 1, "image_size": 28, "patch_size": 14,
                                          "crop_size": 28},
                        "audio_config": {"hidden_size": 64, "intermediate_size": 64, "num_blocks": 1,
                                         "num_attention_heads": 1, "ext_pw_out_channel": 64,
                                         "depthwise_separable_out_channel": 64, "nemo_conv_channels": 64}},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "bamba": {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 16},
    "falcon_h1": {"attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 16,
                  "mamba_d_ssm": 512},
    "cohere_compass_text": {"layer_types": ["sliding_attention", "full_attention"],
                            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 50000.0,
                                                                      "mrope_section": [12, 12, 8]},
                                                "full_attention": None}},
    "zamba2": {"use_mem_rope": True, "layers_block_type": ["mamba", "hybrid"], "num_mem_blocks": 1,
               "mamba_d_state": 16, "n_mamba_heads": 8},
    **{t: {"layer_types": ["linear_attention", "full_attention"]}
       for t in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")},
    "qwen4_exp_text": {"layer_types": ["linear_attention", "indexed_attention"], "indexer_n_heads": 2,
                       "indexer_kv_heads": 1, "indexer_head_dim": 64, "indexer_budget": 64,
                       "indexer_compress_ratio": 4},
}


# --- which architectures ---------------------------------------------------------------------------------


def _modeling_module(class_name: str):
    import transformers

    return sys.modules[getattr(transformers, class_name).__module__]


def _text_rotary_classes(module) -> list[str]:
    return [name for name, value in vars(module).items()
            if name.endswith("RotaryEmbedding") and "Vision" not in name and inspect.isclass(value)
            and value.__module__ == module.__name__]


@lru_cache(maxsize=1)
def _candidates() -> tuple[dict[str, str], dict[str, str]]:
    """({model type: causal-LM class} whose modeling module defines a text rotary module, {model type: why not})
    over transformers' causal-LM mapping."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    rope, other = {}, {}
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        module = _modeling_module(class_name)
        if _text_rotary_classes(module):
            rope[model_type] = class_name
            continue
        source = inspect.getsource(module)
        if "rotary" in source.lower() or "rope" in source.lower():
            other[model_type] = _NO_ROTARY_MODULE.get(model_type, "no rotary module (RoPE named only in passing)")
        else:
            other[model_type] = "no RoPE"
    return rope, other


# Model types that mention rotary positions without a rotary module built from rope_parameters.
_NO_ROTARY_MODULE = {
    "gptj": "rotary with base 10000 fixed in the modeling code (create_sinusoidal_positions): no config key sets it",
    "codegen": "rotary with base 10000 fixed in the modeling code (create_sinusoidal_positions): no config key "
               "sets it",
    "roformer": "sinusoidal rotary with base 10000 fixed in the modeling code (not a causal-LM checkpoint family "
                "longctx extends)",
}


def default_rope_only(model_type: str) -> bool:
    """Whether the model's rotary module computes the default RoPE only: its modeling module takes no
    initialiser from `ROPE_INIT_FUNCTIONS` (RecurrentGemmaRotaryEmbedding raises on any other rope_type)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return "ROPE_INIT_FUNCTIONS" not in inspect.getsource(_modeling_module(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]))


def _composite_text_type(model_type: str) -> str | None:
    """The model type of the language model of a multimodal config class (its `text_config`), else None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    sub = getattr(CONFIG_MAPPING[model_type], "sub_configs", None) or {}
    text = sub.get("text_config")
    return getattr(text, "model_type", None) if text is not None else None


@lru_cache(maxsize=1)
def rope_model_types() -> dict[str, str]:
    """{model type: causal-LM class name} of every RoPE-bearing architecture the matrix covers (see the module
    docstring), in transformers' order."""
    rope, _ = _candidates()
    excluded = excluded_model_types()
    return {t: c for t, c in rope.items() if t not in excluded}


@lru_cache(maxsize=1)
def excluded_model_types() -> dict[str, str]:
    """{model type: why the matrix leaves it out} for every model type of transformers' causal-LM mapping that
    is not in `rope_model_types()`."""
    rope, other = _candidates()
    excluded = dict(other)
    for model_type in rope:
        text = _composite_text_type(model_type)
        if text in rope:
            excluded[model_type] = (f"multimodal wrapper: its language model is the {text} entry (longctx reads the "
                                    "RoPE of a top-level text config)")
        elif text is not None or model_type in _NOT_TINY:
            excluded[model_type] = _NOT_TINY.get(model_type, "multimodal: its language model config is not a "
                                                             "causal-LM checkpoint of its own")
    return excluded


# RoPE-bearing model types the matrix cannot build tiny on the CPU, and why.
_NOT_TINY: dict[str, str] = {
    "gemma3n": "multimodal wrapper of gemma3n_text whose vision tower needs the timm package",
    "emu3": "multimodal (VQ image tokenizer + text): its text model is not a causal-LM checkpoint of its own",
    "mllama": "multimodal wrapper: MllamaForCausalLM's text config (mllama_text_model) has no causal-LM mapping",
    "blt": "byte-level patcher with four transformer stacks: the config has no single text model",
    "dbrx": "DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig no longer has: transformers "
            "5.19 cannot build a DBRX model from any config",
}


# --- tiny configs --------------------------------------------------------------------------------------------


def _config_class(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def tiny_config(model_type: str, **changes: Any):
    """The config class of `model_type` with its defaults, made tiny (TINY, OVERRIDES, then `changes`), with two
    layers of two attention types where the class alternates them."""
    cls = _config_class(model_type)
    params = inspect.signature(cls.__init__).parameters
    values = {k: v for k, v in TINY.items() if k in params}
    if params.get("sliding_window") is not None and params["sliding_window"].default is None:
        del values["sliding_window"]  # no window by default: none in the tiny model either
    values.update(OVERRIDES.get(model_type, {}))
    values.update(changes)
    with _quiet():  # a class default scaled from a longer original length than the tiny one warns here
        config = cls(**values)
    types = getattr(config, "layer_types", None)
    again = {}
    if (isinstance(types, list) and "layer_types" in params and "layer_types" not in values
            and "sliding_attention" in types and "full_attention" not in types):
        again["layer_types"] = ["sliding_attention", "full_attention"]
    rope = getattr(config, "rope_parameters", None) or {}
    original, factor = rope.get("original_max_position_embeddings"), rope.get("factor")
    if original and original > TRAINED_LENGTH and "rope_parameters" not in values:
        # a class that scales by default (YaRN, llama3) from its own original length: the same scaling from the
        # tiny model's, to the length it gives, as the class's real checkpoints have it
        again["rope_parameters"] = {**rope, "original_max_position_embeddings": TRAINED_LENGTH}
        again["max_position_embeddings"] = math.ceil(TRAINED_LENGTH * (factor or 1))
    return cls(**{**values, **again}) if again else config


@contextlib.contextmanager
def _quiet():
    """Within it transformers logs errors only (its config and weight-init warnings repeat for every model)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def model_class(config):
    """The Auto class of the model that generates text of `config`: the causal LM, or of a composite model that
    transformers has none for (Mistral-3), its image-text-to-text model."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return AutoModelForCausalLM if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING else AutoModelForImageTextToText


def build_on_meta(config):
    """The causal-LM model of `config` (`model_class`), built on the meta device (no memory, no weights)."""
    import torch

    with _quiet(), torch.device("meta"):
        return model_class(config).from_config(config)


# --- the Hub layouts ------------------------------------------------------------------------------------------

_HUB_SHAPE = {"vocab_size": 32000, "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "bos_token_id": 1,
              "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False, "torch_dtype": "float32"}

# name -> (family, config.json as the family's Hub checkpoints have it, shrunk)
HUB_LAYOUTS: dict[str, tuple[str, dict[str, Any]]] = {
    # google/gemma-3-4b-it text_config / gemma-3-1b-it: v4 keys; linear x8 on the global layers only,
    # rope_local_base_freq for the sliding ones, every `sliding_window_pattern`-th layer global
    "gemma3-hub": ("Gemma-3", {
        **_HUB_SHAPE, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "max_position_embeddings": 8 * TRAINED_LENGTH, "rope_theta": 1000000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_local_base_freq": 10000.0,
        "sliding_window": SLIDING_WINDOW, "sliding_window_pattern": 2, "query_pre_attn_scalar": 64,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}),
    # google/gemma-3-4b-it as shipped: the language model nested in `text_config` (v4 keys, linear x8 on the
    # global layers), a SigLIP vision tower (shrunk) beside it; Llama-4, Mistral-3, Qwen2.5-VL nest theirs alike
    "gemma3-vlm-hub": ("Gemma-3 (vision-language)", {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {k: v for k, v in {
            **_HUB_SHAPE, "model_type": "gemma3_text", "max_position_embeddings": 8 * TRAINED_LENGTH,
            "rope_theta": 1000000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "rope_local_base_freq": 10000.0, "sliding_window": SLIDING_WINDOW, "sliding_window_pattern": 2,
            "query_pre_attn_scalar": 64}.items() if k not in ("architectures", "tie_word_embeddings", "torch_dtype")},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 64, "intermediate_size": 64,
                          "num_hidden_layers": 1, "num_attention_heads": 1, "image_size": 28, "patch_size": 14,
                          "vision_use_head": False},
        "mm_tokens_per_image": 4, "boi_token_index": 3, "eoi_token_index": 4, "image_token_index": 5,
        "bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 0, "torch_dtype": "float32"}),
    # mistralai/Mistral-Small-3.1-24B-Instruct-2503 (Ministral-3 alike): Mistral nested in `text_config` (v4: base
    # 1e9), a Pixtral vision tower; transformers has no causal LM of it, its image-text-to-text model takes text
    "mistral3-vlm-hub": ("Mistral-3 (vision-language)", {
        "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
        "text_config": {**{k: v for k, v in _HUB_SHAPE.items() if k not in ("architectures", "torch_dtype")},
                        "model_type": "mistral", "max_position_embeddings": TRAINED_LENGTH, "rope_theta": 1e9,
                        "sliding_window": None},
        "vision_config": {"model_type": "pixtral", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
                          "num_attention_heads": 1, "head_dim": 64, "image_size": 56, "patch_size": 14},
        "image_token_index": 10, "spatial_merge_size": 2, "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu", "vision_feature_layer": -1, "torch_dtype": "float32"}),
    # EleutherAI/pythia-*: GPT-NeoX's own keys for the base and the rotated share of each head
    "gpt_neox-hub": ("Pythia / GPT-NeoX", {
        **{k: v for k, v in _HUB_SHAPE.items() if k not in ("num_key_value_heads", "head_dim")},
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "max_position_embeddings": TRAINED_LENGTH,
        "rotary_emb_base": 50000, "rotary_pct": 0.25, "use_parallel_residual": True, "hidden_act": "gelu",
        "layer_norm_eps": 1e-5}),
    # deepseek-ai/DeepSeek-V2-Lite: MLA (its head sizes: vLLM's CPU MLA takes kv_lora_rank + qk_rope_head_dim
    # = 576 only), YaRN x40 in v4 keys ("type"), mscale = mscale_all_dim = 0.707
    "deepseek_v2-hub": ("DeepSeek-V2/V3 (MLA)", {
        **{k: v for k, v in _HUB_SHAPE.items() if k != "head_dim"}, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "num_key_value_heads": 4, "max_position_embeddings": 40 * TRAINED_LENGTH,
        "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                              "mscale_all_dim": 0.707, "original_max_position_embeddings":
                                                  TRAINED_LENGTH, "type": "yarn"},
        "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "first_k_dense_replace": 2, "topk_method": "greedy", "n_group": 1, "topk_group": 1}),
    # deepseek-ai/DeepSeek-V3: the same with mscale = mscale_all_dim = 1.0 and a q LoRA
    "deepseek_v3-hub": ("DeepSeek-V2/V3 (MLA)", {
        **{k: v for k, v in _HUB_SHAPE.items() if k != "head_dim"}, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "num_key_value_heads": 4, "max_position_embeddings": 40 * TRAINED_LENGTH,
        "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                              "mscale_all_dim": 1.0, "original_max_position_embeddings":
                                                  TRAINED_LENGTH, "type": "yarn"},
        "kv_lora_rank": 512, "q_lora_rank": 64, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "first_k_dense_replace": 2, "n_group": 1, "topk_group": 1}),
    # Qwen/Qwen1.5-MoE-A2.7B: a sliding window in the config that use_sliding_window=false switches off
    "qwen2_moe-hub": ("Qwen2-MoE", {
        **_HUB_SHAPE, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
        "max_position_embeddings": TRAINED_LENGTH, "rope_theta": 1000000.0, "rope_scaling": None,
        "sliding_window": SLIDING_WINDOW, "use_sliding_window": False, "max_window_layers": 2, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64}),
    # CohereForAI/c4ai-command-r7b-12-2024: RoPE in the sliding layers only, every 4th layer full (NoPE). Its
    # window holds the vLLM test's prompt: past the window vLLM 0.32's Cohere2 attends to one token more than
    # transformers 5.19's (its log-probs equal transformers' with sliding_window + 1), whatever the RoPE.
    "cohere2-hub": ("Cohere2", {
        **_HUB_SHAPE, "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2",
        "max_position_embeddings": TRAINED_LENGTH, "rope_theta": 50000.0, "rope_scaling": None,
        "sliding_window": 4 * TRAINED_LENGTH, "sliding_window_pattern": 2, "logit_scale": 0.25,
        "tie_word_embeddings": True}),
    # mistralai/Mixtral-8x7B-v0.1: v4 keys without rope_scaling, no head_dim (MixtralConfig leaves it None: the
    # attention computes hidden_size / num_attention_heads), no sliding window
    "mixtral-hub": ("Mixtral", {
        **{k: v for k, v in _HUB_SHAPE.items() if k != "head_dim"}, "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral", "max_position_embeddings": TRAINED_LENGTH, "rope_theta": 1e6,
        "sliding_window": None, "num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
        "output_router_logits": False, "rms_norm_eps": 1e-5, "hidden_act": "silu"}),
    # meta-llama/Llama-3.1-8B: llama3 scaling in v4 keys
    "llama-hub": ("Llama 3.x", {
        **_HUB_SHAPE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "max_position_embeddings": 8 * TRAINED_LENGTH, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": TRAINED_LENGTH, "rope_type": "llama3"}}),
}


@dataclass(frozen=True)
class MatrixEntry:
    """A checkpoint of the matrix: `model_type`'s config as transformers saves it (`hub` None), a Hub layout
    (`hub` its config.json), or a Hub layout as transformers saves it again (`resaved`)."""

    name: str
    model_type: str
    hub: dict[str, Any] | None = None
    resaved: bool = False
    dropped: tuple[str, ...] = ()  # keys left out of the config.json transformers saves (and the same weights)

    @property
    def text_model_type(self) -> str:
        """The model type of its language model (of a composite Hub layout: its `text_config`'s)."""
        text = (self.hub or {}).get("text_config")
        return text["model_type"] if isinstance(text, dict) else self.model_type


@lru_cache(maxsize=1)
def head_dim_left_none_types() -> list[str]:
    """The matrix's model types whose config class leaves head_dim None when config.json has none and whose model
    transformers still builds (the attention computes hidden_size / num_attention_heads; Mixtral's Hub configs
    have none). Ministral's and Hunyuan's classes leave it None too, but their attention reads
    `getattr(config, "head_dim", ...)`, so transformers builds no model of such a config.json."""
    out = []
    for t in rope_model_types():
        if not hasattr(_config_class(t), "head_dim") or _config_class(t).head_dim is not None:
            continue
        config = tiny_config(t, head_dim=None)
        if getattr(config, "head_dim", 0) is not None:
            continue
        try:
            build_on_meta(config)
        except TypeError:
            continue
        out.append(t)
    return out


def _entries() -> dict[str, MatrixEntry]:
    out = {t: MatrixEntry(t, t) for t in rope_model_types()}
    for t in head_dim_left_none_types():
        out[f"{t}-no-head-dim"] = MatrixEntry(f"{t}-no-head-dim", t, dropped=("head_dim",))
    for name, (_, cfg) in HUB_LAYOUTS.items():
        out[name] = MatrixEntry(name, cfg["model_type"], cfg)
        out[f"{name}-saved"] = MatrixEntry(f"{name}-saved", cfg["model_type"], cfg, resaved=True)
    return out


@lru_cache(maxsize=1)
def entries() -> dict[str, MatrixEntry]:
    """Every entry of the matrix by name."""
    return _entries()


# The fast lane (`pytest -m "not slow"`) runs the matrix's tests on this sample only, the full lane on every entry:
# each Hub layout (alone and as transformers saves it again) and, of the transformers-saved entries, one per row
# group of the architecture table (mla, per-layer, scaled, hybrid, partial, sliding, plain), with gemma4_text
# for a `yarn` refusal and gpt_oss (scaled) for an `extend` one.
FAST_SAMPLE = ("deepseek_v3", "gemma3_text", "gemma4_text", "gpt_oss", "qwen3_next", "phi", "mistral", "llama")


def lane_params(names) -> list:
    """`names` as parametrize values: the entries outside the fast lane's sample marked slow."""
    import pytest

    return [n if n in FAST_SAMPLE or entries()[n].hub is not None else pytest.param(n, marks=pytest.mark.slow)
            for n in names]


# --- writing the checkpoints --------------------------------------------------------------------------------


def _hub_config(cfg: dict[str, Any]):
    """transformers' config object of a Hub config.json dict (as AutoConfig.from_pretrained builds it)."""
    from transformers import AutoConfig, PreTrainedConfig

    # infinite floats as transformers writes them ({"__float__": "Infinity"}), decoded as its file reader does
    cfg = PreTrainedConfig._decode_special_floats(cfg)
    values = {k: v for k, v in cfg.items() if k != "model_type"}
    with _quiet():
        return AutoConfig.for_model(cfg["model_type"], **values)


def entry_config(entry: MatrixEntry):
    """The transformers config object the entry's checkpoint is saved from."""
    if entry.hub is not None:
        return _hub_config(entry.hub)
    config = tiny_config(entry.model_type, **dict.fromkeys(entry.dropped))
    config.architectures = [rope_model_types()[entry.model_type]]
    return config


def write_entry(entry: MatrixEntry, out: Path, tokenizer_dir: Path, weights_from: Path | None = None) -> Path:
    """Write the checkpoint of `entry` to `out`: tiny random fp32 weights saved by the model transformers builds
    from its config (`weights_from`: a checkpoint of the same model whose weights are linked instead), config.json
    as transformers saves it (or the Hub layout's own), and the tokenizer files of `tokenizer_dir` (linked)."""
    import torch

    config = entry_config(entry)
    out.mkdir(parents=True)
    if weights_from is not None:
        for f in weights_from.glob("*.safetensors*"):
            os.link(f, out / f.name)
        config.save_pretrained(out)
    else:
        size = sum(p.numel() for p in build_on_meta(config).parameters())
        assert size <= MAX_PARAMETERS, f"{entry.name}: {size} parameters is not tiny; shrink it in OVERRIDES"
        torch.manual_seed(0)
        with _quiet():
            model = model_class(config).from_config(config, dtype=torch.float32).eval()
            model.save_pretrained(out)
    if entry.hub is not None and not entry.resaved:
        (out / "config.json").write_text(json.dumps(entry.hub, indent=2))
    if entry.dropped:
        saved = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k not in entry.dropped},
                                                    indent=2))
    for f in Path(tokenizer_dir).iterdir():
        if f.name.startswith("tokenizer") or f.name.startswith("special_tokens"):
            os.link(f, out / f.name)
    return out


class Matrix:
    """The matrix's checkpoints, each written once into `root` when first asked for."""

    def __init__(self, root: Path, tokenizer_dir: Path):
        self.root, self.tokenizer_dir = Path(root), Path(tokenizer_dir)
        self.written: dict[str, Path] = {}

    def path(self, name: str) -> Path:
        if name not in self.written:
            entry = entries()[name]
            source = None
            if entry.resaved:  # the same model as the Hub layout's: its weights, transformers' config.json
                source = self.path(name.removesuffix("-saved"))
            if entry.dropped:  # the same model as its model type's entry (head_dim 64 = 256 / 4 heads)
                source = self.path(entry.model_type)
            self.written[name] = write_entry(entry, self.root / name, self.tokenizer_dir, weights_from=source)
        return self.written[name]


# --- the oracle: what transformers builds ------------------------------------------------------------------


@dataclass(frozen=True)
class Rotary:
    """What one transformers rotary module computes for one layer type (None: the module serves every layer)."""

    module: str  # its path in the model
    layer_type: str | None
    inv_freq: Any  # fp32 tensor, rotated dims / 2
    attention_scaling: float  # multiplies cos and sin
    parameters: dict[str, Any]  # the standardised RoPE parameters it was built from
    head_dim: int  # the head size whose share `parameters` rotate

    @property
    def rotated_dims(self) -> int:
        return 2 * len(self.inv_freq)

    def computes(self, inv_freq, attention_scaling: float) -> bool:
        """Whether this module computes `inv_freq` and `attention_scaling` (to fp32 precision)."""
        return (same_freqs(self.inv_freq, inv_freq, any_order="mrope_section" in self.parameters)
                and math.isclose(self.attention_scaling, attention_scaling, rel_tol=1e-6))


@dataclass(frozen=True)
class Oracle:
    """What transformers builds from one config."""

    rotaries: list[Rotary]
    layer_types: list[str] | None  # the config's, one per layer
    softmax_scales: list[float] = field(default_factory=list)  # each attention layer's `scaling`
    max_position_embeddings: int | None = None
    mla_qk_head_dim: int | None = None  # MLA (kv_lora_rank): the query/key head size its softmax scale is of

    def by_layer_type(self) -> dict[str | None, Rotary]:
        """{layer type (None: every layer): its rotary} of the model's main rotary module(s)."""
        out: dict[str | None, Rotary] = {}
        for r in self.rotaries:
            out.setdefault(r.layer_type, r)
        return out


def _rotary_head_dim(config, layer_type: str | None) -> int:
    try:
        config = config.per_layer_config[layer_type] if layer_type is not None else config
    except (AttributeError, KeyError, TypeError, ValueError):
        pass
    head_dim = getattr(config, "head_dim", None)
    return head_dim or config.hidden_size // config.num_attention_heads


def _rebuilt(module):
    """`module` (built on the meta device) built again on the CPU from its config, so its buffers hold numbers."""
    import torch

    with _quiet(), torch.device("cpu"):
        return type(module)(module.config)


def rotary_oracle(config) -> Oracle:
    """What transformers' rotary modules of `config` (a transformers config object, or a checkpoint folder or
    config.json dict it reads) compute: every rotary module of the causal-LM model, per layer type where a
    module holds one RoPE per layer type, and the softmax scale of every attention layer."""
    from transformers import AutoConfig, PreTrainedConfig

    if isinstance(config, dict):
        config = _hub_config(config)
    elif not isinstance(config, PreTrainedConfig):
        with _quiet():
            config = AutoConfig.from_pretrained(config)
    model = build_on_meta(config)
    rotaries = []
    for path, module in model.named_modules():
        if not type(module).__name__.endswith("RotaryEmbedding") or "Vision" in type(module).__name__:
            continue
        built = _rebuilt(module)
        types = getattr(built, "layer_types", None)
        params = getattr(built.config, "rope_parameters", None) or {}
        if types and any(hasattr(built, f"{t}_inv_freq") for t in types):
            for t in types:
                if hasattr(built, f"{t}_inv_freq"):
                    rotaries.append(Rotary(path, t, getattr(built, f"{t}_inv_freq"),
                                           float(getattr(built, f"{t}_attention_scaling")), dict(params[t]),
                                           _rotary_head_dim(built.config, t)))
        else:
            rotaries.append(Rotary(path, None, built.inv_freq, float(built.attention_scaling), dict(params),
                                   _rotary_head_dim(built.config, None)))
    scales = [float(m.scaling) for _, m in model.named_modules()
              if type(m).__name__.endswith("Attention") and isinstance(getattr(m, "scaling", None), float)]
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    mla = text.qk_nope_head_dim + text.qk_rope_head_dim if getattr(text, "kv_lora_rank", None) else None
    return Oracle(rotaries, list(getattr(text, "layer_types", None) or []) or None, scales,
                  getattr(text, "max_position_embeddings", None), mla)


# --- the formulas -------------------------------------------------------------------------------------------


def _base_freqs(dim: int, base: float):
    import torch

    return 1.0 / (float(base) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature sqrt(1/t) = 0.1·mscale·ln(s) + 1 (YaRN §3.4; DeepSeek's `yarn_get_mscale`)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim: int, base: float, factor: float, original: int, beta_fast: float = 32.0,
                  beta_slow: float = 1.0, truncate: bool = True):
    """YaRN's frequencies (float64 tensor, dim/2): pair i keeps θ_i where it turns more than beta_fast times over
    the original length, takes θ_i/s where it turns less than beta_slow times, and blends linearly between
    (YaRN §3.2 "NTK-by-parts"; the ramp's ends rounded outwards unless `truncate` is false, clamped to
    [0, dim/2 - 1] as the reference implementation jquesnelle/yarn does)."""
    import torch

    def pair(rotations: float) -> float:  # the pair index whose wavelength fits `rotations` times in `original`
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair(beta_fast), pair(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    theta = _base_freqs(dim, base)
    return theta / factor * ramp + theta * (1 - ramp)


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """The factor YaRN multiplies cos and sin by: mscale(s) = 0.1·ln(s) + 1, or with DeepSeek's keys
    mscale(s, mscale) / mscale(s, mscale_all_dim) (the rest of the temperature is in the softmax scale)."""
    if mscale and mscale_all_dim:
        return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return yarn_get_mscale(factor)


def rope_inv_freq(parameters: dict[str, Any], head_dim: int):
    """(inv_freq float64, attention factor) of standardised RoPE `parameters` for heads of `head_dim` (rotating
    `partial_rotary_factor` of them): default, linear (position interpolation: θ/s), dynamic (as built, before
    any longer sequence: θ), llama3 (Meta's wavelength bands), yarn, longrope (θ/f_i with the short factors,
    which the module holds until a sequence passes the original length)."""
    import torch

    p = parameters
    dim = int(head_dim * (p.get("partial_rotary_factor") or 1.0))
    kind, base, theta = p.get("rope_type", "default"), p["rope_theta"], _base_freqs(dim, p["rope_theta"])
    if kind in ("default", "dynamic"):
        return theta, 1.0
    if kind == "linear":
        return theta / p["factor"], 1.0
    if kind == "llama3":
        original, factor = p["original_max_position_embeddings"], p["factor"]
        low_wavelen, high_wavelen = original / p["low_freq_factor"], original / p["high_freq_factor"]
        wavelen = 2 * math.pi / theta
        smooth = (original / wavelen - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
        mid = (1 - smooth) * theta / factor + smooth * theta
        out = torch.where(wavelen > low_wavelen, theta / factor, theta)
        return torch.where((wavelen >= high_wavelen) & (wavelen <= low_wavelen), mid, out), 1.0
    if kind == "yarn":
        inv = yarn_inv_freq(dim, base, p["factor"], p["original_max_position_embeddings"], p.get("beta_fast") or 32,
                            p.get("beta_slow") or 1, p.get("truncate", True))
        scale = p.get("attention_factor")
        return inv, scale if scale is not None else yarn_attention_factor(p["factor"], p.get("mscale"),
                                                                          p.get("mscale_all_dim"))
    if kind == "proportional":  # Gemma-4: the first partial_rotary_factor of the pairs rotate, the rest do not
        angles = int((p.get("partial_rotary_factor") or 1.0) * head_dim // 2)
        inv = torch.zeros(head_dim // 2, dtype=torch.float64)
        inv[:angles] = 1.0 / float(base) ** (torch.arange(0, 2 * angles, 2, dtype=torch.float64) / head_dim)
        return inv / (p.get("factor") or 1.0), 1.0
    if kind == "longrope":
        factors = torch.tensor(p["short_factor"], dtype=torch.float64)
        scale = p.get("attention_factor")
        if scale is None:
            s = p.get("factor") or 1.0
            scale = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(p["original_max_position_embeddings"]))
        return theta / factors, scale
    raise ValueError(f"no formula for rope_type {kind!r}")


def same_freqs(a, b, rtol: float = 2e-6, any_order: bool = False) -> bool:
    """Whether two inv_freq tensors agree to fp32 precision (one may be float64); `any_order`: as sets, for a
    3-D multimodal RoPE (`mrope_section`), which lays the same frequencies out section by section."""
    import torch

    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if any_order:
        a, b = a.sort().values, b.sort().values
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=rtol, atol=0))


def mla_softmax_scale(qk_head_dim: int, rope: dict[str, Any]) -> float:
    """DeepSeek-V2/V3's softmax scale: qk_head_dim^-0.5, times mscale(s, mscale_all_dim)² under YaRN
    (modeling_deepseek.py `DeepseekV2Attention.__init__`)."""
    scale = qk_head_dim ** -0.5
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        m = yarn_get_mscale(rope["factor"], rope["mscale_all_dim"])
        scale *= m * m
    return scale


# --- what a transformers-4 reader sees ---------------------------------------------------------------------------

# Families whose transformers-4 config class reads the base under another key (configuration_gpt_neox.py 4.x).
_V4_BASE_KEYS = {"gpt_neox": "rotary_emb_base"}


def language_model_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a composite config.json dict (its `text_config`), else `cfg`."""
    return cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg


def config_form(cfg: dict[str, Any]) -> str:
    """Which RoPE keys config.json dict `cfg` has (of a composite one: its language model's): "v5"
    (`rope_parameters`), "v4" (the base key and/or `rope_scaling`), "both", or "none"."""
    cfg = language_model_config(cfg)
    v5 = bool(cfg.get("rope_parameters"))
    v4 = _V4_BASE_KEYS.get(cfg.get("model_type"), "rope_theta") in cfg or "rope_scaling" in cfg
    return {(True, True): "both", (True, False): "v5", (False, True): "v4", (False, False): "none"}[(v5, v4)]


def v4_reader(cfg: dict[str, Any]) -> dict[str, Any]:
    """The RoPE a reader that knows only the transformers-4 keys sees in config.json dict `cfg` (transformers
    4.x config classes; llama.cpp's convert_hf_to_gguf.py reads `rope_theta` and `rope_scaling` the same way):
    the base under the family's key, the scaling in `rope_scaling` (`rope_type`, or `type` as older configs
    say), max_position_embeddings; of a composite config, in its `text_config`. `rope_parameters` it does not
    know."""
    cfg = language_model_config(cfg)
    scaling = cfg.get("rope_scaling") or {}
    return {"base": cfg.get(_V4_BASE_KEYS.get(cfg.get("model_type"), "rope_theta")),
            "rope_type": scaling.get("rope_type") or scaling.get("type") or "default",
            "factor": scaling.get("factor"), "original": scaling.get("original_max_position_embeddings"),
            "max_position_embeddings": cfg.get("max_position_embeddings")}


# --- what the layers see --------------------------------------------------------------------------------------

SLIDING_TYPES = ("sliding_attention", "chunked_attention")


def long_context_layer_type(layer_type: str | None) -> bool:
    """Whether layers of `layer_type` attend to the whole sequence (None: one RoPE for every layer)."""
    return layer_type is None or layer_type not in SLIDING_TYPES


# The RoPE types YaRN can take the place of, pair for pair (transformers' ROPE_INIT_FUNCTIONS but "proportional",
# Gemma-4's, which rotates the first pairs of a head_dim-wide spectrum: no YaRN config lays its pairs out so).
YARN_REPLACES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def yarn_refusal(model_type: str, oracle: Oracle) -> str | None:
    """Why `yarn` must refuse (in one line) a checkpoint of `model_type` whose model builds `oracle`, or None
    when it must write YaRN."""
    kinds = {r.parameters.get("rope_type", "default") for r in oracle.rotaries if long_context_layer_type(r.layer_type)}
    if kinds - set(YARN_REPLACES):
        return f"{'/'.join(sorted(kinds - set(YARN_REPLACES)))} RoPE: no YaRN has its layout"
    if not kinds:
        return "no RoPE in the layers that see the whole sequence"
    if default_rope_only(model_type):
        return "its rotary module computes the default RoPE only"
    return None


def extend_refusal(oracle: Oracle) -> str | None:
    """Why `extend --rope-base` must refuse a checkpoint whose model builds `oracle` before training, or None:
    YaRN's and LongRoPE's frequencies were fitted to their base and length."""
    kinds = {r.parameters.get("rope_type") for r in oracle.rotaries if long_context_layer_type(r.layer_type)}
    fitted = kinds & {"yarn", "longrope"}
    return f"{'/'.join(sorted(fitted))} is fitted to its base" if fitted else None


# --- the architecture table of docs/architectures.md ----------------------------------------------------------

ARCHITECTURES_DOC = Path(__file__).resolve().parent.parent / "docs" / "architectures.md"
_TABLE_AFTER = "Architectures: every verb works on these"
_HEADER = ("| architectures (transformers model types, each as transformers saves it) | RoPE as transformers builds it "
           "| `info` | `yarn --factor 4` | `extend --rope-base` |\n|---|---|---|---|---|")
# (group, test on the entry's oracle and config, RoPE, info, yarn, extend), the first group an entry fits wins
_GROUPS: list[tuple[str, Any, str, str, str, str]] = [
    ("mla", lambda o, c: bool(getattr(c, "kv_lora_rank", None)),
     "MLA: RoPE on the decoupled key part (`qk_rope_head_dim`)", "per layer type, softmax scale",
     "YaRN; `mscale`/`mscale_all_dim` kept (DeepSeek's softmax scale)", "new base"),
    ("per-layer", lambda o, c: any(r.layer_type is not None for r in o.rotaries),
     "a RoPE per layer type (sliding layers: their own base)", "each layer type",
     "YaRN in the full layers; sliding layers keep theirs", "new base in the full layers; sliding keep theirs"),
    ("scaled", lambda o, c: any(r.parameters.get("rope_type", "default") != "default" for r in o.rotaries),
     "scaled as saved (YaRN, llama3)", "type, factor, original length",
     "`--rescale`: YaRN from the original length", "new base, llama3 kept under it"),
    ("hybrid", lambda o, c: bool(set(o.layer_types or []) - {"full_attention", "sliding_attention",
                                                               "chunked_attention"}),
     "RoPE in the attention layers of a hybrid (state-space, linear or compressed attention)", "each layer type",
     "YaRN", "new base"),
    ("partial", lambda o, c: any(r.rotated_dims < r.head_dim for r in o.rotaries),
     "RoPE on a share of each head (`partial_rotary_factor`)", "rotated dimensions", "YaRN over the rotated share",
     "new base"),
    ("sliding", lambda o, c: "sliding_attention" in (o.layer_types or []) or bool(getattr(c, "sliding_window", 0)
                                                                                   and not hasattr(c, "use_sliding_window")),
     "one RoPE for full and sliding-window layers", "base, window", "YaRN (every layer: one module)", "new base"),
    ("plain", lambda o, c: True, "one RoPE for every layer", "base", "YaRN", "new base"),
]
# The Hub layouts' rows: family -> (RoPE as the Hub config says it, info, yarn, extend)
_HUB_ROWS: dict[str, tuple[str, str, str, str]] = {
    "Gemma-3": (("`rope_theta` 1e6 + `rope_scaling` linear x8 (global layers), `rope_local_base_freq` 1e4, "
                 "`sliding_window_pattern`"), "each layer type, local base",
                   "`--rescale`: YaRN in the global layers, written back as `rope_scaling`; local base kept",
                   "new base in the global layers (linear x8 kept); local base kept"),
    "Gemma-3 (vision-language)": ("as Gemma-3's, in `text_config`; a vision tower beside it",
                                  "the language model's, each layer type",
                                  "as Gemma-3's, in `text_config`; the rest of config.json as it was",
                                  "as Gemma-3's, in `text_config`; the vision tower's weights as they were"),
    "Mistral-3 (vision-language)": ("`rope_theta` 1e9 in `text_config`; a vision tower beside it", "base",
                                    "YaRN in `text_config`; the rest of config.json as it was",
                                    "new base in `text_config`"),
    "Pythia / GPT-NeoX": ("`rotary_emb_base` 50000, `rotary_pct` 0.25", "base 50000, 16 of 64 dimensions",
                     "YaRN over the rotated quarter, base 50000", "new base"),
    "DeepSeek-V2/V3 (MLA)": ("YaRN x40 in `rope_scaling` (`type`), `mscale` = `mscale_all_dim`",
                        "YaRN, factor, original length, softmax scale",
                        "`--rescale`: YaRN from the original length, `mscale`s kept",
                        "refused before training (YaRN is fitted to its base)"),
    "Qwen2-MoE": ("`use_sliding_window` false (transformers saves `sliding_window` 0)", "base", "YaRN",
                      "new base"),
    "Cohere2": ("RoPE in the sliding layers only (full layers: none)", "which layers have none",
                    "YaRN in the sliding layers; says the full layers have no RoPE", "new base"),
    "Mixtral": ("`rope_theta` 1e6, no `rope_scaling`, no `head_dim`", "base", "YaRN, written as `rope_theta` + "
                "`rope_scaling` with `head_dim`", "new base"),
    "Llama 3.x": ("llama3 x8 in `rope_scaling`", "type, factor, original length",
                  "`--rescale`: YaRN from the original length", "llama3 kept under the new base"),
}


def _refused(names: list[str], why: dict[str, str]) -> str:
    """'; refused, one line: `a` (reason), ...' for the names of a row the verb refuses."""
    listed = [f"`{n}` ({why[n]})" for n in sorted(names) if n in why]
    return f"; refused, one line: {', '.join(listed)}" if listed else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_architecture_table() -> str:
    """The architecture table of docs/architectures.md: a row per group of the transformers-saved entries (their
    model types listed) and a row per family of Hub layouts (with their saved-again forms)."""
    groups: dict[str, list[str]] = {}
    refused: dict[str, dict[str, str]] = {"yarn": {}, "extend": {}}
    for name, entry in entries().items():
        if entry.hub is None and not entry.dropped:
            config = entry_config(entry)
            o = rotary_oracle(config)
            groups.setdefault(next(g for g, fits, *_ in _GROUPS if fits(o, config)), []).append(name)
            for verb, why in (("yarn", yarn_refusal(name, o)), ("extend", extend_refusal(o))):
                if why:
                    refused[verb][name] = why
    rows = [_HEADER]
    for group, _, rope, info, yarn, extend in _GROUPS:
        if groups.get(group):
            types = ", ".join(f"`{t}`" for t in sorted(groups[group]))
            yarn += _refused(groups[group], refused["yarn"])
            extend += _refused(groups[group], refused["extend"])
            rows.append(f"| {types} | {rope} | {info} | {yarn} | {extend} |")
    families: dict[str, list[str]] = {}
    for family, cfg in HUB_LAYOUTS.values():
        families.setdefault(family, []).append(cfg["model_type"])
    for family, types in families.items():
        rope, info, yarn, extend = _HUB_ROWS[family]
        names = ", ".join(f"`{t}`" for t in types)
        rows.append(f"| {family}: the Hub's config.json ({names}), and as transformers saves it again | "
                    f"{_cell(rope)} | {info} | {yarn} | {extend} |")
    types = ", ".join(f"`{t}`" for t in head_dim_left_none_types())
    rows.append(f"| {types}: config.json without `head_dim` (their config class leaves it None) | as the row of "
                "the type | head size hidden_size / num_attention_heads | YaRN, with `head_dim` written (transformers' "
                "YaRN initialiser reads it) | new base |")
    return "\n".join(rows)


def docs_table(page: Path = ARCHITECTURES_DOC) -> str:
    """The table after docs/architectures.md's 'Architectures: every verb works on these' paragraph, as it
    stands."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(_TABLE_AFTER))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    last = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[first:last])


def write_docs_table(page: Path = ARCHITECTURES_DOC) -> None:
    """Replace docs/architectures.md's architecture table by `render_architecture_table()`."""
    text = page.read_text(encoding="utf-8")
    old = docs_table(page)
    page.write_text(text.replace(old, render_architecture_table(), 1), encoding="utf-8")


if __name__ == "__main__":  # .venv/bin/python tests/rope_matrix.py --write-docs
    if sys.argv[1:] == ["--write-docs"]:
        write_docs_table()
    else:
        print(render_architecture_table())
