"""The settings of `longctx init` (and of a recipe's `models.<name>.init`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import is_tokenizer_file
from longctx.checkpoint.hub import parse_hub_id
from longctx.checkpoint.load import trust_remote_code_setting
from longctx.core.errors import InputError, ref
from longctx.core.kinds import Bool, CheckpointPath, Choice, Int, Kind, KindError, LocalPath, Overrides, Seed
from longctx.core.settings import REQUIRED, Settings, setting
from longctx.init.presets import PRESETS
from longctx.models.gates import CHOICES, CONFIG_KEY, LEGACY_KEYS, gate_name, parse_gate
from longctx.models.variants import VARIANTS

TOKENIZER_CHOICES = ("reference", "bpe")  # or a local tokenizer directory
DTYPES = ("float32", "bfloat16", "float16")


class AttentionVariant(Kind):
    """A named row of the paper's gate design space, or a gate as `field=value,...` (`longctx.models.gates`);
    parsed to its name (`granularity=headwise` is `headwise`)."""

    metavar = "VARIANT"
    words = f"one of {', '.join(VARIANTS)}, or a gate as field=value,... over {', '.join(CHOICES)}"

    def parse(self, value):
        if not isinstance(value, str):
            raise self.wrong(value)
        try:
            return gate_name(parse_gate(value))
        except InputError as e:
            raise KindError(f"is not an attention variant: {e}") from None


class TokenizerSpec(CheckpointPath):
    """reference, bpe, a directory holding tokenizer files, or the Hub id of a repo that holds them."""

    metavar = "TOKENIZER"
    words = "reference, bpe, a tokenizer directory or Hub id"

    def resolve(self, value, base):
        return value if value in TOKENIZER_CHOICES else super().resolve(value, base)


@dataclass(frozen=True)
class InitSettings(Settings):
    output: str | None = setting(None, LocalPath(directory=True), "Checkpoint directory to write.", cli="argument",
                                 recipe=False, cli_required=True)
    preset: str = setting(REQUIRED, Choice(PRESETS, "preset"), "Model shape: tiny (seconds on CPU) or paper-1.7b.")
    attention: str = setting(REQUIRED, AttentionVariant(),
                             "baseline (plain Qwen3), elementwise or headwise (the paper's G1 output gate), another "
                             "row of the paper's gate tables (head-shared, value-elementwise, input-independent, "
                             "ns-sigmoid, additive, silu, rmsnorm, ...) or any gate as field=value,... "
                             "(position, granularity, heads, form, activation, source).")
    tokenizer: str = setting("reference", TokenizerSpec(),
                             "reference (Mistral v1 32k SentencePiece from mistral_common), bpe (train a small "
                             "byte-level BPE now, one token per digit), a local tokenizer directory, or a Hub id "
                             "(org/name[/subfolder][@revision]).")
    vocab_size: int = setting(4096, Int(minimum=260), f"Vocabulary of the BPE trained by {ref('tokenizer')} bpe.")
    bpe_corpus: str | None = setting(None, LocalPath(), f"Text file to train {ref('tokenizer')} bpe on [default: "
                                                       "built-in word-list corpus].")
    bpe_bos: bool = setting(False, Bool(), f"The BPE trained by {ref('tokenizer')} bpe puts its BOS (<s>) before every "
                                           "text, as Llama's tokenizer does: prompts and `sinks` windows begin with "
                                           "it, and so do `stream`-packed training sequences.")
    match_params: bool = setting(False, Bool(), "Shrink a gated model's FFN so its size equals the baseline's.")
    dtype: str | None = setting(None, Choice(DTYPES, "dtype"),
                                "Weights dtype [default: float32 for tiny, bfloat16 for paper-1.7b].")
    seed: int = setting(0, Seed(), "Random seed of the initialisation.")
    tie_embeddings: bool | None = setting(None, Bool(), "Tie the output layer to the input embedding or give it "
                                                        "its own matrix [default: the preset's, tied].",
                                          flag="--tie-embeddings/--untie-embeddings")
    config: dict[str, Any] = setting({}, Overrides(), "Config keys to set on top of the preset (repeatable), e.g. "
                                                      "max_position_embeddings=256.")
    overwrite: bool = setting(False, Bool(), "Replace OUT if it exists.", recipe=False)
    trust_remote_code: bool = trust_remote_code_setting()

    def check(self) -> None:
        owned = sorted(set(self.config) & {*LEGACY_KEYS.values(), CONFIG_KEY, "model_type", "architectures"})
        if owned:
            raise self.error(f"{ref('config')} {owned[0]}: the attention and model class are {ref('attention')}'s to "
                             f"set (now {self.attention}); drop the key and choose the variant with "
                             f"{ref('attention')}")
        if self.match_params and self.attention == "baseline":
            raise self.error(f"{ref('match_params')} shrinks a gated model to the baseline's size; it has no meaning "
                             f"for {ref('attention')} baseline")
        if self.bpe_bos and self.tokenizer != "bpe":
            raise self.error(f"{ref('bpe_bos')} makes the BPE that {ref('tokenizer')} bpe trains add a BOS; a "
                             f"tokenizer given as '{self.tokenizer}' keeps what it adds")

    def check_inputs(self, offline_data: bool = True) -> None:
        # a Hub id (no local folder of that name) is fetched when the tokenizer is written
        if self.tokenizer not in TOKENIZER_CHOICES and (Path(self.tokenizer).is_dir()
                                                        or parse_hub_id(self.tokenizer) is None):
            if not Path(self.tokenizer).is_dir():
                raise self.error(f"{ref('tokenizer')} '{self.tokenizer}' is neither {' nor '.join(TOKENIZER_CHOICES)} "
                                 "nor an existing tokenizer directory")
            if not any(is_tokenizer_file(p) for p in Path(self.tokenizer).iterdir()):
                raise self.error(f"{ref('tokenizer')} '{self.tokenizer}' holds no tokenizer files (tokenizer.json / "
                                 "tokenizer_config.json)")
        if self.bpe_corpus is not None and not Path(self.bpe_corpus).is_file():
            raise self.error(f"{ref('bpe_corpus')} '{self.bpe_corpus}' is not a file")
