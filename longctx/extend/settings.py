"""The settings of `longctx extend` (and of a recipe's `pretrain` and `extend` stages)."""

from __future__ import annotations

from dataclasses import dataclass

from longctx.checkpoint.load import trust_remote_code_setting
from longctx.core.errors import InputError, ref
from longctx.core.kinds import Bool, Choice, Count, Float, Int, Length, LocalPath, Number, Seed, Specs, Text
from longctx.core.settings import REQUIRED, Settings, setting
from longctx.data.sources import check_data_specs

# split: documents fill every sequence, cut where a sequence ends (longctx.extend.packing); whole: first-fit;
# stream: split's sequences as one causal stream across documents
PACKING_MODES = ("split", "whole", "stream")

DTYPES = ("float32", "bfloat16")
# auto: flash_attention_2 on CUDA when flash_attn is installed, else flex_attention there, sdpa on CPU
# (longctx.extend.model.attention_implementation)
ATTENTION_CHOICES = ("auto", "flash_attention_2", "flex_attention", "sdpa")
_FRACTION = Float(0, 1, high_open=True, words="a number from 0 up to (not including) 1")


@dataclass(frozen=True)
class ExtendSettings(Settings):
    checkpoint: str | None = setting(None, Text(), "Checkpoint to continue training.", cli="argument", recipe=False,
                                     cli_required=True)
    seq_len: int = setting(REQUIRED, Length(), "Training sequence length, e.g. 32k; becomes max_position_embeddings.")
    packing: str = setting("split", Choice(PACKING_MODES, "packing"),
                           "split: documents fill every sequence, one cut where a sequence ends continuing in the "
                           "next (padding only in the last); whole: first-fit of whole documents (more padding); "
                           "stream: split's sequences, each one causal stream across its documents (positions run "
                           "on, no mask between documents), as GPT-style pretraining packs.")
    data: list[str] = setting(REQUIRED, Specs(),
                              "Training text (repeatable): a .txt/.jsonl/.json/.parquet file, a directory of them, a "
                              "saved dataset, hf:<dataset id>[:split] or synthetic:<kind>.")
    rope_base: int | float | None = setting(None, Number(), "New RoPE base (ABF), e.g. 1e6 [default: keep the "
                                                            "checkpoint's].")
    short_data: list[str] = setting([], Specs(), f"Short documents mixed in for {ref('short_fraction')} of the "
                                                 f"tokens (repeatable; same forms as {ref('data')}).")
    short_fraction: float = setting(0.0, _FRACTION, f"Share of the tokens from {ref('short_data')} (ProLong: 0.3-0.4).")
    tokens: int | None = setting(None, Count(), "Tokens to train on, e.g. 80B or 1e9 (k/M = x1024, B = 10^9).")
    steps: int | None = setting(None, Int(minimum=1), f"Optimizer steps (instead of {ref('tokens')}).")
    tokens_per_step: int | None = setting(None, Count(), "Tokens per optimizer step, rounded to whole sequences "
                                                         f"[default: 4M, at most {ref('tokens')} / 20].")
    micro_batch_size: int = setting(1, Int(minimum=1), "Sequences per forward pass on each rank.")
    lr: float = setting(2e-5, Float(0, low_open=True, words="a number > 0"), "Peak learning rate (AdamW).")
    warmup_fraction: float = setting(0.1, _FRACTION, "Share of steps in linear warmup.")
    min_lr_ratio: float = setting(0.1, Float(0, 1, words="a number from 0 to 1"), "Cosine decays to lr x this.")
    weight_decay: float = setting(0.1, Float(0, words="a number >= 0"), "AdamW weight decay (not on norms and "
                                                                       "biases).")
    beta2: float = setting(0.95, Float(0, 1, low_open=True, high_open=True, words="a number between 0 and 1"),
                           "AdamW beta2.")
    grad_clip: float = setting(1.0, Float(0, words="a number >= 0"), "Gradient-norm clip (0: none).")
    save_every: int | None = setting(None, Int(minimum=1), "Save resumable state every N steps [default: at the "
                                                           "end].")
    seed: int = setting(0, Seed(), "Seed of the data order and synthetic data.")
    dtype: str | None = setting(None, Choice(DTYPES, "dtype"),
                                "Compute dtype [default: bfloat16 on GPU, float32 on CPU].")
    trust_remote_code: bool = trust_remote_code_setting()
    gradient_checkpointing: bool = setting(True, Bool(), "Recompute activations in backward (off: faster, far more "
                                                         "memory).")
    attention: str = setting("auto", Choice(ATTENTION_CHOICES, "attention"),
                             "Attention kernel: auto (flash_attention_2 when flash_attn is installed, else "
                             "flex_attention on CUDA; sdpa on CPU), or one of them by name.")
    peak_tflops: float | None = setting(None, Float(0, low_open=True, words="a number > 0"),
                                        "Peak TFLOP/s of one device at the compute dtype, for the MFU in the log "
                                        "[default: a table of common GPUs at bf16].")
    tokenize_workers: int | None = setting(None, Int(minimum=1), "Processes that tokenize the data (the same "
                                                                 "tokens for any count) [default: every CPU core].")
    cp_size: int = setting(1, Int(minimum=1), "Context-parallel ranks per sequence (GPUs; causal attention, no "
                                              "document masking).")
    cache_dir: str | None = setting(None, LocalPath(directory=True),
                                    "Tokenized-data cache [default: ~/.cache/longctx/data].")
    output: str | None = setting(None, LocalPath(directory=True), "Output checkpoint directory.", short="-o",
                                 recipe=False,
                                 cli_required=True)
    resume: bool = setting(False, Bool(), "Continue from the latest state in OUTPUT.train/ (same settings).",
                           recipe=False)
    overwrite: bool = setting(False, Bool(), "Replace OUTPUT and start over in OUTPUT.train/.", recipe=False)

    def check(self) -> None:
        if self.seq_len < 2:
            raise self.error(f"{ref('seq_len')} must be a length of at least 2 tokens (e.g. 32k), got {self.seq_len}")
        if (self.tokens is None) == (self.steps is None):
            raise self.error(f"give exactly one of {ref('tokens')} (e.g. 80B) and {ref('steps')}")
        if self.short_fraction > 0 and not self.short_data:
            raise self.error(f"{ref('short_fraction')} {self.short_fraction} needs {ref('short_data')} SPEC (the "
                             "short documents to mix in)")

    def check_inputs(self, offline_data: bool = True) -> None:
        for name in ("data", "short_data"):
            try:
                check_data_specs(getattr(self, name), offline_data)
            except InputError as e:
                raise self.error(f"{ref(name)}: {e}") from None
