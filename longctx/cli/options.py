"""Click commands derived from settings types: a field is an argument or an option (its flag, help,
metavar and default from the field's spec), and the command's callback builds the settings from the raw
command-line strings, so the settings type validates them (errors name the flags)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from longctx.core.errors import SettingError, render_refs
from longctx.core.failures import one_line_failures
from longctx.core.kinds import Bool
from longctx.core.settings import REQUIRED, Settings


def _help(cls: type[Settings], name: str, text: str) -> str:
    text = render_refs(text, cls.flag)  # a help text names other settings by ref(), as messages do
    default = cls.default(name)
    if default in (None, REQUIRED) or isinstance(default, bool) or default == [] or default == {} or "[default" in text:
        return text
    return f"{text} [default: {cls.spec(name).kind.show(default)}]"


def params(cls: type[Settings]) -> list[click.Parameter]:
    """The click parameters of every field `cls` shows on the command line."""
    out: list[click.Parameter] = []
    for f, spec in cls.specs():
        if spec.cli is None:
            continue
        required = cls.default(f.name) is REQUIRED or spec.cli_required
        if spec.cli == "argument":
            out.append(click.Argument([f.name], required=required, nargs=-1 if spec.kind.repeatable else 1,
                                      metavar=f.name.upper() + ("..." if spec.kind.repeatable else "")))
            continue
        on, off = cls.option(f.name)
        decls = [f.name, *([spec.short] if spec.short else [])]
        text = _help(cls, f.name, spec.help)
        if isinstance(spec.kind, Bool):
            out.append(click.Option([*decls, f"{on}/{off}" if off else on], is_flag=True, default=None, help=text))
            continue
        # no `default=`: click then gives None (or () when repeatable) for an absent option, and still
        # enforces `required` (an explicit default=None turns that off)
        out.append(click.Option([*decls, on], required=required, multiple=spec.kind.repeatable,
                                metavar=spec.kind.metavar, help=text))
    return out


def settings_from_params(cls: type[Settings], raw: dict[str, Any]) -> Settings:
    """The settings the parsed command-line values `raw` (click's, by field name) give: absent ones keep
    their defaults."""
    return cls(**{k: list(v) if isinstance(v, tuple) else v for k, v in raw.items() if v is not None and v != ()})


def settings_command(group: click.Group, name: str, cls: type[Settings], run: Callable[[Any], None]) -> click.Command:
    """Add to `group` the command `name` whose options are `cls`'s fields; `run(settings)` does the work and
    its docstring is the command's help. A refusal of the machine's (a full disk, a read-only folder, ...) is
    one line (`longctx.core.failures`)."""
    def callback(**raw: Any) -> None:
        settings = settings_from_params(cls, raw)
        with one_line_failures(settings.output_path()):
            try:
                run(settings)
            except SettingError as e:  # raised below the verb (a shared check): its names are this verb's
                e.owner = e.owner or cls
                raise

    cmd = click.Command(name, params=params(cls), callback=callback, help=run.__doc__)
    group.add_command(cmd)
    return cmd
