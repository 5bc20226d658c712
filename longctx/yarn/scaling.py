"""The `yarn` verb: a YaRN-scaled copy of a checkpoint, and the vLLM settings that serve it.

    longctx yarn CKPT --factor 4 [-o OUT]
    longctx yarn CKPT --factor 16 --rescale    (a checkpoint with RoPE scaling already: replace it)

Static YaRN writes `{"rope_type": "yarn", "factor", "original_max_position_embeddings", "rope_theta"}` with
max_position_embeddings = original x factor, so transformers and every vLLM version agree on the context
length (vLLM before vllm-project/vllm#56446 derived max_model_len from original x factor alone). For the
architectures of `YARN_AS_LONGROPE` the same frequencies and attention scale are written as LongRoPE.
Every config is built back with transformers before anything is published (`check_written_rope`).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.checkpoint.rope import (
    KNOWN_ROPE_TYPES,
    LONGROPE_FORM_KEYS,
    ConfigFormat,
    RopeSettings,
    check_written_rope,
    read_rope,
    write_rope,
    yarn_longrope_form,
)
from longctx.core.errors import InputError
from longctx.yarn.settings import YarnSettings, default_output

# Keys `longctx yarn` never writes: transformers' `attention_factor` replaces the attention scale while
# older vLLM releases ignore it (`_compute_yarn_parameters` vs vLLM's `YaRNScalingRotaryEmbedding`).
_ENGINE_DEPENDENT_KEYS = ("attention_factor", "mscale", "mscale_all_dim", "attn_factor")
# What YaRN keeps of another scaling's RoPE dict: the model's own partial rotation, nothing of the scaling.
_KEPT_KEYS = ("partial_rotary_factor",)
# Architectures whose transformers config class cannot hold rope_type "yarn"; YaRN goes in LongRoPE form:
# - phi3, phi4_multimodal: `convert_rope_params_to_dict` turns "su" and "yarn" into "longrope"
#   (configuration_phi3.py, configuration_phi4_multimodal.py, "For backward compatibility"), which then
#   fails validation for lack of short_factor and long_factor;
# - phimoe: `PhimoeConfig.validate_rope` demands short_mscale and long_mscale for any scaled RoPE
#   (configuration_phimoe.py), which `PhimoeRotaryEmbedding` and vLLM's LongRoPE (not its YaRN) read.
YARN_AS_LONGROPE = ("phi3", "phi4_multimodal", "phimoe")
# Of those, the config classes whose `validate_rope` wants hidden_size // num_attention_heads factors while
# the model rotates head_dim (configuration_phi3.py, configuration_phi4_multimodal.py: `rotary_ndims`).
_FACTORS_SIZED_BY_HIDDEN = ("phi3", "phi4_multimodal")
_NAMES = {"yarn": "YaRN", "llama3": "llama3", "linear": "linear", "dynamic": "dynamic NTK", "longrope": "LongRoPE"}


@dataclass(frozen=True)
class ScaledConfig:
    config: dict[str, Any]
    rope: RopeSettings
    notes: list[str]


def _scaling(rope: RopeSettings) -> tuple[str, str]:
    """('llama3', 'factor 8, original length 8192'): how the messages name a checkpoint's scaling."""
    factor, original = rope.scaling_factor, rope.trained_length
    details = [f"factor {factor:g}"] if factor is not None else []
    if original is not None:
        details.append(f"original length {original}")
    return _NAMES.get(rope.rope_type, rope.rope_type), ", ".join(details)


def _unrecorded(rope: RopeSettings) -> str:
    """Why linear scaling without an original length has none to take."""
    return (f"does not record the original length (max_position_embeddings {rope.max_position_embeddings} may "
            "count before or after the factor)")


def _check_longrope_sizes(cfg: dict[str, Any], label: str) -> None:
    """InputError when no LongRoPE config of this checkpoint can load: its config class sizes the factors by
    hidden_size // num_attention_heads, its model by a different head_dim."""
    heads, hidden, head_dim = cfg.get("num_attention_heads"), cfg.get("hidden_size"), cfg.get("head_dim")
    if cfg.get("model_type") in _FACTORS_SIZED_BY_HIDDEN and heads and hidden and head_dim and (
            hidden // heads != head_dim):
        raise InputError(f"'{label}': transformers' {cfg['model_type']} config class sizes LongRoPE factors by "
                         f"hidden_size / num_attention_heads ({hidden // heads}) but the model rotates head_dim "
                         f"{head_dim}, so no YaRN config (LongRoPE form) of this checkpoint loads in transformers")


def apply_yarn(cfg: dict[str, Any], factor: float, original: int | None = None, rescale: bool = False,
               beta_fast: float | None = None, beta_slow: float | None = None, truncate: bool | None = None,
               config_format: ConfigFormat = "v5", label: str = "config.json", *, trust_remote_code: bool = False,
               checkpoint: str | Path | None = None) -> ScaledConfig:
    """Static YaRN on a config: `{"rope_type": "yarn", "factor", "original_max_position_embeddings", "rope_theta"}`
    with max_position_embeddings = original × factor (see the module docstring).

    `original` defaults to the checkpoint's original length (`RopeSettings.trained_length`): max_position_
    embeddings of an unscaled checkpoint, the recorded original length of a scaled one. A scaled checkpoint
    (yarn, llama3, linear, dynamic, longrope) needs `rescale`, which replaces its scaling with YaRN from that
    length, keeping rope_theta and dropping the old type's own keys (listed in the notes). The config is
    built back with transformers (`check_written_rope`, messages naming `label`; `checkpoint`, the source
    folder, and `trust_remote_code` for a config class the checkpoint ships); for the architectures of
    `YARN_AS_LONGROPE` YaRN is written in LongRoPE form.
    """
    if not factor > 1:
        raise InputError(f"factor must be > 1, got {factor}")
    rope = read_rope(cfg)
    notes: list[str] = []
    if rope.rope_type not in KNOWN_ROPE_TYPES:
        raise InputError(f"unknown RoPE type '{rope.rope_type}' in config.json (known: {', '.join(KNOWN_ROPE_TYPES)})")
    scaled = rope.rope_type != "default"
    unknown_linear = rope.rope_type == "linear" and rope.trained_length is None
    name, details = _scaling(rope)
    if scaled and not rescale:
        if unknown_linear:
            raise InputError(f"checkpoint is already linear-scaled ({details}) and its config {_unrecorded(rope)}; "
                             "pass --rescale --original-max-position-embeddings N, N the length it was trained at "
                             "before the linear scaling")
        raise InputError(f"checkpoint is already {name}-scaled ({details}); pass --rescale to replace its scaling "
                         "with YaRN from the original length")
    n = original if original is not None else rope.trained_length
    if n is None and unknown_linear:
        raise InputError(f"linear RoPE scaling ({details}) {_unrecorded(rope)}; pass --original-max-position-embeddings"
                         " N, N the length the model was trained at before the linear scaling")
    if n is None or n <= 0:
        raise InputError(
            "config has no max_position_embeddings to take as the original length; "
            "pass --original-max-position-embeddings N"
        )
    old = rope.extra
    if rope.stored_type == "longrope":  # longctx's LongRoPE form of YaRN: written again from the new factor
        old = {k: v for k, v in old.items() if k not in LONGROPE_FORM_KEYS}
    if rope.rope_type == "yarn":
        extra = {k: v for k, v in old.items() if k not in _ENGINE_DEPENDENT_KEYS}
        dropped = [k for k in old if k not in extra]
        if dropped:
            notes.append(f"dropped {', '.join(sorted(dropped))}: transformers and vLLM versions disagree on their "
                         "meaning")
    else:
        extra = {k: v for k, v in old.items() if k in _KEPT_KEYS}
        dropped = [k for k in old if k not in extra]
        if scaled:
            notes.append(f"replaced {name} scaling ({details}) with YaRN from original length {n}" + (
                f"; dropped {', '.join(dropped)} ({name}'s own parameters, unused by YaRN)" if dropped else ""))
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
    config = write_rope(cfg, new, config_format)
    check = {"trust_remote_code": trust_remote_code, "checkpoint": checkpoint}
    try:
        check_written_rope(config, new, label, **check)
    except InputError:
        if cfg.get("model_type") not in YARN_AS_LONGROPE:
            raise
        _check_longrope_sizes(cfg, label)
        new = yarn_longrope_form(cfg, new)
        config = write_rope(cfg, new, config_format)
        check_written_rope(config, new, label, **check)
        notes.append(f"transformers' {cfg['model_type']} config class does not keep rope_type 'yarn', so YaRN is "
                     "written as LongRoPE: short_factor = long_factor = YaRN's per-pair factors, attention_factor = "
                     "short_mscale = long_mscale = YaRN's attention scale (longctx reads it back as YaRN)")
    return ScaledConfig(config, new, notes)


def vllm_settings(rope: RopeSettings) -> dict[str, Any]:
    """The vLLM arguments that serve `rope`: max_model_len, and `--hf-overrides` that apply the same
    scaling to the unscaled checkpoint without writing a new directory."""
    overrides = {
        "rope_parameters": {"rope_type": rope.stored_type or rope.rope_type, "rope_theta": rope.theta,
                            **({"factor": rope.factor} if rope.factor is not None else {}),
                            **({"original_max_position_embeddings": rope.original_max_position_embeddings}
                               if rope.original_max_position_embeddings is not None else {}),
                            **rope.extra},
        "max_position_embeddings": rope.max_position_embeddings,
    }
    if rope.stored_type == "longrope":
        # Phi3Config's own field, which vLLM also reads for LongRoPE's default max_model_len
        overrides["original_max_position_embeddings"] = rope.original_max_position_embeddings
    return {"max_model_len": rope.context_length, "hf_overrides": overrides}


def vllm_command_line(checkpoint: str, source: str, rope: RopeSettings) -> tuple[str, str]:
    """(serve the new checkpoint, serve the source checkpoint with --hf-overrides) as shell lines."""
    s = vllm_settings(rope)
    over = json.dumps(s["hf_overrides"], separators=(", ", ": "))
    length = ["--max-model-len", str(s["max_model_len"])]
    return (shlex.join(["vllm", "serve", checkpoint, *length]),
            shlex.join(["vllm", "serve", source, *length, "--hf-overrides", over]))


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
    from longctx.checkpoint.directory import (
        checkpoint_dir,
        copy_side_files,
        read_config,
        write_provenance,
    )
    from longctx.core.files import CHECKPOINT_KIND, atomic_dir, check_output, write_json

    src = checkpoint_dir(s.checkpoint)
    cfg = read_config(src)
    out = Path(s.output) if s.output is not None else default_output(src, s.factor)
    trust = s.trust_remote_code
    result = apply_yarn(cfg, s.factor, s.original_max_position_embeddings, s.rescale, s.beta_fast, s.beta_slow,
                        s.truncate, s.config_format, label=str(out / "config.json"), trust_remote_code=trust,
                        checkpoint=src)
    check_output(out, CHECKPOINT_KIND, inputs=[("input checkpoint", src)], overwrite=s.overwrite)
    args = {k: v for k, v in s.record().items() if k not in ("checkpoint", "output", "overwrite")}
    with atomic_dir(out, CHECKPOINT_KIND) as tmp:
        copy_side_files(src, tmp, link_weights=True)
        write_json(tmp / "config.json", result.config)
        write_provenance(tmp, "yarn", args, src)
        # the file as written, before it is published
        check_written_rope(tmp, result.rope, str(out / "config.json"), trust_remote_code=trust)
    serve_new, serve_override = vllm_command_line(str(out), str(src), result.rope)
    return YarnResult(out, config_changes(cfg, result.config), result.notes, result.rope.context_length,
                      vllm_settings(result.rope), serve_new, serve_override)
