"""Tiny GGUF files written here, the way llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel) writes a Llama
checkpoint: llama.cpp tensor names (`gguf.get_tensor_name_map`), q/k rows permuted into its rotary layout, the
header's llama.* keys, a byte-level BPE tokenizer as `gpt2` tokens + merges, 2-D weights quantized by the `gguf`
package, norms kept in F32."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA = {"vocab_size": None, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
         "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def tiny_llama(tokenizer_dir: Path, seed: int = 0):
    """A random tiny LlamaForCausalLM (fp32) whose vocabulary is the tokenizer's."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(**{**LLAMA, "vocab_size": len(tok)}, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval(), tok


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor(w: np.ndarray, qtype):
    import gguf

    T = gguf.GGMLQuantizationType
    if w.ndim == 1 or qtype == T.F32:
        return w.astype(np.float32), None
    if qtype == T.F16:
        return w.astype(np.float16), None
    return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def write_gguf(model, tokenizer_dir: Path, out: Path, qtype_name: str = "F32", architecture: str = "llama",
               name: str = "tiny llama") -> Path:
    """`model` (a LlamaForCausalLM) and the byte-level BPE tokenizer in `tokenizer_dir` as a GGUF file at `out`."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    cfg = model.config
    w = gguf.GGUFWriter(str(out), architecture)
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type({"F32": 0, "F16": 1}.get(qtype_name, 7))

    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {a["id"] for a in spec["added_tokens"] if a["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in specials else 1 for i in range(len(tokens))])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for key, t in model.state_dict().items():
        data = t.detach().float().numpy()
        if key.endswith("q_proj.weight"):
            data = _permute(data, cfg.num_attention_heads)
        elif key.endswith("k_proj.weight"):
            data = _permute(data, cfg.num_key_value_heads)
        target = names.get_name(key, try_suffixes=(".weight", ".bias"))
        array, raw = _tensor(data, qtype)
        w.add_tensor(target, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def format_roundtrip(t: torch.Tensor, qtype_name: str) -> torch.Tensor:
    """What a weight becomes in `qtype_name` and back: the format's own error, nothing else."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    data = t.detach().float().numpy()
    if t.dim() == 1 or qtype_name == "F32":
        return torch.from_numpy(data.copy())
    if qtype_name == "F16":
        return torch.from_numpy(data.astype(np.float16).astype(np.float32))
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype).copy())
