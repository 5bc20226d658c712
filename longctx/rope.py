"""RoPE settings of a checkpoint config: read both formats, write the one transformers reads, YaRN math.

Config formats (shared/reference/extension.md §1.2, §1.6):
- transformers 5: `"rope_parameters": {"rope_type", "rope_theta", "factor", "original_max_position_embeddings", ...}`
- legacy (4.x): top-level `rope_theta` plus `rope_scaling` (`null`, or a dict with `rope_type` or `type`).
transformers 5 reads both; when both are present a non-null `rope_scaling` replaces `rope_parameters`,
and a top-level `original_max_position_embeddings` overrides the dict's (HF 5.x and vLLM alike).

The YaRN functions at the end are a reference implementation (Peng et al., arXiv 2309.00071) used to
validate what `longctx yarn` writes; models always use transformers' and vLLM's own RoPE code.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from longctx.errors import InputError
from longctx.params import parse_number

ConfigFormat = Literal["v5", "v4", "both"]
# RoPE types transformers implements (ROPE_INIT_FUNCTIONS, plus "default").
KNOWN_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
# Types whose `original_max_position_embeddings` is the pre-extension training length.
_TYPES_WITH_ORIGINAL = ("yarn", "longrope", "llama3")
# Keys `longctx yarn` never writes: their meaning differs between transformers and vLLM versions
# (extension.md §1.4: HF `attention_factor` replaces the scale, older vLLM ignores it).
_ENGINE_DEPENDENT_KEYS = ("attention_factor", "mscale", "mscale_all_dim", "attn_factor")


@dataclass(frozen=True)
class RopeSettings:
    """What a config says about positions, normalised over both config formats."""

    rope_type: str
    theta: int | float
    max_position_embeddings: int | None
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    # Other keys of the RoPE dict (beta_fast, beta_slow, truncate, partial_rotary_factor, ...).
    extra: dict[str, Any] = field(default_factory=dict)
    config_format: str = "v5"
    theta_is_default: bool = False  # the config has no base; this is the model class default

    @property
    def trained_length(self) -> int | None:
        """Length the model was trained at before any context scaling."""
        if self.rope_type in _TYPES_WITH_ORIGINAL:
            return self.original_max_position_embeddings
        return self.max_position_embeddings

    @property
    def context_length(self) -> int | None:
        """Longest sequence (prompt + generation) the checkpoint can be evaluated at.

        For YaRN this is original × factor: vLLM sizes its cos/sin cache by it (and before
        vllm#56446 derived max_model_len from it, ignoring max_position_embeddings).
        """
        if self.rope_type == "yarn" and self.original_max_position_embeddings and self.factor:
            return math.ceil(self.original_max_position_embeddings * self.factor)
        return self.max_position_embeddings


def _default_theta(model_type: str | None) -> float | None:
    """The base transformers falls back to for this model type (None when it knows no such type)."""
    if not model_type:
        return None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return getattr(CONFIG_MAPPING[model_type], "default_theta", None)
    except KeyError:
        return None


def read_rope(cfg: dict[str, Any]) -> RopeSettings:
    """RoPE settings from a raw config.json dict, resolved the way transformers 5 resolves them."""
    params = cfg.get("rope_parameters")
    legacy = cfg.get("rope_scaling")
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        raise InputError(
            "this config has per-layer-type rope_parameters "
            f"({', '.join(k for k, v in params.items() if isinstance(v, dict))}); longctx supports one RoPE for all layers"
        )
    if isinstance(legacy, dict) and legacy:
        rope, fmt = dict(legacy), "v4"
    elif isinstance(params, dict) and params:
        rope, fmt = dict(params), "v5"
    else:
        rope, fmt = {}, "v4" if "rope_theta" in cfg or "rope_scaling" in cfg else "v5"

    rope_type = rope.pop("rope_type", None) or rope.pop("type", None) or "default"
    rope.pop("type", None)
    theta = rope.pop("rope_theta", None)
    if theta is None:
        theta = cfg.get("rope_theta")
    theta_is_default = theta is None
    if theta is None:
        theta = _default_theta(cfg.get("model_type"))
        if theta is None:
            raise InputError(
                f"config has no RoPE base (rope_parameters / rope_theta) and model_type "
                f"'{cfg.get('model_type')}' has no known default; add "
                '"rope_parameters": {"rope_type": "default", "rope_theta": <base>} to config.json'
            )
    try:
        theta = parse_number(theta)
    except ValueError as e:
        raise InputError(f"config rope_theta: {e}") from None

    max_pos = cfg.get("max_position_embeddings")
    factor = rope.pop("factor", None)
    original = rope.pop("original_max_position_embeddings", None)
    if rope_type in _TYPES_WITH_ORIGINAL:
        top = cfg.get("original_max_position_embeddings")
        original = top if top is not None else original if original is not None else max_pos
    return RopeSettings(
        rope_type=rope_type,
        theta=theta,
        max_position_embeddings=max_pos,
        factor=float(factor) if factor is not None else None,
        original_max_position_embeddings=int(original) if original is not None else None,
        extra=rope,
        config_format=fmt,
        theta_is_default=theta_is_default,
    )


def write_rope(cfg: dict[str, Any], rope: RopeSettings, config_format: ConfigFormat = "v5") -> dict[str, Any]:
    """A copy of `cfg` whose RoPE fields and max_position_embeddings say exactly `rope`.

    Every old RoPE field is removed first (a stale top-level `original_max_position_embeddings` would
    override the dict in transformers 5 and vLLM). "v5" is what the pinned transformers writes;
    "v4" is for transformers 4.x readers; "both" writes both (they agree).
    """
    out = copy.deepcopy(cfg)
    for key in ("rope_parameters", "rope_scaling", "rope_theta", "original_max_position_embeddings"):
        out.pop(key, None)
    if rope.max_position_embeddings is not None:
        out["max_position_embeddings"] = int(rope.max_position_embeddings)
    scaling: dict[str, Any] = {}
    if rope.factor is not None:
        scaling["factor"] = float(rope.factor)  # transformers warns on a non-float factor
    if rope.original_max_position_embeddings is not None:
        scaling["original_max_position_embeddings"] = int(rope.original_max_position_embeddings)
    scaling.update(rope.extra)
    if config_format in ("v5", "both"):
        out["rope_parameters"] = {"rope_type": rope.rope_type, "rope_theta": rope.theta, **scaling}
    if config_format in ("v4", "both"):
        out["rope_theta"] = rope.theta
        out["rope_scaling"] = {"rope_type": rope.rope_type, **scaling} if rope.rope_type != "default" else None
    return out


def set_rope_base(cfg: dict[str, Any], base: int | float, max_length: int,
                  config_format: ConfigFormat = "v5") -> tuple[dict[str, Any], RopeSettings]:
    """The config half of `extend`: a new RoPE base (ABF) and maximum length on an unscaled config."""
    rope = read_rope(cfg)
    if rope.rope_type != "default":
        raise InputError(
            f"this checkpoint uses RoPE type '{rope.rope_type}'; raise the base on the unscaled checkpoint "
            "(before YaRN), or remove the scaling from config.json first"
        )
    new = RopeSettings("default", parse_number(base), int(max_length), extra=rope.extra)
    return write_rope(cfg, new, config_format), new


@dataclass(frozen=True)
class YarnResult:
    config: dict[str, Any]
    rope: RopeSettings
    notes: list[str]


def apply_yarn(cfg: dict[str, Any], factor: float, original: int | None = None, rescale: bool = False,
               beta_fast: float | None = None, beta_slow: float | None = None, truncate: bool | None = None,
               config_format: ConfigFormat = "v5") -> YarnResult:
    """Static YaRN on a config: `{"rope_type": "yarn", "factor", "original_max_position_embeddings", "rope_theta"}`
    with max_position_embeddings = original × factor, so transformers and every vLLM version agree
    on the context length (extension.md §5).

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
    return YarnResult(write_rope(cfg, new, config_format), new, notes)


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


# --- reference YaRN math (fp32, as transformers and vLLM compute it) ------------------------------


def yarn_correction_range(dim: int, base: float, original: int, beta_fast: float = 32, beta_slow: float = 1,
                          truncate: bool = True) -> tuple[float, float]:
    """Dimension pair range [low, high] whose ramp goes from extrapolation to interpolation.

    d(r) = D·ln(L/(2πr)) / (2·ln b); low = floor(d(beta_fast)), high = ceil(d(beta_slow)) when
    truncating; clamped to [0, D−1] (D−1, as upstream; extension.md §1.1).
    """
    def d(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = d(beta_fast), d(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_attention_scaling(factor: float) -> float:
    """mscale = 0.1·ln(s) + 1, multiplied into both cos and sin (so logits scale by its square)."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_inv_freq(dim: int, base: float, factor: float, original: int, beta_fast: float = 32,
                  beta_slow: float = 1, truncate: bool = True):
    """inv_freq_i = θ_i/s·ramp_i + θ_i·(1 − ramp_i), θ_i = b^(−2i/D), in fp32 (torch tensor, D/2).

    Evaluated in the same order of fp32 operations as transformers and vLLM (1/(s·b^(2i/D)) rather
    than θ_i/s), so the three agree to the last bit rather than to an ulp.
    """
    import torch

    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    low, high = yarn_correction_range(dim, base, original, beta_fast, beta_slow, truncate)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # share of the original frequency (extrapolation)
    return 1.0 / (factor * pos_freqs) * (1 - keep) + 1.0 / pos_freqs * keep


def rope_cos_sin(inv_freq, positions, attention_scaling: float = 1.0):
    """cos and sin (fp32, shape [len(positions), D/2]) at integer positions, scaled by mscale."""
    import torch

    freqs = torch.as_tensor(positions, dtype=torch.float32)[:, None] * inv_freq[None, :].float()
    return freqs.cos() * attention_scaling, freqs.sin() * attention_scaling


# --- the `yarn` verb ----------------------------------------------------------------------------


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


def default_yarn_output(src, factor: float):
    """`<src>-yarn4x` next to the source checkpoint."""
    return src.parent / f"{src.name}-yarn{factor:g}x"


def yarn_checkpoint(src, factor: float, out=None, original: int | None = None, rescale: bool = False,
                    overwrite: bool = False, beta_fast: float | None = None, beta_slow: float | None = None,
                    truncate: bool | None = None, config_format: ConfigFormat = "v5") -> dict[str, Any]:
    """Write a YaRN-scaled copy of checkpoint `src` (weights hard-linked or copied unchanged, tokenizer and
    generation config copied, provenance in longctx.json), atomically. Returns what it did."""
    from pathlib import Path

    from longctx.checkpoint import (atomic_dir, check_output_dir, checkpoint_dir, copy_checkpoint_files,
                                    read_config, write_json, write_provenance)

    src = checkpoint_dir(src)
    cfg = read_config(src)
    result = apply_yarn(cfg, factor, original, rescale, beta_fast, beta_slow, truncate, config_format)
    out = Path(out) if out is not None else default_yarn_output(src, factor)
    check_output_dir(out, [src], overwrite)
    args = {"factor": factor, "original_max_position_embeddings": original, "rescale": rescale,
            "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": truncate, "config_format": config_format}
    with atomic_dir(out) as tmp:
        copy_checkpoint_files(src, tmp)
        write_json(tmp / "config.json", result.config)
        write_provenance(tmp, "yarn", args, src)
    serve_new, serve_override = vllm_command_line(str(out), str(src), result.rope)
    return {
        "output": str(out),
        "changes": config_changes(cfg, result.config),
        "notes": result.notes,
        "context_length": result.rope.context_length,
        "vllm": vllm_settings(result.rope),
        "vllm_serve": serve_new,
        "vllm_serve_overrides": serve_override,
    }
