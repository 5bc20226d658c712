"""Issue 29, invariants 7 and 8 outside evaluation, and the recipe items: every OS failure is one line with
nothing left behind, every parse is bounded, and a recipe's stage folders keep the user's files and notice
hand edits.

The OS failures are real: a read-only tmpfs and a full tmpfs mounted for the test (we run as root, so
permission bits would not stop a write). Every verb that writes is in the table, derived from the registered
commands.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from longctx.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent


def invoke(argv: list[str]):
    return CliRunner().invoke(cli, [str(a) for a in argv])


# a tqdm progress bar: "42%|", or its elapsed time "[00:14" when the total is unknown
_PROGRESS = re.compile(r"\d+%\||\[\d\d:\d\d")


def one_line_exit_2(r, message: str) -> None:
    """Exit code 2 and one `Error:` line naming `message` (besides progress bars of the work done before)."""
    assert r.exit_code == 2, (r.output, r.exception)
    lines = [line.rsplit("\r", 1)[-1] for line in r.stderr.split("\n")]
    said = [line for line in lines if line.strip() and not _PROGRESS.search(line)]
    assert len(said) == 1 and said[0].startswith("Error: ") and message in said[0], r.stderr
    assert "Traceback" not in r.output


def _snapshot(root: Path) -> dict[str, tuple[int, int] | None]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


# --- the verbs that write -----------------------------------------------------------------------------

# verb -> its command line, writing into {o} (a folder that does not exist yet, under a new parent)
WRITERS = {
    "yarn": "yarn {w}/ckpt --factor 2 -o {o}",
    "init": "init {o} --preset tiny --attention baseline",
    "convert": "convert {w}/official {o} --from official",
    "extend": "extend {w}/ckpt --rope-base 1e5 --seq-len 512 --data synthetic:mixed --steps 1 -o {o}",
    "run": "run {w}/recipe.yaml -o {o}",
    "sinks": "sinks {w}/ckpt --tokens 256 -o {o}",
    "compare": "compare {w}/run-a {w}/run-b -o {o}",
    "export": "export {w}/run-a --format lm-eval -o {o}/results.json",
    "ruler prepare": "ruler prepare --tokenizer {w}/ckpt --lengths 1k --tasks vt -o {o}",
    "ruler run": "ruler {w}/long --lengths 1k --tasks vt --samples 1 --backend hf -o {o}",
    "ruler merge": "ruler merge {o} --shard-dir {w}/sharded/shards/1-of-2 --shard-dir {w}/sharded/shards/2-of-2",
}
EXEMPT = {"info": "writes nothing; its fingerprint cache is best effort (a failed write only costs time)"}
SLOW = {"run"}  # runs a recipe


def _commands(group, prefix="") -> set[str]:
    import click

    found = set()
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            found |= _commands(cmd, f"{prefix}{name} ")
        else:
            found.add(f"{prefix}{name}")
    return found


def test_every_verb_is_in_the_table():
    assert _commands(cli) == set(WRITERS) | set(EXEMPT)
    assert not set(WRITERS) & set(EXEMPT)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_checkpoint):
    """The inputs every writer reads: a tiny checkpoint (and one long enough for RULER), a released-layout
    checkpoint, two RULER runs, a recipe."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_convert import write_official
    from test_report import _run, _scores_doc

    w = tmp_path_factory.mktemp("inputs")
    shutil.copytree(tiny_checkpoint, w / "ckpt")
    shutil.copytree(tiny_checkpoint, w / "long")
    cfg = json.loads((w / "long" / "config.json").read_text())
    (w / "long" / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 2048}))
    write_official(w / "official", "headwise", 4, 2)
    _run(w, "run-a", _scores_doc("a", "fa", {"vt": {4096: 90.0}}))
    _run(w, "run-b", _scores_doc("b", "fb", {"vt": {4096: 80.0}}))
    (w / "recipe.yaml").write_text(yaml.safe_dump({"models": {"m": {"init": {"preset": "tiny",
                                                                              "attention": "baseline"}}},
                                                   "yarn": {"factor": 2}}))
    return w


def _mount(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount(8)): {r.stderr.strip() or r.returncode}")


def _unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.fixture
def read_only(tmp_path):
    where = tmp_path / "read-only"
    _mount(where, "ro,size=1m")
    try:
        yield where
    finally:
        _unmount(where)


def _fill(where: Path, leave: int) -> None:
    """Fill the tmpfs at `where` to all but `leave` bytes."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave))


@pytest.fixture(params=[0, 4 << 10], ids=["full", "one-page-free"])
def full_disk(request, tmp_path):
    """A disk with no room at all (the first write fails: the output's lock), or room for one small file (the
    lock) but not for anything after it."""
    where = tmp_path / "full"
    _mount(where, "size=256k")
    try:
        _fill(where, request.param)
        yield where
    finally:
        _unmount(where)


@pytest.fixture(scope="module")
def shards(world):
    """The two shards of a RULER run in `world` (`ruler merge` merges them); the runs start processes."""
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import RulerRunSettings

    for i in (1, 2):
        run_ruler(RulerRunSettings(checkpoint=str(world / "long"), lengths=[1024], tasks="vt", samples=2,
                                   backend="hf", output=str(world / "sharded"), shard=f"{i}/2"), progress=False)


@pytest.fixture
def environment(world, tmp_path, monkeypatch, request):
    if getattr(request.node, "callspec", None) and request.node.callspec.params.get("verb") == "ruler merge":
        request.getfixturevalue("shards")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    monkeypatch.chdir(tmp_path)
    return world


def _params():
    return [pytest.param(v, marks=pytest.mark.slow if v in SLOW else (), id=v) for v in WRITERS]


def _refused(verb: str, world: Path, disk: Path, message: str) -> None:
    """`verb` writing under `disk` fails in one line naming `message`, leaving `disk` and its inputs as they
    were."""
    inputs, before = _snapshot(world), _snapshot(disk)
    argv = WRITERS[verb].format(w=world, o=disk / "new" / "out").split()
    one_line_exit_2(invoke(argv), message)
    assert _snapshot(disk) == before
    assert _snapshot(world) == inputs


@pytest.mark.parametrize("verb", _params())
@pytest.mark.slow
def test_read_only_output_is_one_line_and_leaves_nothing(verb, environment, read_only):
    _refused(verb, environment, read_only, "Read-only file system")


@pytest.mark.parametrize("verb", _params())
@pytest.mark.slow
def test_full_disk_is_one_line_and_leaves_nothing(verb, environment, full_disk):
    _refused(verb, environment, full_disk, "No space left on device")


@pytest.mark.slow
@pytest.mark.parametrize("full_disk", [0], indirect=True, ids=["full"])
def test_a_full_cache_disk_costs_time_or_names_the_cache(environment, full_disk, tmp_path, monkeypatch):
    """The cache's disk is full, the output's is not: a verb whose caches only save time (the tokenizer and
    essay-sentence caches of `ruler prepare`) runs as it would without them; one that must keep what it caches
    (`extend`'s tokenized data) says it is the cache's disk and how to move the cache, not the output's."""
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(full_disk / "cache"))
    r = invoke(WRITERS["ruler prepare"].format(w=environment, o=tmp_path / "prepared").split())
    assert r.exit_code == 0, r.output
    out = tmp_path / "extended"
    one_line_exit_2(invoke(WRITERS["extend"].format(w=environment, o=out).split()),
                    f"cannot write the tokenized-data cache in '{full_disk / 'cache' / 'data'}': No space left on "
                    "device; free space there, or give --cache-dir on another disk")
    assert not out.exists()


@pytest.mark.parametrize("verb,leave", [("yarn", 64 << 10), ("init", 64 << 10), ("convert", 64 << 10),
                                        ("ruler prepare", 16 << 10)])
@pytest.mark.slow
def test_disk_filling_up_half_way_leaves_nothing(verb, leave, environment, tmp_path):
    """The disk fills while the verb writes (some files fit, the weights or task files do not): its writer's
    temporaries go, and nothing stays."""
    where = tmp_path / "small"
    _mount(where, "size=1m")
    try:
        _fill(where, leave)
        _refused(verb, environment, where, "No space left on device")
    finally:
        _unmount(where)


@pytest.mark.slow
def test_a_ruler_run_on_a_disk_filling_up_keeps_only_whole_files_and_resumes(environment, tmp_path):
    """RULER is resumable: what it finished before the disk filled may stay, but whole (every JSON file and
    JSONL line parses), with no temporaries and no empty folders; with space freed, the same command
    finishes the run."""
    from longctx.core.files import temporary_target

    where = tmp_path / "small"
    _mount(where, "size=1m")
    try:
        _fill(where, 40 << 10)
        argv = WRITERS["ruler run"].format(w=environment, o=where / "run").split()
        one_line_exit_2(invoke(argv), "No space left on device")
        for path in where.rglob("*"):
            assert temporary_target(path.name, any_process=True) is None, path
            assert not path.is_dir() or any(path.iterdir()), f"{path} is an empty folder"
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".jsonl":
                [json.loads(line) for line in path.read_text().splitlines()]
        (where / "filler").unlink()
        r = invoke(argv)
        assert r.exit_code == 0, r.output
        assert (where / "run" / "results.json").is_file()
    finally:
        _unmount(where)


def test_a_name_too_long_for_the_file_system_is_one_line(environment, tmp_path):
    out = tmp_path / "parent" / ("n" * 300)
    one_line_exit_2(invoke(["yarn", environment / "ckpt", "--factor", "2", "-o", out]), "File name too long")
    assert not (tmp_path / "parent").exists()


def test_the_machines_refusals_inside_a_verb_are_one_line():
    """What `longctx.core.failures` turns into one line: an input nested past Python's recursion limit, an OS
    error raised from another error, and a Rust library's I/O error (tokenizers' text)."""
    from longctx.core.failures import failure_line

    def nest(n):
        return nest(n + 1)

    try:
        nest(0)
    except RecursionError as e:
        assert "nested too deeply" in failure_line(e)
    try:
        try:
            open("/nonexistent/x")
        except OSError as e:
            raise RuntimeError("while saving") from e
    except RuntimeError as e:
        assert failure_line(e) == "'/nonexistent/x': No such file or directory"
    from tokenizers import Tokenizer, models

    try:
        Tokenizer(models.BPE()).save("/nonexistent/tokenizer.json")
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception ("... (os error 2)")
        assert not isinstance(e, OSError) and failure_line(e, "out") == os.strerror(2)
    try:
        raise KeyError("a bug")
    except KeyError as e:
        assert failure_line(e) is None  # a bug keeps its traceback


# --- bounded parsing of recipes ------------------------------------------------------------------------

MODEL = "models:\n  m: {init: {preset: tiny, attention: baseline}}\nyarn: {factor: 2}\n"
_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def _chain(d: Path, n: int) -> Path:
    """A recipe whose base is a recipe whose base is ... n deep."""
    for i in range(n):
        (d / f"b{i}.yaml").write_text(f"base: b{i + 1}.yaml\n" if i < n - 1 else MODEL)
    return d / "b0.yaml"


RECIPES = [
    ("long-model-name", lambda d: MODEL.replace("  m:", "  " + "m" * 250 + ":"),
     "bad model name 'mmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm'... (250 characters) (letters, digits, '_', '.', '-', "
     "at most 64 characters"),
    ("not-utf8", lambda d: ("description: caf\xe9\n" + MODEL).encode("latin-1"),
     "not UTF-8 text (byte 0xe9 at line 1); save the recipe as UTF-8"),
    ("duplicate-stage", lambda d: MODEL + "yarn: {factor: 4}\n",
     "not valid YAML at line 4 (found the key 'yarn' twice)"),
    ("duplicate-key", lambda d: MODEL.replace("factor: 2", "factor: 2, factor: 4"),
     "not valid YAML at line 3 (found the key 'factor' twice)"),
    ("alias-bomb", lambda d: _BOMB + MODEL, "YAML expands to more than 100,000 nodes"),
    ("deep-nesting", lambda d: "description: " + "[" * 3000 + "]" * 3000 + "\n" + MODEL,
     "YAML nested deeper than 100 levels"),
    ("huge", lambda d: MODEL + "#" * (1 << 20) + "\n", "over the limit of 1,048,576 bytes"),
    ("base-chain", lambda d: _chain(d, 1100), "base starts a chain of more than 32 recipes"),
    ("base-cycle", lambda d: "base: recipe.yaml\n" + MODEL, "base 'recipe.yaml' includes itself"),
]


@pytest.mark.parametrize("make,message", [r[1:] for r in RECIPES], ids=[r[0] for r in RECIPES])
def test_a_bad_recipe_file_is_one_line_naming_the_limit(make, message, tmp_path):
    made = make(tmp_path)
    recipe = tmp_path / "recipe.yaml"
    if isinstance(made, Path):
        recipe = made
    elif isinstance(made, bytes):
        recipe.write_bytes(made)
    else:
        recipe.write_text(made)
    r = invoke(["run", recipe, "--dry-run", "-o", tmp_path / "out"])
    one_line_exit_2(r, message)
    assert not (tmp_path / "out").exists()


def test_a_yaml_alias_bomb_is_refused_before_it_expands():
    """The bomb above expands to 9**9 (387 million) nodes: refused from its size in YAML, not its expansion
    (the old loader took a minute and 3 GB). Its node count is what the refusal names."""
    from longctx.core.parse import LimitError, load_yaml

    with pytest.raises(LimitError, match="more than 100,000 nodes"):
        load_yaml(_BOMB)
    small = load_yaml("a: &a [1, 2]\nb: [*a, *a]\n")
    assert small == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


def test_yaml_merge_keys_give_defaults_that_a_mapping_overrides():
    """`<<: *anchor` (recipes/tiny-ablations.yaml shares one init among its models): the mapping's own keys
    override the merged ones, and a key the mapping itself gives twice is still refused."""
    import yaml

    from longctx.core.parse import load_yaml

    text = "a: &a {x: 1, y: 2}\nb: {<<: *a, y: 3}\nc:\n  <<: *a\n  z: 4\n"
    assert load_yaml(text) == {"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 3}, "c": {"x": 1, "y": 2, "z": 4}}
    with pytest.raises(yaml.YAMLError, match="found the key 'y' twice"):
        load_yaml("a: &a {x: 1}\nb: {<<: *a, y: 3, y: 4}\n")


# --- every JSON document through longctx.core.parse --------------------------------------------------

_RAW_JSON = re.compile(r"\bjson\.loads?\(|\.json\(\)")


def test_json_is_parsed_only_through_core_parse():
    """Python's json recurses once per level (RecursionError on a deep document) and bounds nothing: every
    JSON document longctx reads goes through `longctx.core.parse.loads`."""
    offenders = []
    for folder in ("longctx", "ruler_tasks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "longctx" / "core" / "parse.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _RAW_JSON.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "parse with longctx.core.parse.loads:\n" + "\n".join(offenders)


# --- a recipe's stage folders: the user's files are kept, hand edits are noticed -------------------------


@pytest.fixture(scope="module")
def finished_recipe(tmp_path_factory):
    """A tiny recipe (init, then yarn) run once: its output folder, to copy."""
    from longctx.recipe.run import run_recipe

    d = tmp_path_factory.mktemp("recipe")
    (d / "r.yaml").write_text(MODEL)
    run_recipe(d / "r.yaml", d / "out", log=lambda _: None)
    return d


@pytest.fixture
def recipe_run(finished_recipe, tmp_path):
    shutil.copytree(finished_recipe, tmp_path / "recipe", symlinks=True)
    return tmp_path / "recipe"


def _rerun(d: Path, *extra):
    return invoke(["run", d / "r.yaml", "-o", d / "out", *extra])


@pytest.mark.slow
def test_a_finished_recipe_is_up_to_date(recipe_run):
    r = _rerun(recipe_run, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "skip   init for m: up to date" in r.output and "skip   yarn for m: up to date" in r.output
    marker = json.loads((recipe_run / "out" / "m" / "yarn" / "stage.json").read_text())
    assert {"m-yarn/config.json", "m-yarn/model.safetensors"} <= set(marker["files"])
    assert not any(name.startswith(".") or "/." in name for name in marker["files"])  # bookkeeping is not counted


@pytest.mark.slow
@pytest.mark.parametrize("edit,reason", [
    (lambda d: (d / "m-yarn" / "config.json").write_text((d / "m-yarn" / "config.json").read_text() + " "),
     "m-yarn/config.json was changed"),
    (lambda d: (d / "m-yarn" / "generation_config.json").unlink(), "m-yarn/generation_config.json was removed"),
], ids=["edited", "removed"])
def test_a_hand_edited_stage_output_is_noticed_and_the_stage_reruns(edit, reason, recipe_run):
    stage = recipe_run / "out" / "m" / "yarn"
    edit(stage)
    r = _rerun(recipe_run, "--dry-run")
    assert r.exit_code == 0, r.output
    assert f"run    yarn for m: its files differ from what it wrote: {reason}" in r.output
    assert "skip   init for m: up to date" in r.output
    r = _rerun(recipe_run)
    assert r.exit_code == 0, r.output
    assert f"run yarn for m (its files differ from what it wrote: {reason})" in r.output
    assert "skip yarn for m: up to date" in _rerun(recipe_run).output


@pytest.mark.slow
@pytest.mark.parametrize("where", ["m/yarn/notes.txt", "m/yarn/m-yarn/notes.txt", "m/init/notes.txt"])
@pytest.mark.parametrize("extra", [[], ["--dry-run"], ["--from", "yarn"]], ids=["run", "dry-run", "from-yarn"])
def test_a_users_file_in_a_stage_folder_is_never_deleted(where, extra, recipe_run):
    """A file the stage did not write makes the stage out of date, and rerunning it would replace its folder:
    refused in one line naming the file, whatever asked for the rerun; nothing is changed."""
    out = recipe_run / "out"
    (out / where).write_text("my notes")
    before = _snapshot(out)
    stage = "init" if where.startswith("m/init") else "yarn"
    r = _rerun(recipe_run, *extra)
    one_line_exit_2(r, f"'{out / where}' was not written by the {stage} stage, whose folder a rerun replaces")
    assert f"move it out of '{out / 'm' / stage}' first" in r.stderr
    assert _snapshot(out) == before


@pytest.mark.slow
def test_an_interrupted_stage_folder_with_a_users_file_is_refused(recipe_run):
    """Without a record of what the stage wrote (it never finished), the entries beside its outputs that are
    not named after one of them are the user's."""
    stage = recipe_run / "out" / "m" / "yarn"
    marker = json.loads((stage / "stage.json").read_text())
    (stage / "stage.json").write_text(json.dumps({**marker, "complete": False, "files": None, "key": "other"}))
    (stage / "mine").mkdir()
    (stage / "mine" / "a.txt").write_text("mine")
    one_line_exit_2(_rerun(recipe_run, "--dry-run"), f"'{stage / 'mine'}' was not written by the yarn stage")
    shutil.rmtree(stage / "mine")
    r = _rerun(recipe_run, "--dry-run")
    assert r.exit_code == 0 and "run    yarn for m: settings or inputs changed" in r.output
