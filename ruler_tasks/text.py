"""Prompt text as a list of parts, so token counts can reuse the counts of repeated pieces.

A prompt is a list whose elements are `str` or `Join`. `render(parts)` is the text; the token counter
(`ruler_tasks.counting`) counts the same text without building it where it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Join:
    """`sep.join(items)`, preceded by `sep` when `lead` is true."""

    sep: str
    items: Sequence[str]
    lead: bool = False

    def render(self) -> str:
        body = self.sep.join(self.items)
        return self.sep + body if self.lead else body

    def char_len(self) -> int:
        n = len(self.items)
        if n == 0:
            return len(self.sep) if self.lead else 0
        return sum(map(len, self.items)) + len(self.sep) * (n - 1 + (1 if self.lead else 0))


@dataclass(frozen=True)
class NumberedList:
    """`" ".join(f"{i + 1}. {w}" for i, w in enumerate(words))` (RULER CWE's list format)."""

    words: Sequence[str]

    def render(self) -> str:
        return " ".join([f"{i + 1}. {w}" for i, w in enumerate(self.words)])

    def char_len(self) -> int:
        return len(self.render())


@dataclass(frozen=True)
class Rows:
    """`sep.join(lines)`, each line `literals[0] + row[0] + literals[1] + ... + row[-1] + literals[-1]`.

    Many lines of one template (NIAH's needle haystack): the counter counts the fixed text once and
    the field values in bulk.
    """

    sep: str
    literals: Sequence[str]  # one more than fields per row
    rows: Sequence[Sequence[str]]

    def lines(self) -> list[str]:
        lit = self.literals
        if len(lit) == 3:  # the common case, fast
            a, b, c = lit
            return [f"{a}{k}{b}{v}{c}" for k, v in self.rows]
        return ["".join(x for pair in zip(lit, (*row, "")) for x in pair) for row in self.rows]

    def render(self) -> str:
        return self.sep.join(self.lines())


Part = str | Join | NumberedList | Rows


def render(parts: Sequence[Part]) -> str:
    return "".join(p if isinstance(p, str) else p.render() for p in parts)


def truncate(parts: Sequence[Part], nchars: int) -> list[Part]:
    """Parts whose text is `render(parts)[:nchars]`."""
    out: list[Part] = []
    left = nchars
    for p in parts:
        if left <= 0:
            break
        if isinstance(p, str):
            if len(p) <= left:
                out.append(p)
                left -= len(p)
            else:
                out.append(p[:left])
                left = 0
            continue
        if isinstance(p, NumberedList):
            s = p.render()
            out.append(s[:left])
            left -= min(left, len(s))
            continue
        if isinstance(p, Rows):  # cut as the Join of its lines; whole lines stay Rows
            j = Join(p.sep, p.lines())
            total = j.char_len()
            if total <= left:
                out.append(p)
                left -= total
                continue
            for q in truncate([j], left):
                out.append(Rows(p.sep, p.literals, p.rows[: len(q.items)]) if isinstance(q, Join) else q)
            break
        # Join
        total = p.char_len()
        if total <= left:
            out.append(p)
            left -= total
            continue
        pos = 0
        sep, items = p.sep, p.items
        if p.lead:
            if left <= len(sep):
                out.append(sep[:left])
                break
            pos = len(sep)
        for k, it in enumerate(items):
            if k > 0:
                if pos + len(sep) >= left:
                    out.append(Join(sep, items[:k], p.lead))
                    out.append(sep[: left - pos])
                    left = 0
                    break
                pos += len(sep)
            if pos + len(it) >= left:
                # the cut falls in item k
                if k == 0:
                    out.append((sep if p.lead else "") + it[: left - pos])
                else:
                    out.append(Join(sep, items[:k], p.lead))
                    out.append(sep + it[: left - pos])
                left = 0
                break
            pos += len(it)
        break
    return out
