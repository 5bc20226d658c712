"""The settings of `longctx yarn` (and of a recipe's `yarn` stage)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from longctx.checkpoint.hub import hub_origin, resolve_checkpoint
from longctx.checkpoint.load import trust_remote_code_setting
from longctx.core.kinds import Bool, Choice, Factor, Float, Length, LocalPath, Text
from longctx.core.settings import REQUIRED, Settings, setting
from longctx.info.describe import checkpoint_name

CONFIG_FORMATS = ("v5", "v4", "both")


@dataclass(frozen=True)
class YarnSettings(Settings):
    checkpoint: str | None = setting(None, Text(), "Checkpoint to scale.", cli="argument", recipe=False,
                                     cli_required=True)
    factor: float = setting(REQUIRED, Factor(), "Context scaling factor, > 1 (4: 32k -> 128k).")
    original_max_position_embeddings: int | None = setting(
        None, Length(), "Length the model was trained at before any RoPE scaling [default: the checkpoint's "
                        "original length; linear scaling does not record it].")
    output: str | None = setting(None, LocalPath(directory=True),
                                 "Output directory [default: CHECKPOINT-yarn<factor>x].", short="-o", recipe=False)
    rescale: bool = setting(False, Bool(), "Replace the checkpoint's RoPE scaling (yarn, llama3, linear, dynamic, "
                                           "longrope) with YaRN from its original length.")
    overwrite: bool = setting(False, Bool(), "Replace the output directory if it exists.", recipe=False)
    beta_fast: float | None = setting(None, Float(0, low_open=True, words="a number > 0"),
                                      "YaRN beta_fast (written only when given; engines default to 32).")
    beta_slow: float | None = setting(None, Float(0, low_open=True, words="a number > 0"),
                                      "YaRN beta_slow (written only when given; engines default to 1).")
    truncate: bool | None = setting(None, Bool(), "Round the ramp bounds (written only when given).",
                                    flag="--truncate/--no-truncate")
    config_format: str | None = setting(
        None, Choice(CONFIG_FORMATS, "config format"),
        "v5: rope_parameters (transformers 5); v4: rope_theta + rope_scaling (a per-layer RoPE: the family's "
        "transformers-4 keys); both [default: the form the checkpoint has].")
    trust_remote_code: bool = trust_remote_code_setting()

    def output_path(self) -> str | None:
        """The output, or without -o the default beside the checkpoint (None when the checkpoint cannot be found:
        the verb itself says why)."""
        if self.output is not None or self.checkpoint is None:
            return self.output

        try:
            return str(default_output(resolve_checkpoint(self.checkpoint), self.factor))
        except Exception:  # noqa: BLE001 - a checkpoint that does not resolve is the verb's to refuse
            return None


def default_output(src: Path, factor: float) -> Path:
    """Where `yarn` writes without -o: beside the source, or (a Hub snapshot, inside the Hub cache) in the
    current directory, as `<name>-yarn<factor>x`."""
    beside = Path.cwd() if hub_origin(src) else src.parent
    return beside / f"{checkpoint_name(src)}-yarn{factor:g}x"
