"""RoPE settings as one value (`RopeSettings`: what a config says about positions, over both config formats), the
lengths they reach, and the `longctx yarn` command that extends a checkpoint beyond them (`check_context`).
Reading and writing them in config.json is `longctx.rope.config`; what differs by type, `longctx.rope.types`."""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.checkpoint.hub import hub_origin
from longctx.core.errors import InputError, option_name
from longctx.rope.types import RopeType, rope_type


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
    # The rope_type config.json stores when it is not `rope_type`: "longrope" for YaRN in LongRoPE form.
    stored_type: str | None = None

    @property
    def type_record(self) -> RopeType:
        """The record of its type (`longctx.rope.types`)."""
        return rope_type(self.rope_type)

    @property
    def scaled(self) -> bool:
        """Whether it is a context scaling (which `yarn` replaces only when asked)."""
        return self.type_record.scaled

    @property
    def trained_length(self) -> int | None:
        """Length the model was trained at before any context scaling (`RopeType.trained_from`): the original
        length of yarn, llama3 and longrope; of dynamic NTK the recorded original, else max_position_embeddings
        (the length transformers' `_compute_dynamic_ntk_parameters` and vLLM's `DynamicNTKScalingRotaryEmbedding`
        scale from); of linear only a recorded original (configs write max_position_embeddings before or after
        the factor: None when unknown)."""
        return self.type_record.trained_length(self.original_max_position_embeddings, self.max_position_embeddings)

    @property
    def original_unknown(self) -> bool:
        """Whether the type has an original length the config does not record (linear scaling without one)."""
        return self.trained_length is None and self.type_record.original == "recorded"

    @property
    def scaling_factor(self) -> float | None:
        """The context factor: `factor`, or for LongRoPE without one max_position_embeddings / original, as
        transformers' `_compute_longrope_parameters` takes it."""
        if self.factor is not None or not self.type_record.factor_from_lengths:
            return self.factor
        if self.max_position_embeddings and self.original_max_position_embeddings:
            return self.max_position_embeddings / self.original_max_position_embeddings
        return None

    @property
    def yarn_factor(self) -> float | None:
        """The factor of a YaRN RoPE (None for any other)."""
        return self.factor if self.type_record.is_yarn else None

    @property
    def context_length(self) -> int | None:
        """Longest sequence (prompt + generation) the checkpoint can be evaluated at.

        For YaRN this is original × factor: vLLM sizes its cos/sin cache by it (and before
        vllm#56446 derived max_model_len from it, ignoring max_position_embeddings).
        """
        return self.type_record.context_length(self.factor, self.original_max_position_embeddings,
                                        self.max_position_embeddings)


def hub_name(checkpoint: str | os.PathLike) -> str:
    """How a user names `checkpoint`: a folder inside the Hub cache by its Hub id (`org/name[/subfolder]`, with
    `@commit` unless the repo's main branch is at that commit), any other folder by its path."""
    hub = hub_origin(checkpoint)
    if hub is None:
        return os.fspath(checkpoint)
    name = hub["repo_id"] + (f"/{hub['subfolder']}" if hub["subfolder"] else "")
    repo = Path(checkpoint).resolve()
    while repo.parent.name != "snapshots" and repo != repo.parent:
        repo = repo.parent
    main = repo.parent.parent / "refs" / "main"
    try:
        at_main = main.read_text(encoding="utf-8").strip() == hub["commit"]
    except OSError:
        at_main = False
    return name if at_main else f"{name}@{hub['commit']}"


def yarn_command(checkpoint: str | os.PathLike, rope: RopeSettings, longest: int) -> str:
    """The `longctx yarn` command line whose result covers `longest` tokens: the checkpoint as a user names it
    (`hub_name`), the factor (a power of two) from the original length `yarn` will use, `--rescale` when the
    checkpoint is scaled already, and for linear scaling without a recorded original length
    `--original-max-position-embeddings` with the length the config claims (max_position_embeddings)."""
    base, flag = rope.trained_length, ""
    if rope.original_unknown and rope.max_position_embeddings:
        base = rope.max_position_embeddings
        flag = f" {option_name('original_max_position_embeddings')} {base}"
    base = base or rope.context_length or longest
    factor = max(2, 2 ** math.ceil(math.log2(longest / base)))
    rescale = f" {option_name('rescale')}" if rope.scaled else ""
    return f"longctx yarn {shlex.quote(hub_name(checkpoint))} {option_name('factor')} {factor}{rescale}{flag}"


def check_context(checkpoint: Path, rope: RopeSettings, longest: int) -> None:
    """InputError when `longest` tokens (prompt + generation) are beyond what the checkpoint can do; the
    message says which `longctx yarn` would make room (`yarn_command`)."""
    ctx = rope.context_length
    if ctx is None or longest <= ctx:
        return
    raise InputError(f"length {longest} is beyond what '{hub_name(checkpoint)}' can do (context length {ctx} tokens, "
                     f"prompt + generation); extend it first: {yarn_command(checkpoint, rope, longest)}")
