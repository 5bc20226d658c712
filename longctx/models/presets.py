"""Freshly initialised checkpoints from named configs (tiny ones for demos and tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Qwen3 with head_dim 64 (vLLM's CPU attention rejects head sizes below 32) and GQA 2:1; 32k vocab
# to match the reference tokenizer. About 4.6M parameters, most of them the (tied) embedding.
TINY_QWEN3: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000},
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_tiny_qwen3(out: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None, seed: int = 0,
                     **overrides: Any) -> Path:
    """Write a randomly initialised tiny Qwen3 checkpoint (fp32 safetensors + tokenizer) to `out`.

    The tokenizer defaults to the reference Mistral v1 SentencePiece one (see
    `longctx.checkpoint.write_reference_tokenizer`).
    """
    import shutil

    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from longctx.checkpoint import atomic_dir, write_reference_tokenizer

    out = Path(out)
    config = Qwen3Config(**{**TINY_QWEN3, **overrides}, architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, max_shard_size="2GB")
        GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(tmp)
        if tokenizer_dir is None:
            write_reference_tokenizer(tmp)
        else:
            for f in Path(tokenizer_dir).iterdir():
                if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                    shutil.copy2(f, tmp / f.name)
    return out


# --- `longctx init`: presets, attention variants, tokenizers --------------------------------------

# Model shapes only; the vocabulary comes from the tokenizer. Tied embeddings and QK-norm (Qwen3).
PRESETS: dict[str, dict[str, Any]] = {
    # Runs in seconds on CPU; head_dim 64 so vLLM's CPU attention accepts it; GQA 2:1.
    "tiny": {k: v for k, v in TINY_QWEN3.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id")},
    # The paper's dense 1.7B-28L (Qiu et al. 2025, Table 7), pretrained at 4096 tokens with RoPE base 10k.
    "paper-1.7b": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000},
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
    },
}
# Weights dtype written by default (a 1.7B model in fp32 would be 6 GB for no benefit).
PRESET_DTYPES = {"tiny": "float32", "paper-1.7b": "bfloat16"}
TOKENIZER_CHOICES = ("reference", "bpe")  # or a local tokenizer directory
DEFAULT_BPE_VOCAB = 4096


def _did_you_mean(value: str, choices) -> str:
    import difflib

    close = difflib.get_close_matches(value, list(choices), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def check_preset(preset: str) -> dict[str, Any]:
    from longctx.errors import InputError

    if preset not in PRESETS:
        raise InputError(f"unknown preset '{preset}'; choose one of {', '.join(PRESETS)}{_did_you_mean(preset, PRESETS)}")
    return PRESETS[preset]


def check_tokenizer(spec: str) -> None:
    """InputError unless `spec` is one of TOKENIZER_CHOICES or a directory holding tokenizer files."""
    from longctx.errors import InputError

    if spec in TOKENIZER_CHOICES:
        return
    if not Path(spec).is_dir():
        raise InputError(f"'{spec}' is neither {' nor '.join(TOKENIZER_CHOICES)} nor an existing tokenizer directory")
    if not any(Path(spec).glob("tokenizer*")):
        raise InputError(f"'{spec}' holds no tokenizer files (tokenizer.json / tokenizer_config.json)")


def model_config(preset: str, attention: str, vocab_size: int, match_params: bool = False, **overrides: Any):
    """The transformers config for a preset and attention variant: `Qwen3Config` for the baseline
    (plain Qwen3, vLLM's native path), `GatedQwen3Config` for the gated variants.

    `match_params` shrinks a gated model's FFN (`intermediate_size`) so that its parameter count is
    the baseline's, to the nearest FFN unit (3 * hidden parameters per layer), as the paper did.
    """
    from transformers import Qwen3Config

    from longctx.models.gated_qwen3 import GatedQwen3Config, gate_flags, gate_width

    flags = gate_flags(attention)
    values = {**check_preset(preset), "vocab_size": vocab_size, **overrides}
    if attention == "baseline":
        return Qwen3Config(**values, architectures=["Qwen3ForCausalLM"])
    config = GatedQwen3Config(**values, **flags, architectures=["GatedQwen3ForCausalLM"])
    if match_params:
        gate_params = gate_width(config) * (config.hidden_size + int(config.attention_bias))
        config.intermediate_size -= round(gate_params / (3 * config.hidden_size))
    return config


def parameter_count(config) -> int:
    """Parameters of the model a config describes (tied embeddings counted once), built on `meta`."""
    import torch
    from transformers import Qwen3ForCausalLM

    from longctx.models.gated_qwen3 import GatedQwen3Config, GatedQwen3ForCausalLM

    cls = GatedQwen3ForCausalLM if isinstance(config, GatedQwen3Config) else Qwen3ForCausalLM
    with torch.device("meta"):
        model = cls(config)
    return sum(p.numel() for p in model.parameters())


def bpe_corpus() -> list[str]:
    """A deterministic offline corpus for the on-the-spot BPE: `wonderwords`' English word lists
    (nouns, verbs, adjectives) in simple sentences, plus numbers. Enough for demos, not for quality."""
    import random

    from importlib.resources import files

    assets = files("wonderwords") / "assets"
    nouns, verbs, adjs = ([w.strip() for w in (assets / f).read_text().split("\n") if w.strip()]
                          for f in ("nounlist.txt", "verblist.txt", "adjectivelist.txt"))
    rng = random.Random(0)
    lines = [" ".join(words) for words in (nouns, verbs, adjs)]
    for _ in range(20000):
        lines.append(f"The {rng.choice(adjs)} {rng.choice(nouns)} will {rng.choice(verbs)} "
                     f"{rng.randint(0, 99999)} {rng.choice(nouns)}s{rng.choice('.,;:?!')}")
    return lines


def train_bpe_tokenizer(out: Path, vocab_size: int = DEFAULT_BPE_VOCAB, corpus: list[str] | None = None,
                        digit_group: int | None = None) -> Path:
    """Train a small byte-level BPE with `tokenizers` and save it as a transformers fast tokenizer
    (`<unk>`=0, `<s>`=1, `<\\s>`=2, like the reference tokenizer; every byte sequence encodes).
    `digit_group` cuts numbers into runs of at most that many digits before BPE (1: one token per digit,
    as Qwen's tokenizer; 3: as Llama 3's and GPT-4's), so a number is tokenized the same whatever precedes
    it; None leaves digits to the byte-level rules (a number is one piece that BPE chunks as it learnt)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if digit_group:
        # Digits for 1: the same splits as Split, and the tokenizer.json the shipped tiny models were made with.
        runs = pre_tokenizers.Digits(individual_digits=True) if digit_group == 1 else \
            pre_tokenizers.Split(Regex(rf"\d{{1,{digit_group}}}"), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([runs, tok.pre_tokenizer])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus if corpus is not None else bpe_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    return out


def _write_tokenizer(spec: str, out: Path, vocab_size: int, corpus_file: str | None):
    """Write the tokenizer `spec` asks for into `out`; return it loaded."""
    import shutil

    from transformers import AutoTokenizer

    from longctx.checkpoint import write_reference_tokenizer

    if spec == "reference":
        write_reference_tokenizer(out)
    elif spec == "bpe":
        corpus = Path(corpus_file).read_text(encoding="utf-8").splitlines() if corpus_file else None
        # One token per digit, as Qwen's tokenizer. Two-digit tokens (a digit recurs inside a 7-digit value,
        # so copying one needs two tokens of context) were tried: the tiny baseline then learnt no copying
        # at all in tiny-pretrain's copy phase, twice (issue 7's notes).
        train_bpe_tokenizer(out, vocab_size, corpus, digit_group=1)
    else:
        for f in Path(spec).iterdir():
            if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
                shutil.copy2(f, out / f.name)
    return AutoTokenizer.from_pretrained(out)


def init_checkpoint(out: str | os.PathLike, preset: str = "tiny", attention: str = "baseline",
                    tokenizer: str = "reference", match_params: bool = False, seed: int = 0,
                    overwrite: bool = False, dtype: str | None = None, bpe_vocab_size: int = DEFAULT_BPE_VOCAB,
                    bpe_corpus_file: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Write a freshly initialised checkpoint (config, safetensors, tokenizer, generation config,
    longctx.json) for a preset and attention variant; what `longctx init` runs. Returns a summary."""
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    from longctx.checkpoint import atomic_dir, check_output_dir, write_provenance
    from longctx.errors import InputError
    from longctx.models.gated_qwen3 import GatedQwen3Config, GatedQwen3ForCausalLM, gate_flags

    # Validate everything before writing anything.
    check_preset(preset)
    gate_flags(attention)
    out = Path(out)
    try:
        check_tokenizer(tokenizer)
    except InputError as e:
        raise InputError(f"tokenizer {e}") from None
    sources = [] if tokenizer in TOKENIZER_CHOICES else [Path(tokenizer)]
    if bpe_corpus_file is not None and not Path(bpe_corpus_file).is_file():
        raise InputError(f"BPE corpus '{bpe_corpus_file}' is not a file")
    if match_params and attention == "baseline":
        raise InputError("--match-params shrinks a gated model to the baseline's size; it has no meaning for "
                         "--attention baseline")
    dtype = dtype or PRESET_DTYPES[preset]
    if dtype not in ("float32", "bfloat16", "float16"):
        raise InputError(f"unknown dtype '{dtype}'; choose float32, bfloat16 or float16")
    check_output_dir(out, sources, overwrite)

    with atomic_dir(out) as tmp:
        tok = _write_tokenizer(tokenizer, tmp, bpe_vocab_size, bpe_corpus_file)
        ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
        config = model_config(preset, attention, len(tok), match_params, **{**ids, **overrides})
        baseline_params = parameter_count(model_config(preset, "baseline", len(tok), **{**ids, **overrides}))
        cls = GatedQwen3ForCausalLM if isinstance(config, GatedQwen3Config) else Qwen3ForCausalLM
        torch.manual_seed(seed)
        model = cls._from_config(config, dtype=getattr(torch, dtype)).eval()
        if not config.tie_word_embeddings:
            # Untied, the output matrix starts as a copy of the input embedding: the model begins as the tied
            # one it replaces, so untying changes only how training moves the two matrices, not the start.
            with torch.no_grad():
                model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp, max_shard_size="5GB")
        GenerationConfig(**ids).save_pretrained(tmp)
        write_provenance(tmp, "init", {"preset": preset, "attention": attention, "tokenizer": tokenizer,
                                       "match_params": match_params, "seed": seed, "dtype": dtype,
                                       **({"bpe_vocab_size": bpe_vocab_size} if tokenizer == "bpe" else {}),
                                       **overrides}, None)
    return {"output": str(out), "preset": preset, "attention": attention, "architecture": config.architectures[0],
            "parameters": params, "baseline_parameters": baseline_params,
            "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size, "dtype": dtype}
