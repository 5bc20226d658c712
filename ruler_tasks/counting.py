"""Exact token counts, as RULER counts them: `len(tokenizer.tokenize(text))` (no special tokens added).

Three strategies, chosen from the loaded tokenizer's own pipeline description:

* ``metaspace`` -- SentencePiece-style BPE (no normalizer and `Metaspace(split=False)`, or the legacy
  `Prepend("▁") + Replace(" ", "▁")` normalizer). The whole text is one BPE word, so BPE merges could in
  principle cross anywhere; but a merge can only join two symbols into a vocabulary token, so two pieces of
  text tokenize independently when the last character of the first and the first character of the second
  never occur next to each other inside any vocabulary token (a "safe boundary"). Counts are then sums over
  pieces, and repeated pieces (noise sentences, essay sentences, words, "Document i:" lines) are counted
  once. Boundaries that are not safe are never split: the pieces are glued and counted together.
  Where the vocabulary allows it (`_init_words`), strings are cut with C string operations (before
  spaces, around digits and punctuation) and counted as sums of cached pieces, one by one
  (`_c_words`) or many at once (`_c_sum`, used for the field values of `Rows`).
* ``pretoken`` -- any other BPE/WordPiece/... pipeline without added tokens in the text: the text is
  normalized and pre-tokenized by the tokenizer itself and each pre-token's count is cached (byte-level BPE
  such as GPT-2/Llama-3/Qwen).
* ``full`` -- tokenize the whole text (anything with dropout, unusual models, or added tokens in the text).

`RULER_TASKS_VERIFY_COUNTS=1` checks every count against a full tokenization (used by the tests).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Sequence

from longctx.core.parse import loads
from ruler_tasks.text import Join, NumberedList, Part, Rows, render, truncate

_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
# candidate cut points inside a piece: before a space, around each digit, at other whitespace
_ATOM_RE = re.compile(r" ?[^\s\d]+| ?\d|\s")
_ROWS_BLOCK = 128  # rows per block of `TokenCounter._rows_fields`


class _Fallback(Exception):
    pass


def backend_of(tokenizer):
    """The Rust `tokenizers.Tokenizer` behind a transformers fast tokenizer (or the object itself)."""
    for attr in ("backend_tokenizer", "_tokenizer"):
        b = getattr(tokenizer, attr, None)
        if b is not None and hasattr(b, "encode_batch"):
            return b
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "to_str"):
        return tokenizer
    raise TypeError("need a fast (Rust `tokenizers`) tokenizer")


class TokenCounter:
    """Counts tokens of prompt parts exactly as `len(tokenizer.tokenize(render(parts)))`."""

    def __init__(self, tokenizer, strategy: str | None = None):
        self.backend = backend_of(tokenizer)
        self.verify = os.environ.get("RULER_TASKS_VERIFY_COUNTS", "") not in ("", "0")
        spec = loads(self.backend.to_str())
        self._added = [t["content"] for t in spec.get("added_tokens", []) if t.get("content")]
        auto, why = _choose_strategy(spec)
        self.strategy = strategy or auto
        self.reason = why
        self._first: dict[str, int] = {}
        self._word: dict[str, int] = {}
        self._joined: dict[str, dict[str, int]] = {}
        self._num_prefix = [0, 0]  # _num_prefix[k] = sum of counts of " 2." ... " k."
        self._safe_cache: dict[tuple[str, str], bool] = {}
        self._rows_last = None  # (rows, block sums) of the last large Rows counted (`_rows_fields`)
        if self.strategy == "metaspace":
            self._init_metaspace(spec)
        elif self.strategy == "pretoken":
            self._normalizer = self.backend.normalizer
            self._pre = self.backend.pre_tokenizer
            self._model = self.backend.model

    # --- public -------------------------------------------------------------------------------
    def count_text(self, text: str) -> int:
        """Full tokenization count of `text` (what RULER computes)."""
        return len(self.backend.encode(text, add_special_tokens=False).ids)

    def count(self, parts: Sequence[Part] | str) -> int:
        if isinstance(parts, str):
            parts = [parts]
        if self.strategy == "metaspace":
            try:
                n = self._count_metaspace(parts)
            except _Fallback:
                n = self.count_text(render(parts))
        elif self.strategy == "pretoken":
            n = self._count_pretoken(render(parts))
        else:
            n = self.count_text(render(parts))
        if self.verify:
            full = self.count_text(render(parts))
            if n != full:
                raise AssertionError(f"fast token count {n} != full tokenization {full} ({self.strategy})")
        return n

    def count_prefix(self, parts: Sequence[Part], nchars: int) -> int:
        """Count of `render(parts)[:nchars]`."""
        return self.count(truncate(parts, nchars))

    # --- strategy: pretoken ------------------------------------------------------------------
    def _count_pretoken(self, text: str) -> int:
        if self._added and any(a in text for a in self._added):
            return self.count_text(text)
        norm = self._normalizer.normalize_str(text) if self._normalizer is not None else text
        if self._pre is None:
            pieces = [norm] if norm else []
        else:
            pieces = [p for p, _ in self._pre.pre_tokenize_str(norm)]
        cache = self._word
        total = 0
        for piece, k in Counter(pieces).items():
            c = cache.get(piece)
            if c is None:
                c = len(self._model.tokenize(piece))
                cache[piece] = c
            total += c * k
        return total

    # --- strategy: metaspace -----------------------------------------------------------------
    def _init_metaspace(self, spec) -> None:
        model = spec["model"]
        self._repl = _metaspace_replacement(spec)
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
            for x, y in zip(tok, tok[1:]):
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
                raise _Fallback

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
                raise _Fallback
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

    def _count_metaspace(self, parts: Sequence[Part]) -> int:
        st = _State()
        for p in parts:
            if isinstance(p, str):
                self._push(st, p)
            elif isinstance(p, Join):
                self._join(st, p)
            elif isinstance(p, NumberedList):
                self._numlist(st, p)
            elif isinstance(p, Rows):
                self._rows(st, p)
            else:  # pragma: no cover
                raise TypeError(type(p))
        self._flush(st)
        return st.total

    def _push(self, st: "_State", s: str) -> None:
        if not s:
            return
        if st.buf and self._safe(st.last, s[0]):
            self._flush(st)
        st.buf.append(s)
        st.last = s[-1]

    def _flush(self, st: "_State") -> None:
        if not st.buf:
            return
        s = st.buf[0] if len(st.buf) == 1 else "".join(st.buf)
        st.buf = []
        st.total += self._c(s) if st.started else self._c_first(s)
        st.started = True

    def _joined_counts(self, sep: str, keys) -> dict[str, int]:
        cache = self._joined.setdefault(sep, {})
        if len(cache) > 500_000:
            cache.clear()
        missing = [k for k in keys if k not in cache]
        if missing:
            for k, c in zip(missing, self._c_many([sep + k for k in missing])):
                cache[k] = c
        return cache

    def _join(self, st: "_State", j: Join) -> None:
        sep, items = j.sep, j.items
        n = len(items)
        if n == 0:
            if j.lead:
                self._push(st, sep)
            return
        fast = bool(sep) and n >= 3 and (j.lead or items[0] != "")
        if fast:
            s0 = sep[0]
            cnt = Counter(items[1 : n - 1])
            for d in list(cnt) + [items[0]]:
                last = d[-1] if d else sep[-1]
                if not self._safe(last, s0):
                    fast = False
                    break
        if not fast:
            self._push(st, (sep + items[0]) if j.lead else items[0])
            for it in items[1:]:
                self._push(st, sep + it)
            return
        self._push(st, (sep + items[0]) if j.lead else items[0])
        self._flush(st)
        cache = self._joined_counts(sep, cnt.keys())
        st.total += sum(cache[d] * k for d, k in cnt.items())
        self._push(st, sep + items[n - 1])

    def _rows(self, st: "_State", r: Rows) -> None:
        """Count `Rows`: the fixed text once per line, the field values in bulk (`_c_sum`).

        When every literal before a field ends with a space (cut right before it), every field is cut
        right after it and those cuts are safe, the text is the pieces
        `L0[:-1] | " f1" | L1[:-1] | " f2" | ... | " fm" | Lm + sep + L0[:-1] | " f1" | ... | " fm" | Lm`
        (L = literals, f = a row's fields), so its count is the sum of theirs.
        """
        lit, rows, n = r.literals, r.rows, len(r.rows)
        fast = n >= 2 and len(lit) >= 2 and lit[-1] != "" and self._cut_all is not None
        fast = fast and all(len(L) >= 2 and L[-1] == " " and self._safe(L[-2], " ") for L in lit[:-1])
        cols = list(zip(*rows)) if fast else []
        if fast and len(cols) == len(lit) - 1 and all(len(col) == n and all(col) for col in cols):
            for j, col in enumerate(cols):
                nxt = lit[j + 1][0]
                if not all(self._safe(c, nxt) for c in {f[-1] for f in col}):
                    fast = False
                    break
        else:
            fast = False
        if not fast:
            self._join(st, Join(r.sep, r.lines()))
            return
        self._push(st, lit[0][:-1])
        self._flush(st)
        st.total += self._rows_fields(rows, cols)
        st.total += n * sum(self._c_many([L[:-1] for L in lit[1:-1]]))
        st.total += (n - 1) * self._c_many([lit[-1] + r.sep + lit[0][:-1]])[0]
        self._push(st, lit[-1])

    def _fields_sum(self, cols, a: int, b: int) -> int:
        """Sum of the counts of `" " + field` over the fields of rows a..b-1 (columns `cols`)."""
        total = 0
        rest = []
        for col in cols:
            col = col[a:b]
            digits = "".join(col)
            if self._zero is not None and digits.isascii() and digits.isdigit():
                # a column of ASCII-digit fields (NIAH numbers): by the digit rule (`_init_words`) each
                # digit is a piece of its own, so " " + field counts as " " plus one per digit
                total += len(col) * self._c_many([" "])[0] + len(digits) * self._digit_count
            else:
                rest.extend([" " + f for f in col])
        if rest:
            total += self._c_sum(rest)
        return total

    def _rows_fields(self, rows, cols) -> int:
        """`_fields_sum` over all rows, reusing the block sums of the last large `rows` counted.

        The field sum is a plain sum of per-field counts (each field is cut off on both sides, see
        `_rows`), so it is additive over any split of the rows. For a large `rows` it is computed per
        block of `_ROWS_BLOCK` rows and the running sums are kept with the rows themselves; a later
        `rows` equal to a prefix of those (NIAH's `token_position_answer`: `count_prefix` of the sample
        just counted) takes the sum of its whole blocks from there and counts only the rest. Equal
        rows have equal fields, hence equal counts, so the reuse is exact.
        """
        n = len(rows)
        B = _ROWS_BLOCK
        last = self._rows_last
        if last is not None and isinstance(rows, list):
            old, sums = last
            if n <= len(old) and rows == old[:n]:
                m = n // B
                return sums[m] + (self._fields_sum(cols, m * B, n) if m * B < n else 0)
        if n < 2 * B or not isinstance(rows, list):
            return self._fields_sum(cols, 0, n)
        sums = [0]
        for a in range(0, n, B):
            sums.append(sums[-1] + self._fields_sum(cols, a, min(a + B, n)))
        self._rows_last = (list(rows), sums)  # a copy: the caller's list may change later
        return sums[-1]

    def _numlist(self, st: "_State", nl: NumberedList) -> None:
        words = nl.words
        n = len(words)
        if n == 0:
            return
        fast = n >= 2 and self._safe(".", " ") and all(words)
        if fast:
            cnt = Counter(words[: n - 1])
            for w in cnt:
                if not self._safe(w[-1], " "):
                    fast = False
                    break
        if not fast:
            self._push(st, nl.render())
            return
        self._push(st, "1.")
        self._flush(st)
        # units " w1", " 2.", " w2", ..., " n.", then " wn" stays pending
        pre = self._num_prefix
        if len(pre) <= n:
            new = list(range(len(pre), n + 1))
            counts = self._c_many([f" {i}." for i in new])
            for c in counts:
                pre.append(pre[-1] + c)
        st.total += pre[n]
        cache = self._joined_counts(" ", cnt.keys())
        st.total += sum(cache[w] * k for w, k in cnt.items())
        self._push(st, " " + words[n - 1])


class _State:
    __slots__ = ("buf", "last", "total", "started")

    def __init__(self):
        self.buf: list[str] = []
        self.last = ""
        self.total = 0
        self.started = False


def _metaspace_replacement(spec) -> str | None:
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


def _choose_strategy(spec) -> tuple[str, str]:
    model = spec.get("model") or {}
    if model.get("dropout") not in (None, 0, 0.0):
        return "full", "BPE dropout makes tokenization random"
    if model.get("type") == "BPE":
        plain = (not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix")
                 and not model.get("ignore_merges"))
        if plain and _metaspace_replacement(spec) is not None:
            return "metaspace", "SentencePiece-style BPE over the whole text (safe-boundary piece counts)"
        return "pretoken", "BPE per pre-token (pre-token counts cached)"
    if model.get("type") in ("WordPiece", "WordLevel", "Unigram"):
        return "pretoken", f"{model.get('type')} per pre-token (pre-token counts cached)"
    return "full", "unknown tokenizer model"
