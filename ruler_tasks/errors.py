"""Exceptions of `ruler_tasks`.

`RulerInputError` is the one type for bad user input (unknown task, length too short, a tokenizer
that does not load, a data file in the wrong format, ...). Its message is one line saying what was
wrong and what to do; a CLI prints it and exits with code 2.

It is a `longctx.core.errors.SettingError`: a message that names a parameter of `prepare` does it with
`ref(name)` (the parameter names are the settings' names: samples, seed, lengths, template, system_prompt,
chat_template_kwargs, think_tokens, data_dir, essay, squad, hotpotqa). `prepare` maps one to one onto
`longctx ruler prepare`, so without an `owner` `str()` names them as that command line does (`--samples`);
longctx sets the owner to the settings it called on behalf of, so a recipe shows `ruler.samples`.
"""

from longctx.core.errors import SettingError


class RulerInputError(SettingError):
    """Bad user input for RULER task generation: one line for the user."""


class RulerDataWarning(UserWarning):
    """A data file whose checksum differs from the one RULER's published file has."""
