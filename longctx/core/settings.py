"""Settings types: one frozen dataclass per verb, validated once when it is made.

    @dataclass(frozen=True)
    class YarnSettings(Settings):
        checkpoint: str = setting(REQUIRED, Text(), "Checkpoint to scale.", cli="argument", recipe=False)
        factor: float = setting(REQUIRED, Factor(), "Context scaling factor, > 1 (4: 32k -> 128k).")

Everything else is derived from the fields: the click command (`longctx.cli`), the recipe section
(`longctx.recipe`) and the command line a multi-process launch passes on (`Settings.to_args`), so a
setting cannot exist in one of them and be missing from another. Values are parsed by their kind in
`__post_init__` (command-line strings, YAML values and Python values alike), then `check()` does the
checks that span several settings; `check_inputs()` looks at the files they name. Errors name settings
with `ref()`; see `longctx.core.errors`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from longctx.core.errors import SettingError, option_name, ref
from longctx.core.kinds import Bool, Kind, KindError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Spec:
    """How one field appears. cli: "option", "argument" or None (library and recipe only). flag: the option's
    name(s), "--name" from the field name when None ("--x/--no-x" for a switch pair). key: the recipe key
    [default: the field name], under the mapping `group` when given. recipe: False for what a recipe run
    supplies itself (checkpoint and output paths, overwrite)."""

    kind: Kind
    help: str
    cli: str | None = "option"
    flag: str | None = None
    short: str | None = None
    key: str | None = None
    group: str | None = None
    recipe: bool = True
    cli_required: bool = False  # required on the command line although optional in the type


def setting(default: Any, kind: Kind, help: str, **spec: Any) -> Any:
    """A settings field: its default (REQUIRED, None for optional, or a value), kind and help text."""
    meta = {"spec": Spec(kind, help, **spec)}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    """Base of the settings types; see the module docstring."""

    def __post_init__(self) -> None:
        for f, spec in self.specs():
            value = getattr(self, f.name)
            if value is REQUIRED:
                raise SettingError(f"{ref(f.name)} is required", type(self))
            if value is None:
                continue
            try:
                object.__setattr__(self, f.name, spec.kind.parse(value))
            except KindError as e:
                cli = None if e.cli_predicate is None else f"{ref(f.name)}: {e.cli_predicate}"
                raise SettingError(f"{ref(f.name)} {e.predicate}", type(self), cli) from None
        try:
            self.check()
        except SettingError as e:
            e.owner = e.owner or type(self)
            raise

    def check(self) -> None:
        """Checks across settings (values only, no files); raise `self.error(...)`."""

    def check_inputs(self, offline_data: bool = True) -> None:
        """Checks of what the settings point to (files and folders that must exist); the verb calls it before
        it writes anything, a recipe when it is loaded. `offline_data`: also refuse `hf:` data that is not in
        the local cache while offline (a recipe's --dry-run lists such data instead)."""

    def output_path(self) -> str | None:
        """The path the verb writes (its `output` setting, when it has one), for the command line's clean-up
        after a failure (`longctx.core.failures`); a verb whose output defaults to a path computed from its
        other settings overrides this."""
        return getattr(self, "output", None)

    def error(self, text: str, cli_text: str | None = None) -> SettingError:
        return SettingError(text, type(self), cli_text)

    @classmethod
    def specs(cls) -> Iterator[tuple[dataclasses.Field, Spec]]:
        for f in dataclasses.fields(cls):
            yield f, f.metadata["spec"]

    @classmethod
    def spec(cls, name: str) -> Spec:
        return next(s for f, s in cls.specs() if f.name == name)

    @classmethod
    def default(cls, name: str) -> Any:
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return f.default

    @classmethod
    def option(cls, name: str) -> tuple[str, str | None]:
        """The option names of a setting: ('--seq-len', None), or a switch pair ('--plot', '--no-plot') for a
        true/false setting whose default is not False (one that is False by default is a bare flag)."""
        spec = cls.spec(name)
        on, _, off = (spec.flag or option_name(name)).partition("/")
        if not off and isinstance(spec.kind, Bool) and cls.default(name) is not False:
            off = f"--no-{on[2:]}"
        return on, off or None

    @classmethod
    def flag(cls, name: str) -> str:
        """How the command line names a setting: '--seq-len', or the argument's name ('CHECKPOINT')."""
        return name.upper() if cls.spec(name).cli == "argument" else cls.option(name)[0]

    @classmethod
    def key(cls, name: str) -> str:
        """How a recipe section names a setting: 'lr', or 'backend_options.dtype' inside a group."""
        spec = cls.spec(name)
        key = spec.key or name
        return f"{spec.group}.{key}" if spec.group else key

    def record(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict to write down (provenance, stage hashes): a value that may hold a
        secret in its recorded (redacted) form."""
        return {f.name: spec.kind.recorded(getattr(self, f.name)) for f, spec in self.specs()}

    def to_args(self) -> list[str]:
        """Command-line arguments that parse back to these settings: the arguments, then every option whose
        value is not its default."""
        args: list[str] = []
        options: list[str] = []
        for f, spec in self.specs():
            value = getattr(self, f.name)
            if spec.cli is None or value is None:
                continue
            if spec.cli == "argument":
                args += spec.kind.to_cli(value) if spec.kind.repeatable else [str(value)]
                continue
            if value == self.default(f.name):
                continue
            on, off = self.option(f.name)
            if isinstance(spec.kind, Bool):
                options.append(on if value else off)
            elif spec.kind.repeatable:
                for item in spec.kind.to_cli(value):
                    options += [on, item]
            else:
                options += [on, *spec.kind.to_cli(value)]
        return args + options
