"""The settings of `longctx sinks` (and of a recipe's `sinks` stage)."""

from __future__ import annotations

from dataclasses import dataclass

from longctx.checkpoint.load import check_device, trust_remote_code_setting
from longctx.core.errors import InputError, ref
from longctx.core.kinds import Bool, Choice, Count, Int, Length, LocalPath, Seed, Source, Text
from longctx.core.settings import Settings, setting
from longctx.data.sources import check_data_specs

DEFAULT_TOKENS = 16384
DEFAULT_MAX_LENGTH = 4096  # the paper's pretraining length; the default window never exceeds it
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class SinksSettings(Settings):
    checkpoint: str | None = setting(None, Text(), "Checkpoint to analyse.", cli="argument", recipe=False,
                                     cli_required=True)
    data: str | None = setting(None, Source(), "Text: a .txt/.jsonl/.json/.parquet file, a directory of them, a "
                                               "saved dataset, hf:<dataset id>[:split] or synthetic:<kind> "
                                               "[default: the first built-in synthetic corpus].")
    tokens: int = setting(DEFAULT_TOKENS, Count(), "Tokens to analyse, as ceil(tokens / length) windows (k = x1024).")
    length: int | None = setting(None, Length(), "Window length [default: the checkpoint's trained length, at most "
                                                 "4k].")
    output: str | None = setting(None, LocalPath(directory=True), "Folder for sinks.json, sinks.md and sinks.png "
                                 "(a RULER run directory: compare then shows them).", short="-o", recipe=False,
                                 cli_required=True)
    trust_remote_code: bool = trust_remote_code_setting()
    batch_size: int = setting(1, Int(minimum=1), "Windows per forward.")
    chunk: int | None = setting(None, Int(minimum=1), "Queries per score chunk [default: the fp32 scores of one chunk "
                                                      "stay under 256 MiB].")
    dtype: str | None = setting(None, Choice(DTYPES, "dtype"), "Weights dtype [default: auto on GPU, float32 on "
                                                               "CPU].")
    device: str | None = setting(None, Text(), "cpu, cuda, cuda:1, ... [default: cuda when available].")
    seed: int = setting(0, Seed(), "Seed of synthetic data.")
    plot: bool = setting(True, Bool(), "Write sinks.png (needs longctx[plot]).", flag="--plot/--no-plot")
    name: str | None = setting(None, Text(), "The model's name in tables [default: its Hub id, or its folder's name; "
                                             "in a recipe, the run's].", recipe=False)

    def check(self) -> None:
        if self.length is not None and self.length < 2:
            raise self.error(f"{ref('length')} {self.length} is too short: first-token attention needs at least 2 "
                             "tokens")

    def check_inputs(self, offline_data: bool = True) -> None:
        # The device is what the machine has, like a file: checked here, before the model is loaded onto it.
        check_device(self.device)
        if self.data is not None:
            try:
                check_data_specs([self.data], offline_data)
            except InputError as e:
                raise self.error(f"{ref('data')}: {e}") from None
