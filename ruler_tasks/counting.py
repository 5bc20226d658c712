"""Exact token counts, as RULER counts them: `len(tokenizer.tokenize(text))` (no special tokens added).

Three strategies, chosen from the loaded tokenizer's own pipeline description:

* ``metaspace`` -- SentencePiece-style BPE (no normalizer and `Metaspace(split=False)`, or the legacy
  `Prepend("▁") + Replace(" ", "▁")` normalizer). Strings are counted as sums of cached counts of pieces cut
  at safe boundaries (`ruler_tasks.pieces`); prompt parts (`Join`, `NumberedList`, `Rows`) as sums of the
  counts of their repeated items, where the boundaries between them are safe.
* ``pretoken`` -- any other BPE/WordPiece/... pipeline without added tokens in the text: the text is
  normalized and pre-tokenized by the tokenizer itself and each pre-token's count is cached (byte-level BPE
  such as GPT-2/Llama-3/Qwen).
* ``full`` -- tokenize the whole text (anything with dropout, unusual models, or added tokens in the text).

`RULER_TASKS_VERIFY_COUNTS=1` checks every count against a full tokenization (used by the tests).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence

from longctx.core.parse import loads
from ruler_tasks.pieces import Fallback, PieceCounter, metaspace_replacement
from ruler_tasks.text import Join, NumberedList, Part, Rows, render, truncate

_ROWS_BLOCK = 128  # rows per block of `TokenCounter._rows_fields`
_UNSAFE = -(1 << 62)  # `TokenCounter._sep_sum`'s mark of an item that is not a safe cut before the separator


def backend_of(tokenizer):
    """The Rust `tokenizers.Tokenizer` behind a transformers fast tokenizer (or the object itself)."""
    for attr in ("backend_tokenizer", "_tokenizer"):
        b = getattr(tokenizer, attr, None)
        if b is not None and hasattr(b, "encode_batch"):
            return b
    if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "to_str"):
        return tokenizer
    raise TypeError("need a fast (Rust `tokenizers`) tokenizer")


def counting_strategy(pipeline: str) -> str:
    """The strategy `TokenCounter` counts texts with for the tokenizer whose Rust pipeline (`to_str()`) this is."""
    return _choose_strategy(loads(pipeline))[0]


class TokenCounter(PieceCounter):
    """Counts tokens of prompt parts exactly as `len(tokenizer.tokenize(render(parts)))`."""

    def __init__(self, tokenizer, strategy: str | None = None):
        backend = backend_of(tokenizer)
        spec = loads(backend.to_str())
        super().__init__(backend, spec)
        self.verify = os.environ.get("RULER_TASKS_VERIFY_COUNTS", "") not in ("", "0")
        auto, why = _choose_strategy(spec)
        self.strategy = strategy or auto
        self.reason = why
        self._joined: dict[str, dict[str, int]] = {}
        self._num_prefix = [0, 0]  # _num_prefix[k] = sum of counts of " 2." ... " k."
        self._rows_last = None  # (rows, block sums) of the last large Rows counted (`_rows_fields`)
        if self.strategy == "metaspace":
            self._init_metaspace(spec)
        elif self.strategy == "pretoken":
            self._normalizer = self.backend.normalizer
            self._pre = self.backend.pre_tokenizer
            self._model = self.backend.model

    # --- public -------------------------------------------------------------------------------
    def count(self, parts: Sequence[Part] | str) -> int:
        if isinstance(parts, str):
            parts = [parts]
        if self.strategy == "metaspace":
            try:
                n = self._count_metaspace(parts)
            except Fallback:
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

    # --- strategy: metaspace (prompt parts; strings are `PieceCounter`'s) ---------------------
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

    def _push(self, st: _State, s: str) -> None:
        if not s:
            return
        if st.buf and self._safe(st.last, s[0]):
            self._flush(st)
        st.buf.append(s)
        st.last = s[-1]

    def _flush(self, st: _State) -> None:
        if not st.buf:
            return
        s = st.buf[0] if len(st.buf) == 1 else "".join(st.buf)
        st.buf = []
        st.total += self._c(s) if st.started else self._c_first(s)
        st.started = True

    def _join(self, st: _State, j: Join) -> None:
        sep, items = j.sep, j.items
        n = len(items)
        if sep and n >= 2 and "" in items[:-1]:
            # An empty item (NIAH's empty haystack chunk at depth 0 or between needles) is its two separators
            # in a row: the same text as the next item with one separator before it, which keeps the rest
            # countable item by item.
            items = list(items)
            for k in reversed(range(n - 1)):
                if items[k] == "":
                    items[k + 1] = sep + items[k + 1]
                    del items[k]
            n = len(items)
        if n == 0:
            if j.lead:
                self._push(st, sep)
            return
        middle = self._join_middle(sep, items) if n >= 3 and (j.lead or items[0] != "") else None
        if middle is None:
            self._push(st, (sep + items[0]) if j.lead else items[0])
            for it in items[1:]:
                self._push(st, sep + it)
            return
        self._push(st, (sep + items[0]) if j.lead else items[0])
        self._flush(st)
        st.total += middle
        self._push(st, sep + items[n - 1])

    def _join_middle(self, sep: str, items: Sequence[str]) -> int | None:
        """The count of `sep + item` summed over the items but the first and the last, when every cut before a
        `sep` is safe (the first item's included), else None."""
        if not sep or not self._safe(items[0][-1] if items[0] else sep[-1], sep[0]):
            return None
        return self._sep_sum(sep, items[1:-1])

    def _sep_sum(self, sep: str, items: Sequence[str]) -> int | None:
        """The count of `sep + item` summed over `items`, or None when an item's last character and `sep` may
        merge. Per separator and item, the count is kept, or `_UNSAFE` for such an item: one makes the sum
        negative."""
        s0 = sep[0]
        cache = self._joined.setdefault(sep, {})
        try:
            total = sum(map(cache.__getitem__, items))
        except KeyError:
            if len(cache) > 500_000:
                cache.clear()
            missing = list(set(items).difference(cache))
            safe = [self._safe(d[-1] if d else sep[-1], s0) for d in missing]
            counted = [d for d, ok in zip(missing, safe) if ok]
            cache.update(zip(counted, self._c_many([sep + d for d in counted])))
            cache.update((d, _UNSAFE) for d, ok in zip(missing, safe) if not ok)
            total = sum(map(cache.__getitem__, items))
        return total if total >= 0 else None

    def _rows(self, st: _State, r: Rows) -> None:
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

    def _numlist(self, st: _State, nl: NumberedList) -> None:
        words = nl.words
        n = len(words)
        if n == 0:
            return
        middle = self._sep_sum(" ", words[: n - 1]) if n >= 2 and self._safe(".", " ") and all(words) else None
        if middle is None:
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
        st.total += pre[n] + middle
        self._push(st, " " + words[n - 1])


class _State:
    __slots__ = ("buf", "last", "started", "total")

    def __init__(self):
        self.buf: list[str] = []
        self.last = ""
        self.total = 0
        self.started = False


def _choose_strategy(spec) -> tuple[str, str]:
    model = spec.get("model") or {}
    if model.get("dropout") not in (None, 0, 0.0):
        return "full", "BPE dropout makes tokenization random"
    if model.get("type") == "BPE":
        plain = (not model.get("continuing_subword_prefix") and not model.get("end_of_word_suffix")
                 and not model.get("ignore_merges"))
        if plain and metaspace_replacement(spec) is not None:
            return "metaspace", "SentencePiece-style BPE over the whole text (safe-boundary piece counts)"
        return "pretoken", "BPE per pre-token (pre-token counts cached)"
    if model.get("type") in ("WordPiece", "WordLevel", "Unigram"):
        return "pretoken", f"{model.get('type')} per pre-token (pre-token counts cached)"
    return "full", "unknown tokenizer model"
