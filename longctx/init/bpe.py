"""A small byte-level BPE trained on the spot with `tokenizers`, for tiny demo models."""

from __future__ import annotations

import random
from importlib.resources import files
from pathlib import Path

DEFAULT_BPE_VOCAB = 4096


def bpe_corpus() -> list[str]:
    """A deterministic offline corpus for the on-the-spot BPE: `wonderwords`' English word lists
    (nouns, verbs, adjectives) in simple sentences, plus numbers. Enough for demos, not for quality."""

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
                        digit_group: int | None = None, bos: bool = False) -> Path:
    """Train a small byte-level BPE with `tokenizers` and save it as a transformers fast tokenizer
    (`<unk>`=0, `<s>`=1, `<\\s>`=2, like the reference tokenizer; every byte sequence encodes).
    `digit_group` cuts numbers into runs of at most that many digits before BPE (1: one token per digit,
    as Qwen's tokenizer; 3: as Llama 3's and GPT-4's), so a number is tokenized the same whatever precedes
    it; None leaves digits to the byte-level rules (a number is one piece that BPE chunks as it learnt).
    `bos`: the tokenizer puts `<s>` before every text (a `TemplateProcessing` post-processor, as Llama's
    tokenizer.json has), so a prompt's first token is the same fixed token as a BOS-led training sequence's."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if digit_group:
        # `Digits` for single digits: the same splits as `Split`, and the tokenizer.json the shipped tiny
        # models were made with.
        runs = pre_tokenizers.Digits(individual_digits=True) if digit_group == 1 else \
            pre_tokenizers.Split(Regex(rf"\d{{1,{digit_group}}}"), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([runs, tok.pre_tokenizer])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus if corpus is not None else bpe_corpus(), trainer=trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    return out
