"""Issue 29: a path read from inside a checkpoint folder stays inside it, the fingerprint covers every weight
file a loader reads, one rule for a tokenizer that needs its own code, suggested commands that survive the
shell, and bounded JSON in checkpoint files.

Every escape is tried on every verb that reads a checkpoint folder (the table is checked against the verbs the
CLI registers): exit 2, one `Error:` line, no traceback, nothing written anywhere, and the file outside the
folder never read. That file is a valid safetensors file (or tokenizer, or module) a loader would happily use;
its access time is set before its modification time, so that any read moves it (relatime, mount(8)).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil

import click
import pytest
import yaml
from click.testing import CliRunner
from conftest import mark_unread

from longctx.cli.main import cli

RULER = ["--lengths", "1k", "--tasks", "niah_single_1", "--samples", "1"]
EXTEND = ["--rope-base", "1e5", "--seq-len", "512", "--data", "synthetic:mixed", "--steps", "1", "--tokens-per-step",
          "512"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_exit_2(r, *messages):
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    for message in messages:
        assert message in r.stderr, r.stderr


def registered_verbs() -> set[str]:
    """Every command the CLI registers ('ruler prepare' for a group's subcommand)."""
    return {f"{name} {sub}" if isinstance(cmd, click.Group) else name
            for name, cmd in cli.commands.items() for sub in (getattr(cmd, "commands", None) or [None])}


def tree(root):
    """Every path under `root` with its size and modification time: what a verb may not change."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


def assert_unchanged(root, before, outside, atimes, reads_show):
    assert tree(root) == before, "a refused verb changed files"
    for f, atime in zip(outside, atimes):
        assert not (reads_show and os.stat(f).st_atime_ns != atime), f"{f} was read"


def _recipe(c, o, tmp):
    recipe = tmp / "r.yaml"
    recipe.write_text(yaml.safe_dump({"models": {"m": {"checkpoint": str(c)}}, "yarn": {"factor": 2}}))
    return ["run", recipe, "-o", o]


# Every verb that reads a checkpoint folder's weights, as (verb, argv(checkpoint, output, tmp)).
WEIGHT_VERBS = {
    "info": lambda c, o, t: ["info", c],
    "yarn": lambda c, o, t: ["yarn", c, "--factor", "2", "-o", o],
    "convert": lambda c, o, t: ["convert", c, o],
    "extend": lambda c, o, t: ["extend", c, *EXTEND, "--cache-dir", t / "cache", "-o", o],
    "sinks": lambda c, o, t: ["sinks", c, "--tokens", "256", "-o", o],
    "ruler run --backend hf": lambda c, o, t: ["ruler", c, *RULER, "--backend", "hf", "-o", o],
    # refused by checkpoint_dir, the runner's first step, before vLLM is imported or a server is asked
    "ruler run --backend vllm": lambda c, o, t: ["ruler", c, *RULER, "-o", o],
    "ruler run --backend openai": lambda c, o, t: ["ruler", c, *RULER, "--backend", "openai", "--base-url",
                                                   "http://127.0.0.1:9/v1", "-o", o],
    "run": _recipe,
}
WEIGHTS_EXEMPT = {
    "init": "reads only the tokenizer files of --tokenizer (TOKENIZER_VERBS)",
    "ruler prepare": "reads only the tokenizer (TOKENIZER_VERBS)",
    "compare": "reads RULER run directories, not checkpoints",
    "export": "reads RULER run directories, not checkpoints",
    "ruler merge": "reads the shards of a RULER run, not checkpoints",
}


def test_every_verb_that_reads_a_checkpoint_is_in_the_tables():
    weights = {v.split(" --")[0] for v in WEIGHT_VERBS}
    assert weights | set(WEIGHTS_EXEMPT) == registered_verbs()
    tokenizers = {v.split(" --")[0] for v in TOKENIZER_VERBS}
    assert tokenizers | set(TOKENIZER_EXEMPT) == registered_verbs()


# --- 1. shard names in an index --------------------------------------------------------------------


def _other_weights(src, dst):
    """A valid safetensors file with the tensors of `src`, other values: what a loader would take."""
    from safetensors.torch import load_file, save_file

    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v + 1 for k, v in load_file(src).items()}, dst, metadata={"format": "pt"})
    return dst


def _index(ckpt, names):
    """Write ckpt/model.safetensors.index.json mapping every tensor of the tiny model to `names(tensor)`."""
    from safetensors import safe_open

    with safe_open(ckpt / "model.safetensors", "pt") as f:
        tensors = list(f.keys())
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": {t: names(t) for t in tensors}}))


ESCAPES = {
    "absolute": lambda ckpt, outside: str(outside),
    "parent": lambda ckpt, outside: os.path.relpath(outside, ckpt),
    "through a subfolder": lambda ckpt, outside: "shards/../" + os.path.relpath(outside, ckpt),
}


REFUSING_VERBS = sorted(WEIGHT_VERBS)


@pytest.mark.parametrize("escape", sorted(ESCAPES))
@pytest.mark.parametrize("verb", REFUSING_VERBS)
def test_a_shard_outside_the_checkpoint_is_refused_unread(verb, escape, tiny_checkpoint, tmp_path, reads_show):
    """Before: transformers loaded the shard wherever the index said, yarn linked it and the fingerprint left
    it out."""
    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "shards").mkdir()
    outside = _other_weights(ckpt / "model.safetensors", tmp_path / "other" / "model.safetensors")
    name = ESCAPES[escape](ckpt, outside)
    _index(ckpt, lambda t: name)
    (ckpt / "model.safetensors").unlink()  # the index is the only way to the weights
    argv = WEIGHT_VERBS[verb](ckpt, tmp_path / "out", tmp_path)
    atime = mark_unread(outside)
    before = tree(tmp_path)
    r = run(*argv)
    one_line_exit_2(r, f"'{ckpt}/model.safetensors.index.json' names the shard '{name}', outside the folder")
    assert_unchanged(tmp_path, before, [outside], [atime], reads_show)


def _sharded(tiny_checkpoint, root, shard="shards/model-00001-of-00001.safetensors"):
    """The tiny checkpoint with its weights in a subfolder shard that the index names."""
    ckpt = shutil.copytree(tiny_checkpoint, root)
    (ckpt / shard).parent.mkdir(parents=True, exist_ok=True)
    _index(ckpt, lambda t: shard)
    os.replace(ckpt / "model.safetensors", ckpt / shard)
    return ckpt


def test_the_fingerprint_covers_a_shard_in_a_subfolder_and_yarn_copies_it(tiny_checkpoint, tmp_path):
    from longctx.checkpoint.directory import count_parameters, fingerprint
    from longctx.checkpoint.weights import weight_files

    ckpt = _sharded(tiny_checkpoint, tmp_path / "ckpt")
    shard = ckpt / "shards" / "model-00001-of-00001.safetensors"
    (ckpt / "optimizer.pt").write_bytes(b"not weights")  # a Trainer side file: neither hashed nor copied
    assert weight_files(ckpt) == [shard]
    assert count_parameters(ckpt) == count_parameters(tiny_checkpoint)
    before = fingerprint(ckpt)
    r = run("info", ckpt)
    assert r.exit_code == 0 and before in r.output, r.output

    r = run("yarn", ckpt, "--factor", "2", "-o", tmp_path / "y")
    assert r.exit_code == 0, r.output
    copied = sorted(str(p.relative_to(tmp_path / "y")) for p in (tmp_path / "y").rglob("*") if p.is_file())
    assert "shards/model-00001-of-00001.safetensors" in copied and "model.safetensors.index.json" in copied
    assert "optimizer.pt" not in copied
    assert [w.relative_to(tmp_path / "y") for w in weight_files(tmp_path / "y")] == [shard.relative_to(ckpt)]

    _other_weights(shard, tmp_path / "other.safetensors")
    shutil.copy(tmp_path / "other.safetensors", shard)
    assert fingerprint(ckpt) != before


def test_a_sharded_hub_snapshot_of_symlinks_is_inside(tiny_checkpoint, tmp_path):
    """A Hub cache snapshot holds relative symlinks into ../../blobs (huggingface_hub's layout): the names stay
    inside the snapshot, the content behind them is fingerprinted."""
    import hashlib

    from longctx.checkpoint.directory import fingerprint

    local = _sharded(tiny_checkpoint, tmp_path / "local")
    repo = tmp_path / "hub" / "models--org--sharded"
    snapshot = repo / "snapshots" / ("0" * 40)
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, blob)
        link = snapshot / f.relative_to(local)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    r = run("info", snapshot)
    assert r.exit_code == 0, r.output
    assert fingerprint(snapshot) == fingerprint(local)


# --- names of code and tokenizer files -------------------------------------------------------------

_CUSTOM_TOKENIZER = '''import os
from pathlib import Path

from transformers import PreTrainedTokenizerFast


class TinyCustomTokenizer(PreTrainedTokenizerFast):
    def __init__(self, *args, **kwargs):
        if os.environ.get("LONGCTX_TEST_TOKENIZER_CODE_RAN"):
            Path(os.environ["LONGCTX_TEST_TOKENIZER_CODE_RAN"]).touch()
        super().__init__(*args, **kwargs)
'''


def _edit_json(path, **changes):
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def long_checkpoint(tmp_path_factory, tiny_checkpoint):
    """The tiny checkpoint with a context of 2048 tokens, for RULER at 1k."""
    ckpt = shutil.copytree(tiny_checkpoint, tmp_path_factory.mktemp("long") / "ckpt")
    _edit_json(ckpt / "config.json", max_position_embeddings=2048)
    return ckpt


@pytest.fixture(scope="module")
def custom_tokenizer_checkpoint(tmp_path_factory, long_checkpoint):
    """A Qwen3 (a model type transformers knows) whose tokenizer is a class it ships as code: without
    trust_remote_code transformers would quietly build a generic tokenizer instead."""
    ckpt = shutil.copytree(long_checkpoint, tmp_path_factory.mktemp("custom") / "ckpt")
    _edit_json(ckpt / "tokenizer_config.json", tokenizer_class="TinyCustomTokenizer",
               auto_map={"AutoTokenizer": [None, "tokenization_tiny_custom.TinyCustomTokenizer"]})
    (ckpt / "tokenization_tiny_custom.py").write_text(_CUSTOM_TOKENIZER)
    return ckpt


@pytest.fixture
def code_ran(tmp_path_factory, monkeypatch):
    """A path the custom tokenizer creates each time it is built (outside the test's tmp_path)."""
    marker = tmp_path_factory.mktemp("marker") / "tokenizer-code-ran"
    monkeypatch.setenv("LONGCTX_TEST_TOKENIZER_CODE_RAN", str(marker))
    return marker


# Every verb that builds a checkpoint's tokenizer, as (verb, argv(checkpoint, output, tmp)).
TOKENIZER_VERBS = {
    "init": lambda c, o, t: ["init", o, "--preset", "tiny", "--attention", "baseline", "--tokenizer", c],
    "ruler prepare": lambda c, o, t: ["ruler", "prepare", "--tokenizer", c, *RULER, "-o", o],
    "ruler run --backend hf": lambda c, o, t: ["ruler", c, *RULER, "--backend", "hf", "--no-plot", "-o", o],
    "ruler run --backend vllm": lambda c, o, t: ["ruler", c, *RULER, "-o", o],  # refused before the engine
    "sinks": lambda c, o, t: ["sinks", c, "--tokens", "256", "-o", o],
    "extend": lambda c, o, t: ["extend", c, *EXTEND, "--cache-dir", t / "cache", "-o", o],
}
TOKENIZER_EXEMPT = {
    "info": "builds no tokenizer",
    "yarn": "copies the tokenizer files, never builds the tokenizer",
    "convert": "copies the tokenizer files, never builds the tokenizer",
    "compare": "reads RULER run directories, not checkpoints",
    "export": "reads RULER run directories, not checkpoints",
    "ruler merge": "reads the shards of a RULER run, not checkpoints",
    "run": "a recipe runs the verbs above, each with its own check",
}
# Starting a vLLM engine (30+ s on CPU) only to see the same load_tokenizer call succeed is not worth it.
TRUSTED_RUNS = sorted(set(TOKENIZER_VERBS) - {"ruler run --backend vllm"})


@pytest.mark.parametrize("verb", sorted(TOKENIZER_VERBS))
def test_a_tokenizer_that_needs_its_code_is_refused_without_trust_remote_code(
        verb, custom_tokenizer_checkpoint, code_ran, tmp_path):
    """Before: `ruler prepare` and `ruler` built a generic tokenizer in its place while init and extend refused."""
    before = tree(custom_tokenizer_checkpoint)
    r = run(*TOKENIZER_VERBS[verb](custom_tokenizer_checkpoint, tmp_path / "out", tmp_path))
    one_line_exit_2(r, "needs its own Python code to build its tokenizer", "--trust-remote-code")
    assert not code_ran.exists() and not (tmp_path / "out").exists()
    assert tree(custom_tokenizer_checkpoint) == before


@pytest.mark.parametrize("verb", TRUSTED_RUNS)
@pytest.mark.slow
def test_with_trust_remote_code_the_tokenizer_code_runs(verb, custom_tokenizer_checkpoint, code_ran, tmp_path):
    r = run(*TOKENIZER_VERBS[verb](custom_tokenizer_checkpoint, tmp_path / "out", tmp_path), "--trust-remote-code")
    assert r.exit_code == 0, (r.output, r.exception)
    assert code_ran.exists()
    if verb == "init":  # the code travels with the tokenizer it builds
        assert (tmp_path / "out" / "tokenization_tiny_custom.py").is_file()


def _outside_module(tmp_path):
    f = tmp_path / "other" / "evil.py"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("raise SystemExit('outside code ran')\n")
    return f


def _outside_tokenizer_file(tmp_path, long_checkpoint):
    f = tmp_path / "other" / "tokenizer.4.0.0.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(long_checkpoint / "tokenizer.json", f)
    return f


# (file edited, entry, how it names the outside file) -> the name given
NAMED_FILES = {
    "tokenizer auto_map, absolute": ("tokenizer_config.json", "code module",
                                     lambda ckpt, f: {"tokenizer_class": "Evil",
                                                      "auto_map": {"AutoTokenizer": [None, f"{f.with_suffix('')}.E"]}}),
    "tokenizer auto_map, parent": ("tokenizer_config.json", "code module",
                                   lambda ckpt, f: {"tokenizer_class": "Evil", "auto_map": [
                                       None, os.path.relpath(f.with_suffix(""), ckpt) + ".E"]}),
    "config auto_map, absolute": ("config.json", "code module",
                                  lambda ckpt, f: {"auto_map": {"AutoConfig": f"{f.with_suffix('')}.E"}}),
    "fast_tokenizer_files, absolute": ("tokenizer_config.json", "tokenizer file",
                                       lambda ckpt, f: {"fast_tokenizer_files": [str(f)]}),
    "fast_tokenizer_files, parent": ("tokenizer_config.json", "tokenizer file",
                                     lambda ckpt, f: {"fast_tokenizer_files": [os.path.relpath(f, ckpt)]}),
}


@pytest.mark.parametrize("named", sorted(NAMED_FILES))
@pytest.mark.parametrize("verb", sorted(TOKENIZER_VERBS))
def test_code_or_a_tokenizer_file_outside_the_checkpoint_is_refused_unread(
        verb, named, long_checkpoint, tmp_path, reads_show):
    """transformers joins these names to the folder (os.path.join): with --trust-remote-code it would import a
    module anywhere; `fast_tokenizer_files` would make it read another tokenizer.json."""
    file, what, entry = NAMED_FILES[named]
    ckpt = shutil.copytree(long_checkpoint, tmp_path / "ckpt")
    outside = (_outside_module if what == "code module" else
               lambda t: _outside_tokenizer_file(t, long_checkpoint))(tmp_path)
    changes = entry(ckpt, outside)
    _edit_json(ckpt / file, **changes)
    atime = mark_unread(outside)
    before = tree(tmp_path)
    r = run(*TOKENIZER_VERBS[verb](ckpt, tmp_path / "out", tmp_path), "--trust-remote-code")
    one_line_exit_2(r, f"'{ckpt}/{file}' names the {what} '", "outside the folder")
    assert_unchanged(tmp_path, before, [outside], [atime], reads_show)


@pytest.mark.parametrize("verb", ["info", "yarn"])
def test_config_code_outside_the_checkpoint_is_refused_by_every_checkpoint_verb(verb, tiny_checkpoint, tmp_path):
    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    _edit_json(ckpt / "config.json", auto_map={"AutoModelForCausalLM": "../modeling_evil.EvilForCausalLM"})
    r = run(*WEIGHT_VERBS[verb](ckpt, tmp_path / "out", tmp_path))
    one_line_exit_2(r, f"'{ckpt}/config.json' names the code module '../modeling_evil.py', outside the folder")
    assert not (tmp_path / "out").exists()


# --- 3. suggested commands -------------------------------------------------------------------------


def test_suggested_commands_quote_their_paths(tiny_checkpoint, tmp_path):
    """A checkpoint folder named with a space and a quote: each printed command splits back into its argv."""
    from longctx.checkpoint.hub import download_command

    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "my dir's ckpt")
    out = tmp_path / "my dir's ckpt-yarn2x"  # yarn's default output, beside its input
    r = run("yarn", ckpt, "--factor", "2")
    assert r.exit_code == 0, r.output
    serve = [shlex.split(line) for line in r.output.splitlines() if line.strip().startswith("vllm serve")]
    assert serve[0] == ["vllm", "serve", str(out), "--max-model-len", "512"]
    assert serve[1][:5] == ["vllm", "serve", str(ckpt), "--max-model-len", "512"]
    assert serve[1][5] == "--hf-overrides" and json.loads(serve[1][6])["rope_parameters"]["rope_type"] == "yarn"

    r = run("ruler", ckpt, *RULER, "--backend", "hf", "-o", tmp_path / "run")
    one_line_exit_2(r, "extend it first: longctx yarn ")
    argv = shlex.split(r.stderr.split("extend it first: ")[1])
    assert argv[:2] == ["longctx", "yarn"] and os.path.samefile(argv[2], ckpt) and argv[3] == "--factor"

    assert shlex.split(download_command("org/name", "sub dir", "it's", tokenizer_only=True))[:7] == [
        "hf", "download", "org/name", "--revision", "it's", "--include", "sub dir/tokenizer*"]


# --- 4. bounded JSON in checkpoint files -----------------------------------------------------------

DEEP = "[" * 5000 + "]" * 5000


def _deep_config(ckpt):
    text = (ckpt / "config.json").read_text()
    (ckpt / "config.json").write_text(text.replace("{", '{"deep": ' + DEEP + ", ", 1))
    return "config.json", "'{ckpt}/config.json': JSON nested deeper than 100 levels"


def _deep_header(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = b'{"deep": ' + DEEP.encode() + b", " + data[9:8 + n]
    (ckpt / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + data[8 + n:])
    return "model.safetensors", ("'{ckpt}/model.safetensors' is not a valid safetensors file: its header is JSON "
                                 "nested deeper than 100 levels")


def _deep_index(ckpt):
    _index(ckpt, lambda t: "model.safetensors")
    _edit_json(ckpt / "model.safetensors.index.json", metadata={"deep": 0})
    text = (ckpt / "model.safetensors.index.json").read_text().replace('{"deep": 0}', DEEP)
    (ckpt / "model.safetensors.index.json").write_text(text)
    return "index", "'{ckpt}/model.safetensors.index.json': JSON nested deeper than 100 levels"


def _deep_provenance(ckpt):
    (ckpt / "longctx.json").write_text('{"history": ' + DEEP + "}")
    return "longctx.json", "'{ckpt}/longctx.json': JSON nested deeper than 100 levels"


def _deep_tokenizer_config(ckpt):
    text = (ckpt / "tokenizer_config.json").read_text()
    (ckpt / "tokenizer_config.json").write_text(text.replace("{", '{"deep": ' + DEEP + ", ", 1))
    return "tokenizer_config.json", "'{ckpt}/tokenizer_config.json': JSON nested deeper than 100 levels"


DEEP_FILES = [(_deep_config, "info"), (_deep_config, "yarn"), (_deep_header, "info"), (_deep_header, "yarn"),
              (_deep_index, "info"), (_deep_index, "yarn"), (_deep_provenance, "yarn"),
              (_deep_tokenizer_config, "ruler prepare"), (_deep_tokenizer_config, "sinks")]


@pytest.mark.parametrize("edit,verb", DEEP_FILES, ids=[f"{e.__name__[6:]}-{v}" for e, v in DEEP_FILES])
def test_json_nested_5000_deep_is_one_line_naming_the_file_and_the_limit(edit, verb, long_checkpoint, tmp_path):
    """Before: RecursionError (a traceback) from Python's json parser."""
    ckpt = shutil.copytree(long_checkpoint, tmp_path / "ckpt")
    _, message = edit(ckpt)
    argv = {**WEIGHT_VERBS, **TOKENIZER_VERBS}[verb](ckpt, tmp_path / "out", tmp_path)
    one_line_exit_2(run(*argv), message.format(ckpt=ckpt))
    assert not (tmp_path / "out").exists()
