"""The exception types for bad user input.

Library code raises `InputError` with a message that says what was wrong and what to do; the CLI
prints it as one line and exits with code 2. Anything else is a bug and keeps its traceback.

`SettingError` is an `InputError` about a setting of a verb. Its text refers to settings with
`ref(name)`, and whoever shows it names them as the user wrote them: `--seq-len` on the command
line, `recipes/x.yaml: extend.seq_len` in a recipe. `str()` gives the command-line form.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_REF = re.compile("\x1e([A-Za-z_][A-Za-z0-9_]*)\x1f")


def render_refs(text: str, name: Callable[[str], str]) -> str:
    """`text` with every `ref(setting)` in it named by `name` (a flag, a recipe key); a name `name` does not
    know (text from outside that happens to hold the marker bytes) is shown as it is, never a traceback."""

    def named(m: re.Match) -> str:
        try:
            return name(m.group(1))
        except (StopIteration, KeyError, AttributeError):
            return m.group(1)

    return _REF.sub(named, text)


def option_name(name: str) -> str:
    """The command-line option of the setting `name` that declares no `flag=` of its own: '--seq-len'. Code below
    the verbs (which cannot import their settings types) names a verb's option with it."""
    return "--" + name.replace("_", "-")


# Characters a terminal acts on rather than shows (C0 but the white space `split` takes, DEL, C1: escape
# sequences move the cursor, recolour, retitle the window), and lone surrogates (which no file encoding takes).
_UNPRINTABLE = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` on one line, with what a terminal would act on (an escape sequence a server sent) shown escaped."""
    return " ".join(_UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode(),
                                     text).split())


def one_line(text: str, limit: int = 300) -> str:
    """`text` (a server's answer, a library's exception) on one line, printable (`printable`), cut to `limit`
    characters."""
    text = printable(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def exception_line(e: BaseException, limit: int = 240) -> str:
    """An exception's text on one line (huggingface_hub puts the cause of a field error on the second line), or
    its type's name when it has none."""
    return one_line(str(e), limit) or type(e).__name__


class InputError(ValueError):
    """Bad user input (a path, a config, an argument): one line for the user, exit code 2."""


class ProcessFailed(Exception):
    """A process a verb ran (a launched training) failed, and said why above: one line for the user, exit code 1."""


def ref(name: str) -> str:
    """A reference to the setting `name` inside a `SettingError` text."""
    return f"\x1e{name}\x1f"


class SettingError(InputError):
    """Bad value of a setting. `owner` is the settings type the names in `text` belong to; `cli_text`,
    when given, is the wording for the command line (else `text` serves both)."""

    def __init__(self, text: str, owner: type | None = None, cli_text: str | None = None):
        super().__init__(text)
        self.text, self.owner, self.cli_text = text, owner, cli_text

    def render(self, name: Callable[[str], str], cli: bool = False) -> str:
        text = self.cli_text if cli and self.cli_text is not None else self.text
        return render_refs(text, name)

    def __str__(self) -> str:
        """The command-line form: named by the owner's flags, or (raised below the verbs, no owner set yet) by
        the rule that names a setting without a flag of its own."""
        flag = getattr(self.owner, "flag", None)
        return self.render(flag if flag is not None else option_name, cli=True)
