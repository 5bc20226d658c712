"""Model shapes (presets) and the configs and parameter counts of the attention variants on them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import copy_side_files, is_tokenizer_file
from longctx.checkpoint.tokenizer import write_reference_tokenizer
from longctx.core.files import CHECKPOINT_KIND, atomic_dir
from longctx.models.gates import parse_gate
from longctx.models.variants import gate_flags

# Qwen3 with head_dim 64 (vLLM's CPU attention rejects head sizes below 32) and GQA 2:1; 32k vocab
# to match the reference tokenizer. About 4.6M parameters, most of them the (tied) embedding.
TINY_QWEN3: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000},
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# Model shapes only; the vocabulary comes from the tokenizer. Tied embeddings and QK-norm (Qwen3).
PRESETS: dict[str, dict[str, Any]] = {
    # Runs in seconds on CPU; head_dim 64 so vLLM's CPU attention accepts it; GQA 2:1.
    "tiny": {k: v for k, v in TINY_QWEN3.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id")},
    # The paper's dense 1.7B-28L (Qiu et al. 2025, Table 7), pretrained at 4096 tokens with RoPE base 10k.
    "paper-1.7b": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000},
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
    },
}
# Weights dtype written by default (a 1.7B model in fp32 would be 6 GB for no benefit).
PRESET_DTYPES = {"tiny": "float32", "paper-1.7b": "bfloat16"}
# `match_params` rounds a gated model's FFN width to a multiple of this. A GPU's matrix kernels tile an FFN of a
# multiple of 64 without remainder; an odd width such as 5461 (the exact match of paper-1.7b's elementwise gate)
# leaves its bf16 matmuls unaligned, and the gated model trained 1.7x slower than the baseline on an H200
# (docs/gpu.md). The tiny preset runs on CPUs and matches exactly, as the shipped checkpoints were made.
FFN_MULTIPLES = {"tiny": 1, "paper-1.7b": 64}


def write_tiny_qwen3(out: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None, seed: int = 0,
                     **overrides: Any) -> Path:
    """Write a randomly initialised tiny Qwen3 checkpoint (fp32 safetensors + tokenizer, no provenance) to
    `out`: the plain model tests and benchmarks start from. The tokenizer defaults to the reference one."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out)
    config = Qwen3Config(**{**TINY_QWEN3, **overrides}, architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    with atomic_dir(out, CHECKPOINT_KIND) as tmp:
        model.save_pretrained(tmp, max_shard_size="2GB")
        GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(tmp)
        if tokenizer_dir is None:
            write_reference_tokenizer(tmp)
        else:
            copy_side_files(Path(tokenizer_dir), tmp, keep=is_tokenizer_file)
    return out


def model_config(preset: str, attention: str, vocab_size: int, match_params: bool = False, **overrides: Any):
    """The transformers config for a preset and attention variant: `Qwen3Config` for the baseline
    (plain Qwen3, vLLM's native path), `GatedQwen3Config` for the gated variants.

    `match_params` shrinks a gated model's FFN (`intermediate_size`) so that its parameter count is
    the baseline's, as the paper did: to the nearest multiple of the preset's `FFN_MULTIPLES` FFN units (an FFN
    unit is 3 * hidden parameters per layer).
    """
    from transformers import Qwen3Config

    from longctx.models.gated_qwen3 import GatedQwen3Config, gate_parameter_count

    values = {**PRESETS[preset], "vocab_size": vocab_size, **overrides}
    baseline = Qwen3Config(**values, architectures=["Qwen3ForCausalLM"])
    if parse_gate(attention) is None:
        return baseline
    config = GatedQwen3Config(**values, **gate_flags(attention), architectures=["GatedQwen3ForCausalLM"])
    if match_params:
        gate_params = gate_parameter_count(config) / config.num_hidden_layers
        exact = config.intermediate_size - gate_params / (3 * config.hidden_size)
        multiple = FFN_MULTIPLES[preset]
        config.intermediate_size = multiple * round(exact / multiple)
    return config


def parameter_count(config) -> int:
    """Parameters of the model a config describes (tied embeddings counted once), built on `meta`."""
    import torch

    from longctx.models.gated_qwen3 import causal_lm_class

    with torch.device("meta"):
        model = causal_lm_class(config)(config)
    return sum(p.numel() for p in model.parameters())
