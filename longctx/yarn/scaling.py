"""The `yarn` verb: a YaRN-scaled copy of a checkpoint, and the vLLM settings that serve it.

    longctx yarn CKPT --factor 4 [-o OUT]

Static YaRN writes `{"rope_type": "yarn", "factor", "original_max_position_embeddings", "rope_theta"}` with
max_position_embeddings = original x factor, so transformers and every vLLM version agree on the context
length (vLLM before vllm-project/vllm#56446 derived max_model_len from original x factor alone).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.checkpoint.rope import KNOWN_ROPE_TYPES, ConfigFormat, RopeSettings, read_rope, write_rope
from longctx.core.errors import InputError
from longctx.yarn.settings import YarnSettings

# Keys `longctx yarn` never writes: transformers' `attention_factor` replaces the attention scale while
# older vLLM releases ignore it (`_compute_yarn_parameters` vs vLLM's `YaRNScalingRotaryEmbedding`).
_ENGINE_DEPENDENT_KEYS = ("attention_factor", "mscale", "mscale_all_dim", "attn_factor")


@dataclass(frozen=True)
class ScaledConfig:
    config: dict[str, Any]
    rope: RopeSettings
    notes: list[str]


def apply_yarn(cfg: dict[str, Any], factor: float, original: int | None = None, rescale: bool = False,
               beta_fast: float | None = None, beta_slow: float | None = None, truncate: bool | None = None,
               config_format: ConfigFormat = "v5") -> ScaledConfig:
    """Static YaRN on a config: `{"rope_type": "yarn", "factor", "original_max_position_embeddings", "rope_theta"}`
    with max_position_embeddings = original × factor (see the module docstring).

    `original` defaults to the checkpoint's trained length: max_position_embeddings of an unscaled
    checkpoint, the recorded original length of a YaRN one (`rescale`).
    """
    if not factor > 1:
        raise InputError(f"factor must be > 1, got {factor}")
    rope = read_rope(cfg)
    notes: list[str] = []
    if rope.rope_type not in KNOWN_ROPE_TYPES:
        raise InputError(f"unknown RoPE type '{rope.rope_type}' in config.json (known: {', '.join(KNOWN_ROPE_TYPES)})")
    if rope.rope_type == "yarn" and not rescale:
        raise InputError(
            f"checkpoint is already YaRN-scaled (factor {rope.factor}, original length "
            f"{rope.original_max_position_embeddings}); pass --rescale to recompute from the original length"
        )
    if rope.rope_type not in ("default", "yarn"):
        raise InputError(f"cannot apply YaRN on top of RoPE type '{rope.rope_type}'; start from an unscaled checkpoint")
    n = original if original is not None else rope.trained_length
    if n is None or n <= 0:
        raise InputError(
            "config has no max_position_embeddings to take as the original length; "
            "pass --original-max-position-embeddings N"
        )
    extra = {k: v for k, v in rope.extra.items() if k not in _ENGINE_DEPENDENT_KEYS}
    dropped = sorted(set(rope.extra) - set(extra))
    if dropped:
        notes.append(f"dropped {', '.join(dropped)}: transformers and vLLM versions disagree on their meaning")
    for key, value in (("beta_fast", beta_fast), ("beta_slow", beta_slow)):
        if value is not None:
            extra[key] = float(value)
    if truncate is not None:
        extra["truncate"] = bool(truncate)
    new = RopeSettings(
        "yarn", rope.theta, math.ceil(n * factor), factor=float(factor),
        original_max_position_embeddings=int(n), extra=extra,
    )
    if rope.theta_is_default:
        notes.append(f"config had no RoPE base; wrote the {cfg.get('model_type')} default {rope.theta}")
    return ScaledConfig(write_rope(cfg, new, config_format), new, notes)


def vllm_settings(rope: RopeSettings) -> dict[str, Any]:
    """The vLLM arguments that serve `rope`: max_model_len, and `--hf-overrides` that apply the same
    scaling to the unscaled checkpoint without writing a new directory."""
    overrides = {
        "rope_parameters": {"rope_type": rope.rope_type, "rope_theta": rope.theta,
                            **({"factor": rope.factor} if rope.factor is not None else {}),
                            **({"original_max_position_embeddings": rope.original_max_position_embeddings}
                               if rope.original_max_position_embeddings is not None else {}),
                            **rope.extra},
        "max_position_embeddings": rope.max_position_embeddings,
    }
    return {"max_model_len": rope.context_length, "hf_overrides": overrides}


def vllm_command_line(checkpoint: str, source: str, rope: RopeSettings) -> tuple[str, str]:
    """(serve the new checkpoint, serve the source checkpoint with --hf-overrides) as shell lines."""
    s = vllm_settings(rope)
    over = json.dumps(s["hf_overrides"], separators=(", ", ": "))
    return (f"vllm serve {checkpoint} --max-model-len {s['max_model_len']}",
            f"vllm serve {source} --max-model-len {s['max_model_len']} --hf-overrides '{over}'")


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable top-level differences between two configs, e.g. 'max_position_embeddings: 32768 -> 131072'."""
    lines = []
    for key in [*old, *(k for k in new if k not in old)]:
        if key not in new:
            lines.append(f"{key}: {json.dumps(old[key])} -> (removed)")
        elif key not in old:
            lines.append(f"{key}: (new) {json.dumps(new[key])}")
        elif old[key] != new[key]:
            lines.append(f"{key}: {json.dumps(old[key])} -> {json.dumps(new[key])}")
    return lines


@dataclass(frozen=True)
class YarnResult:
    output: Path
    changes: list[str]  # what changed in config.json
    notes: list[str]
    context_length: int | None
    vllm: dict[str, Any]  # max_model_len and hf_overrides
    vllm_serve: str  # serve the new checkpoint
    vllm_serve_overrides: str  # serve the source with --hf-overrides instead


def yarn_checkpoint(s: YarnSettings) -> YarnResult:
    """Write a YaRN-scaled copy of `s.checkpoint` (weights hard-linked or copied unchanged, tokenizer and
    generation config copied, provenance in longctx.json), atomically."""
    from longctx.checkpoint.describe import checkpoint_name
    from longctx.checkpoint.directory import checkpoint_dir, copy_side_files, read_config, write_provenance
    from longctx.checkpoint.hub import hub_origin
    from longctx.core.files import CHECKPOINT_KIND, atomic_dir, check_output, write_json

    src = checkpoint_dir(s.checkpoint)
    cfg = read_config(src)
    result = apply_yarn(cfg, s.factor, s.original_max_position_embeddings, s.rescale, s.beta_fast, s.beta_slow,
                        s.truncate, s.config_format)
    # default: beside the source, or (a Hub snapshot, inside the Hub cache) in the current directory
    beside = Path.cwd() if hub_origin(src) else src.parent
    out = Path(s.output) if s.output is not None else beside / f"{checkpoint_name(src)}-yarn{s.factor:g}x"
    check_output(out, CHECKPOINT_KIND, inputs=[("input checkpoint", src)], overwrite=s.overwrite)
    args = {k: v for k, v in s.record().items() if k not in ("checkpoint", "output", "overwrite")}
    with atomic_dir(out, CHECKPOINT_KIND) as tmp:
        copy_side_files(src, tmp, link_weights=True)
        write_json(tmp / "config.json", result.config)
        write_provenance(tmp, "yarn", args, src)
    serve_new, serve_override = vllm_command_line(str(out), str(src), result.rope)
    return YarnResult(out, config_changes(cfg, result.config), result.notes, result.rope.context_length,
                      vllm_settings(result.rope), serve_new, serve_override)
