"""Every verb's bad inputs, in one table: exit code 2, one `Error: ...` line, no traceback, nothing written.

The world the cases run in (checkpoints with one defect each, a user's folder, a file, partial results) is made
once; every case must leave all of it, byte for byte, as it was, and make nothing new beside it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct

import pytest
import yaml
from click.testing import CliRunner

from longctx.cli.main import cli

SENTINEL = "planted-code-ran"


class _Planted:
    """A pickle that, unpickled with full pickle, creates the sentinel file."""

    def __reduce__(self):
        return (os.system, (f"touch {SENTINEL}",))


def _checkpoint_variants(root, good):
    def copy(name):
        shutil.copytree(good, root / name)
        return root / name

    def edit_config(name, **changes):
        d = copy(name)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **changes}))

    copy("ckpt")
    edit_config("long", max_position_embeddings=2048)  # room for RULER's shortest lengths
    d = copy("no-tokenizer")
    for f in d.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            f.unlink()
    d = copy("config-only-tokenizer")  # transformers builds an empty tokenizer from it
    for f in d.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) and f.name != "tokenizer_config.json":
            f.unlink()
    d = copy("truncated")
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    d = copy("huge-header")
    w = d / "model.safetensors"
    w.write_bytes(struct.pack("<Q", 1 << 62) + w.read_bytes()[8:])
    d = copy("not-json-header")
    w = d / "model.safetensors"
    data = w.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    w.write_bytes(data[:8] + b"{" * n + data[8 + n:])
    edit_config("length-not-a-number", max_position_embeddings="abc")
    edit_config("factor-not-a-number", rope_parameters={"rope_type": "yarn", "rope_theta": 10000, "factor": "abc",
                                                        "original_max_position_embeddings": 256})
    edit_config("pad-beyond-vocab", pad_token_id=32000)  # the embedding has rows 0..31999
    edit_config("tokenizer-beyond-vocab", max_position_embeddings=2048)  # a tokenizer that adds id 32000:
    d = root / "tokenizer-beyond-vocab"
    tokenizer = json.loads((d / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({"id": 32000, "content": "<pad>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    (d / "tokenizer.json").write_text(json.dumps(tokenizer))
    tokenizer_config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "pad_token": "<pad>"}))
    edit_config("llama3-scaled", rope_parameters={"rope_type": "llama3", "rope_theta": 10000, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 256})
    d = copy("pickled-code")
    (d / "model.safetensors").unlink()
    with open(d / "pytorch_model.bin", "wb") as f:
        pickle.dump({"model.embed_tokens.weight": _Planted()}, f)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("world")
    _checkpoint_variants(root, tiny_checkpoint)
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("not longctx's")
    (root / "mine.train").mkdir()  # a user's folder where `extend -o mine` keeps its state
    (root / "mine.train" / "notes.txt").write_text("not longctx's either")
    (root / "afile").write_text("a file")
    (root / "partial-run").mkdir()
    (root / "partial-run" / "results.json").write_text(json.dumps({"format": "longctx-ruler-results/1"}))
    inside = root / "runs" / "m" / "yarn" / "m-yarn"
    shutil.copytree(tiny_checkpoint, inside)
    (root / "inside.yaml").write_text(yaml.safe_dump({"models": {"m": {"checkpoint": str(inside)}},
                                                      "yarn": {"factor": 2}}))
    (root / "seeds.yaml").write_text(yaml.safe_dump({"models": {"m": {"checkpoint": str(root / "ckpt")}},
                                                     "yarn": {"factor": 2}, "sweep": {"seeds": [0, 2**32]}}))
    (root / "huge-int.yaml").write_text(f"models:\n  m:\n    checkpoint: {root / 'ckpt'}\nyarn:\n  factor: "
                                        f"{'9' * 5000}\n")
    (root / "cuda.yaml").write_text(yaml.safe_dump({
        "models": {"m": {"checkpoint": str(root / "long")}},
        "ruler": {"lengths": "1k", "tasks": "vt", "samples": 1, "backend": "hf",
                  "backend_options": {"device": "cuda"}}}))
    return root


def _snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


CASES = [
    # info
    ("info {w}/missing", "does not exist"),
    ("info {w}/afile", "is not a directory"),
    ("info {w}/truncated", "model.safetensors"),
    ("info {w}/huge-header", "model.safetensors"),
    ("info {w}/not-json-header", "model.safetensors"),
    ("info {w}/length-not-a-number", "max_position_embeddings"),
    ("info {w}/pickled-code", "pytorch_model.bin"),
    ("info {w}/pad-beyond-vocab", "pad_token_id 32000 is not below vocab_size 32000"),
    # yarn
    ("yarn {w}/ckpt --factor 2 --beta-fast nan -o {w}/new", "--beta-fast must be a number > 0, got nan"),
    ("yarn {w}/ckpt --factor 2 --beta-fast -5 -o {w}/new", "--beta-fast must be a number > 0"),
    ("yarn {w}/ckpt --factor 2 -o {w}/afile", "is a file, not a folder"),
    ("yarn {w}/ckpt --factor 2 -o {w}/ckpt/inside", "lies inside the input checkpoint"),
    ("yarn {w}/ckpt --factor 2 -o {w}/mine --overwrite", "exists and was not made by longctx"),
    ("yarn {w}/truncated --factor 2 -o {w}/new", "model.safetensors"),
    ("yarn {w}/factor-not-a-number --factor 2 -o {w}/new", "factor"),
    ("yarn {w}/length-not-a-number --factor 2 -o {w}/new", "max_position_embeddings"),
    ("yarn {w}/llama3-scaled --factor 2 -o {w}/new", "--rescale"),
    ("yarn {w}/pad-beyond-vocab --factor 2 -o {w}/new", "pad_token_id 32000"),
    # init
    ("init {w}/afile --preset tiny --attention baseline", "is a file, not a folder"),
    ("init {w}/mine --preset tiny --attention baseline --overwrite", "exists and was not made by longctx"),
    ("init {w}/new --preset tiny --attention baseline --config elementwise_attn_output_gate=true",
     "--config elementwise_attn_output_gate: the attention and model class are --attention's to set"),
    ("init {w}/new --preset tiny --attention headwise --config model_type=qwen3",
     "--config model_type: the attention and model class are --attention's to set (now headwise)"),
    # convert
    ("convert {w}/pickled-code {w}/new --from official", "pytorch_model.bin"),
    # extend
    ("extend {w}/ckpt --rope-base 1e5 --seq-len 512 --data synthetic:mixed --steps 1 -o {w}/ckpt/inside",
     "lies inside the input checkpoint"),
    ("extend {w}/ckpt --rope-base 1e5 --seq-len 512 --data synthetic:mixed --steps 1 -o {w}/mine --resume",
     "exists and was not made by longctx"),
    ("extend {w}/ckpt --rope-base 1e5 --seq-len 512 --data synthetic:mixed --steps 1 -o {w}/new "
     "--cache-dir {w}/afile", "is a file, not a folder"),
    ("extend {w}/ckpt --rope-base 1e5 --seq-len 512 --data hf:nobody/nothing --steps 1 -o {w}/new",
     "not in the local Hugging Face cache"),
    ("extend {w}/tokenizer-beyond-vocab --rope-base 1e5 --seq-len 512 --data synthetic:mixed --steps 1 -o {w}/new",
     "the model's embedding has 32000 rows"),
    ("extend {w}/truncated --rope-base 1e5 --seq-len 512 --data synthetic:mixed --steps 1 -o {w}/new",
     "model.safetensors"),
    # ruler prepare / ruler
    ("ruler prepare --tokenizer {w}/ckpt --lengths 1k --tasks vt -o {w}/afile", "is a file, not a folder"),
    ("ruler prepare --tokenizer {w}/ckpt --lengths 1k --tasks vt -o {w}/ckpt/tasks", "lies inside the tokenizer"),
    ("ruler prepare --tokenizer {w}/config-only-tokenizer --lengths 1k --tasks vt -o {w}/new",
     "encodes a plain English sentence to no tokens"),
    ("ruler {w}/no-tokenizer --lengths 1k --tasks vt --backend hf -o {w}/new", "tokenizer"),
    ("ruler {w}/long --lengths 1k --tasks vt --backend hf -o {w}/long/run", "lies inside the checkpoint"),
    ("ruler {w}/long --lengths 1k --tasks vt --backend hf -o {w}/afile/sub", "is a file, not a folder"),
    ("ruler {w}/long --lengths 1k --tasks vt --backend hf -o {w}/mine", "is not a longctx ruler run directory"),
    ("ruler {w}/truncated --lengths 1k --tasks vt --backend hf -o {w}/new", "model.safetensors"),
    ("ruler {w}/tokenizer-beyond-vocab --lengths 1k --tasks vt --backend hf -o {w}/new",
     "has pad_token_id 32000, but the model's embedding has 32000 rows"),
    # sinks
    ("sinks {w}/no-tokenizer --tokens 256 -o {w}/new", "tokenizer"),
    ("sinks {w}/ckpt --tokens 256 --device cuda -o {w}/new", "--device cuda"),
    ("sinks {w}/ckpt --tokens 256 -o {w}/ckpt/sinks", "lies inside the checkpoint"),
    ("sinks {w}/ckpt --tokens 256 -o {w}/mine", "exists and was not made by longctx"),
    ("sinks {w}/tokenizer-beyond-vocab --tokens 256 -o {w}/new", "the model's embedding has 32000 rows"),
    # compare
    ("compare {w}/partial-run", "is incomplete or corrupt"),
    ("compare {w}/partial-run -o {w}/afile", "is a file, not a folder"),
    ("compare {w}/partial-run --replicates a={w}/x --replicates a={w}/y", "--replicates names 'a' twice"),
    # run
    ("run {w}/inside.yaml -o {w}/runs --dry-run", "lies inside this run's output folder"),
    ("run {w}/inside.yaml -o {w}/runs", "lies inside this run's output folder"),
    ("run {w}/inside.yaml -o {w}/afile", "is a file, not a folder"),
    ("run {w}/cuda.yaml -o {w}/new --dry-run", "ruler.backend_options.device cuda: torch sees no CUDA device"),
    # numbers out of range where they are read: a seed every generator takes (numpy's below 2**32), an integer
    # Python refuses to convert (over 4,300 digits)
    *[(f"{verb} --seed 4294967296", "--seed is invalid: 4294967296 is not in the range 0<=x<=4294967295")
      for verb in ("init {w}/new --preset tiny --attention baseline",
                   "extend {w}/ckpt --rope-base 1e5 --seq-len 512 --data synthetic:mixed --steps 1 -o {w}/new",
                   "ruler prepare --tokenizer {w}/ckpt --lengths 1k --tasks vt -o {w}/new",
                   "ruler {w}/long --lengths 1k --tasks vt --backend hf -o {w}/new",
                   "sinks {w}/ckpt --tokens 256 -o {w}/new")],
    ("init {w}/new --preset tiny --attention baseline --seed " + "9" * 5000, "(5,000 characters) is not a valid"),
    ("run {w}/seeds.yaml -o {w}/new --dry-run", "4294967296 is not in the range 0<=x<=4294967295"),
    ("run {w}/huge-int.yaml -o {w}/new --dry-run", "a YAML integer of 5,000 digits"),
]


@pytest.mark.parametrize("argv,message", CASES, ids=[c[0].replace("{w}/", "")[:80] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(argv, message, world, monkeypatch):
    import torch

    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(world.parent / "empty-hf-home"))
    monkeypatch.chdir(world)
    before = _snapshot(world)
    r = CliRunner().invoke(cli, [a.format(w=world) for a in argv.split()])
    assert r.exit_code == 2, (r.output, r.exception)
    assert "Traceback" not in r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr, r.stderr
    assert _snapshot(world) == before
    assert not (world / SENTINEL).exists()
