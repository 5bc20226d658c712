"""What transformers builds: per layer type, the RoPE a checkpoint's own rotary module computes.

A config.json says what RoPE a model has only as its transformers config class reads it (Gemma-3 ignores a
flat `rope_parameters`, GPT-NeoX reads its base from `rotary_emb_base`, Phi-3 turns "yarn" into "longrope"),
and a model applies it only where its attention code does (Cohere2's full-attention layers use none). So
`info` reports, and every writer checks before publishing, what the model transformers builds computes: the
model is built on the meta device (no memory, no weights), its rotary embedding module is built again on the
CPU from the same config (a few vectors), and its attention modules give their softmax scale.

transformers 5.19: every `<Family>RotaryEmbedding(config, device=None)` keeps `inv_freq`, `attention_scaling`
and `rope_type`; per-layer-type modules (`Gemma3RotaryEmbedding`) keep `<layer type>_inv_freq`,
`<layer type>_attention_scaling` and a `rope_type` dict (modeling_gemma3.py); `ROPE_INIT_FUNCTIONS` in
modeling_rope_utils.py. `reference_rope` computes the same from the asked parameters without the model's
classes (YaRN by `longctx.rope.reference`).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longctx.checkpoint.load import transformers_quiet
from longctx.checkpoint.text_config import built_text_config
from longctx.core.errors import InputError, exception_line
from longctx.rope.types import rope_type as rope_type_of

# Model types whose attention skips RoPE in some layers: (config, layer index) -> whether that layer applies
# it, as the attention's forward decides in transformers 5.19 models/<type>/modeling_<type>.py.
_APPLIES_ROPE = {
    # Cohere2Attention: `if self.sliding_window is not None: apply_rotary_pos_emb(...)`
    "cohere2": lambda c, i: c.sliding_window is not None and c.layer_types[i] == "sliding_attention",
    # Cohere2MoeAttention: the same, or `force_rope` for dense prefix layers
    "cohere2_moe": lambda c, i: (c.sliding_window is not None and c.layer_types[i] == "sliding_attention") or (
        c.mlp_layer_types[i] == "dense" and c.prefix_dense_sliding_window_pattern == 1),
    # Exaone4Attention / ExaoneMoeAttention: `if self.sliding_window is None or self.is_sliding`
    "exaone4": lambda c, i: c.sliding_window is None or c.layer_types[i] == "sliding_attention",
    "exaone_moe": lambda c, i: c.sliding_window is None or c.layer_types[i] == "sliding_attention",
    # SmolLM3Attention / Llama4TextAttention: `self.use_rope = config.no_rope_layers[layer_idx]`
    "smollm3": lambda c, i: bool(c.no_rope_layers[i]),
    "llama4_text": lambda c, i: bool(c.no_rope_layers[i]),
    # AfmoeAttention: RoPE only `if self.is_local_attention`
    "afmoe": lambda c, i: c.layer_types[i] == "sliding_attention",
}
# Relative tolerance of the written-RoPE check: the reference and transformers evaluate the same fp32
# operations (YaRN bit for bit, YaRN in LongRoPE form within 1 ulp); a wrong base or factor is far beyond.
RTOL = 1e-5


@dataclass(frozen=True)
class BuiltRope:
    """What transformers computes for the layers of one layer type."""

    layer_type: str
    layers: int  # layers of this type
    rope_layers: int  # of those, the layers that apply RoPE (0: these layers use none)
    rope_type: str | None  # as the rotary module runs it (None: the model builds no RoPE for this type)
    base: float | None
    factor: float | None  # the scaling factor the initialiser uses (longrope/yarn without one: max / original)
    original_max_position_embeddings: int | None
    attention_scaling: float | None  # what cos and sin are multiplied by
    softmax_scale: float | None  # the attention's score scale (None: not known, or its layers differ)
    rotary_dim: int | None  # rotated dimensions per head
    inv_freq: Any = field(default=None, repr=False, compare=False)  # fp32 tensor of rotary_dim / 2

    def summary(self) -> dict[str, Any]:
        """The fields without `inv_freq` (what `info --json` prints)."""
        return {k: getattr(self, k) for k in ("layers", "rope_layers", "rope_type", "base", "factor",
                                              "original_max_position_embeddings", "attention_scaling",
                                              "softmax_scale", "rotary_dim")}


def meta_model(config: Any, trust_remote_code: bool = False):
    """The model transformers builds from `config` (a causal LM, else its base model) on the meta device;
    InputError with transformers' reason in one line when it builds none."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    import longctx.models.gated_qwen3  # noqa: F401  (registers the gated family with the Auto classes)

    first = None
    for auto in (AutoModelForCausalLM, AutoModel):
        try:
            with torch.device("meta"), transformers_quiet():
                return auto.from_config(config, trust_remote_code=trust_remote_code)
        except Exception as e:  # noqa: BLE001 - any failure of the model's own constructor is the config's
            first = first or e
    raise InputError(f"transformers builds no model from this config ({exception_line(first)})")


def _is_rotary(cls: type) -> bool:
    name = cls.__name__
    return name.endswith("RotaryEmbedding") and "Vision" not in name


def _rotary_modules(model) -> list:
    """The model's text rotary embedding modules (one per class)."""
    seen, out = set(), []
    for m in model.modules():
        if _is_rotary(type(m)) and hasattr(m, "rope_type") and type(m) not in seen:
            seen.add(type(m))
            out.append(m)
    return out


def _family_rotary(config: Any) -> list:
    """The rotary module of `config`'s model family built on the CPU without the model: the first
    `*RotaryEmbedding` class of the family's modeling module that builds from the config (for a config whose
    model transformers does not build, e.g. a token id beyond a test's small vocabulary)."""

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING

    for mapping in (MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING):
        try:
            module = sys.modules[mapping[type(config)].__module__]
        except (KeyError, ValueError):
            continue
        for obj in vars(module).values():
            if isinstance(obj, type) and _is_rotary(obj):
                built = _on_cpu(obj, config)
                if built is not None and hasattr(built, "rope_type"):
                    return [built]
    return []


def _on_cpu(cls: type, config: Any):
    """Rotary module class `cls` built on the CPU from `config` (the model's were made on `meta`); None when it
    does not take (config) alone (code a checkpoint ships may not)."""
    import torch

    try:
        with torch.device("cpu"), transformers_quiet():
            return cls(config)
    except Exception:  # noqa: BLE001 - then the values are not known; the rest of the report still is
        return None


def _attention_layers(model) -> dict[int, float]:
    """{layer index: softmax scale} of the model's attention modules (those with a numeric `scaling`, which
    transformers' attention functions take as the score scale), the index from the module's place
    (`layers.<i>.`, which a block shared by layers has too: Zamba2), else its `layer_idx`."""

    out: dict[int, float] = {}
    for name, m in model.named_modules():
        scaling = getattr(m, "scaling", None)
        if not isinstance(scaling, (int, float)) or isinstance(scaling, bool):
            continue
        place = re.search(r"(?:^|\.)layers\.(\d+)(?:\.|$)", name)
        idx = int(place.group(1)) if place else getattr(m, "layer_idx", None)
        if isinstance(idx, int) and idx >= 0:
            out.setdefault(idx, float(scaling))
    return out


def _type_values(module, cpu, layer_type: str | None, params: dict[str, Any], max_pos: Any) -> dict[str, Any]:
    """rope_type, base, factor, original length, attention scaling, inv_freq of one layer type of a rotary
    module (`layer_type` None: a module for every layer)."""
    prefix = f"{layer_type}_" if layer_type else ""
    rope_type = module.rope_type[layer_type] if layer_type else module.rope_type
    source = cpu if cpu is not None else module
    inv = getattr(cpu, f"{prefix}inv_freq", None) if cpu is not None else None
    scaling = getattr(source, f"{prefix}attention_scaling", None)
    factor, original = params.get("factor"), params.get("original_max_position_embeddings")
    if rope_type_of(rope_type).original != "pretrained":
        original = None
    elif factor is None and original and isinstance(max_pos, int):
        factor = max_pos / original  # `_compute_yarn_parameters`, `_compute_longrope_parameters`
    return {"rope_type": rope_type, "base": params.get("rope_theta"), "factor": factor,
            "original_max_position_embeddings": original,
            "attention_scaling": float(scaling) if isinstance(scaling, (int, float)) else None,
            "inv_freq": inv.float() if inv is not None else None}


def built_rope(config: Any, trust_remote_code: bool = False) -> dict[str, BuiltRope]:
    """Per layer type of the transformers `config` (in the order its layers first use them): what the rotary
    module of the model transformers builds from it computes, how many layers apply it (`_APPLIES_ROPE`),
    and the attention's softmax scale. A model without a rotary module gets rope_type None for every type."""
    text = built_text_config(config)
    try:
        model = meta_model(config, trust_remote_code)
    except InputError:
        modules = _family_rotary(text)
        if not modules:
            raise
        pairs, attention = [(m, m) for m in modules], {}
    else:
        pairs, attention = [(m, _on_cpu(type(m), m.config)) for m in _rotary_modules(model)], _attention_layers(model)
    n = getattr(text, "num_hidden_layers", None) or 0
    types = list(getattr(text, "layer_types", None) or ["full_attention"] * n)
    applies = _APPLIES_ROPE.get(getattr(text, "model_type", None))
    values: dict[str, dict[str, Any]] = {}
    for module, cpu in pairs:
        params = getattr(module.config, "rope_parameters", None) or {}
        max_pos = getattr(module.config, "max_position_embeddings", None)
        if isinstance(module.rope_type, dict) and set(module.rope_type) & set(types):
            for lt in module.rope_type:
                values.setdefault(lt, _type_values(module, cpu, lt, params.get(lt) or {}, max_pos))
        elif isinstance(module.rope_type, dict):  # labels of its own (DeepSeek-V4: the attention's "main" first)
            main = next(iter(module.rope_type))
            for lt in dict.fromkeys(types):
                values.setdefault(lt, _type_values(module, cpu, main, params.get(main) or {}, max_pos))
        else:
            for lt in dict.fromkeys(types):
                values.setdefault(lt, _type_values(module, cpu, None, params, max_pos))
    out = {}
    for lt in dict.fromkeys(types):
        index = [i for i, t in enumerate(types) if t == lt]
        v = values.get(lt)
        # layers without an attention module with a softmax scale (linear attention, state-space) use no RoPE
        attn = [i for i in index if i in attention] if attention else index
        rope = [i for i in attn if applies is None or applies(text, i)] if v is not None else []
        scales = {attention[i] for i in attn if i in attention}
        inv = v["inv_freq"] if v else None
        out[lt] = BuiltRope(
            lt, len(index), len(rope), v["rope_type"] if v else None, v["base"] if v else None,
            v["factor"] if v else None, v["original_max_position_embeddings"] if v else None,
            v["attention_scaling"] if v else None, scales.pop() if len(scales) == 1 else None,
            2 * len(inv) if inv is not None else None, inv)
    return out


def prose(layer_type: str) -> str:
    """'full-attention': a layer type in a sentence."""
    return layer_type.replace("_", "-")


def reach_notes(built: Mapping[str, BuiltRope], change: str, changed: list[str] | None = None) -> list[str]:
    """Notes on the layers of the types `changed` (default: all) that a RoPE change (`change`: "YaRN", "the new
    base") cannot reach in the built model because they use no RoPE, e.g. 'YaRN cannot reach the full-attention
    layers (1 of 4): they use no RoPE'."""
    notes = []
    total = sum(b.layers for b in built.values())
    for lt, b in built.items():
        if (changed is not None and lt not in changed) or b.rope_layers == b.layers:
            continue
        if b.rope_layers == 0:
            notes.append(f"{change} cannot reach the {prose(lt)} layers ({b.layers} of {total}): they use no RoPE")
        else:
            notes.append(f"{change} reaches {b.rope_layers} of the {b.layers} {prose(lt)} layers; the others use no "
                         "RoPE")
    return notes


def reference_rope(params: Mapping[str, Any], dim: int, max_position_embeddings: int | None):
    """(inv_freq (fp32, dim / 2), attention scaling) of the RoPE `params` ({"rope_type", "rope_theta",
    "factor", "original_max_position_embeddings", ...}) at `dim` rotated dimensions, computed without the
    model's classes by its type's reference (`longctx.rope.types`: default and linear from the base, YaRN by
    `longctx.rope.reference`, DeepSeek's mscale keys included, other types by transformers' `ROPE_INIT_FUNCTIONS`
    on a plain config holding only `params`). None when there is none for the type."""
    return rope_type_of(params.get("rope_type", "default")).reference(params, dim, max_position_embeddings)


def _described(params: Mapping[str, Any]) -> str:
    """'yarn (base 1e+06, factor 4, original length 512)': the asked RoPE in a message."""
    keys = (("rope_theta", "base"), ("factor", "factor"), ("original_max_position_embeddings", "original length"))
    parts = [f"{label} {params[k]:g}" for k, label in keys if params.get(k) is not None]
    return f"{params.get('rope_type', 'default')} ({', '.join(parts)})"


def _same_frequencies(built, reference) -> bool:
    """Whether the built inv_freq are the reference's, in its order or in the module's own (Cohere Compass
    pre-rotates them for M-RoPE: modeling_cohere_compass.py `compute_default_rope_parameters`)."""
    import torch

    return (torch.allclose(built, reference, rtol=RTOL, atol=0)
            or torch.allclose(built.sort().values, reference.sort().values, rtol=RTOL, atol=0))


def rope_differences(built: Mapping[str, BuiltRope], expected: Mapping[str, Mapping[str, Any]],
                     max_position_embeddings: int | None) -> list[str]:
    """What the built RoPE of each layer type that applies RoPE does differently from the asked `expected`
    parameters of that type (its reference, `reference_rope`), one entry per type, e.g. "full_attention
    layers: inv_freq up to 0.875 (relative) off the asked linear (base 1e+06, factor 8)"; [] when every such
    type computes what was asked."""
    diffs = []
    for lt, b in built.items():
        want = expected.get(lt)
        if b.rope_layers == 0 or want is None or b.inv_freq is None:
            continue  # no RoPE; nothing asked; or a module longctx cannot build again (its config was compared)
        ref = reference_rope(want, b.rotary_dim, max_position_embeddings)
        if ref is None:
            continue
        inv, scaling = ref
        wrong = []
        if inv.shape != b.inv_freq.shape:
            wrong.append(f"{b.rotary_dim} rotated dimensions, not the {2 * len(inv)} asked")
        elif not _same_frequencies(b.inv_freq, inv):
            worst = ((b.inv_freq - inv).abs() / inv.abs().clamp_min(1e-30)).max().item()
            wrong.append(f"inv_freq up to {worst:.3g} (relative) off the asked {_described(want)}")
        if b.attention_scaling is None or not math.isclose(b.attention_scaling, scaling, rel_tol=RTOL):
            wrong.append(f"attention scaling {b.attention_scaling} (asked {scaling:.6g})")
        if wrong:
            diffs.append(f"{lt} layers: {', '.join(wrong)}")
    return diffs
