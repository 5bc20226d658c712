"""What a checkpoint is, for `longctx info` and for the `model` entry of every result file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from longctx.checkpoint.classes import known_model_type
from longctx.checkpoint.directory import checkpoint_dir, count_parameters, fingerprint, read_config, read_provenance
from longctx.checkpoint.hub import hub_origin
from longctx.checkpoint.load import model_config, remote_code, sliding_window, trust_remote_code_setting
from longctx.checkpoint.text_config import text_config, text_config_key
from longctx.core.errors import InputError
from longctx.core.kinds import Bool, Text
from longctx.core.settings import REQUIRED, Settings, setting
from longctx.models.gates import PAPER_ROWS, GateSpec, gate_name, gate_of
from longctx.models.variants import attention_label, attention_variant
from longctx.rope.built import built_rope
from longctx.rope.config import read_rope


@dataclass(frozen=True)
class InfoSettings(Settings):
    checkpoint: str = setting(REQUIRED, Text(), "Checkpoint to describe.", cli="argument")
    json: bool = setting(False, Bool(), "Print one JSON object instead of a table.")
    trust_remote_code: bool = trust_remote_code_setting()


class ModelInfo(TypedDict, total=False):
    """The `model` entry of results.json and sinks.json."""

    checkpoint: str
    name: str
    fingerprint: str
    architecture: str | None
    attention: str | None  # baseline | gated-elementwise | gated-headwise
    rope_type: str | None
    yarn_factor: float | None
    context_length: int | None  # longest prompt + generation the checkpoint supports ("claimed")
    trained_length: int | None  # length before any context scaling
    parent_fingerprint: str | None  # the checkpoint this one was derived from by `longctx yarn`
    hub: dict | None  # repo_id, commit, subfolder: where a checkpoint given by Hub id came from
    sliding_window: dict | None  # window, layers, of: layers that see only the last `window` tokens
    remote_code: dict | None  # the auto_map of a checkpoint whose own code built it (--trust-remote-code)


def model_info(path: str | os.PathLike, fp: str | None = None, trust_remote_code: bool = False,
               name: str | None = None) -> ModelInfo:
    """The ModelInfo of checkpoint `path` (`fp`: its fingerprint when already known), named `name` in tables
    [default: `model_name`]."""
    ckpt = checkpoint_dir(path)
    cfg = read_config(ckpt)
    rope = read_rope(cfg)
    prov = read_provenance(ckpt)
    parent = prov.get("source_fingerprint") if prov.get("verb") == "yarn" else None
    hub = hub_origin(ckpt)
    return ModelInfo(checkpoint=str(ckpt.resolve()), name=name or model_name(ckpt), fingerprint=fp or fingerprint(ckpt),
                     architecture=(cfg.get("architectures") or [None])[0],
                     attention=attention_label(attention_variant(cfg)), rope_type=rope.rope_type,
                     yarn_factor=rope.yarn_factor,
                     context_length=rope.context_length, trained_length=rope.trained_length,
                     parent_fingerprint=parent, hub=hub,
                     sliding_window=sliding_window(model_config(ckpt, trust_remote_code=trust_remote_code)),
                     remote_code=ran_remote_code(cfg, trust_remote_code))


def ran_remote_code(cfg: dict, trust_remote_code: bool) -> dict | None:
    """The config's auto_map when its code, trusted, builds the model (what results record)."""

    auto_map = cfg.get("auto_map")
    needed = remote_code(auto_map, known_model_type(cfg.get("model_type"))) is not None
    return auto_map if trust_remote_code and needed else None


def window_text(window: dict | None) -> str:
    """A `sliding_window` entry in words, e.g. '4096 tokens in 20 of 40 layers'."""
    if window is None:
        return "none (every layer attends to the whole sequence)"
    return f"{window['window']} tokens in {window['layers']} of {window['of']} layers"


def sliding_note(name: str, window: dict | None, lengths: list[int]) -> str | None:
    """What a result at `lengths` means for a model with sliding-window layers (None: nothing to say). The
    engines run those layers as the model defines them, attending to the last `window` tokens only."""
    beyond = [L for L in lengths if window is not None and L > window["window"]]
    if not beyond:
        return None
    return (f"{name} has sliding-window attention ({window_text(window)}): at {', '.join(map(str, beyond))} "
            f"tokens those layers see only the last {window['window']} tokens, as the model defines them; it is not "
            "full attention over the whole sequence")


def model_name(ckpt: Path) -> str:
    """What tables call a checkpoint unless told otherwise (`--name`): the Hub id of a Hub snapshot
    (org/name[/subfolder], not the commit), else its folder's name."""
    hub = hub_origin(ckpt)
    if hub is None:
        return ckpt.resolve().name
    return "/".join(part for part in (hub["repo_id"], hub["subfolder"]) if part)


def checkpoint_name(ckpt: Path) -> str:
    """A name for folders made from a checkpoint (`yarn`'s default output): the last part of `model_name`."""
    return model_name(ckpt).rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Description:
    """What `longctx info` shows (`--json`: these fields, in this order)."""

    checkpoint: str
    architecture: str | None
    model_type: str | None
    # of a composite config, where its language model's config is and its model type: "text_config (gemma3_text)"
    language_model: str | None
    attention: str
    rope_type: str
    rope_theta: int | float
    rope_theta_from_default: bool
    yarn_factor: float | None
    rope_factor: float | None  # the scaling factor of any RoPE type that has one (LongRoPE without one: max / original)
    original_max_position_embeddings: int | None
    max_position_embeddings: int | None
    context_length: int | None
    parameters: int | None
    gate: str | None  # the attention gate in words, with the paper's row it reproduces (None: no gate)
    gate_parameters: int  # what the gate adds; parameters - gate_parameters is the ungated model's size
    fingerprint: str
    hub: dict | None  # repo_id, commit, subfolder of a checkpoint given by Hub id
    sliding_window: dict | None  # window, layers, of: layers that see only the last `window` tokens
    remote_code: dict | None  # the auto_map of a checkpoint built by its own code (--trust-remote-code)
    # per layer type, what the rotary module of the model transformers builds computes (`BuiltRope.summary`);
    # None when transformers builds no model from the config
    rope_layers: dict[str, dict] | None


def describe(path: str | os.PathLike, trust_remote_code: bool = False) -> Description:
    """Architecture, attention variant, RoPE (as longctx reads the config, and per layer type as the model
    transformers builds computes it), lengths, sliding windows, size (from the weight headers) and
    fingerprint."""
    from longctx.models.gated_qwen3 import gate_parameter_count  # torch and transformers: not at start-up

    p = checkpoint_dir(path)
    cfg = read_config(p)
    rope = read_rope(cfg)
    config = model_config(p, trust_remote_code=trust_remote_code)
    return Description(
        checkpoint=str(p), architecture=(cfg.get("architectures") or [None])[0], model_type=cfg.get("model_type"),
        language_model=_language_model(cfg), attention=attention_label(attention_variant(cfg)),
        rope_type=rope.rope_type, rope_theta=rope.theta,
        rope_theta_from_default=rope.theta_is_default, yarn_factor=rope.yarn_factor,
        rope_factor=rope.scaling_factor, original_max_position_embeddings=rope.original_max_position_embeddings,
        max_position_embeddings=rope.max_position_embeddings, context_length=rope.context_length,
        parameters=count_parameters(Path(p)), gate=gate_text(gate_of(cfg)),
        gate_parameters=gate_parameter_count(config),
        fingerprint=fingerprint(p), hub=hub_origin(p),
        sliding_window=sliding_window(config), remote_code=ran_remote_code(cfg, trust_remote_code),
        rope_layers=_built_summary(config, trust_remote_code))


def _language_model(cfg: dict) -> str | None:
    """'text_config (gemma3_text)': where a composite config keeps its language model's, None for a flat one."""
    key = text_config_key(cfg)
    return None if key is None else f"{key} ({text_config(cfg).get('model_type')})"


def gate_text(spec: GateSpec | None) -> str | None:
    """A gate in words and the paper's row it reproduces, e.g. 'multiplicative sigmoid gate, ... (Table 4 ...)'."""
    if spec is None:
        return None
    row = PAPER_ROWS.get(gate_name(spec))
    return spec.words() + (f"; the paper's {row}" if row else "")


def _built_summary(config, trust_remote_code: bool) -> dict[str, dict] | None:
    """`Description.rope_layers` of the transformers `config`."""
    try:
        return {lt: b.summary() for lt, b in built_rope(config, trust_remote_code).items()}
    except InputError:  # the config builds, its model does not: `info` still describes the checkpoint
        return None


def rope_layer_text(layer_type: str, rope: dict, of: int) -> str:
    """A layer type's entry of `Description.rope_layers` in words, e.g. 'full_attention (1 of 6 layers): yarn,
    base 1e+06, factor 4 from original length 32768, attention scaling 1.139, softmax scale 0.125'."""
    head = f"{layer_type} ({rope['layers']} of {of} layers)"
    if rope["rope_type"] is None or rope["rope_layers"] == 0:
        return f"{head}: no RoPE (the model applies none in these layers)"
    base = rope["base"]
    text = f"{head}: {rope['rope_type']}, base {int(base) if float(base).is_integer() else f'{base:g}'}"
    if rope["factor"] is not None:
        original = rope["original_max_position_embeddings"]
        text += f", factor {rope['factor']:g}" + (f" from original length {original}" if original else "")
    if rope["rotary_dim"] is not None:
        text += f", {rope['rotary_dim']} rotated dimensions"
    if rope["attention_scaling"] is not None and rope["attention_scaling"] != 1:
        text += f", attention scaling {rope['attention_scaling']:.6g}"
    if rope["softmax_scale"] is not None:
        text += f", softmax scale {rope['softmax_scale']:.6g}"
    if rope["rope_layers"] < rope["layers"]:
        text += f"; {rope['layers'] - rope['rope_layers']} of these layers use no RoPE"
    return text


def built_rope_text(layers: dict[str, dict] | None, indent: int = 25) -> str:
    """`Description.rope_layers` in words, one line per layer type (`rope_layer_text`), the lines after the
    first indented by `indent`."""
    if layers is None:
        return "not known: transformers builds no model from this config"
    of = sum(r["layers"] for r in layers.values())
    lines = [rope_layer_text(lt, r, of) for lt, r in layers.items()] or ["transformers builds no RoPE for this model"]
    return ("\n" + " " * indent).join(lines)
