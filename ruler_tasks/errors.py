"""Exceptions of `ruler_tasks`.

`RulerInputError` is the one type for bad user input (unknown task, length too short, a tokenizer
that does not load, a data file in the wrong format, ...). Its message is one line saying what was
wrong and what to do; a CLI prints it and exits with code 2.
"""

from longctx.core.errors import InputError


class RulerInputError(InputError):
    """Bad user input for RULER task generation: one line for the user."""


class RulerDataWarning(UserWarning):
    """A data file whose checksum differs from the one RULER's published file has."""
