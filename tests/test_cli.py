"""The `longctx` command line: help, `info`, `yarn`, and one-line exit-2 errors for bad input."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file

from longctx import __version__
from longctx.cli.main import cli

VERBS = ["compare", "convert", "export", "extend", "info", "init", "ruler", "run", "sinks", "yarn"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_help_lists_every_verb():
    r = run("--help")
    assert r.exit_code == 0
    listed = [line.split()[0] for line in r.output.split("Commands:")[1].strip().splitlines()]
    assert listed == sorted(cli.commands) == VERBS
    assert "k/K (both x1024" in r.output


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and __version__ in r.output


@pytest.mark.slow
def test_console_script_is_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "longctx")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "yarn" in r.stdout


def test_info(tiny_checkpoint):
    r = run("info", tiny_checkpoint, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["architecture"] == "Qwen3ForCausalLM" and d["attention"] == "baseline"
    assert (d["rope_type"], d["rope_theta"], d["yarn_factor"]) == ("default", 10000, None)
    assert d["max_position_embeddings"] == d["context_length"] == 256
    # tied embeddings: 32000*128 + 2 layers, counted from the safetensors header
    tensors = load_file(tiny_checkpoint / "model.safetensors")
    assert d["parameters"] == sum(t.numel() for t in tensors.values())
    assert len(d["fingerprint"]) == 64
    text = run("info", tiny_checkpoint)
    assert "context length           256 tokens" in text.output and d["fingerprint"] in text.output


def test_yarn_writes_a_complete_scaled_checkpoint(tiny_checkpoint, tmp_path):
    out = tmp_path / "scaled"
    r = run("yarn", tiny_checkpoint, "--factor", "4", "-o", out)
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 10000, "factor": 4.0,
                                      "original_max_position_embeddings": 256}
    assert cfg["max_position_embeddings"] == 1024 and "original_max_position_embeddings" not in cfg
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (tiny_checkpoint / name).read_bytes(), name
    prov = json.loads((out / "longctx.json").read_text())
    assert prov["verb"] == "yarn" and prov["args"]["factor"] == 4.0
    assert prov["source_fingerprint"] == run("info", tiny_checkpoint, "--json").output.split('"fingerprint": "')[1][:64]
    assert prov["versions"]["transformers"] and len(prov["history"]) == 1
    # what changed, the context length and the vLLM settings are printed
    assert "max_position_embeddings: 256 -> 1024" in r.output
    assert "context length: 1024 tokens" in r.output
    assert f"vllm serve {out} --max-model-len 1024" in r.output
    assert "--hf-overrides '{\"rope_parameters\": {\"rope_type\": \"yarn\"" in r.output
    # nothing but the output was created next to it (no temp dirs left behind)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scaled"]
    info = json.loads(run("info", out, "--json").output)
    assert (info["rope_type"], info["yarn_factor"], info["original_max_position_embeddings"],
            info["context_length"]) == ("yarn", 4.0, 256, 1024)


def test_yarn_default_output_rescale_and_overwrite(tiny_checkpoint, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint, src)
    assert run("yarn", src, "--factor", "2").exit_code == 0
    default_out = tmp_path / "src-yarn2x"
    assert json.loads((default_out / "config.json").read_text())["max_position_embeddings"] == 512
    r = run("yarn", default_out, "--factor", "4", "--rescale", "-o", tmp_path / "re")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "re" / "config.json").read_text())
    assert cfg["rope_parameters"]["original_max_position_embeddings"] == 256 and cfg["max_position_embeddings"] == 1024
    assert len(json.loads((tmp_path / "re" / "longctx.json").read_text())["history"]) == 2
    r = run("yarn", src, "--factor", "8", "-o", default_out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert json.loads((default_out / "config.json").read_text())["max_position_embeddings"] == 2048
    assert sorted(p.name for p in tmp_path.iterdir()) == ["re", "src", "src-yarn2x"]


def _bad_checkpoints(root, good):
    import shutil

    (root / "empty").mkdir()
    (root / "badjson").mkdir()
    (root / "badjson" / "config.json").write_text("{not json")
    (root / "norope").mkdir()
    (root / "norope" / "config.json").write_text(json.dumps({"model_type": "mystery", "max_position_embeddings": 4}))
    shutil.copytree(good, root / "scaled")
    cfg = json.loads((good / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000, "factor": 2.0,
                              "original_max_position_embeddings": 256}
    (root / "scaled" / "config.json").write_text(json.dumps(cfg))
    shutil.copytree(good, root / "unknown")
    cfg["rope_parameters"] = {"rope_type": "wibble", "rope_theta": 10000}
    (root / "unknown" / "config.json").write_text(json.dumps(cfg))
    _taken_folders(root)


def _taken_folders(root):
    """`taken`: a longctx checkpoint folder; `mine`: a user's folder; `file`: a file."""
    from longctx.core.files import mark_output

    (root / "taken").mkdir()
    mark_output(root / "taken", "checkpoint")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("not longctx's")
    (root / "file").write_text("a file")


@pytest.mark.parametrize("args,message", [
    (["yarn", "{ckpt}", "--factor", "1"], "factor must be a number > 1"),
    (["yarn", "{ckpt}", "--factor", "-2"], "factor must be a number > 1"),
    (["yarn", "{ckpt}", "--factor", "abc"], "'abc' is not a number"),
    (["yarn", "{root}/missing", "--factor", "4"], "does not exist"),
    (["yarn", "{root}/empty", "--factor", "4"], "has no config.json"),
    (["yarn", "{root}/badjson", "--factor", "4"], "is not valid JSON"),
    (["yarn", "{root}/norope", "--factor", "4"], "no RoPE base"),
    (["yarn", "{root}/scaled", "--factor", "4"], "already YaRN-scaled"),
    (["yarn", "{root}/unknown", "--factor", "4"], "unknown RoPE type 'wibble'"),
    (["yarn", "{ckpt}", "--factor", "4", "-o", "{root}/taken"], "already exists; pass --overwrite"),
    (["yarn", "{ckpt}", "--factor", "4", "-o", "{ckpt}", "--overwrite"], "would hold the input checkpoint"),
    (["yarn", "{ckpt}", "--factor", "4", "-o", "{ckpt}/inside"], "lies inside the input checkpoint"),
    (["yarn", "{ckpt}", "--factor", "4", "-o", "{root}/mine", "--overwrite"], "exists and was not made by longctx"),
    (["yarn", "{ckpt}", "--factor", "4", "-o", "{root}/file", "--overwrite"], "is a file, not a folder"),
    (["yarn", "{ckpt}", "--factor", "4", "-o", "{root}/file/sub"], "is a file, not a folder"),
    (["yarn", "{ckpt}"], "Missing option '--factor'"),
    (["info", "{root}/missing"], "does not exist"),
    (["info", "{root}/badjson"], "is not valid JSON"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(args, message, tiny_checkpoint, tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    _bad_checkpoints(root, tiny_checkpoint)
    before = sorted(p.name for p in root.iterdir())
    ckpt_before = sorted(p.name for p in tiny_checkpoint.iterdir())
    r = run(*[a.format(root=root, ckpt=tiny_checkpoint) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.output
    assert sorted(p.name for p in root.iterdir()) == before
    assert sorted(p.name for p in tiny_checkpoint.iterdir()) == ckpt_before
    assert not list(tiny_checkpoint.parent.glob(".*tmp*"))


@pytest.mark.parametrize("lengths,message", [
    ("12q", "'12q' in '12q' is not a length (use 32k or 32768"),
    ("0", "'0' in '0' is not a positive length"),
    ("-4k", "'-4k' in '-4k' is not a length"),
    ("4k,4k", "'4k' in '4k,4k' repeats 4096"),
    ("", "no lengths given"),
])
def test_bad_lengths_on_the_command_line(lengths, message, tmp_path):
    out = tmp_path / "out"
    r = run("ruler", "prepare", "--tokenizer", tmp_path, "--lengths", lengths, "-o", out)
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()
