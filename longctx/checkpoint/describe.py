"""What a checkpoint is, for `longctx info` and for the `model` entry of every result file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from longctx.checkpoint.directory import (checkpoint_dir, count_parameters, fingerprint, read_config,
                                          read_provenance)
from longctx.checkpoint.hub import hub_origin
from longctx.checkpoint.rope import read_rope
from longctx.core.kinds import Bool, Text
from longctx.core.settings import REQUIRED, Settings, setting
from longctx.models.variants import attention_label, attention_variant


@dataclass(frozen=True)
class InfoSettings(Settings):
    checkpoint: str = setting(REQUIRED, Text(), "Checkpoint to describe.", cli="argument")
    json: bool = setting(False, Bool(), "Print one JSON object instead of a table.")


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


def model_info(path: str | os.PathLike, fp: str | None = None) -> ModelInfo:
    """The ModelInfo of checkpoint `path` (`fp`: its fingerprint when already known)."""
    ckpt = checkpoint_dir(path)
    cfg = read_config(ckpt)
    rope = read_rope(cfg)
    prov = read_provenance(ckpt)
    parent = prov.get("source_fingerprint") if prov.get("verb") == "yarn" else None
    hub = hub_origin(ckpt)
    return ModelInfo(checkpoint=str(ckpt.resolve()), name=checkpoint_name(ckpt), fingerprint=fp or fingerprint(ckpt),
                     architecture=(cfg.get("architectures") or [None])[0],
                     attention=attention_label(attention_variant(cfg)), rope_type=rope.rope_type,
                     yarn_factor=rope.factor if rope.rope_type == "yarn" else None,
                     context_length=rope.context_length, trained_length=rope.trained_length,
                     parent_fingerprint=parent, hub=hub)


def checkpoint_name(ckpt: Path) -> str:
    """What tables call a checkpoint: its folder name; for a Hub snapshot the repo's (or subfolder's) name,
    not the commit."""
    hub = hub_origin(ckpt)
    if hub is None:
        return ckpt.resolve().name
    return (hub["subfolder"] or hub["repo_id"]).rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Description:
    """What `longctx info` shows (`--json`: these fields, in this order)."""

    checkpoint: str
    architecture: str | None
    model_type: str | None
    attention: str
    rope_type: str
    rope_theta: int | float
    rope_theta_from_default: bool
    yarn_factor: float | None
    original_max_position_embeddings: int | None
    max_position_embeddings: int | None
    context_length: int | None
    parameters: int | None
    fingerprint: str
    hub: dict | None  # repo_id, commit, subfolder of a checkpoint given by Hub id


def describe(path: str | os.PathLike) -> Description:
    """Architecture, attention variant, RoPE, lengths, size (from the weight headers) and fingerprint."""
    p = checkpoint_dir(path)
    cfg = read_config(p)
    rope = read_rope(cfg)
    return Description(
        checkpoint=str(p), architecture=(cfg.get("architectures") or [None])[0], model_type=cfg.get("model_type"),
        attention=attention_label(attention_variant(cfg)), rope_type=rope.rope_type, rope_theta=rope.theta,
        rope_theta_from_default=rope.theta_is_default, yarn_factor=rope.factor if rope.rope_type == "yarn" else None,
        original_max_position_embeddings=rope.original_max_position_embeddings,
        max_position_embeddings=rope.max_position_embeddings, context_length=rope.context_length,
        parameters=count_parameters(Path(p)), fingerprint=fingerprint(p), hub=hub_origin(p))
