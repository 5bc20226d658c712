"""Built-in synthetic documents that teach the retrieval skills RULER probes.

Each document is a haystack with something to find in it, followed by a question and its answer, so
a model trained on them (pretraining from scratch, or the `extend` stage) is trained on retrieval at
every depth of its sequence length:

- `niah`: key -> value needles (word keys or uuids; 7-digit numbers, uuids or words as values; one or
  several keys, values and queries) in a noise haystack ("The grass is green. ..."), a haystack of
  random-word sentences, or a haystack of distractor needles; half the documents with several keys
  ask follow-up questions about the other keys (more retrievals per token);
- `vt`: chains of variable assignments (`VAR ABCDE = 12345`, `VAR FGHIJ = VAR ABCDE`) among noise;
- `cwe`: a numbered word list in which a few words repeat more often than the others;
- `fwe`: coded text whose word frequencies follow a Zipf law, ask for the most frequent ones;
- `mixed` (the default): a draw among the four per document;
- `recall`: dense key -> value recall: many needles (RULER's needle line) with little or no haystack,
  then questions about most of them, so a good share of all tokens are copied from earlier in the
  document (a needle document of 1024 tokens has one 7-digit answer). Some answers repeat the needle's
  own line (plain induction), the others use RULER's answer phrasing (look the key up);
- `copy`: lines of random letter strings and numbers, each repeated once later; nothing but copying predicts
  the repeats. Copying lines of varying length is what makes a model trained from scratch form
  induction heads (lines of one fixed length only teach it to look a fixed distance back; retrieval
  documents alone teach their format, not copying: checkpoints/README.md);
- `backcopy`: the Bigram-Backcopy task of Guo et al. 2024 (arXiv 2410.13835): words from a fixed bigram table,
  except that the word after one of four trigger words repeats the word before the trigger; a head that copies
  is needed only there, and a small model forms an attention sink on the first token where it is not;
- `pretrain`: copy (40%), recall (25%), niah (25%) and the other three kinds (10%), for pretraining
  from scratch (`recipes/tiny-pretrain.yaml`).

Most documents use RULER's own phrasing (task sentence, needle line, question and answer prefix, so
"The special magic number for X mentioned in the provided text is 1234567."); the rest use other
phrasings so the skill, not one sentence, is learnt. The samples themselves are never RULER's: the
stream comes from `random.Random` seeded with a string naming the kind and seed (hashed with SHA-512
by Python), a stream disjoint from the integer seed 42 that `ruler_tasks` draws evaluation samples
from. Words are `wonderwords`' lists, loaded as `ruler_tasks.words` loads them.

Lengths are estimated, not tokenized (the tokenizer is not known here): `approx_tokens` counts about
1.3 tokens per short word, more for long ones, plus one per digit (SentencePiece and most BPEs split
long numbers) and one per punctuation mark. `length_tokens` is the target; each document's estimate is
drawn uniformly in [0.8, 1] x the target, so that with the reference 32k SentencePiece tokenizer a
document holds about 0.5-1.0x the target (0.65x on average) and fits a sequence of that many tokens
(below ~256 tokens the question and answer alone can exceed the target).
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

from longctx.core.errors import InputError
from longctx.data import synthetic_kinds

KINDS: tuple[str, ...] = ("mixed", "niah", "vt", "cwe", "fwe", "recall", "copy", "pretrain", "backcopy")
NATURAL_LENGTH = 1024  # tokens: the target when `length_tokens` is None
MIN_LENGTH = 128  # the question and answer take about 100 tokens: below this no haystack is left
# Share of each kind in `mixed`: retrieval of needles first (8 of RULER's 13 tasks are NIAH).
MIX_WEIGHTS = {"niah": 0.6, "vt": 0.15, "cwe": 0.1, "fwe": 0.15}
# From scratch: copying first (it is what makes retrieval learnable), then the retrieval documents.
PRETRAIN_WEIGHTS = {"copy_far": 0.3, "copy": 0.1, "recall": 0.25, "niah": 0.25, "vt": 0.04, "cwe": 0.03, "fwe": 0.03}


def code_hash() -> str:
    """A hash of the generators' source: cached token streams of synthetic data are valid only for it."""
    h = hashlib.sha256()
    for path in (Path(__file__), Path(synthetic_kinds.__file__)):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def documents(kind: str = KINDS[0], seed: int = 0, *, length_tokens: int | None = None) -> Iterator[str]:
    """An endless, deterministic stream of documents of `kind` (see the module docstring)."""
    if kind not in KINDS:
        raise InputError(f"unknown synthetic kind '{kind}'; choose one of {', '.join(KINDS)}")
    if length_tokens is not None and (isinstance(length_tokens, bool) or not isinstance(length_tokens, int)
                                      or length_tokens < MIN_LENGTH):
        raise InputError(f"synthetic document length must be an integer >= {MIN_LENGTH} tokens, "
                         f"got {length_tokens!r}")
    return _stream(kind, seed, length_tokens or NATURAL_LENGTH)


def _stream(kind: str, seed: int, target: int) -> Iterator[str]:
    rng = random.Random(f"longctx.synthetic/{kind}/{seed}/{target}")
    mix = {"mixed": MIX_WEIGHTS, "pretrain": PRETRAIN_WEIGHTS}.get(kind, {kind: 1.0})
    kinds, weights = list(mix), list(mix.values())
    while True:
        k = rng.choices(kinds, weights)[0] if len(kinds) > 1 else kind  # single kinds draw nothing
        budget = round(target * rng.uniform(0.8, 1.0))
        yield synthetic_kinds.BUILDERS[k](rng, budget)
