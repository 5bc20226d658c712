"""Word lists RULER draws from (wonderwords package data), loaded once per process.

`niah_keys()` is RULER's `sorted(set(f"{adj}-{noun}" ...))` list (6,171,620 strings with wonderwords
3.0.1) without building it: blocks of one adjective are contiguous runs of the sorted list except where
adjectives interleave (one adjective a prefix of another), and only those few blocks are materialised.
`random.choice` on it makes the same draw as on the real list (it only uses `len` and indexing).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence


@functools.cache
def wonderwords_lists() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(nouns, adjectives, verbs) exactly as `wonderwords.random_word._get_words_from_text_file` reads them."""
    from wonderwords.random_word import _get_words_from_text_file as read

    return (tuple(read("nounlist.txt")), tuple(read("adjectivelist.txt")), tuple(read("verblist.txt")))


def wonderwords_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("wonderwords")
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "unknown"


class AdjNounKeys(Sequence):
    """Read-only view equal to `sorted(set(f"{a}-{n}" for a in adjs for n in nouns))`."""

    def __init__(self, adjs: Sequence[str], nouns: Sequence[str]):
        nouns_sorted = sorted(set(nouns))
        self._nouns = nouns_sorted
        blocks = []  # (first, last, adj)
        for a in sorted(set(adjs)):
            blocks.append((f"{a}-{nouns_sorted[0]}", f"{a}-{nouns_sorted[-1]}", a))
        blocks.sort()
        # Group blocks whose [first, last] ranges overlap; only groups of several are materialised.
        groups: list[list[tuple[str, str, str]]] = []
        hi = None
        for b in blocks:
            if groups and b[0] <= hi:
                groups[-1].append(b)
                hi = max(hi, b[1])
            else:
                groups.append([b])
                hi = b[1]
        self._starts: list[int] = []
        self._parts: list = []  # str (an adjective: virtual block) or list[str] (materialised)
        n = 0
        for g in groups:
            self._starts.append(n)
            if len(g) == 1:
                self._parts.append(g[0][2])
                n += len(nouns_sorted)
            else:
                merged = sorted({f"{a}-{x}" for _, _, a in g for x in nouns_sorted})
                self._parts.append(merged)
                n += len(merged)
        self._len = n

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("AdjNounKeys index out of range")
        return self.at(i)

    def at(self, i: int) -> str:
        """`self[i]` for `0 <= i < len(self)` (no checks: the hot path of key draws)."""
        g = bisect.bisect_right(self._starts, i) - 1
        part = self._parts[g]
        off = i - self._starts[g]
        if isinstance(part, str):
            return f"{part}-{self._nouns[off]}"
        return part[off]

    def take(self, indices) -> list[str]:
        """`[self.at(i) for i in indices]` for a NumPy array of valid indices, with the block lookup in bulk."""
        import numpy as np

        groups = np.searchsorted(np.asarray(self._starts), indices, side="right") - 1
        offsets = (indices - np.asarray(self._starts)[groups]).tolist()
        parts, nouns = self._parts, self._nouns
        return [f"{part}-{nouns[off]}" if isinstance(part, str) else part[off]
                for part, off in zip(map(parts.__getitem__, groups.tolist()), offsets)]


@functools.cache
def niah_keys() -> AdjNounKeys:
    nouns, adjs, _ = wonderwords_lists()
    return AdjNounKeys(adjs, nouns)


@functools.cache
def cwe_words_sorted() -> tuple[str, ...]:
    """`sorted(set(nouns + adjs + verbs))` (CWE shuffles it with Random(seed) per run)."""
    nouns, adjs, verbs = wonderwords_lists()
    return tuple(sorted(set(nouns + adjs + verbs)))
