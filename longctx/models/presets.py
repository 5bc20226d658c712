"""Freshly initialised checkpoints from named configs (tiny ones for demos and tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


def write_tiny_qwen3(out: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None, seed: int = 0,
                     **overrides: Any) -> Path:
    """Write a randomly initialised tiny Qwen3 checkpoint (fp32 safetensors + tokenizer) to `out`.

    The tokenizer defaults to the reference Mistral v1 SentencePiece one (see
    `longctx.checkpoint.write_reference_tokenizer`).
    """
    import shutil

    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from longctx.checkpoint import atomic_dir, write_reference_tokenizer

    out = Path(out)
    config = Qwen3Config(**{**TINY_QWEN3, **overrides}, architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, max_shard_size="2GB")
        GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(tmp)
        if tokenizer_dir is None:
            write_reference_tokenizer(tmp)
        else:
            for f in Path(tokenizer_dir).iterdir():
                if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                    shutil.copy2(f, tmp / f.name)
    return out
