"""Parsers for the units every verb shares: context lengths, RoPE bases, token counts, scaling factors.

Each raises ValueError with a message that quotes the bad item and shows an accepted form.
"""

from __future__ import annotations

import math
import re

_LENGTH = re.compile(r"(\d+(?:_\d+)*)([kKmM]?)")
_UNIT = {"": 1, "k": 1024, "K": 1024, "m": 1024**2, "M": 1024**2}


def parse_lengths(text: str) -> list[int]:
    """'4k,8K,32k,131072' -> [4096, 8192, 32768, 131072]; k/K mean ×1024 (RULER's 128k = 131072)."""
    if not text.strip():
        raise ValueError("no lengths given (use e.g. 4k,8k,32k or 4096,8192)")
    seen: dict[int, str] = {}
    for raw in text.split(","):
        item = raw.strip()
        m = _LENGTH.fullmatch(item)
        if not item:
            raise ValueError(f"empty item in '{text}' (use e.g. 4k,8k,32k)")
        if m is None:
            raise ValueError(f"'{item}' in '{text}' is not a length (use 32k or 32768; k and K mean x1024)")
        value = int(m.group(1).replace("_", "")) * _UNIT[m.group(2)]
        if value <= 0:
            raise ValueError(f"'{item}' in '{text}' is not a positive length (use 32k or 32768)")
        if value in seen:
            raise ValueError(f"'{item}' in '{text}' repeats {value} (given as '{seen[value]}'); list each length once")
        seen[value] = item
    return sorted(seen)


def _float(text: str | float | int, example: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ValueError(f"'{text}' is not a number (use e.g. {example})") from None


def parse_number(text: str | float | int) -> int | float:
    """'1e6', '1_000_000', '1000000' -> 1000000 (int when whole); finite and > 0, e.g. a RoPE base."""
    value = _float(text, "1e6, 1_000_000 or 1000000")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"'{text}' must be a finite number > 0 (e.g. 1e6)")
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


_COUNT = re.compile(r"(\d+(?:_\d+)*(?:\.\d+)?)([kKmMbBtT]?)")
# k/K and m/M as in lengths (x1024: "4M" tokens per step = 128 x 32k); B and T are the decimal words
# billion and trillion ("80B tokens" = 80,000,000,000), as papers count training tokens.
_COUNT_UNIT = {**_UNIT, "b": 10**9, "B": 10**9, "t": 10**12, "T": 10**12}


def parse_count(text: str | int) -> int:
    """A whole count > 0, e.g. of tokens: '80B' -> 80_000_000_000, '4M' -> 4_194_304, '1e9', '1_000_000'."""
    item = str(text).strip()
    m = _COUNT.fullmatch(item)
    if m is not None:
        value = float(m.group(1).replace("_", "")) * _COUNT_UNIT[m.group(2)]
    else:
        try:
            value = float(parse_number(item))
        except ValueError:
            raise ValueError(f"'{text}' is not a count (use e.g. 80B, 4M, 1e9 or 1_000_000; k/M are x1024, "
                             "B/T are 10^9/10^12)") from None
    if value <= 0 or not value.is_integer():
        raise ValueError(f"'{text}' must be a whole number > 0 (e.g. 80B, 4M or 1e9)")
    return int(value)


def parse_factor(text: str | float | int) -> float:
    """A scaling factor: a float > 1 (4 means 32k -> 128k)."""
    value = _float(text, "4 to go from 32k to 128k")
    if not math.isfinite(value) or value <= 1:
        raise ValueError(f"factor must be a number > 1, got '{text}' (e.g. 4 to go from 32k to 128k)")
    return value


def length_label(length: int) -> str:
    """131072 -> '128K', 1048576 -> '1M', 3000 -> '3000' (RULER's column names)."""
    if length % (1024 * 1024) == 0:
        return f"{length // (1024 * 1024)}M"
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)
