"""Shared parameter types: lengths (k/K = x1024), numbers (1e6, 1_000_000), factors (> 1)."""

import pytest

from longctx.core.units import parse_factor, parse_lengths, parse_number


@pytest.mark.parametrize("text,expected", [
    ("4k,8K,32k,131072", [4096, 8192, 32768, 131072]),
    ("128k", [131072]),
    ("32k, 4k ,16K", [4096, 16384, 32768]),  # sorted, spaces allowed
    ("1_024,2k", [1024, 2048]),
    ("1M", [1048576]),
])
def test_lengths(text, expected):
    assert parse_lengths(text) == expected


@pytest.mark.parametrize("text,message", [
    ("12q", "'12q' in '12q' is not a length (use 32k or 32768"),
    ("0", "'0' in '0' is not a positive length"),
    ("-4k", "'-4k' in '-4k' is not a length"),
    ("4k,4k", "'4k' in '4k,4k' repeats 4096"),
    ("4k,4096", "'4096' in '4k,4096' repeats 4096 (given as '4k')"),
    ("", "no lengths given (use e.g. 4k,8k,32k"),
    ("4k,,8k", "empty item in '4k,,8k'"),
    ("1.5k", "'1.5k' in '1.5k' is not a length"),
])
def test_lengths_rejected(text, message):
    with pytest.raises(ValueError) as e:
        parse_lengths(text)
    assert message in str(e.value)


@pytest.mark.parametrize("text,expected", [("1e6", 1000000), ("1_000_000", 1000000), ("1000000", 1000000),
                                           ("500000.0", 500000), ("1.5e4", 15000), ("2.5", 2.5)])
def test_numbers(text, expected):
    value = parse_number(text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text", ["abc", "0", "-1e6", "inf", "nan", ""])
def test_numbers_rejected(text):
    with pytest.raises(ValueError, match=f"'{text}'"):
        parse_number(text)


def test_factors():
    assert parse_factor("4") == 4.0 and isinstance(parse_factor("4"), float)
    assert parse_factor("1.5") == 1.5
    for bad in ("1", "-2", "0.5", "abc", "inf"):
        with pytest.raises(ValueError, match=f"'{bad}'"):
            parse_factor(bad)
