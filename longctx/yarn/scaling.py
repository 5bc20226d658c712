"""The `yarn` verb: a YaRN-scaled copy of a checkpoint, and the vLLM settings that serve it.

    longctx yarn CKPT --factor 4 [-o OUT]
    longctx yarn CKPT --factor 16 --rescale    (a checkpoint with RoPE scaling already: replace it)

Static YaRN writes `{"rope_type": "yarn", "factor", "original_max_position_embeddings", "rope_theta"}` with
max_position_embeddings = original x factor, so transformers and every vLLM version agree on the context
length (vLLM before vllm-project/vllm#56446 derived max_model_len from original x factor alone). For the
architectures of `YARN_AS_LONGROPE` the same frequencies and attention scale are written as LongRoPE.
A config with per-layer-type RoPE (Gemma-3) gets YaRN in its layers that see the whole sequence, its sliding
layers keeping their own RoPE, written in the form it has (`longctx.rope.layers`). Every config is
built back with transformers, rotary module included, before anything is published (`check_written_rope`).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import checkpoint_dir, copy_side_files, read_config, write_provenance
from longctx.checkpoint.text_config import text_config, text_config_key
from longctx.core.errors import InputError, SettingError, ref
from longctx.core.files import CHECKPOINT_KIND, atomic_dir, check_output, write_json
from longctx.rope.built import BuiltRope, prose, reach_notes
from longctx.rope.config import (
    LONGROPE_FORM_KEYS,
    ConfigFormat,
    RopeSettings,
    check_written_rope,
    long_layer_type,
    read_rope,
    rope_dict,
    write_rope,
    yarn_longrope_form,
)
from longctx.rope.layers import LayerRopes, built_config, read_rope_layers, write_rope_layers
from longctx.yarn.settings import YarnSettings, default_output

# Keys `longctx yarn` does not carry over from an old YaRN: transformers' `attention_factor` replaces the attention
# scale while older vLLM releases ignore it (`_compute_yarn_parameters` vs vLLM's `YaRNScalingRotaryEmbedding`), and
# it is a constant for the old factor; DeepSeek's mscale keys, except where they count (`_kept_mscale`).
_ENGINE_DEPENDENT_KEYS = ("attention_factor", "mscale", "mscale_all_dim", "attn_factor")
# DeepSeek's YaRN keys. As a pair, transformers 5.19 `_compute_yarn_parameters` and vLLM 0.32
# `YaRNScalingRotaryEmbedding` scale cos and sin by mscale(s, mscale) / mscale(s, mscale_all_dim) (one alone does
# nothing); for the model types below the attention also scales its softmax by mscale(s, mscale_all_dim)^2
# (`yarn_apply_mscale`, models/deepseek_v3/modeling_deepseek_v3.py and the modeling files of those types).
# Dropping them changes the attention of the same weights.
_MLA_KEYS = ("mscale", "mscale_all_dim")
MLA_MSCALE_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa", "longcat_flash",
                    "minicpm3", "mistral4", "youtu", "axk1", "axk2", "hy_v4")
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


def _scaling(rope: RopeSettings) -> tuple[str, str]:
    """('llama3', 'factor 8, original length 8192'): how the messages name a checkpoint's scaling."""
    factor, original = rope.scaling_factor, rope.trained_length
    details = [f"factor {factor:g}"] if factor is not None else []
    if original is not None:
        details.append(f"original length {original}")
    return rope.type_record.display, ", ".join(details)


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


@dataclass(frozen=True)
class ScaledConfig:
    config: dict[str, Any]
    rope: RopeSettings  # of the layers that see the whole sequence
    notes: list[str]
    layers: dict[str, RopeSettings] | None = None  # per layer type, for a config with per-layer-type RoPE
    text_key: str | None = None  # where a composite config keeps its language model's (`text_config_key`)

    @property
    def expected(self) -> RopeSettings | dict[str, RopeSettings]:
        """What `check_written_rope` checks the written config against."""
        return self.layers if self.layers is not None else self.rope


@dataclass(frozen=True)
class YarnAsk:
    """What `longctx yarn` was asked (its settings, less the checkpoint and output)."""

    factor: float
    original: int | None = None
    rescale: bool = False
    beta_fast: float | None = None
    beta_slow: float | None = None
    truncate: bool | None = None
    model_type: str | None = None


ORIGINAL = ref("original_max_position_embeddings")


def _refusals(rope: RopeSettings, ask: YarnAsk, whose: str) -> int:
    """The original length YaRN scales `rope` from (`whose` RoPE it is, in messages); InputError where there is
    none, or where `rope` is scaled already and `ask.rescale` is off."""
    if rope.type_record.yarn == "refuse":
        raise InputError(rope.type_record.yarn_refusal)
    unknown_linear = rope.original_unknown
    name, details = _scaling(rope)
    if rope.scaled and not ask.rescale:
        if unknown_linear:
            raise SettingError(f"{whose} is already linear-scaled ({details}) and its config {_unrecorded(rope)}; "
                               f"pass {ref('rescale')} {ORIGINAL} N, N the length it was trained at before the "
                               "linear scaling", YarnSettings)
        raise SettingError(f"{whose} is already {name}-scaled ({details}); pass {ref('rescale')} to replace its "
                           "scaling with YaRN from the original length", YarnSettings)
    n = ask.original if ask.original is not None else rope.trained_length
    if n is None and unknown_linear:
        raise SettingError(f"linear RoPE scaling ({details}) {_unrecorded(rope)}; pass {ORIGINAL} N, N the length "
                           "the model was trained at before the linear scaling", YarnSettings)
    if n is None or n <= 0:
        raise SettingError("config has no max_position_embeddings to take as the original length; "
                           f"pass {ORIGINAL} N", YarnSettings)
    return n


def _kept_mscale(old: dict[str, Any], model_type: Any) -> tuple[str, ...]:
    """DeepSeek's mscale keys a rescaled YaRN keeps: for the types whose attention reads them (`MLA_MSCALE_TYPES`),
    and for any type when both are set (their ratio scales cos and sin); a lone one does nothing and goes."""
    if model_type in MLA_MSCALE_TYPES or (old.get("mscale") and old.get("mscale_all_dim")):
        return _MLA_KEYS
    return ()


def yarn_rope(rope: RopeSettings, ask: YarnAsk, whose: str = "checkpoint") -> tuple[RopeSettings, list[str]]:
    """Static YaRN in place of `rope` (the RoPE of the checkpoint, or of some of its layers: `whose`), and notes
    on what was replaced, dropped and kept. YaRN's own keys stay; of an old YaRN, `_ENGINE_DEPENDENT_KEYS` are
    dropped except DeepSeek's mscale keys where they count (`_kept_mscale`)."""
    n = _refusals(rope, ask, whose)
    notes: list[str] = []
    name, details = _scaling(rope)
    old = rope.extra
    if rope.stored_type is not None:  # longctx's LongRoPE form of YaRN: written again from the new factor
        old = {k: v for k, v in old.items() if k not in LONGROPE_FORM_KEYS}
    if rope.type_record.is_yarn:
        keep = _kept_mscale(old, ask.model_type)
        extra = {k: v for k, v in old.items() if k not in _ENGINE_DEPENDENT_KEYS or k in keep}
        dropped = [k for k in old if k not in extra]
        if dropped:
            notes.append(f"dropped {', '.join(sorted(dropped))}: transformers and vLLM versions disagree on their "
                         "meaning")
        kept = [k for k in keep if k in extra]
        if kept:
            values = ", ".join(f"{k} {extra[k]:g}" for k in kept)
            mla = ask.model_type in MLA_MSCALE_TYPES
            notes.append(f"kept {values}: " + (f"{ask.model_type}'s attention (DeepSeek's MLA) multiplies" if mla
                                               else "transformers and vLLM multiply") +
                         " cos and sin by mscale(s, mscale) / mscale(s, mscale_all_dim)" +
                         (" and its softmax scale by mscale(s, mscale_all_dim)^2" if mla else ""))
    else:
        extra = {k: v for k, v in old.items() if k in _KEPT_KEYS}
        dropped = [k for k in old if k not in extra]
        if rope.scaled:
            notes.append(f"replaced {name} scaling ({details}) with YaRN from original length {n}" + (
                f"; dropped {', '.join(dropped)} ({name}'s own parameters, unused by YaRN)" if dropped else ""))
    for key, value in (("beta_fast", ask.beta_fast), ("beta_slow", ask.beta_slow)):
        if value is not None:
            extra[key] = float(value)
    if ask.truncate is not None:
        extra["truncate"] = bool(ask.truncate)
    new = RopeSettings("yarn", rope.theta, math.ceil(n * ask.factor), factor=float(ask.factor),
                       original_max_position_embeddings=int(n), extra=extra)
    if rope.theta_is_default:
        notes.append(f"config had no RoPE base; wrote the {ask.model_type} default {rope.theta}")
    return new, notes


def apply_yarn(cfg: dict[str, Any], factor: float, *, original: int | None = None, rescale: bool = False,
               beta_fast: float | None = None, beta_slow: float | None = None, truncate: bool | None = None,
               config_format: ConfigFormat | None = None, label: str = "config.json",
               trust_remote_code: bool = False, checkpoint: str | Path | None = None) -> ScaledConfig:
    """Static YaRN on a config: `{"rope_type": "yarn", "factor", "original_max_position_embeddings", "rope_theta"}`
    with max_position_embeddings = original × factor (see the module docstring).

    `original` defaults to the checkpoint's original length (`RopeSettings.trained_length`): max_position_
    embeddings of an unscaled checkpoint, the recorded original length of a scaled one. A scaled checkpoint
    (yarn, llama3, linear, dynamic, longrope) needs `rescale`, which replaces its scaling with YaRN from that
    length, keeping rope_theta and dropping the old type's own keys (listed in the notes; `yarn_rope`). A config
    with per-layer-type RoPE gets YaRN in the layer types that see the whole sequence, the others kept, in its
    own form [`config_format` default: the form the config has, `stored_form`]. The config is built back with
    transformers, its rotary module included (`check_written_rope`, messages naming `label`; `checkpoint`, the
    source folder, and `trust_remote_code` for a config class the checkpoint ships); for the architectures of
    `YARN_AS_LONGROPE` YaRN is written in LongRoPE form.
    """
    if not factor > 1:
        raise InputError(f"factor must be > 1, got {factor}")
    text = text_config(cfg)  # what the language model's config says (of a composite config: its text_config)
    ask = YarnAsk(factor, original, rescale, beta_fast, beta_slow, truncate, text.get("model_type"))
    check = {"trust_remote_code": trust_remote_code, "checkpoint": checkpoint}
    key = text_config_key(cfg)
    layers = read_rope_layers(cfg, built_config(cfg, checkpoint, trust_remote_code))
    if layers is not None:
        return _yarn_layers(cfg, layers, ask, config_format, label, check)
    new, notes = yarn_rope(read_rope(cfg), ask)
    config = write_rope(cfg, new, config_format)
    try:
        built = check_written_rope(config, new, label, **check)
    except InputError:
        if ask.model_type not in YARN_AS_LONGROPE:
            raise
        _check_longrope_sizes(text, label)
        new = yarn_longrope_form(text, new)
        config = write_rope(cfg, new, config_format)
        built = check_written_rope(config, new, label, **check)
        notes.append(f"transformers' {ask.model_type} config class does not keep rope_type 'yarn', so YaRN is "
                     "written as LongRoPE: short_factor = long_factor = YaRN's per-pair factors, attention_factor = "
                     "short_mscale = long_mscale = YaRN's attention scale (longctx reads it back as YaRN)")
    return ScaledConfig(config, new, notes + reach_notes(built, "YaRN") + _softmax_note(built, new, ask),
                        text_key=key)


def _yarn_layers(cfg: dict[str, Any], layers: LayerRopes, ask: YarnAsk, config_format: str | None, label: str,
                 check: dict[str, Any]) -> ScaledConfig:
    """`apply_yarn` for a config with per-layer-type RoPE: YaRN in `layers.long_types`, the others kept."""
    if not layers.long_types:
        raise InputError(f"every layer type of this config ({', '.join(layers.types)}) attends to a window of the "
                         "sequence only; YaRN has no layers that see the whole of it to scale")
    types, notes = {}, []
    for lt in layers.long_types:
        types[lt], more = yarn_rope(layers.types[lt], ask, f"checkpoint (its {prose(lt)} layers)")
        notes += more
    long = types[long_layer_type(list(types))]
    for lt, rope in layers.types.items():
        if lt not in types:
            types[lt] = replace(rope, max_position_embeddings=long.max_position_embeddings)
            notes.append(f"YaRN applies to the {', '.join(map(prose, layers.long_types))} layers; the {prose(lt)} "
                         f"layers ({layers.count(lt)}) keep their RoPE ({rope.rope_type}, base {rope.theta:g}): they "
                         "attend to a window of the sequence only")
    types = {lt: types[lt] for lt in layers.types}
    config = write_rope_layers(cfg, replace(layers, types=types), config_format)
    built = check_written_rope(config, types, label, **check)
    notes += reach_notes(built, "YaRN", layers.long_types) + _softmax_note(built, long, ask)
    return ScaledConfig(config, long, notes, layers=types, text_key=text_config_key(cfg))


def _softmax_note(built: dict[str, BuiltRope], rope: RopeSettings, ask: YarnAsk) -> list[str]:
    """For an attention that YaRN's mscale_all_dim scales (`MLA_MSCALE_TYPES`): the softmax scale and the cos/sin
    scaling the built model has."""
    if ask.model_type not in MLA_MSCALE_TYPES or not rope.extra.get("mscale_all_dim"):
        return []
    b = next((b for b in built.values() if b.rope_layers), None)
    if b is None or b.softmax_scale is None:
        return []
    return [f"transformers builds softmax scale {b.softmax_scale:.6g} and cos/sin scaling {b.attention_scaling:.6g} "
            f"for YaRN x{rope.factor:g}"]


def vllm_settings(rope: RopeSettings, layers: dict[str, RopeSettings] | None = None,
                  text_key: str | None = None) -> dict[str, Any]:
    """The vLLM arguments that serve `rope` (of every layer type in `layers` for per-layer-type RoPE):
    max_model_len, and `--hf-overrides` that apply the same scaling to the unscaled checkpoint without writing
    a new directory (vLLM sets them on the transformers config object it built, so they are in its form; for a
    composite config on its language model's sub-config, `text_key`, which vLLM updates in place)."""
    params = {lt: rope_dict(r) for lt, r in layers.items()} if layers else rope_dict(rope)
    overrides = {"rope_parameters": params, "max_position_embeddings": rope.max_position_embeddings}
    if rope.stored_type is not None:  # YaRN in LongRoPE form
        # Phi3Config's own field, which vLLM also reads for LongRoPE's default max_model_len
        overrides["original_max_position_embeddings"] = rope.original_max_position_embeddings
    if text_key is not None:
        overrides = {text_key: overrides}
    return {"max_model_len": rope.context_length, "hf_overrides": overrides}


def vllm_command_line(checkpoint: str, source: str, rope: RopeSettings,
                      layers: dict[str, RopeSettings] | None = None, text_key: str | None = None) -> tuple[str, str]:
    """(serve the new checkpoint, serve the source checkpoint with --hf-overrides) as shell lines."""
    s = vllm_settings(rope, layers, text_key)
    over = json.dumps(s["hf_overrides"], separators=(", ", ": "))
    length = ["--max-model-len", str(s["max_model_len"])]
    return (shlex.join(["vllm", "serve", checkpoint, *length]),
            shlex.join(["vllm", "serve", source, *length, "--hf-overrides", over]))


def config_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable top-level differences between two configs, e.g. 'max_position_embeddings: 32768 -> 131072';
    within a composite config's language model as 'text_config.max_position_embeddings: ...'."""
    lines = []
    text_key = text_config_key(old)
    for key in [*old, *(k for k in new if k not in old)]:
        name = prefix + key
        if key not in new:
            lines.append(f"{name}: {json.dumps(old[key])} -> (removed)")
        elif key not in old:
            lines.append(f"{name}: (new) {json.dumps(new[key])}")
        elif key == text_key and isinstance(old[key], dict) and isinstance(new[key], dict):
            lines += config_changes(old[key], new[key], f"{name}.")
        elif old[key] != new[key]:
            lines.append(f"{name}: {json.dumps(old[key])} -> {json.dumps(new[key])}")
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
    src = checkpoint_dir(s.checkpoint)
    cfg = read_config(src)
    out = Path(s.output) if s.output is not None else default_output(src, s.factor)
    result = apply_yarn(cfg, s.factor, original=s.original_max_position_embeddings, rescale=s.rescale,
                        beta_fast=s.beta_fast, beta_slow=s.beta_slow, truncate=s.truncate,
                        config_format=s.config_format, label=str(out / "config.json"),
                        trust_remote_code=s.trust_remote_code, checkpoint=src)
    check_output(out, CHECKPOINT_KIND, inputs=[("input checkpoint", src)], overwrite=s.overwrite)
    args = {k: v for k, v in s.record().items() if k not in ("checkpoint", "output", "overwrite")}
    with atomic_dir(out, CHECKPOINT_KIND) as tmp:
        copy_side_files(src, tmp, link_weights=True)
        write_json(tmp / "config.json", result.config)
        write_provenance(tmp, "yarn", args, src)
        # the file as written, before it is published
        check_written_rope(tmp, result.expected, str(out / "config.json"), trust_remote_code=s.trust_remote_code)
    serve_new, serve_override = vllm_command_line(str(out), str(src), result.rope, result.layers, result.text_key)
    return YarnResult(out, config_changes(cfg, result.config), result.notes, result.rope.context_length,
                      vllm_settings(result.rope, result.layers, result.text_key), serve_new, serve_override)
