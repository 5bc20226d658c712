"""The commands in README.md and docs/*.md are real: each is built with the real command line, nothing runs.

The rule the pages follow (docs/README.md, "Commands in these pages"): in a fenced code block, a line that
starts with `longctx ` or `.venv/bin/longctx ` (after any `VAR=value` words, or after `&&`), or that runs
`-m longctx ` under a launcher, is a command, with `\\` continuations joined and `# comments` dropped.
- A command is parsed by the `longctx` click group down to its verb and the verb's settings type is built from
  the parsed values (`longctx.cli.options.settings_from_params`, which validates every value), without running
  the verb and without `check_inputs` (paths need not exist): an unknown flag, a removed option or a bad value
  fails with the file and line. `--help` and `--version` lines are invoked and must exit 0.
- A word in UPPER case (`CKPT`, `OUT`, `RUN_DIR`, ...) is a placeholder for a path: a path is put in its place.
- A line with `[`, `|` or `...` outside quotes is a synopsis (a verb's form): its verb must exist and every
  option it names must be one of that verb's.
Every verb named in code (`longctx <verb>`) must exist and its `--help` run; every verb has a page; every
relative link of the pages reaches a file (and a heading, for a `#fragment`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import click
import pytest
from click.testing import CliRunner

import longctx.cli.options as cli_options
from longctx.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
_NOT_SHELL = {"python", "py", "json", "yaml", "yml", "toml", "jinja", "md", "markdown", "csv", "text"}
_PROGRAM = re.compile(r"^(?:\S*/)?longctx$")  # longctx, .venv/bin/longctx
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")


@dataclass(frozen=True)
class DocCommand:
    page: Path
    line: int  # 1-based, of the command's first line
    text: str  # as the page has it, continuations joined, the comment dropped
    args: tuple[str, ...]  # after `longctx`
    synopsis: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _code_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of the shell code blocks of `page`, continuations joined."""
    out: list[tuple[int, str]] = []
    fence, shell, pending, start = None, False, "", 0
    for n, raw in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        m = _FENCE.match(raw)
        if fence is None:
            if m:
                fence, shell = m.group(1), m.group(2).lower() not in _NOT_SHELL
            continue
        if m and m.group(1).startswith(fence) and not m.group(2):
            fence = None
            continue
        if not shell:
            continue
        if not pending:
            start = n
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        out.append((start, pending + raw))
        pending = ""
    return out


def _without_comment(line: str) -> str:
    """`line` up to an unquoted `#` that starts a word."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _longctx_args(words: list[str]) -> list[str] | None:
    """The arguments after `longctx` of one simple command, or None when it does not run longctx."""
    while words and _ENV_WORD.match(words[0]):
        words = words[1:]
    if words and _PROGRAM.match(words[0]):
        return words[1:]
    for i in range(len(words) - 1):  # python -m longctx, accelerate launch ... -m longctx, torchrun ... -m longctx
        if words[i] == "-m" and words[i + 1] == "longctx":
            return words[i + 2:]
    return None


def doc_commands() -> list[DocCommand]:
    found = []
    for page in PAGES:
        for n, line in _code_lines(page):
            line = _without_comment(line)
            for part in re.split(r"\s*(?:&&|\|\||;)\s*", line):
                bare = _QUOTED.sub("''", part)
                synopsis = bool(re.search(r"\[|\||\.\.\.", bare))
                if _longctx_args(bare.split()) is None:
                    continue
                try:
                    words = bare.split() if synopsis else shlex.split(part)
                except ValueError as e:  # an unclosed quote: the test of this command fails on it
                    words = ["longctx", f"<unparsable shell: {e}>"]
                found.append(DocCommand(page, n, part.strip(), tuple(_longctx_args(words)), synopsis))
    return found


COMMANDS = doc_commands()
_IDS = [c.where for c in COMMANDS]


def _resolve(args: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """(the command path, its click command, the arguments left for it) of `longctx ARGS`: the groups parsed on
    the way as click parses them (`longctx ruler CKPT` is `longctx ruler run CKPT`)."""
    cmd: click.Command = cli
    path, rest, parent = ["longctx"], list(args), None
    while isinstance(cmd, click.Group):
        ctx = cmd.make_context(" ".join(path), rest, parent=parent, resilient_parsing=False)
        protected = getattr(ctx, "_protected_args", None)
        if protected is None:
            protected = ctx.protected_args
        rest = [*protected, *ctx.args]
        if not rest:
            raise click.UsageError(f"'{' '.join(path)}' needs a verb")
        name, sub, rest = cmd.resolve_command(ctx, rest)
        path.append(name)
        cmd, parent = sub, ctx
    return path, cmd, rest


class _Built(Exception):
    def __init__(self, settings):
        super().__init__()
        self.settings = settings


def build_settings(args: list[str]):
    """The settings `longctx ARGS` builds, as the verb's command builds them, without running the verb."""
    path, cmd, rest = _resolve(args)
    real = cli_options.settings_from_params

    def built(cls, raw):
        raise _Built(real(cls, raw))

    ctx = cmd.make_context(" ".join(path), rest, parent=None)
    with ctx, mock.patch.object(cli_options, "settings_from_params", built):
        try:
            ctx.invoke(cmd.callback, **ctx.params)
        except _Built as b:
            return b.settings
    raise AssertionError(f"'{' '.join(path)}' ran without building its settings")


def _substituted(args: tuple[str, ...], tmp_path: Path) -> list[str]:
    return [str(tmp_path / a.lower()) if _PLACEHOLDER.match(a) else a for a in args]


def test_docs_have_commands():
    pages = {c.page.name for c in COMMANDS}
    assert "README.md" in pages and len(COMMANDS) >= 20, pages


@pytest.mark.parametrize("command", COMMANDS, ids=_IDS)
def test_docs_command_parses(command: DocCommand, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the pages' relative paths are from the repository root
    if command.synopsis:
        _check_synopsis(command)
        return
    args = _substituted(command.args, tmp_path)
    if {"--help", "-h", "--version"} & set(args):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, f"{command.where}: `{command.text}` exits {result.exit_code}: {result.output}"
        return
    problem = None
    try:
        build_settings(args)
    except click.ClickException as e:
        problem = e.format_message()
    except Exception as e:  # noqa: BLE001 - a settings type's refusal (SettingError, an InputError), said with the line
        problem = f"{type(e).__name__}: {e}"
    if problem is not None:
        pytest.fail(f"{command.where}: `{command.text}`: {problem}", pytrace=False)


def _options(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


def _check_synopsis(command: DocCommand) -> None:
    words = list(command.args)
    path: list[str] = []
    group: click.Command = cli
    while isinstance(group, click.Group) and words and words[0] in group.commands:
        path.append(words.pop(0))
        group = group.commands[path[-1]]
    if isinstance(group, click.Group):  # `longctx ruler CKPT ...` is `longctx ruler run ...`
        assert "run" in group.commands, f"{command.where}: `{command.text}`: no such verb"
        group = group.commands["run"]
    assert path, f"{command.where}: `{command.text}` names no verb"
    known = _options(group) | {"-h", "--help"}
    named = {f for w in words for f in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", w)}
    unknown = sorted(named - known)
    assert not unknown, (f"{command.where}: `{command.text}`: `longctx {' '.join(path)}` has no option "
                         f"{', '.join(unknown)}")


def _verbs_named() -> dict[tuple[str, ...], str]:
    """{verb path: where a page first names it} for every `longctx <verb>` in the pages' code: the commands of
    their code blocks and their inline code spans."""
    named: dict[tuple[str, ...], str] = {}

    def add(words: list[str], where: str) -> None:
        if words and re.fullmatch(r"[a-z][a-z-]*", words[0]):
            key = tuple(words[:2]) if words[0] == "ruler" and words[1:2] in (["prepare"], ["run"]) else (words[0],)
            named.setdefault(key, where)

    for c in COMMANDS:
        add(list(c.args), c.where)
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        # fenced blocks blanked (line numbers kept): what is left has the inline spans
        prose = re.sub(r"^\s*```.*?^\s*```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)
        for span in re.finditer(r"`([^`]+)`", prose):
            for m in re.finditer(r"(?:^|\s|/)longctx ((?:\S+ ?){1,2})", span.group(1)):
                add(m.group(1).split(), f"{page.relative_to(ROOT)}:{prose.count(chr(10), 0, span.start()) + 1}")
    return named


def test_docs_name_only_real_verbs_and_their_help_runs():
    named = _verbs_named()
    assert ("yarn",) in named and ("ruler", "prepare") in named, named
    runner = CliRunner()
    for verb, where in sorted(named.items()):
        group = cli
        for word in verb:
            assert isinstance(group, click.Group) and word in group.commands, (
                f"{where}: the pages name `longctx {' '.join(verb)}`, which is no verb")
            group = group.commands[word]
        result = runner.invoke(cli, [*verb, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, f"longctx {' '.join(verb)} --help: {result.output}"


def test_docs_every_verb_has_a_page():
    missing = [v for v in cli.commands if not (ROOT / "docs" / f"{v}.md").is_file()]
    assert not missing, f"verbs without a docs/<verb>.md page: {missing}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [v for v in cli.commands if f"(docs/{v}.md)" not in readme]
    assert not unlinked, f"README.md's quick tour links no page for: {unlinked}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_docs_links_reach_their_targets():
    broken = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, fragment = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            line = text.count("\n", 0, m.start()) + 1
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}:{line}: {target} (no such file)")
                continue
            if fragment and path.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M)}
                if fragment not in headings:
                    broken.append(f"{page.relative_to(ROOT)}:{line}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_docs_readme_opens_with_the_two_commands_and_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move reference text to docs/"
    first = [line for line in lines[:6] if line.startswith("bash scripts/setup.sh")]
    assert [line.split("#")[0].split() for line in first] == [
        ["bash", "scripts/setup.sh", "&&", ".venv/bin/longctx", "run", "recipes/tiny-seeds.yaml"],
        ["bash", "scripts/setup.sh", "&&", ".venv/bin/python", "-m", "pytest"]], first


def test_docs_cpu_serving_line_parses():
    """The CPU serving line the slow test starts a real server with (test_eval_runner) is on its page, whole."""
    from test_eval_runner import readme_cpu_serve_command

    env, argv = readme_cpu_serve_command()
    assert "VLLM_CPU_KVCACHE_SPACE" in env
    assert argv[:3] == [".venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--model", "--host", "--port", "--max-model-len"):
        assert flag in argv and not argv[argv.index(flag) + 1].startswith("--"), (flag, argv)


_CODE_PATH = re.compile(r"`((?:longctx|tests|scripts|recipes|docs)/[\w/.-]+\.(?:py|md|yaml|json|toml))`")
_MODULE = re.compile(r"`(longctx(?:\.\w+)+)`")
# "`NAME` (`path`)", "`NAME` and `OTHER` (`path`)", "`NAME`, `OTHER` (`path`)": names said to be in that file
_NAMED_IN = re.compile(r"((?:`[\w.]+`(?:,? and |, )?)+) \(`((?:longctx|tests|scripts)/[\w/.-]+\.py)`")


def _module_file(dotted: str) -> Path | None:
    """The file of a dotted name under longctx (a module, a package, or an attribute of one), None when none."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                return candidate
    return None


# The pages that say where the code is: what they name must be there.
CODE_MAPS = [ROOT / "docs" / "extending.md", ROOT / "docs" / "library.md"]


def test_code_maps_name_only_files_and_code_that_exist():
    """Every file, module and name the code maps point to is there: a path (`longctx/rope/types.py`), a module
    (`longctx.rope.config`, or a name in one), and a name said to be in a file (`NAME` (`path`))."""
    missing = []
    for page in CODE_MAPS:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(ROOT)
        for m in _CODE_PATH.finditer(text):
            if not (ROOT / m.group(1)).exists():
                missing.append(f"{where}: {m.group(1)} (no such file)")
        for m in _MODULE.finditer(text):
            dotted = m.group(1)
            file = _module_file(dotted)
            if file is None:
                missing.append(f"{where}: {dotted} (no such module)")
                continue
            rest = dotted.split(".")[len(file.relative_to(ROOT).with_suffix("").parts) - (file.name == "__init__.py"):]
            if rest and rest[0] not in file.read_text(encoding="utf-8"):
                missing.append(f"{where}: {dotted} ({rest[0]} is not in {file.relative_to(ROOT)})")
        for m in _NAMED_IN.finditer(text):
            file = ROOT / m.group(2)
            if not file.exists():
                continue
            source = file.read_text(encoding="utf-8")
            for name in re.findall(r"`([\w.]+)`", m.group(1)):
                if name.split(".")[0] not in source:
                    missing.append(f"{where}: `{name}` is not in {m.group(2)}")
    assert not missing, "\n".join(missing)
