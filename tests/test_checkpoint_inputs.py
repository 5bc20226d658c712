"""Every checkpoint input is checked before a verb works on it: weight files (safetensors headers, PyTorch
pickles), the types of config values, the tokenizer, the device, and a vLLM engine that will not start.
Each bad input is one line on stderr, exit code 2, no traceback, and nothing written.

The corrupt files are copies of the tiny checkpoint's real files, rewritten. safetensors layout:
https://github.com/huggingface/safetensors#format (8-byte little-endian header length, JSON header, data).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from conftest import require_vllm, user_environment

from longctx.cli.main import cli
from longctx.core.errors import InputError

RULER_DATA = os.path.join(os.path.dirname(__file__), "data", "ruler", "data")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_one_line(r, message: str, *, exact: bool = False):
    """Exit code 2, exactly one line on stderr that says `message`, nothing else printed, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    if exact:
        assert r.stderr == f"Error: {message}\n"
    else:
        assert message in r.stderr, r.stderr


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit_config(ckpt, **changes):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))


# --- 1. weight files ------------------------------------------------------------------------------


def _parts(path):
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write(path, header, body, n=None):
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes((len(raw) if n is None else n).to_bytes(8, "little") + raw + body)


def _first_tensor(header):
    return next(k for k in header if k != "__metadata__")


def _huge_length(f):
    data = f.read_bytes()
    f.write_bytes((2**62).to_bytes(8, "little") + data[8:])


def _length_past_end(f):
    data = f.read_bytes()
    f.write_bytes(len(data).to_bytes(8, "little") + data[8:])


def _truncated(f):
    os.truncate(f, f.stat().st_size // 2)


def _not_json(f):
    header, body = _parts(f)
    raw = json.dumps(header).encode()
    _write(f, b"\xff" + raw[1:], body)


def _json_list(f):
    _write(f, [1, 2], _parts(f)[1])


def _unknown_dtype(f):
    header, body = _parts(f)
    header[_first_tensor(header)]["dtype"] = "F128"
    _write(f, header, body)


def _wrong_shape(f):
    header, body = _parts(f)
    header[_first_tensor(header)]["shape"][-1] += 1
    _write(f, header, body)


def _trailing_bytes(f):
    header, body = _parts(f)
    _write(f, header, body + b"\0" * 8)


def _too_short(f):
    f.write_bytes(b"\x01\x02")


CORRUPTIONS = {
    "huge_header_length": (_huge_length, "header length 4611686018427387904 is over the format's limit"),
    "header_length_past_end": (_length_past_end, "runs past the end of the file"),
    "truncated": (_truncated, "past the end of the file"),
    "header_not_json": (_not_json, "its header is not UTF-8 JSON"),
    "header_a_list": (_json_list, "its header is a JSON list, not an object"),
    "unknown_dtype": (_unknown_dtype, "has the unknown dtype 'F128'"),
    "offsets_disagree_with_shape": (_wrong_shape, "bytes, but F32 x"),
    "data_not_covered": (_trailing_bytes, "its tensors cover"),
    "shorter_than_8_bytes": (_too_short, "it is 2 bytes, shorter than the 8-byte header length"),
}


@pytest.mark.parametrize("verb", ["info", "yarn"])
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_safetensors_is_one_line_before_anything_is_written(corruption, verb, tiny_checkpoint, tmp_path):
    """Before: `info` died in MemoryError on a huge header length and printed parameters of truncated files;
    `yarn` scaled a corrupt checkpoint and linked its broken weights into the output."""
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    edit, message = CORRUPTIONS[corruption]
    edit(ckpt / "model.safetensors")
    out = tmp_path / "out"
    r = run(verb, ckpt) if verb == "info" else run(verb, ckpt, "--factor", "2", "-o", out)
    assert_one_line(r, f"'{ckpt}/model.safetensors' is not a valid safetensors file: ")
    assert message in r.stderr and "restore it from the original checkpoint" in r.stderr
    assert not out.exists()


def test_valid_checkpoints_pass_the_weight_check(tiny_checkpoint, tmp_path):
    """The tiny checkpoint's safetensors and the same tensors in a .bin pass, and `info` counts them alike."""
    from safetensors.torch import load_file

    from longctx.checkpoint.weights import check_weight_files

    check_weight_files(tiny_checkpoint)
    ckpt = copy(tiny_checkpoint, tmp_path / "bin")
    torch.save(load_file(ckpt / "model.safetensors"), ckpt / "pytorch_model.bin")
    (ckpt / "model.safetensors").unlink()
    a, b = run("info", tiny_checkpoint, "--json"), run("info", ckpt, "--json")
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    assert json.loads(a.output)["parameters"] == json.loads(b.output)["parameters"] > 0


class _RunsCode:
    """Pickled as a call to os.system: what a malicious pytorch_model.bin holds."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_pickle_that_holds_code_is_refused_without_running_it(writer, tiny_checkpoint, tmp_path):
    """Before: a traceback whose text suggests `weights_only=False`, the one setting that runs the code (a
    PyTorch zip archive), or that says to save it again in the zip format (a bare pickle)."""
    import pickle

    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    marker = tmp_path / "ran"
    state = {"w": torch.zeros(2), "x": _RunsCode(marker)}
    if writer == "torch.save":
        torch.save(state, ckpt / "pytorch_model.bin")
    else:
        with open(ckpt / "pytorch_model.bin", "wb") as f:
            pickle.dump(state, f)
    r = run("info", ckpt)
    assert_one_line(r, f"'{ckpt}/pytorch_model.bin' holds code, not only tensors; longctx loads weights only; "
                       "convert it to safetensors with a tool you trust", exact=True)
    assert "weights_only=False" not in r.output
    assert not marker.exists()


def test_legacy_torch_bin_is_one_line(tiny_checkpoint, tmp_path):
    """PyTorch's pre-1.6 format cannot be memory-mapped (torch.load(mmap=True) raises RuntimeError)."""
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    torch.save({"w": torch.zeros(4)}, ckpt / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert_one_line(run("info", ckpt), f"'{ckpt}/pytorch_model.bin' is in PyTorch's legacy (pre-1.6) format, which "
                                       "cannot be memory-mapped; convert it to safetensors with a tool you trust",
                    exact=True)


def test_truncated_torch_bin_is_one_line(tiny_checkpoint, tmp_path):
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    torch.save({"w": torch.zeros(1000)}, ckpt / "pytorch_model.bin")
    os.truncate(ckpt / "pytorch_model.bin", 300)
    out = tmp_path / "out"
    assert_one_line(run("yarn", ckpt, "--factor", "2", "-o", out),
                    f"'{ckpt}/pytorch_model.bin' is not a readable PyTorch weights file (")
    assert not out.exists()


def test_index_naming_a_missing_shard_is_one_line(tiny_checkpoint, tmp_path):
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    out = tmp_path / "out"
    assert_one_line(run("yarn", ckpt, "--factor", "2", "-o", out),
                    "names the shard 'model-00002-of-00002.safetensors', which is not in")
    assert not out.exists()


def test_weight_files_are_read_once_per_version(tiny_checkpoint, tmp_path, monkeypatch):
    """checkpoint_dir runs at every verb's start and inside read_config / fingerprint: each file version is
    checked once per process, again when it changes."""
    from longctx.checkpoint import weights
    from longctx.checkpoint.directory import checkpoint_dir, fingerprint, read_config

    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    calls = []
    real = weights.check_safetensors
    monkeypatch.setattr(weights, "check_safetensors", lambda f: (calls.append(f), real(f)))
    checkpoint_dir(ckpt)
    read_config(ckpt)
    fingerprint(ckpt)
    assert len(calls) == 1
    st = (ckpt / "model.safetensors").stat()
    os.utime(ckpt / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    checkpoint_dir(ckpt)
    assert len(calls) == 2


def test_a_fingerprint_follows_content_not_size_and_time(tiny_checkpoint, tmp_path):
    """Weights rewritten at the same size with their modification time put back are new weights: the fingerprint
    (and a tokenizer cache key) hash content, even in the process that hashed the old content."""
    from longctx.checkpoint.directory import fingerprint
    from longctx.checkpoint.prompt_tokenizer import source_key

    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    weights_file, tok_file = ckpt / "model.safetensors", ckpt / "tokenizer.json"
    before, key_before = fingerprint(ckpt), source_key(ckpt, False)
    for f, at in ((weights_file, -2), (tok_file, -1)):  # the last tensor's last element; tokenizer.json's last byte
        st = f.stat()
        data = bytearray(f.read_bytes())
        data[at] ^= 1
        f.write_bytes(bytes(data))
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert source_key(ckpt, False) != key_before
    assert fingerprint(ckpt) != before


def test_trainer_side_files_are_not_weights(tiny_checkpoint, tmp_path):
    """A transformers Trainer `checkpoint-N/` folder holds pickles beside the weights (training_args.bin is a
    pickled dataclass): they are neither refused as weights nor part of the fingerprint."""
    import pickle
    import shutil

    from longctx.checkpoint.directory import fingerprint

    ckpt = tmp_path / "checkpoint-100"
    shutil.copytree(tiny_checkpoint, ckpt)
    (ckpt / "training_args.bin").write_bytes(pickle.dumps(_RunsCode(tmp_path / "ran")))
    (ckpt / "rng_state.pth").write_bytes(pickle.dumps(_RunsCode(tmp_path / "ran")))
    r = run("info", ckpt)
    assert r.exit_code == 0, r.output
    assert fingerprint(ckpt) == fingerprint(tiny_checkpoint) and not (tmp_path / "ran").exists()


# --- 2. config values of the wrong type -----------------------------------------------------------


@pytest.mark.parametrize("key,value,message", [
    ("rope_scaling", {"rope_type": "yarn", "factor": "abc"}, "rope_scaling.factor must be a number > 0, got 'abc'"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": "x"},
     "rope_parameters.rope_theta must be a number > 0, got 'x'"),
    ("rope_theta", "x", "rope_theta must be a number > 0, got 'x'"),
    ("max_position_embeddings", "abc", "max_position_embeddings must be a whole number > 0, got 'abc'"),
    ("max_position_embeddings", -5, "max_position_embeddings must be a whole number > 0, got -5"),
    ("max_position_embeddings", True, "max_position_embeddings must be a whole number > 0, got true"),
    ("num_attention_heads", "a", "num_attention_heads must be a whole number > 0, got 'a'"),
    ("headwise_attn_output_gate", "false", "headwise_attn_output_gate must be true or false, got 'false'"),
    ("rope_scaling", "yarn", "rope_scaling must be an object or null, got 'yarn'"),
])
def test_wrongly_typed_config_value_is_one_line_naming_file_key_and_type(key, value, message, tiny_checkpoint,
                                                                         tmp_path):
    """Before: TypeError/ValueError tracebacks (factor 'abc', max_position_embeddings 'abc' or -5), or a
    scaled checkpoint written from a config no loader can build (rope_theta 'x', num_attention_heads 'a')."""
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    edit_config(ckpt, **{key: value})
    out = tmp_path / "out"
    assert_one_line(run("yarn", ckpt, "--factor", "2", "-o", out), f"'{ckpt}/config.json': {message}", exact=True)
    assert not out.exists()


def test_read_rope_names_the_key_and_type():
    from longctx.rope.config import read_rope

    with pytest.raises(InputError, match=r"^'config.json': rope_scaling.factor must be a number > 0, got 'abc'$"):
        read_rope({"model_type": "qwen3", "max_position_embeddings": 256,
                   "rope_scaling": {"rope_type": "yarn", "factor": "abc"}})


def test_config_transformers_cannot_build_is_one_line(tiny_checkpoint, tmp_path):
    """Before: huggingface_hub's StrictDataclassFieldValidationError traceback (a field longctx does not read)."""
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    edit_config(ckpt, rms_norm_eps="x")
    out = tmp_path / "out"
    r = run("sinks", ckpt, "-o", out, "--tokens", "64", "--length", "32", "--no-plot")
    assert_one_line(r, f"'{ckpt}/config.json': transformers cannot build a config from it (Validation error for "
                       "field 'rms_norm_eps': TypeError: Field 'rms_norm_eps' expected float")
    assert not out.exists()


def test_weights_of_another_shape_than_config_is_one_line(tiny_checkpoint, tmp_path):
    """Before: transformers' load report, then a RuntimeError traceback telling to look at the report."""
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    edit_config(ckpt, intermediate_size=384)
    out = tmp_path / "out"
    r = run("sinks", ckpt, "-o", out, "--tokens", "64", "--length", "32", "--no-plot")
    assert_one_line(r, f"checkpoint '{ckpt}': tensor 'model.layers.0.mlp.gate_proj.weight' has shape [256, 128] "
                       "in the weight files but [384, 128] in the model config.json describes", )
    assert not out.exists()


# --- 3. tokenizers --------------------------------------------------------------------------------


def _tokenizer_config_only(ckpt):
    """What transformers silently turns into an empty tokenizer: tokenizer_config.json without a vocabulary."""
    for f in ckpt.glob("tokenizer*"):
        if f.name != "tokenizer_config.json":
            f.unlink()
    return ckpt


@pytest.mark.parametrize("files,message", [
    ("config_only", ("the tokenizer in '{ckpt}' encodes a plain English sentence to no tokens; copy the model's "
                     "full tokenizer (tokenizer.json or tokenizer.model) into it")),
    ("none", ("checkpoint '{ckpt}' has no tokenizer files (tokenizer.json / tokenizer_config.json); copy the "
              "tokenizer of the model into it")),
])
def test_sinks_refuses_a_checkpoint_without_a_usable_tokenizer(files, message, tiny_checkpoint, tmp_path):
    """Before (config_only): exit 0 and sinks.json with numbers computed from no text."""
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    _tokenizer_config_only(ckpt)
    if files == "none":
        (ckpt / "tokenizer_config.json").unlink()
    out = tmp_path / "out"
    r = run("sinks", ckpt, "-o", out, "--tokens", "64", "--length", "32", "--no-plot")
    assert_one_line(r, message.format(ckpt=ckpt), exact=True)
    assert not out.exists()


def _ruler_checkpoint(tiny_checkpoint, dst):
    """The tiny checkpoint with room for RULER's shortest tasks (1k)."""
    ckpt = copy(tiny_checkpoint, dst)
    edit_config(ckpt, max_position_embeddings=1024)
    return ckpt


def test_ruler_hf_with_an_empty_tokenizer_is_one_line_nothing_written(tiny_checkpoint, tmp_path):
    """Before: ZeroDivisionError in the needle-in-a-haystack generator (tokens per haystack sentence: 0),
    after the run directory was created."""
    ckpt = _tokenizer_config_only(_ruler_checkpoint(tiny_checkpoint, tmp_path / "ckpt"))
    out = tmp_path / "run"
    r = run("ruler", "run", ckpt, "--backend", "hf", "--lengths", "1k", "--tasks", "niah_single_1", "--samples", "1",
            "--data-dir", RULER_DATA, "-o", out, "--no-plot")
    assert_one_line(r, f"the tokenizer in '{ckpt}' encodes a plain English sentence to no tokens")
    assert not out.exists()


def test_load_tokenizer_refuses_one_that_gives_special_tokens_only(tmp_path):
    """A word-level vocabulary of special tokens only: every word becomes <unk>."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    from longctx.checkpoint.tokenizer import load_tokenizer

    raw = Tokenizer(WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    raw.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(tmp_path)
    with pytest.raises(InputError, match="encodes a plain English sentence to special tokens only"):
        load_tokenizer(tmp_path)


# --- 4. devices -----------------------------------------------------------------------------------

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


@no_cuda
def test_sinks_device_cuda_without_cuda_is_one_line(tiny_checkpoint, tmp_path):
    """Before: AssertionError 'Torch not compiled with CUDA enabled' traceback after the model was loaded."""
    out = tmp_path / "out"
    r = run("sinks", tiny_checkpoint, "-o", out, "--tokens", "64", "--length", "32", "--no-plot", "--device", "cuda")
    assert_one_line(r, "--device cuda: torch sees no CUDA device here; use --device cpu", exact=True)
    assert not out.exists()


def test_sinks_device_torch_does_not_know_is_one_line(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    r = run("sinks", tiny_checkpoint, "-o", out, "--tokens", "64", "--length", "32", "--no-plot", "--device", "gpu")
    assert_one_line(r, "--device gpu: not a torch device; use cpu, cuda or cuda:N", exact=True)
    assert not out.exists()


@no_cuda
def test_ruler_hf_device_cuda_without_cuda_is_one_line_nothing_written(tiny_checkpoint, tmp_path):
    """Before: the task files and run.json were written, then a traceback when the model moved to CUDA."""
    ckpt = _ruler_checkpoint(tiny_checkpoint, tmp_path / "ckpt")
    out = tmp_path / "run"
    r = run("ruler", "run", ckpt, "--backend", "hf", "--device", "cuda", "--lengths", "1k", "--tasks",
            "niah_single_1", "--samples", "1", "--data-dir", RULER_DATA, "-o", out, "--no-plot")
    assert_one_line(r, "--device cuda: torch sees no CUDA device here; use --device cpu", exact=True)
    assert not out.exists()


# --- 5. a vLLM engine that does not start ---------------------------------------------------------


@pytest.mark.slow
def test_vllm_engine_start_failure_is_one_line_with_the_full_output_in_a_log(tiny_checkpoint, tmp_path):
    """A checkpoint every check before the engine passes, and a KV cache larger than the machine's memory: vLLM's
    worker fails in its engine process. Before: ~180 lines of both processes' tracebacks."""
    require_vllm()
    ckpt = _ruler_checkpoint(tiny_checkpoint, tmp_path / "ckpt")
    out = tmp_path / "run"
    env = {**user_environment(), "VLLM_CPU_KVCACHE_SPACE": "100000", "TQDM_DISABLE": "1"}  # GiB; no progress bars
    r = subprocess.run([sys.executable, "-m", "longctx", "ruler", "run", str(ckpt), "--backend", "vllm", "--dtype",
                        "float32", "--enforce-eager", "--lengths", "1k", "--tasks", "niah_single_1", "--samples", "1",
                        "--data-dir", RULER_DATA, "-o", str(out), "--no-plot"],
                       capture_output=True, text=True, env=env, timeout=600, check=False)
    log = out / "vllm-engine.log"
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert r.stderr.startswith(f"Error: vLLM could not start the engine for {ckpt} (")
    assert r.stderr.endswith(f"); full output in {log}\n")
    assert "kv cache allocation" in r.stderr  # the cause vLLM's worker gave, not "Engine core initialization failed"
    assert "Engine core initialization failed" not in r.stderr
    text = log.read_text()
    assert "Traceback" in text and "Engine core initialization failed" in text


def test_a_config_no_model_generates_text_for_is_one_line_before_and_without_weights(tmp_path):
    """A config transformers has neither a causal LM nor an image-text-to-text model for (CLIP) is refused in one
    line by the loader, whether or not weight files are there to compare."""
    from transformers import CLIPConfig

    from longctx.checkpoint.load import load_model
    from longctx.core.errors import InputError

    CLIPConfig().save_pretrained(tmp_path)
    with pytest.raises(InputError, match="transformers has no model that generates text for its CLIPConfig"):
        load_model(tmp_path)
