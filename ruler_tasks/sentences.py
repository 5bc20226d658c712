"""The essay haystack's sentences at any size: `sent_tokenize(" ".join(words[:n]).strip())` for every n a task
asks for (RULER `scripts/data/synthetic/niah.py` @ c3f5e3b), from one segmentation, shared by the tasks of a
process and kept across runs.

Each of RULER's five essay tasks splits a prefix of the essay words into sentences at every size its length
search probes and its samples use, which redone for every task took most of its set-up. Punkt (nltk) decides each
break from the few words around it, with fixed parameters, so a prefix's sentences are those of a longer text up to
one that ends well before the cut, followed by the sentences of the rest of the prefix tokenized on its own. The
rest is tokenized from the start of a sentence of the longer text (after whitespace, so no word is cut), and its
first sentence must come out as the longer text's: when it does not, the whole prefix is tokenized.

The segmentation and the splits of the sizes asked for are kept in longctx's cache, keyed by the essay's content,
the Punkt model and nltk's version: a later run that asks for the same sizes imports nothing of nltk.
"""

from __future__ import annotations

import bisect
import string
from collections import OrderedDict
from importlib import metadata
from pathlib import Path

from longctx.core import cache
from longctx.core.hashing import hash_json
from ruler_tasks.data import DataSource, essay_haystack
from ruler_tasks.punkt import PUNKT_SHA256, punkt_tokenizer

FORMAT = "longctx-essay-sentences/2"
# Bounds of what is read back: words a text may cover (RULER's essay haystack at 1M tokens is under a million
# words), and the cache file's size.
MAX_WORDS = 1 << 24
CACHE_BYTES = 1 << 30
# Characters of the prefix left for the rest to be tokenized on its own: Punkt's decision at a break reads the
# word before it and the token after it, and its realignment of closing quotes a few characters more.
MARGIN = 2000
_WHITESPACE = frozenset(string.whitespace)


def _spans(text: str, offset: int) -> list[tuple[int, int]]:
    """Punkt's sentence spans of `text` (`sent_tokenize(text)` is `[text[a:b] for a, b in spans]`), shifted by
    `offset`."""
    return [(a + offset, b + offset) for a, b in punkt_tokenizer().span_tokenize(text)]


class EssaySentences:
    """`sent_tokenize(" ".join(words[:n]).strip())` for any n (`words` repeat when n is beyond them, as RULER
    repeats them), from the spans of the longest text asked for so far."""

    def __init__(self, words: list[str], key: str | None = None):
        self.words = words
        self.base = ""  # " ".join of the first `covered` words (repeated)
        self.covered = 0
        self.lengths: list[int] = [0]  # lengths[n]: len(" ".join(first n words))
        self.spans: list[tuple[int, int]] = []  # sentence spans of base.strip(), in base's offsets
        self.ends: list[int] = []  # their ends
        self.texts: list[str] = []  # base[a:b] for the first spans, made as asked for
        self.splits: dict[int, tuple[int, list[tuple[int, int]]]] = {}  # n -> (sentences kept, spans of the rest)
        self.memo: OrderedDict[int, list[str]] = OrderedDict()
        self.key = key
        self._changed = False
        self._read()

    # --- the text -------------------------------------------------------------------------------------
    def _grow_text(self, n: int) -> None:
        """`base` and `lengths` over the first n words."""
        if n <= self.covered:
            return
        words = self.words
        new = [words[i % len(words)] for i in range(self.covered, n)]
        lengths, total = self.lengths, self.lengths[-1]
        for i, w in enumerate(new, start=self.covered):
            total += len(w) + (1 if i else 0)
            lengths.append(total)
        self.base = self.base + (" " if self.covered else "") + " ".join(new)
        self.covered = n

    def _text_length(self, n: int) -> int:
        """len(" ".join of the first n words, repeated)), without making it."""
        if n == 0 or not self.words:
            return 0
        rounds, rest = divmod(n, len(self.words))
        return rounds * sum(map(len, self.words)) + sum(map(len, self.words[:rest])) + n - 1

    def _end(self, n: int) -> int:
        """Where `" ".join(words[:n]).strip()` ends in `base`."""
        e = self.lengths[n]
        while e and self.base[e - 1].isspace():
            e -= 1
        return e

    def _whole(self, end: int) -> list[tuple[int, int]]:
        """Spans of `base[:end].strip()`, tokenized whole."""
        lead = len(self.base) - len(self.base.lstrip())
        return _spans(self.base[lead:end], lead) if lead < end else []

    def _set_spans(self, spans: list[tuple[int, int]], kept: int) -> None:
        self.spans, self.ends = spans, [b for _, b in spans]
        del self.texts[kept:]

    # --- splitting ------------------------------------------------------------------------------------
    def _restart(self, stable_end: int, end: int) -> tuple[int, list[tuple[int, int]]] | None:
        """(j, spans): the sentences of `base[:end].strip()` are the longer text's first j followed by `spans`,
        where the longer text's sentence j starts after whitespace and ends `MARGIN` before `stable_end`. None
        when there is no such sentence, or the rest does not begin as the longer text does there."""
        j = bisect.bisect_right(self.ends, stable_end - MARGIN) - 1
        while j > 0 and self.base[self.spans[j][0] - 1] not in _WHITESPACE:
            j -= 1
        if j < 1:
            return None
        start = self.spans[j][0]
        rest = _spans(self.base[start:end], start)
        return (j, rest) if rest and rest[0] == self.spans[j] else None

    def _cover(self, n: int) -> None:
        """Spans of the whole text over at least n words."""
        if n <= self.covered:
            return
        old_end = self._end(self.covered)
        self._grow_text(max(n, 2 * self.covered, 4096))
        end = self._end(self.covered)
        split = self._restart(old_end, end) if self.spans else None
        if split is None:
            self._set_spans(self._whole(end), 0)
            self.splits.clear()  # made against spans not checked to be these
        else:  # the splits asked for so far keep fewer sentences than this one: still valid
            j, rest = split
            self._set_spans(self.spans[:j] + rest, j)
        self._changed = True

    def _split(self, n: int) -> tuple[int, list[tuple[int, int]]]:
        split = self.splits.get(n)
        if split is None:
            self._cover(n)
            end = self._end(n)
            split = self._restart(end, end) or (0, self._whole(end))
            self.splits[n] = split
            self._changed = True
        return split

    def get(self, n: int) -> list[str]:
        """`sent_tokenize(" ".join(words[:n]).strip())`, with `words` repeated as far as n needs."""
        out = self.memo.get(n)
        if out is not None:
            self.memo.move_to_end(n)
            return out
        j, rest = self._split(n)
        base, texts = self.base, self.texts
        texts.extend(base[a:b] for a, b in self.spans[len(texts):j])
        out = texts[:j] + [base[a:b] for a, b in rest]
        self.memo[n] = out
        if len(self.memo) > 4:
            self.memo.popitem(last=False)
        return out

    # --- the cache ------------------------------------------------------------------------------------
    @property
    def file(self) -> Path | None:
        """Where the cache keeps this essay's sentences (the cache folder may change while a process lives)."""
        return cache.cache_dir() / "ruler" / f"essay-sentences-{self.key}.json" if self.key else None

    def _read(self) -> None:
        """What the cache keeps of this essay, when it is sealed for this essay by this user
        (`longctx.core.cache`) and well formed within bounds; else nothing (it is computed again)."""
        doc = cache.read_json(self.file, CACHE_BYTES) if self.file is not None else None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return
        covered, flat, kept = doc.get("covered"), doc.get("spans"), doc.get("splits")
        if not (_count(covered, MAX_WORDS) and isinstance(kept, dict)):
            return
        text = self._text_length(covered)
        if not _spans_ok(flat, text):
            return
        splits = {}
        for n, split in kept.items():
            if not (n.isdigit() and int(n) <= covered and isinstance(split, list) and len(split) == 2
                    and _count(split[0], len(flat) // 2) and _spans_ok(split[1], text)):
                return
            splits[int(n)] = (split[0], list(zip(split[1][0::2], split[1][1::2])))
        self._grow_text(covered)
        self._set_spans(list(zip(flat[0::2], flat[1::2])), 0)
        self.splits = splits

    def keep(self) -> None:
        """Write what was computed to the cache, with the splits another process wrote there meanwhile (every
        split holds for any text that covers its size)."""
        if self.file is None or not (self._changed or not self.file.is_file()):
            return
        folder = cache.folder("ruler")
        if folder is None:
            return
        doc = cache.read_json(self.file, CACHE_BYTES)
        doc = doc if isinstance(doc, dict) and doc.get("format") == FORMAT else {}
        splits = {str(n): [j, [x for span in rest for x in span]] for n, (j, rest) in self.splits.items()}
        out = {"format": FORMAT, "covered": self.covered, "spans": [x for span in self.spans for x in span]}
        if (_count(doc.get("covered"), MAX_WORDS) and doc["covered"] > self.covered
                and _spans_ok(doc.get("spans"), self._text_length(doc["covered"]))):
            out = {k: doc[k] for k in ("format", "covered", "spans")}
            if isinstance(doc.get("splits"), dict):
                splits = {**doc["splits"], **splits}
        if cache.write_json(self.file, {**out, "splits": splits}):
            self._changed = False


def _count(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _spans_ok(flat: object, text: int) -> bool:
    """Whether `flat` is a list of span bounds [a0, b0, a1, b1, ...] in order within a text of `text` characters:
    a_i < b_i <= a_(i+1) <= text."""
    if not isinstance(flat, list) or len(flat) % 2:
        return False
    last = 0
    for x in flat:
        if not _count(x, text) or x < last:
            return False
        last = x
    return all(a < b for a, b in zip(flat[0::2], flat[1::2]))


def _nltk_version() -> str:
    try:
        return metadata.version("nltk")
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "none"


_SHARED: dict[str, EssaySentences] = {}


def essay_sentences(essay: DataSource) -> EssaySentences:
    """The sentences of the essay haystack of `essay`, one object per process and essay content."""
    key = hash_json({"format": FORMAT, "essay": essay.sha256, "punkt": PUNKT_SHA256, "nltk": _nltk_version()})
    found = _SHARED.get(key)
    if found is None:
        found = _SHARED[key] = EssaySentences(essay_haystack(essay), key)
    return found

