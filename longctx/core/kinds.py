"""Kinds of setting values: how each is parsed (from a command-line string, a YAML value or a Python
value, all the same way), how it is written back onto a command line, and which values are local paths.

`parse` raises `KindError` whose text is a predicate that follows the setting's name
(`must be a number > 0, got 'fast'`), so one message serves the command line (`--lr must ...`) and a
recipe (`extend.lr must ...`). Parsing is idempotent: a parsed value parses to itself.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from longctx.core import units
from longctx.core.files import file_in_the_way
from longctx.core.parse import LimitError, loads
from longctx.core.secrets import redact_url


class KindError(ValueError):
    """`predicate` follows the setting's name; `cli_predicate` is the command-line wording, when it differs."""

    def __init__(self, predicate: str, cli_predicate: str | None = None):
        super().__init__(predicate)
        self.predicate, self.cli_predicate = predicate, cli_predicate


def did_you_mean(value: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _invalid(e: ValueError) -> KindError:
    return KindError(f"is invalid: {e}")


class Kind:
    """A value kind. `metavar` names it in --help; `repeatable` options are given once per item."""

    metavar = "TEXT"
    repeatable = False
    words = "a value"

    def parse(self, value: Any) -> Any:
        raise NotImplementedError

    def wrong(self, value: Any) -> KindError:
        return KindError(f"must be {self.words}, got {value!r}")

    def to_cli(self, value: Any) -> list[str]:
        """The command-line strings that parse back to `value` (one per occurrence when repeatable)."""
        return [str(value)]

    def show(self, value: Any) -> str:
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)

    def resolve(self, value: Any, base: Path) -> Any:
        """`value` with its relative local paths made absolute against `base` (recipes)."""
        return value

    def recorded(self, value: Any) -> Any:
        """`value` as it may be written to a file or shown (provenance, stage markers, --help)."""
        return value


class Text(Kind):
    """A non-empty string (a path given as `os.PathLike` becomes its string)."""

    words = "a string"

    def parse(self, value):
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise self.wrong(value)
        return value


class Url(Text):
    """A URL that may carry a credential (user info, query values): recorded and shown redacted
    (`longctx.core.secrets`)."""

    metavar = "URL"
    words = "a URL"

    def recorded(self, value):
        return redact_url(value) if isinstance(value, str) else value

    def show(self, value):
        return str(self.recorded(value))


class Urls(Url):
    """One URL or several (a list; one per occurrence on the command line), each recorded and shown redacted."""

    repeatable = True
    words = "a URL or a list of URLs"

    def parse(self, value):
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise self.wrong(value)
        return [Text.parse(self, v) for v in items]

    def to_cli(self, value):
        return list(value)

    def recorded(self, value):
        return [redact_url(v) for v in value] if isinstance(value, list) else super().recorded(value)

    def show(self, value):
        shown = self.recorded(value)
        return ",".join(shown) if isinstance(shown, list) else str(shown)


class Choice(Kind):
    """One of `choices`; `noun` names it on the command line ("unknown backend 'tgi'; choose one of ...")."""

    def __init__(self, choices: Sequence[str] | Callable[[], Sequence[str]], noun: str):
        # a callable: choices that a registry holds, read when asked (so an entry added later is one)
        self._choices, self.noun = choices, noun

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self._choices() if callable(self._choices) else self._choices)

    @property
    def metavar(self) -> str:
        return "[" + "|".join(self.choices) + "]"

    def parse(self, value):
        if value not in self.choices:
            hint = did_you_mean(str(value), self.choices)
            raise KindError(f"must be one of {', '.join(self.choices)}, got {value!r}{hint}",
                            f"unknown {self.noun} '{value}'; choose one of {', '.join(self.choices)}{hint}")
        return value


class Bool(Kind):
    words = "true or false"

    def parse(self, value):
        if not isinstance(value, bool):
            raise self.wrong(value)
        return value


class Int(Kind):
    metavar = "INTEGER"

    def __init__(self, minimum: int | None = None, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum

    def parse(self, value):
        if isinstance(value, str):
            try:
                value = int(value.replace("_", ""))
            except ValueError:
                shown = repr(value) if len(value) <= 40 else f"{value[:20]!r}... ({len(value):,} characters)"
                raise KindError(f"is invalid: {shown} is not a valid integer") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise KindError(f"must be an integer, got {value!r}")
        low_ok = self.minimum is None or value >= self.minimum
        high_ok = self.maximum is None or value <= self.maximum
        if not (low_ok and high_ok):
            raise KindError(f"is invalid: {value} is not in the range {self._range()}")
        return value

    def _range(self) -> str:
        if self.maximum is None:
            return f"x>={self.minimum}"
        if self.minimum is None:
            return f"x<={self.maximum}"
        return f"{self.minimum}<=x<={self.maximum}"


# numpy's generators (`np.random.seed`, `RandomState`) take seeds below 2**32; torch's and Python's take more.
MAX_SEED = 2**32 - 1


class Seed(Int):
    """A random seed every generator longctx seeds takes: 0 to 2**32 - 1."""

    def __init__(self):
        super().__init__(0, MAX_SEED)


class Float(Kind):
    """A finite float in a range; `words` says the range ("a number > 0", "a number from 0 to 1")."""

    metavar = "FLOAT"

    def __init__(self, low: float | None = None, high: float | None = None, *, low_open: bool = False,
                 high_open: bool = False, words: str = "a number"):
        self.low, self.high, self.low_open, self.high_open, self.words = low, high, low_open, high_open, words

    def parse(self, value):
        if isinstance(value, str):  # the command line, or YAML 1.1 reading 2e-5 (no dot) as a string
            try:
                value = float(value.replace("_", ""))
            except ValueError:
                raise self.wrong(value) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.wrong(value)
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        if not (low_ok and high_ok):
            raise self.wrong(value)
        return value


class _Unit(Kind):
    """A number in one of `longctx.core.units`' forms, parsed by the subclass's `parser`."""

    def parse(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise self.wrong(value)
        try:
            return self.parser(value)
        except ValueError as e:
            raise self.invalid(e) from None

    def invalid(self, e: ValueError) -> KindError:
        return _invalid(e)


class Number(_Unit):
    """A finite number > 0 such as a RoPE base: 1e6, 1_000_000 (an int when whole)."""

    metavar = "NUMBER"
    words = "a number > 0 (e.g. 1e6 or 1_000_000)"
    parser = staticmethod(units.parse_number)


class Count(_Unit):
    """A whole count > 0: 80B, 4M (x1024), 1e9."""

    metavar = "COUNT"
    words = "a count (e.g. 80B, 4M or 1e9)"
    parser = staticmethod(units.parse_count)


class Factor(_Unit):
    """A scaling factor > 1 (4 means 32k -> 128k)."""

    metavar = "FACTOR"
    words = "a number > 1 (e.g. 4)"
    parser = staticmethod(units.parse_factor)

    def invalid(self, e: ValueError) -> KindError:
        text = str(e)  # "factor must be ..." reads as a predicate of the setting's name
        return KindError(text.removeprefix("factor ")) if text.startswith("factor ") else _invalid(e)


def _length_text(value: Any) -> str | None:
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in items):
        return None
    return ",".join(str(v) for v in items)


class Lengths(Kind):
    """Context lengths, sorted: '4k,8k' or [4096, '8k'] (k/K = x1024)."""

    metavar = "LENGTHS"
    words = "lengths (e.g. 4k,8k or [4096, 8192])"

    def parse(self, value):
        text = _length_text(value)
        if text is None:
            raise self.wrong(value)
        try:
            return units.parse_lengths(text)
        except ValueError as e:
            raise _invalid(e) from None

    def to_cli(self, value):
        return [",".join(map(str, value))]


class Length(Lengths):
    """One context length: 32k or 32768."""

    metavar = "LENGTH"
    words = "a length (e.g. 32k or 32768)"

    def parse(self, value):
        lengths = super().parse(value)
        if len(lengths) != 1:
            raise KindError("takes one length (e.g. 32k)")
        return lengths[0]

    def to_cli(self, value):
        return [str(value)]


class Names(Kind):
    """A list of names: 'a,b' or [a, b]."""

    metavar = "NAMES"
    words = "a name or a list of names"

    def parse(self, value):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items or not all(isinstance(v, str) and v.strip()
                                                                         for v in items):
            raise self.wrong(value)
        return [v.strip() for v in items]

    def to_cli(self, value):
        return [",".join(value)]


def _local(value: str, base: Path) -> str:
    return os.path.normpath(base / os.path.expanduser(value))


class Seeds(Kind):
    """Distinct seeds (each a `Seed`): '0,1,2' or [0, 1, 2]."""

    metavar = "SEEDS"
    words = f"a list of distinct integers from 0 to {MAX_SEED}"

    def parse(self, value):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise self.wrong(value)
        seeds = [Seed().parse(v.strip() if isinstance(v, str) else v) for v in items]
        if len(set(seeds)) != len(seeds):
            raise KindError(f"names a seed twice: {value!r}")
        return seeds


class Shard(Kind):
    """One part of a run split N ways: 'I/N' with 1 <= I <= N (kept as that text, e.g. '2/8')."""

    metavar = "I/N"
    words = "a shard I/N (e.g. 2/8: the second of eight)"

    def parse(self, value):
        parts = value.split("/") if isinstance(value, str) else None
        if parts is None or len(parts) != 2 or not all(p.strip().isascii() and p.strip().isdigit() for p in parts):
            raise self.wrong(value)
        index, count = (int(p) for p in parts)
        if not 1 <= index <= count:
            raise KindError(f"is invalid: {value!r} is not a shard I/N with 1 <= I <= N")
        return f"{index}/{count}"


class LocalPath(Text):
    """A local path. `directory`: a folder (one to read, or one a verb makes), so a file there (or at a parent
    of it) is refused when the value is parsed, on the command line and in a recipe alike."""

    metavar = "PATH"
    words = "a path"

    def __init__(self, directory: bool = False):
        self.directory = directory

    def parse(self, value):
        value = super().parse(value)
        if self.directory:
            found = file_in_the_way(Path(os.path.expanduser(value)))
            if found is not None:
                if found == Path(os.path.expanduser(value)):
                    raise KindError(f"'{value}' is a file, not a folder; choose another path")
                raise KindError(f"'{value}' lies under '{found}', which is a file, not a folder; choose another path")
        return value

    def resolve(self, value, base):
        return _local(value, base) if isinstance(value, str) and value.strip() else value


_SCHEME = re.compile(r"^[A-Za-z]{2,}:")  # hf:<id>, synthetic:<kind>: specs that are not local paths


_HUB_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
# A Hugging Face Hub checkpoint: org/name, then subfolders, then @revision (`longctx.checkpoint.hub`).
HUB_ID = re.compile(rf"^(?P<repo>{_HUB_PART}/{_HUB_PART})(?P<sub>(?:/{_HUB_PART})*)"
                    r"(?:@(?P<revision>[A-Za-z0-9._/-]+))?$")


class CheckpointPath(LocalPath):
    """A local checkpoint folder or a Hub id: in a recipe, a relative path counts from the recipe's folder
    unless no such folder exists there and the value reads as a Hub id."""

    words = "a checkpoint folder or Hub id"

    def resolve(self, value, base):
        if isinstance(value, str) and HUB_ID.match(value) and not (base / value).exists():
            return value
        return super().resolve(value, base)


class Source(Text):
    """A local file or a `scheme:...` spec (`hf:<dataset id>`)."""

    metavar = "SOURCE"
    words = "a path or spec string"

    def resolve(self, value, base):
        return _local(value, base) if isinstance(value, str) and value.strip() and ":" not in value else value


class Specs(Kind):
    """Data specs (a file, a directory, hf:<id>[:split], synthetic:<kind>): a list, or a comma-separated
    string in a recipe; one per occurrence on the command line."""

    metavar = "SPEC"
    repeatable = True
    words = "a data spec or a list of them (file, directory, hf:<id>, synthetic:<kind>)"

    def parse(self, value):
        items = value.split(",") if isinstance(value, str) else value
        if isinstance(items, (list, tuple)):
            items = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in items]
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in items):
            raise self.wrong(value)
        return [v.strip() for v in items]

    def to_cli(self, value):
        return list(value)

    def resolve(self, value, base):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            return value
        return [_local(v.strip(), base) if isinstance(v, str) and v.strip() and not _SCHEME.match(v.strip()) else v
                for v in items]


class LocalPaths(Specs):
    """Local paths: a list (one per occurrence on the command line)."""

    metavar = "PATH"
    words = "a path or a list of paths"

    def parse(self, value):
        return super().parse([value] if isinstance(value, (str, os.PathLike)) else value)

    def resolve(self, value, base):
        items = value if isinstance(value, list) else [value]
        return [_local(v, base) if isinstance(v, str) and v.strip() else v for v in items]


class Overrides(Kind):
    """Config keys to set: a mapping in a recipe, KEY=VALUE (VALUE as JSON, else a string) per occurrence
    on the command line."""

    metavar = "KEY=VALUE"
    repeatable = True
    words = "a mapping of config keys to values"

    def parse(self, value):
        if isinstance(value, (list, tuple)):
            out = {}
            for item in value:
                key, sep, text = str(item).partition("=")
                if not sep or not key.strip():
                    raise KindError(f"is invalid: '{item}' is not KEY=VALUE (e.g. max_position_embeddings=256)")
                try:
                    out[key.strip()] = loads(text)
                except LimitError as e:
                    raise KindError(f"is invalid: '{key.strip()}': {e}") from None
                except ValueError:  # not JSON: the text itself
                    out[key.strip()] = text
            return out
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise self.wrong(value)
        return dict(value)

    def to_cli(self, value):
        return [f"{k}={json.dumps(v)}" for k, v in value.items()]

    def show(self, value):
        return " ".join(self.to_cli(value)) or "none"


class NamedLists(Kind):
    """Names of lists of items: a mapping of name -> list in a recipe (or a job), NAME=A,B,C per occurrence on the
    command line."""

    metavar = "NAME=A,B,..."
    repeatable = True
    words = "a mapping of names to lists"

    def parse(self, value):
        if isinstance(value, (list, tuple)):
            out = {}
            for item in value:
                name, sep, text = str(item).partition("=")
                items = [v.strip() for v in text.split(",") if v.strip()]
                if not sep or not name.strip() or not items:
                    raise KindError(f"is invalid: '{item}' is not NAME=A,B,... (e.g. baseline=runs/b0,runs/b1)")
                if name.strip() in out:  # the later one would replace the earlier silently
                    raise KindError(f"names '{name.strip()}' twice; give each name once, with all of its items "
                                    "(NAME=A,B,...)")
                out[name.strip()] = items
            return out
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and v and all(isinstance(i, (str, os.PathLike)) for i in v)
                for k, v in value.items()):
            raise self.wrong(value)
        return {k: [os.fspath(i) for i in v] for k, v in value.items()}

    def to_cli(self, value):
        return [f"{k}={','.join(v)}" for k, v in value.items()]

    def show(self, value):
        return " ".join(self.to_cli(value)) or "none"


class JsonObject(Kind):
    """A JSON object: a mapping in a recipe, its JSON text on the command line (e.g. '{"enable_thinking": false}')."""

    metavar = "JSON"
    words = "a JSON object, e.g. '{\"enable_thinking\": false}'"

    def parse(self, value):
        if isinstance(value, str):
            try:
                value = loads(value)
            except json.JSONDecodeError as e:
                raise KindError(f"must be a JSON object, got {value!r} ({e.msg} at character {e.pos})") from None
            except LimitError as e:
                raise KindError(f"must be a JSON object ({e})") from None
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise self.wrong(value)
        return dict(value)

    def to_cli(self, value):
        return [json.dumps(value)]

    def show(self, value):
        return json.dumps(value)
