"""The RoPE types longctx knows, one record each: everything that differs from one type to another, so that
reading (`longctx.rope.config`), `info`, `yarn`, `extend`'s base change and the reference frequencies
(`longctx.rope.built`) ask the record and never compare type names.

A type is what a config's `rope_type` names and transformers' `ROPE_INIT_FUNCTIONS` implements
(modeling_rope_utils.py @ 5.19; "default" is its `compute_default_rope_parameters`); vLLM has one file per type
(`model_executor/layers/rotary_embedding/`). A new type is one `RopeType` passed to `register` (and, where
transformers has no initialiser for it, one there: its models build their rotary modules from that table).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Reference = Callable[[Mapping[str, Any], int, "int | None"], Any]


def _base_freqs(base: float, dim: int):
    """RoPE's frequencies θ_i = base^(-2i/dim) in fp32, in transformers' order of operations (Su et al., arXiv
    2104.09864 §3.2.2)."""
    import torch

    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _default(params: Mapping[str, Any], dim: int, max_pos: int | None):
    return _base_freqs(params["rope_theta"], dim), 1.0


def _linear(params: Mapping[str, Any], dim: int, max_pos: int | None):
    """Position interpolation (Chen et al., arXiv 2306.15595): every frequency divided by the factor."""
    return _base_freqs(params["rope_theta"], dim) / params["factor"], 1.0


def _yarn(params: Mapping[str, Any], dim: int, max_pos: int | None):
    """YaRN (Peng et al., arXiv 2309.00071 §3.2-3.4) by `longctx.rope.reference`, DeepSeek's mscale keys
    included; the factor of a config without one is max_position_embeddings / original, as transformers takes it."""
    from longctx.rope import reference as ref

    factor, original = params.get("factor"), params["original_max_position_embeddings"]
    if factor is None:
        factor = max_pos / original
    betas = {k: params[k] for k in ("beta_fast", "beta_slow") if params.get(k)}
    inv = ref.yarn_inv_freq(dim, params["rope_theta"], factor, original, truncate=params.get("truncate", True),
                            **betas)
    return inv, ref.yarn_attention_factor(factor, params.get("mscale"), params.get("mscale_all_dim"),
                                          params.get("attention_factor"))


def transformers_initialiser(name: str, whole_head: bool = False) -> Reference:
    """The reference of type `name` as transformers' own initialiser computes it, on a LlamaConfig that holds the
    parameters and nothing of the model's family. `whole_head`: the type spreads its frequencies over the whole
    head and zeroes the rest (proportional RoPE), so it is given the partial rotation; the others the rotated
    dimensions alone."""

    def reference(params: Mapping[str, Any], dim: int, max_pos: int | None):
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        from longctx.checkpoint.load import transformers_quiet

        init = ROPE_INIT_FUNCTIONS.get(name)
        if init is None:
            return None
        rope = {k: v for k, v in params.items() if k != "partial_rotary_factor" or whole_head}
        with transformers_quiet():
            plain = LlamaConfig(hidden_size=dim, num_attention_heads=1, head_dim=dim, num_hidden_layers=1,
                                max_position_embeddings=max_pos or 2048, rope_parameters=dict(rope))
            inv, scaling = init(plain, "cpu")
        return inv.float(), float(scaling)

    return reference


@dataclass(frozen=True)
class RopeType:
    """What one RoPE type is, for every verb."""

    name: str  # the rope_type config.json says
    display: str  # its name in messages ("dynamic NTK")
    reference: Reference  # (params, rotated dims, max_position_embeddings) -> (fp32 inv_freq, attention scaling)
    # its original_max_position_embeddings: "pretrained" - the length before the scaling, which transformers fills
    # from max_position_embeddings when absent (`standardize_rope_params`) and config classes may hold top-level
    # (Phi3Config); "recorded" - transformers does not read it, but where a config records it, it is the
    # original length; "none" - not the type's
    original: Literal["pretrained", "recorded", "none"] = "none"
    # the length the model was trained at before any context scaling: its original length, that or
    # max_position_embeddings when none is recorded (the length dynamic NTK scales from), or max_position_embeddings
    trained_from: Literal["original", "original_or_max", "max"] = "max"
    scaled: bool = True  # a context scaling: `yarn` replaces it only when asked (--rescale)
    # the longest sequence it serves: max_position_embeddings, or original x factor (vLLM sizes YaRN's cos/sin
    # cache by that, and before vllm-project/vllm#56446 took its max_model_len from it)
    context: Literal["max", "original_x_factor"] = "max"
    factor_from_lengths: bool = False  # without a factor, max_position_embeddings / original is its factor
    # `yarn --rescale`: "again" - the type is YaRN, whose own keys (betas, truncate) stay; "replace" - YaRN takes
    # its place and its own keys go (listed); "refuse" - no YaRN has its layout (`yarn_refusal` says why)
    yarn: Literal["again", "replace", "refuse"] = "replace"
    yarn_refusal: str = ""
    # `extend --rope-base`: None keeps the type under the new base (position-independent: llama3, linear, dynamic,
    # a partial layout); else why a new base would invalidate it ({whose}, {display}, {base}, {factor}, {original})
    rebase_refusal: str | None = None
    whole_head: bool = False  # frequencies over the whole head, the rest zeroed (proportional)
    # a config of this type may be YaRN written in its form (LongRoPE: `longctx.rope.config.yarn_longrope_form`)
    may_hold_yarn: bool = False

    @property
    def is_yarn(self) -> bool:
        """Whether the type is YaRN itself (`yarn --rescale` writes it again)."""
        return self.yarn == "again"

    def trained_length(self, original: int | None, max_position_embeddings: int | None) -> int | None:
        """The length trained at before any scaling, from the type's original length and max_position_embeddings."""
        if self.trained_from == "original":
            return original
        if self.trained_from == "original_or_max":
            return original or max_position_embeddings
        return max_position_embeddings

    def context_length(self, factor: float | None, original: int | None, max_position_embeddings: int | None):
        """The longest sequence (prompt + generation) it serves."""
        if self.context == "original_x_factor" and original and factor:
            return math.ceil(original * factor)
        return max_position_embeddings


_FITTED = ("{whose} uses RoPE type '{name}', whose per-dimension factors were fitted for base {base:g}; a new base "
           "would invalidate them: extend a checkpoint without it, then scale the result with longctx yarn")

ROPE_TYPES: dict[str, RopeType] = {}


def register(record: RopeType) -> RopeType:
    """Add `record` (replacing a type of its name); returns it."""
    ROPE_TYPES[record.name] = record
    return record


for _record in (
    RopeType("default", "unscaled", _default, scaled=False),
    RopeType("linear", "linear", _linear, original="recorded", trained_from="original"),
    RopeType("dynamic", "dynamic NTK", transformers_initialiser("dynamic"), original="recorded",
             trained_from="original_or_max"),
    RopeType("yarn", "YaRN", _yarn, original="pretrained", trained_from="original", context="original_x_factor",
             yarn="again",
             rebase_refusal="{whose} is YaRN-scaled (factor {factor:g} from original length {original}); extend "
                            "the checkpoint before YaRN, then scale the result with longctx yarn"),
    RopeType("longrope", "LongRoPE", transformers_initialiser("longrope"), original="pretrained",
             trained_from="original", factor_from_lengths=True, rebase_refusal=_FITTED, may_hold_yarn=True),
    RopeType("llama3", "llama3", transformers_initialiser("llama3"), original="pretrained", trained_from="original"),
    RopeType("proportional", "proportional", transformers_initialiser("proportional", whole_head=True),
             scaled=False, yarn="refuse", whole_head=True,
             yarn_refusal="proportional RoPE (Gemma-4's) rotates the first pairs of a head_dim-wide spectrum; no "
                          "YaRN config lays its pairs out so"),
):
    register(_record)


def rope_type(name: str) -> RopeType:
    """The record of RoPE type `name`; for a type longctx does not know, one that reads it and reports it as
    transformers builds it and refuses whatever would change it (`yarn`, a new base)."""
    record = ROPE_TYPES.get(name)
    if record is not None:
        return record
    return RopeType(name, name, transformers_initialiser(name), yarn="refuse",
                    yarn_refusal=f"unknown RoPE type '{name}' in config.json (known: {', '.join(ROPE_TYPES)})",
                    rebase_refusal=_FITTED)
