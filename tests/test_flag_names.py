"""Settings are named the user's way everywhere: no library module spells a longctx command-line flag by hand.
A message (or help text) that names a setting does it with `ref(name)`, so the command line shows `--seq-len`
and a recipe `extend.seq_len`; the flags themselves are declared once, in the settings types (`flag=` of
`setting(...)`), and the CLI derives every option from them. Read from the source with `ast`: docstrings and
comments may describe the command line; string values that reach a user may not."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import click
import pytest

from longctx.cli.main import cli
from longctx.core.errors import SettingError, ref
from longctx.eval.settings import RulerRunSettings
from longctx.rope.settings import RopeSettings, yarn_command
from longctx.yarn.settings import YarnSettings

ROOT = Path(__file__).resolve().parent.parent
FLAG = re.compile(r"--[a-z][a-z0-9-]*")
# The command-line layer, which turns settings into options and may name them.
CLI_LAYER = ("longctx/cli/",)


@cache
def longctx_flags() -> frozenset[str]:
    """Every option name of every longctx command (`--x`, and `--no-x` of a switch)."""
    found: set[str] = set()

    def walk(cmd: click.Command) -> None:
        if isinstance(cmd, click.Group):
            for sub in cmd.commands.values():
                walk(sub)
            return
        for p in cmd.params:
            found.update(o for o in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])] if o.startswith("--"))

    walk(cli)
    return frozenset(found - {"--help", "--version"})


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _declarations(tree: ast.AST) -> set[int]:
    """The string values of `flag=` arguments: where a setting's flag is declared."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "flag" and isinstance(kw.value, ast.Constant):
                    out.add(id(kw.value))
    return out


def hand_typed_flags(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree) | _declarations(tree)
    flags = longctx_flags()
    return [(node.lineno, flag) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            for flag in FLAG.findall(node.value) if flag in flags]


LIBRARY = sorted(p.relative_to(ROOT).as_posix() for top in ("longctx", "ruler_tasks") for p in (ROOT / top).rglob("*.py")
                 if not p.relative_to(ROOT).as_posix().startswith(CLI_LAYER))


def test_the_scan_knows_the_flags():
    assert {"--seq-len", "--resume", "--no-plot", "--engine-arg", "--from", "--backend"} <= longctx_flags()
    sample = ROOT / "tests" / "data" / "flag_scan_sample.py"
    assert [flag for _, flag in hand_typed_flags(sample)] == ["--seq-len", "--resume"]


@pytest.mark.parametrize("module", LIBRARY)
def test_no_library_module_spells_a_flag(module):
    found = hand_typed_flags(ROOT / module)
    assert not found, (f"{module} spells longctx flags by hand (line, flag): {found}; name the setting with "
                       "ref(name) in a SettingError (or Settings.flag(name)), so a recipe names it as its key")


def test_a_reference_the_owner_does_not_know_is_shown_as_written():
    """Text from outside (a server's model id) may hold the marker bytes: shown as it is, never a traceback."""
    e = SettingError(f"{ref('no_such_setting')} is not served; change {ref('seed')}", RulerRunSettings)
    assert str(e) == "no_such_setting is not served; change --seed"
    assert e.render(lambda n: f"ruler.{RulerRunSettings.key(n)}") == \
        "no_such_setting is not served; change ruler.seed"


def test_the_yarn_command_other_verbs_suggest_uses_yarns_own_options():
    """`check_context` (below the verbs) suggests a `longctx yarn` line built by the rule that names undeclared
    flags; yarn's settings must still be named by it."""
    line = yarn_command("ckpt", RopeSettings(theta=10000.0, rope_type="linear", max_position_embeddings=4096), 65536)
    for name in ("factor", "rescale", "original_max_position_embeddings"):
        assert f" {YarnSettings.flag(name)} " in f"{line} "
