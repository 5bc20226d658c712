"""The string level of the ``metaspace`` strategy of `ruler_tasks.counting`: token counts of strings under a
SentencePiece-style BPE tokenizer, as sums of cached counts of pieces cut at safe boundaries.

The whole text is one BPE word, so BPE merges could in principle cross anywhere; but a merge can only join two
symbols into a vocabulary token, so two pieces of text tokenize independently when the last character of the
first and the first character of the second never occur next to each other inside any vocabulary token (a
"safe boundary"). Counts are then sums over pieces, and repeated pieces (noise sentences, essay sentences,
words, "Document i:" lines) are counted once. Boundaries that are not safe are never split: the pieces are
glued and counted together. Where the vocabulary allows it (`_init_words`), strings are cut with C string
operations (before spaces, around digits and punctuation) and counted as sums of cached pieces, one by one
(`_c_words`) or many at once (`_c_sum`, used for the field values of `Rows`).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
# candidate cut points inside a piece: before a space, around each digit, at other whitespace
_ATOM_RE = re.compile(r" ?[^\s\d]+| ?\d|\s")


class Fallback(Exception):
    """The text holds an added token: count it by a full tokenization."""


class PieceCounter:
    """Token counts of strings as the tokenizer `backend` (`spec`: its JSON description) makes them: by a full
    tokenization (`count_text`), or, once `_init_metaspace` has read a SentencePiece-style vocabulary, as sums of
    cached piece counts (`_c_first` for the start of the text, `_c_many` and `_c_sum` for the rest). Those raise
    `Fallback` for a string holding an added token."""

    def __init__(self, backend, spec) -> None:
        self.backend = backend
        self._added = [t["content"] for t in spec.get("added_tokens", []) if t.get("content")]
        self._first: dict[str, int] = {}
        self._word: dict[str, int] = {}
        self._safe_cache: dict[tuple[str, str], bool] = {}

    def count_text(self, text: str) -> int:
        """Full tokenization count of `text` (what RULER computes)."""
        return len(self.backend.encode(text, add_special_tokens=False).ids)

    def _init_metaspace(self, spec) -> None:
        model = spec["model"]
        self._repl = metaspace_replacement(spec)
        vocab = model["vocab"]
        merges = model.get("merges") or []
        merge_parts = set()
        for m in merges:
            a, b = (m.split(" ", 1) if isinstance(m, str) else m)
            merge_parts.add(a)
            merge_parts.add(b)
            merge_parts.add(a + b)
        pairs = set()
        for tok in vocab:
            if len(tok) < 2:
                continue
            if _BYTE_TOKEN.match(tok) and tok not in merge_parts:
                continue  # a byte-fallback token: only ever made from one unknown character
            for x, y in itertools.pairwise(tok):
                pairs.add((x, y))
        self._pairs = pairs
        single = {t for t in vocab if len(t) == 1}
        byte_merges = any(_BYTE_TOKEN.match(p) for p in merge_parts)
        # Characters missing from the vocabulary become byte tokens (or <unk>); they are barriers unless
        # merges involve byte tokens or adjacent unknowns are fused.
        self._unknown_unsafe = byte_merges or (not model.get("byte_fallback") and model.get("fuse_unk"))
        self._single = single
        # A barrier character never touches another character inside a vocabulary token.
        chars_in_pairs = {c for p in pairs for c in p}
        self._anchor = None
        for cand in ("\n", "\x00", "\x01"):
            if cand not in chars_in_pairs and (not self._unknown_unsafe or cand in single):
                self._anchor = cand
                break
        if self._anchor is not None:
            self._anchor_count = self.count_text(self._anchor)
        self._model = self.backend.model
        self._init_words()

    def _init_words(self) -> None:
        """Set up the word-level path of `_c_many` (`_c_words`), where the vocabulary allows it.

        A cut between characters x and y is safe when x, y are never adjacent inside a vocabulary token
        (module docstring). `_c_words` cuts a string, in one `str.translate`, at positions that are
        safe by these rules:

        * before a space: safe when no vocabulary token has anything but the space mark itself right
          before a space mark (SentencePiece vocabularies: only runs of "▁"), in strings without double
          spaces and without a literal "▁" before a space;
        * around a barrier (newline, tab or ASCII punctuation never adjacent to anything inside a
          vocabulary token): always safe;
        * around a "cut char" (ASCII punctuation with few partners in vocabulary tokens, like "-"):
          safe in strings where `_unsafe_re` finds none of its partner pairs;
        * digits: when no vocabulary token of two or more characters contains a digit and every digit
          counts the same on its own, each digit is its own piece wherever it stands, and replacing it
          by "0" keeps the count (so numbers and UUIDs are sums of a few cached pieces).
        """
        self._cut_all = self._cut_bar = self._unsafe_re = self._zero = None
        self._unsafe_cache: dict = {}
        repl = self._repl
        if self._unknown_unsafe or repl is None:
            return
        left: dict[str, set] = {}
        right: dict[str, set] = {}
        for x, y in self._pairs:
            right.setdefault(x, set()).add(y)
            left.setdefault(y, set()).add(x)
        if not left.get(repl, set()) <= {repl}:
            return

        def chars(cs):  # a regex class of characters (the space mark stands for " " too)
            cs = set(cs) | ({" "} if repl in cs else set())
            return "[" + "".join(re.escape(c) for c in sorted(cs)) + "]"

        if "\0" in left or "\0" in right:
            return  # "\0" marks cuts below
        bar = {" ": "\0 "}
        digits = "0123456789"
        if all(d not in left and d not in right for d in digits):
            counts = set(self._raw_counts(list(digits)))
            if len(counts) == 1:
                bar.update({d: "\x000\x00" for d in digits})
                self._zero = str.maketrans("123456789", "000000000")
                self._digit_cut = str.maketrans(dict.fromkeys(digits, "\0"))
                self._digit_count = counts.pop()
        cut = {}
        self._unsafe_pairs: dict[str, dict[str, set]] = {}  # cut char -> {x: {y: x y is not a safe cut}}
        for c in "\n\t" + "".join(c for c in map(chr, range(33, 127)) if not c.isalnum()):
            lc, rc = left.get(c, set()), right.get(c, set())
            if not lc and not rc:
                bar[c] = f"\x00{c}\x00"
            elif len(lc) <= 40 and len(rc) <= 40:
                cut[c] = f"\x00{c}\x00"
                u = self._unsafe_pairs[c] = {}
                for x in lc:
                    for x2 in ({x, " "} if x == repl else {x}):
                        u.setdefault(x2, set()).add(c)
                u.setdefault(c, set()).update(rc)
        self._chars = chars
        self._barriers = [c for c in bar if c != " " and c not in digits]
        self._cut_bar = str.maketrans(bar)
        self._cut_all = str.maketrans({**bar, **cut})
        self._unsafe_re = self._unsafe_regex(tuple(cut))

    def _unsafe_regex(self, cut_chars: tuple[str, ...]):
        """Regex finding a pair of characters around one of `cut_chars` that is not a safe cut."""
        rx = self._unsafe_cache.get(cut_chars)
        if rx is None and cut_chars not in self._unsafe_cache:
            merged: dict[str, set] = {}
            for c in cut_chars:
                for x, ys in self._unsafe_pairs[c].items():
                    merged.setdefault(x, set()).update(ys)
            # one alternative per first character, so the regex engine skips other characters quickly
            alts = [re.escape(x) + self._chars(ys) for x, ys in sorted(merged.items())]
            rx = self._unsafe_cache[cut_chars] = re.compile("|".join(alts)) if alts else None
        return rx

    def _safe(self, a: str, b: str) -> bool:
        key = (a, b)
        r = self._safe_cache.get(key)
        if r is None:
            x = self._repl if a == " " else a
            y = self._repl if b == " " else b
            r = (x, y) not in self._pairs
            if r and self._unknown_unsafe and (x not in self._single or y not in self._single):
                r = False
            self._safe_cache[key] = r
        return r

    def _check_added(self, s: str) -> None:
        for a in self._added:
            if a in s:
                raise Fallback

    def _c_first(self, s: str) -> int:
        c = self._first.get(s)
        if c is None:
            self._check_added(s)
            c = self.count_text(s)
            if len(s) < 4096:
                self._first[s] = c
        return c

    def _c_many(self, strings: list[str]) -> list[int]:
        """Counts of strings that do not start the text (no prefix space is prepended).

        Each string is cut into atoms at safe boundaries (before a space, around digits, at whitespace,
        wherever the vocabulary allows it); atoms repeat a lot (words, digits) and are counted once.
        """
        for s in strings:
            self._check_added(s)
        if self._cut_all is not None:
            return [self._c_words(s) for s in strings]
        return self._c_atoms(strings)

    def _c_words(self, s: str) -> int:
        """Count of `s` (not at the text start): a sum of cached piece counts, cut as `_init_words` says."""
        if "  " in s or self._repl + " " in s or "\0" in s:
            return self._c_atoms([s])[0]
        table = self._cut_all
        if self._unsafe_re is not None and self._unsafe_re.search(s):
            table = self._cut_bar
        pieces = s.translate(table).split("\0")
        word = self._word
        try:
            return sum(map(word.__getitem__, pieces))
        except KeyError:
            pass
        missing = list({w: None for w in pieces if w not in word})
        if len(word) + len(missing) > 2_000_000:
            word.clear()
            missing = list(dict.fromkeys(pieces))
        for w, c in zip(missing, self._raw_counts(missing)):
            word[w] = c
        return sum(map(word.__getitem__, pieces))

    def _c_sum(self, strings: list[str], clean: bool = False) -> int:
        """`sum(self._c_many(strings))`, in bulk with C string operations and no per-string cache.

        The strings are joined by "\0" (never inside a vocabulary token, so it pairs with nothing)
        and cut exactly as `_c_words` cuts each one: the joined text has a double space or an unsafe
        pair around a cut char exactly when one of the strings has.
        """
        t = "\0".join(strings)
        if (self._cut_all is None or "  " in t or self._repl + " " in t
                or t.count("\0") != len(strings) - 1):
            return sum(self._c_many(strings))
        for a in self._added:
            if a in t:
                raise Fallback
        cuts = tuple(c for c in self._unsafe_pairs if c in t)
        rx = self._unsafe_regex(cuts) if cuts and not clean else None
        if rx is not None:
            bad = {t.count("\0", 0, m.start()) for m in rx.finditer(t)}  # indexes of strings with one
            if bad:  # count those one by one (`_c_words` does not cut around their cut chars)
                rest = [x for i, x in enumerate(strings) if i not in bad]
                # matches never span the "\0" separators, so the rest has none: `clean`
                return (sum(self._c_many([strings[i] for i in bad]))
                        + (self._c_sum(rest, clean=True) if rest else 0))
        total = 0
        if self._zero is not None:
            # every digit is a piece of its own with the same count: count them and turn each into a
            # cut ("\0"); the empty pieces this leaves between cuts are no text (0 tokens), dropped below
            seps = t.count("\0")
            if t.isascii():
                t = t.translate(self._digit_cut)  # fast for ASCII text only
            else:
                for d in "0123456789":
                    if d in t:
                        t = t.replace(d, "\0")
            total += (t.count("\0") - seps) * self._digit_count
        for c in (*self._barriers, *cuts):
            if c in t:
                t = t.replace(c, f"\0{c}\0")
        cnt = Counter(filter(None, t.replace(" ", "\0 ").split("\0")))
        word = self._word
        missing = [w for w in cnt if w not in word]
        if missing:
            if len(word) + len(missing) > 2_000_000:
                word.clear()
                missing = list(cnt)
            for w, c in zip(missing, self._raw_counts(missing)):
                word[w] = c
        return total + sum([word[w] * k for w, k in cnt.items()])

    def _c_atoms(self, strings: list[str]) -> list[int]:
        """`_c_many` without the word-level path: atoms cut by `_ATOM_RE`, glued where not safe."""
        atoms_of = []
        missing = {}
        word = self._word
        safe = self._safe
        for s in strings:
            atoms = _ATOM_RE.findall(s) if len(s) < 20000 else [s]
            if len(atoms) > 1 and "".join(atoms) != s:  # pragma: no cover - the pattern covers every char
                atoms = [s]
            merged = []
            for a in atoms:
                if merged and not safe(merged[-1][-1], a[0]):
                    merged[-1] += a
                else:
                    merged.append(a)
            atoms_of.append(merged)
            for a in merged:
                if a not in word:
                    missing[a] = None
        if missing:
            keys = list(missing)
            for k, c in zip(keys, self._raw_counts(keys)):
                if len(k) < 4096:
                    word[k] = c
                else:
                    missing[k] = c
        out = []
        for merged in atoms_of:
            total = 0
            for a in merged:
                c = word.get(a)
                total += c if c is not None else missing[a]
            out.append(total)
        if len(word) > 2_000_000:
            word.clear()
        return out

    def _raw_counts(self, strings: list[str]) -> list[int]:
        if self._anchor is not None:
            encs = self.backend.encode_batch([self._anchor + s for s in strings], add_special_tokens=False)
            return [len(e.ids) - self._anchor_count for e in encs]
        repl = self._repl
        return [len(self._model.tokenize(s.replace(" ", repl))) for s in strings]

    def _c(self, s: str) -> int:
        return self._c_many([s])[0]


def metaspace_replacement(spec) -> str | None:
    """The space mark ("▁") of a SentencePiece-style pipeline in the tokenizer JSON `spec`; None for another."""
    norm, pre = spec.get("normalizer"), spec.get("pre_tokenizer")
    if norm is None and pre and pre.get("type") == "Metaspace" and not pre.get("split", True):
        if pre.get("prepend_scheme", "always") in ("first", "always", "never"):
            return pre.get("replacement", "▁")
    if pre is None and norm and norm.get("type") == "Sequence":
        ns = norm.get("normalizers", [])
        types = [n.get("type") for n in ns]
        if sorted(types) == ["Prepend", "Replace"]:
            rep = next(n for n in ns if n["type"] == "Replace")
            prep = next(n for n in ns if n["type"] == "Prepend")
            if rep.get("pattern") == {"String": " "} and rep.get("content") == prep.get("prepend"):
                return rep["content"]
    return None
