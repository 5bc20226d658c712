"""Convert the paper's released checkpoints (official layout) into the longctx gated family.

The official code (`qiuzh20/gated_attention`, released as `QwQZh/gated_attention`) has no gate
projection: it widens `q_proj` and orders its rows KV-group-major (its `modeling_qwen3.py` views the
`q_proj` output per KV group before the split). With G = H / KV
query heads per KV head, the rows of KV group k are `[q of heads kG..kG+G-1][their gates]`:
- elementwise: `q_proj` is `[2*H*hd, D]` = `view(KV, 2, G*hd, D)`; `[:, 0]` -> q, `[:, 1]` -> gate;
- headwise:    `q_proj` is `[H*hd + H, D]` = `view(KV, G*hd + G, D)`; `[:, :G*hd]` -> q, the rest -> gate.
Biases follow the same maps. Reading the weights as Qwen3-Next's per-head interleave instead is only
right for G = 1 (the released models have G = 2).

The released config says `model_type: "qwen2"` with the gate flags, `qkv_bias` (which also covers
`o_proj`, like Qwen3's `attention_bias`) and `use_qk_norm`; weights are `pytorch_model*.bin`, read
here with `torch.load(weights_only=True)` only. The output is a `GatedQwen3ForCausalLM` checkpoint
(a plain `Qwen3ForCausalLM` for the baseline) in safetensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import checkpoint_dir, copy_side_files, read_config, write_provenance
from longctx.checkpoint.weights import weight_files
from longctx.convert.result import ConvertResult
from longctx.convert.settings import ConvertSettings
from longctx.core.errors import InputError
from longctx.core.files import CHECKPOINT_KIND, atomic_dir, check_output
from longctx.models.variants import attention_variant, gate_flags
from longctx.rope.config import check_written_rope, read_rope

EXPECTED = ("expected the official gated-attention layout (QwQZh/gated_attention): config.json with model_type "
            "'qwen2' or 'qwen3' and the keys headwise_attn_output_gate and elementwise_attn_output_gate, and "
            "pytorch_model*.bin or *.safetensors weights whose q_proj is widened by the gate")
_GATE_KEYS = ("headwise_attn_output_gate", "elementwise_attn_output_gate")
# Config keys copied as they are (when present) into the converted config.
_COPIED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "initializer_range",
           "rms_norm_eps", "tie_word_embeddings", "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id")


def split_official_q_proj(w, num_heads: int, num_kv_heads: int, head_dim: int, variant: str):
    """Split an official widened `q_proj` weight `[rows, D]` (or bias `[rows]`) into (q, gate) in the
    longctx layout: q `[H*hd, ...]`, gate `[H*hd, ...]` (elementwise) or `[H, ...]` (headwise), head-major."""
    groups = num_heads // num_kv_heads
    rest = tuple(w.shape[1:])
    if variant == "elementwise":
        packed = w.reshape(num_kv_heads, 2, groups * head_dim, *rest)
        return (packed[:, 0].reshape(num_heads * head_dim, *rest).contiguous(),
                packed[:, 1].reshape(num_heads * head_dim, *rest).contiguous())
    if variant == "headwise":
        packed = w.reshape(num_kv_heads, groups * head_dim + groups, *rest)
        return (packed[:, : groups * head_dim].reshape(num_heads * head_dim, *rest).contiguous(),
                packed[:, groups * head_dim:].reshape(num_heads, *rest).contiguous())
    raise ValueError(f"no gate to split for variant '{variant}'")


def _not_official(src: Path, why: str) -> InputError:
    return InputError(f"'{src}' is not an official gated-attention checkpoint ({why}); {EXPECTED}")


def _official_variant(src: Path, cfg: dict[str, Any]) -> str:
    if cfg.get("model_type") not in ("qwen2", "qwen3"):
        raise _not_official(src, f"model_type is {cfg.get('model_type')!r}")
    missing = [k for k in _GATE_KEYS if k not in cfg]
    if missing:
        raise _not_official(src, f"config.json has no {' or '.join(missing)}")
    if cfg["headwise_attn_output_gate"] and cfg["elementwise_attn_output_gate"]:
        raise InputError(f"'{src}/config.json' asks for both headwise_attn_output_gate and "
                         "elementwise_attn_output_gate; set at most one of them (neither = baseline)")
    if cfg.get("use_qk_norm", True) is False:
        raise InputError(f"'{src}/config.json' has use_qk_norm false; the Qwen3-based family always has QK-norm")
    return attention_variant(cfg)


def _load_weights(src: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    # the files the fingerprint covers (an index's shards included), the .bin ones when there are any
    weights = weight_files(src)
    bins = [f for f in weights if f.suffix == ".bin"]
    files = bins or [f for f in weights if f.suffix == ".safetensors"]
    if not files:
        raise _not_official(src, "no pytorch_model*.bin or *.safetensors weight files")
    state: dict[str, Any] = {}
    for f in files:
        if f.suffix == ".bin":
            try:
                part = torch.load(f, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - untrusted input: weights_only refuses anything but tensors
                why = next((line.strip() for line in str(e).splitlines() if "Unsupported global" in line),
                           str(e).splitlines()[0] if str(e) else type(e).__name__)
                raise InputError(f"cannot read '{f}' as plain tensors with torch.load(weights_only=True), which "
                                 f"refuses pickled code for safety: {why}") from None
        else:
            part = load_file(f)
        if not isinstance(part, dict):
            raise _not_official(src, f"'{f.name}' holds a {type(part).__name__}, not a state dict")
        state.update(part)
    return state


def official_config(src: Path, cfg: dict[str, Any], variant: str):
    """The longctx config for an official config dict (RoPE written as transformers 5 `rope_parameters`)."""
    from transformers import Qwen3Config

    from longctx.models.gated_qwen3 import GatedQwen3Config

    values = {k: cfg[k] for k in _COPIED if k in cfg}
    if "head_dim" not in values:  # the official config class defaults to 128
        values["head_dim"] = 128
    rope = read_rope({**cfg, "model_type": "qwen3"})
    params = {"rope_type": rope.rope_type, "rope_theta": rope.theta, **rope.extra}
    if rope.factor is not None:
        params["factor"] = rope.factor
    if rope.original_max_position_embeddings is not None and rope.scaled:
        params["original_max_position_embeddings"] = rope.original_max_position_embeddings
    values["rope_parameters"] = params
    values["attention_bias"] = bool(cfg.get("qkv_bias", cfg.get("attention_bias", False)))
    if cfg.get("use_sliding_window"):
        values.update(use_sliding_window=True, sliding_window=cfg.get("sliding_window"),
                      max_window_layers=cfg.get("max_window_layers", values.get("num_hidden_layers")))
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if variant == "baseline":
        config = Qwen3Config(**values, architectures=["Qwen3ForCausalLM"])
    else:
        config = GatedQwen3Config(**values, **gate_flags(variant), architectures=["GatedQwen3ForCausalLM"])
    if dtype:
        config.dtype = dtype
    return config


def convert_state_dict(state: dict[str, Any], config, variant: str, src: Path) -> dict[str, Any]:
    """Official state dict -> longctx state dict (split q_proj, tied lm_head dropped, RoPE buffers dropped)."""
    H, KV, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    gate_rows = {"baseline": 0, "elementwise": H * hd, "headwise": H}[variant]
    out: dict[str, Any] = {}
    for name, t in state.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if ".self_attn.q_proj." in name and variant != "baseline":
            if t.shape[0] != H * hd + gate_rows:
                raise _not_official(src, f"{name} has {t.shape[0]} rows, the {variant} layout needs "
                                         f"{H * hd + gate_rows} = {H}*{hd} + {gate_rows}")
            q, g = split_official_q_proj(t, H, KV, hd, variant)
            out[name] = q
            out[name.replace(".q_proj.", ".g_proj.")] = g
            continue
        out[name] = t
    return out


def _check_keys(state: dict[str, Any], config, src: Path) -> None:
    import torch

    from longctx.models.gated_qwen3 import causal_lm_class

    with torch.device("meta"):
        expected = causal_lm_class(config)(config).state_dict()
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = [f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                 for what, names in (("missing", missing), ("unexpected", unexpected)) if names]
        raise _not_official(src, "; ".join(parts))
    for name, t in expected.items():
        if tuple(state[name].shape) != tuple(t.shape):
            raise _not_official(src, f"{name} has shape {tuple(state[name].shape)}, the config implies "
                                     f"{tuple(t.shape)}")


def convert(s: ConvertSettings) -> ConvertResult:
    """Convert `s.source` (a checkpoint in the official layout) into a longctx checkpoint at `s.output`."""
    from safetensors.torch import save_file

    src, out = checkpoint_dir(s.source, weights=True), Path(s.output)  # a local folder or a Hub id
    cfg = read_config(src)
    variant = _official_variant(src, cfg)
    check_output(out, CHECKPOINT_KIND, inputs=[("input checkpoint", src)], overwrite=s.overwrite)
    if not cfg.get("tie_word_embeddings", False) and not cfg.get("vocab_size"):
        raise _not_official(src, "config.json has no vocab_size")
    config = official_config(src, cfg, variant)
    state = convert_state_dict(_load_weights(src), config, variant, src)
    _check_keys(state, config, src)

    with atomic_dir(out, CHECKPOINT_KIND) as tmp:
        # the official remote code (*.py) describes the widened q_proj this conversion removes
        copy_side_files(src, tmp, keep=lambda p: p.suffix != ".py")
        config.save_pretrained(tmp)
        check_written_rope(tmp, read_rope(cfg))  # the official checkpoint's RoPE, as transformers reads it back
        save_file({k: v.contiguous() for k, v in state.items()}, tmp / "model.safetensors", metadata={"format": "pt"})
        write_provenance(tmp, "convert", {"from": s.layout}, src)
    return ConvertResult(out, src, variant, config.architectures[0], sum(v.numel() for v in state.values()),
                         config.num_attention_heads // config.num_key_value_heads)
