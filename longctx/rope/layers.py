"""Per-layer-type RoPE: configs whose layer types each have their own RoPE (Gemma-3: global layers base 1e6 with
linear x8, local sliding layers base 1e4), read and written in the form the config has.

Forms (transformers 5.19 config classes, `convert_rope_params_to_dict`):
- v5: `"rope_parameters": {"full_attention": {...}, "sliding_attention": {...}}`, what transformers 5 writes;
- v4: the family's top-level keys (`V4_LAYER_KEYS`): Gemma-3's Hub configs say `rope_theta` and `rope_scaling`
  for the global layers and `rope_local_base_freq` for the local ones (configuration_gemma3.py).
Whether a config's RoPE is per layer type, and which types its layers have, is what transformers builds from
it (`nested_rope_parameter_keys`, `layer_types` of the config object). Long-context changes (YaRN, a new base)
apply to the layer types that see the whole sequence and leave the sliding ones as they are.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from longctx.checkpoint.config_keys import check_config_types
from longctx.checkpoint.load import model_config
from longctx.checkpoint.text_config import built_text_config, text_config, text_config_key, with_text_config
from longctx.core.errors import InputError
from longctx.rope.config import (
    SHORT_LAYER_TYPES,
    RopeSettings,
    long_layer_type,
    nested_rope_keys,
    parse_rope,
    read_rope,
    rebased,
    rope_dict,
)

# model_type -> ({layer type: the top-level key of its base}, the layer types `rope_scaling` applies to), for
# the families whose transformers-4 configs spread per-layer RoPE over top-level keys (their config classes'
# `convert_rope_params_to_dict`: configuration_gemma3.py, configuration_gemma3n.py,
# configuration_modernbert_decoder.py). Other families are written in the v5 form.
V4_LAYER_KEYS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "gemma3_text": ({"full_attention": "rope_theta", "sliding_attention": "rope_local_base_freq"}, ("full_attention",)),
    "gemma3n_text": ({"full_attention": "rope_theta", "sliding_attention": "rope_local_base_freq"},
                     ("full_attention",)),
    "modernbert_decoder": ({"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"},
                           ("full_attention", "sliding_attention")),
}


@dataclass(frozen=True)
class LayerRopes:
    """The RoPE of each layer type of a config with per-layer-type RoPE."""

    types: dict[str, RopeSettings]  # layer type -> its RoPE, in the config's order
    form: str  # "v5" (per-layer-type rope_parameters) or "v4" (the family's top-level keys)
    layer_types: tuple[str, ...]  # each layer's type
    nope: tuple[str, ...] = ()  # layer types the config gives no RoPE (`null` parameters)

    @property
    def long_types(self) -> list[str]:
        """The layer types whose layers see the whole sequence: what YaRN and a new base change."""
        return [t for t in self.types if t not in SHORT_LAYER_TYPES]

    @property
    def long(self) -> RopeSettings:
        """The RoPE of the layers that see the whole sequence (what `read_rope` gives)."""
        return self.types[long_layer_type(list(self.types))]

    def count(self, layer_type: str) -> str:
        """'5 of 6': how many layers have `layer_type`."""
        return f"{Counter(self.layer_types)[layer_type]} of {len(self.layer_types)}"


def built_config(cfg: dict[str, Any], checkpoint: Any = None, trust_remote_code: bool = False):
    """transformers' config object of the config.json dict `cfg` (that of the folder `checkpoint`), or None when
    transformers cannot build one (what longctx writes from it is then refused by `check_written_rope`, which
    says why); longctx's refusal to run code a checkpoint ships is raised."""

    try:
        return model_config(checkpoint or ".", copy.deepcopy(cfg), trust_remote_code=trust_remote_code)
    except InputError as e:
        if e.__context__ is None:
            raise
        return None


def read_rope_layers(cfg: dict[str, Any], built: Any, source: str = "config.json") -> LayerRopes | None:
    """The RoPE of each layer type of config.json dict `cfg`, whose transformers config object is `built`;
    None when transformers reads one RoPE for all layers (or `built` is None). Each type is read from the
    config's own dict in the v5 form, from the config class's reading of the family's keys in the v4 form; of
    the language model's part of a composite config (`text_config`)."""
    check_config_types(cfg, source)
    cfg, built = text_config(cfg), built_text_config(built)
    params = getattr(built, "rope_parameters", None)
    if not isinstance(params, dict) or not hasattr(built, "nested_rope_parameter_keys"):
        return None
    keys = built.nested_rope_parameter_keys(params)
    if not keys:
        return None
    raw = cfg.get("rope_parameters") if nested_rope_keys(cfg) else {}
    form = "v5" if raw else "v4"
    base_keys = V4_LAYER_KEYS.get(cfg.get("model_type"), ({}, ()))[0]
    types = {}
    for lt in keys:
        if params[lt] is None:
            continue
        own = isinstance(raw.get(lt), dict)
        rope = parse_rope(cfg, raw[lt] if own else params[lt], form, source, nested=True,
                          base=cfg.get(base_keys[lt]) if lt in base_keys else None,
                          default_key="local" if lt in SHORT_LAYER_TYPES else "global")
        if not own:  # the class filled in the base; it is the model's default when the family's key is absent
            rope = replace(rope, theta_is_default=lt in base_keys and cfg.get(base_keys[lt]) is None)
        types[lt] = rope
    if not types:
        return None
    layer_types = tuple(getattr(built, "layer_types", None) or ())
    return LayerRopes(types, form, layer_types, tuple(k for k in keys if params[k] is None))


def asked_rope(cfg: dict[str, Any], built: Any, source: str = "config.json"):
    """What config.json dict `cfg` asks of every layer (`built`: its transformers config): the RoPE of each
    layer type for a per-layer config, else its one `read_rope` (what `check_written_rope` takes)."""
    layers = read_rope_layers(cfg, built, source)
    return layers.types if layers is not None else read_rope(cfg, source)


def _v4_keys(model_type: Any, types: dict[str, RopeSettings]) -> dict[str, Any]:
    """The family's top-level keys that say `types` (`V4_LAYER_KEYS`); InputError when they cannot."""
    if model_type not in V4_LAYER_KEYS:
        raise InputError(f"transformers' {model_type} config class has no transformers-4 keys for per-layer-type "
                         "RoPE; write it in config format v5")
    keys, scaled = V4_LAYER_KEYS[model_type]
    out: dict[str, Any] = {}
    scalings = []
    for lt, rope in types.items():
        if lt not in keys:
            raise InputError(f"{model_type} has no transformers-4 key for the base of its {lt} layers; write it in "
                             "config format v5")
        out[keys[lt]] = rope.theta
        params = {k: v for k, v in rope_dict(rope).items() if k != "rope_theta"}
        if lt in scaled:
            scalings.append(params)
        elif params != {"rope_type": "default"}:
            raise InputError(f"the {lt} layers' RoPE ({params['rope_type']}) has no place in {model_type}'s "
                             "transformers-4 keys (rope_scaling is for the other layers); write it in config format v5")
    if any(p != scalings[0] for p in scalings):
        raise InputError(f"{model_type}'s transformers-4 rope_scaling applies to all of {', '.join(scaled)}, whose "
                         "RoPE differ here; write it in config format v5")
    out["rope_scaling"] = scalings[0] if scalings and scalings[0]["rope_type"] != "default" else None
    return out


def write_rope_layers(cfg: dict[str, Any], layers: LayerRopes, config_format: str | None = None) -> dict[str, Any]:
    """A copy of `cfg` whose RoPE says `layers.types` and whose max_position_embeddings is that of the layers
    that see the whole sequence, in `config_format` [default: the form `cfg` has]: "v5" per-layer-type
    rope_parameters, "v4" the family's top-level keys, "both" both (they agree). Every old RoPE key is removed
    first. A composite config gets it in its language model's part (`text_config`), the rest kept."""
    if text_config_key(cfg) is not None:
        return with_text_config(cfg, write_rope_layers(text_config(cfg), layers, config_format))
    form = config_format or layers.form
    model_type = cfg.get("model_type")
    out = copy.deepcopy(cfg)
    old = V4_LAYER_KEYS.get(model_type, ({}, ()))[0].values()
    for key in ("rope_parameters", "rope_scaling", "rope_theta", *old):
        out.pop(key, None)
    if layers.long.max_position_embeddings is not None:
        out["max_position_embeddings"] = int(layers.long.max_position_embeddings)
    if form in ("v5", "both"):
        out["rope_parameters"] = {**{lt: rope_dict(r) for lt, r in layers.types.items()},
                                  **{lt: None for lt in layers.nope}}
    if form in ("v4", "both"):
        out.update(_v4_keys(model_type, layers.types))
    return out


def set_rope_base_layers(cfg: dict[str, Any], layers: LayerRopes, base: float, max_length: int,
                         config_format: str | None = None) -> tuple[dict[str, Any], LayerRopes, list[str]]:
    """`set_rope_base` for per-layer RoPE: the new base and length for the layer types that see the whole
    sequence, the others' RoPE kept; returns (config, its layers, notes saying what was kept)."""
    types, notes = {}, []
    for lt, rope in layers.types.items():
        if lt in layers.long_types:
            types[lt] = rebased(rope, base, max_length, f"the RoPE of the {lt} layers")
        else:
            types[lt] = replace(rope, max_position_embeddings=int(max_length))
            notes.append(f"the {lt} layers ({layers.count(lt)}) keep their RoPE ({rope.rope_type}, base "
                         f"{rope.theta:g}): they attend to a window of the sequence, not the whole of it")
    new = replace(layers, types=types)
    return write_rope_layers(cfg, new, config_format), new, notes
