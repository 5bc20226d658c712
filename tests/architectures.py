"""Tiny random checkpoints of every architecture longctx supports, built from transformers configs.

Each has the shape a real checkpoint of that family has where it matters to longctx (its RoPE type and
parameters, sliding windows, soft-capping, fused projections, embedding scaling, biases), and is small
where it does not: 2 layers, 4 query heads over 2 KV heads of head_dim 64 (vLLM's CPU attention rejects
smaller heads) and hidden size 4 x 64, as real checkpoints have it (vLLM's Qwen2 derives head_dim from
hidden_size / heads, Phi3Config sizes LongRoPE factors by it), the reference tokenizer's 32k vocabulary,
trained length 256.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TRAINED_LENGTH = 256
_SHAPE: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "max_position_embeddings": TRAINED_LENGTH, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None,
}

# name -> (transformers config class name, architecture, config values over _SHAPE)
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                                                  "tie_word_embeddings": True}),
    # Qwen2.5: q/k/v biases; a sliding window in the config that use_sliding_window=false switches off; a
    # vocabulary padded past the tokenizer's (transformers gives a qwen2 checkpoint Qwen2Tokenizer, which adds
    # <|endoftext|> as id 32000 to the reference vocabulary)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"vocab_size": 32064,
                                                  "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                                                  "use_sliding_window": False, "sliding_window": 128,
                                                  "tie_word_embeddings": True}),
    # Llama 3.1: llama3 scaling (factor 8 over the original length, Meta's wavelength bands); the tiny
    # model's original length is 256 and its max_position_embeddings 2048, as 8192 -> 131072 in the real one
    "llama3": ("LlamaConfig", "LlamaForCausalLM", {
        "max_position_embeddings": TRAINED_LENGTH * 8, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": TRAINED_LENGTH}}),
    # Mistral 7B v0.1: every layer attends to the last `sliding_window` tokens only
    "mistral": ("MistralConfig", "MistralForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                                                        "sliding_window": 128, "tie_word_embeddings": False}),
    # Gemma: GeGLU, embeddings scaled by sqrt(hidden), (1 + weight) RMSNorm, tied embeddings
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                                                  "tie_word_embeddings": True}),
    # Gemma 2: sliding and full layers alternating, attention and final logit soft-capping
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"], "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 64, "tie_word_embeddings": True}),
    # Phi-3 mini 4k: fused qkv and gate/up projections, a top-level original_max_position_embeddings, and
    # a vocabulary padded past the tokenizer's (32064), as the real one
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {
        "vocab_size": 32064, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
        "original_max_position_embeddings": TRAINED_LENGTH, "pad_token_id": 32000, "tie_word_embeddings": False}),
}


def write_tiny_architecture(name: str, out: Path, tokenizer_dir: Path, seed: int = 0,
                            **overrides: Any) -> Path:
    """Write the tiny random checkpoint `name` of ARCHITECTURES (fp32 safetensors, generation config, the
    tokenizer of `tokenizer_dir`) to `out`."""
    import shutil

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    config_class, architecture, values = ARCHITECTURES[name]
    config = getattr(transformers, config_class)(**{**_SHAPE, **values, **overrides}, architectures=[architecture])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(out)
    for f in Path(tokenizer_dir).iterdir():
        if f.name.startswith("tokenizer") or f.name.startswith("special_tokens"):
            shutil.copy2(f, out / f.name)
    return out


# A checkpoint whose config and model classes ship with it (config.json auto_map): a Llama under another
# model_type. Importing its code touches $LONGCTX_TEST_REMOTE_CODE_RAN, so a test sees whether it ran.
_REMOTE_CONFIG = '''import os
from pathlib import Path

from transformers import LlamaConfig

if os.environ.get("LONGCTX_TEST_REMOTE_CODE_RAN"):
    Path(os.environ["LONGCTX_TEST_REMOTE_CODE_RAN"]).touch()


class TinyRemoteConfig(LlamaConfig):
    model_type = "tiny_remote"
'''
_REMOTE_MODEL = '''from transformers import LlamaForCausalLM

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteForCausalLM(LlamaForCausalLM):
    config_class = TinyRemoteConfig
'''


def write_remote_code_checkpoint(out: Path, tokenizer_dir: Path, **overrides: Any) -> Path:
    """A tiny Llama whose config.json names model_type 'tiny_remote', built by the code it ships."""
    import json

    ARCHITECTURES["tiny_remote"] = ("LlamaConfig", "LlamaForCausalLM", {
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "tie_word_embeddings": False})
    try:
        write_tiny_architecture("tiny_remote", out, tokenizer_dir, **overrides)
    finally:
        del ARCHITECTURES["tiny_remote"]
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(model_type="tiny_remote", architectures=["TinyRemoteForCausalLM"],
               auto_map={"AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
                         "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "configuration_tiny_remote.py").write_text(_REMOTE_CONFIG)
    (out / "modeling_tiny_remote.py").write_text(_REMOTE_MODEL)
    return out
