"""`longctx convert --from gguf`: tiny GGUF files written by the `gguf` package from a tiny Llama checkpoint (as
llama.cpp's converter lays them out) come back as a transformers checkpoint whose weights are the original's
through the format (exact for F32, F16's rounding, the quantization's own error for Q8_0/Q4_0/Q4_1) and equal
what transformers' GGUF loader gives; the file's sha256 and quantization are recorded; bad input is one line."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from gguf_helpers import CHAT_TEMPLATE, format_roundtrip, tiny_llama, write_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from longctx.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "checkpoints" / "tiny-gated"  # a byte-level BPE: GGUF's `gpt2` tokenizer model
FORMATS = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def original():
    return tiny_llama(TOKENIZER)


@pytest.fixture(scope="module")
def files(original, tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    model, _ = original
    out = {}
    for name in FORMATS:
        (root / name).mkdir()
        out[name] = write_gguf(model, TOKENIZER, root / name / f"tiny-{name}.gguf", name)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_weights_are_the_originals_through_the_format_and_transformers_loader(original, files, fmt, tmp_path):
    model, tok = original
    r = run("convert", files[fmt], tmp_path / "out", "--from", "gguf")
    assert r.exit_code == 0, r.output
    assert "LlamaForCausalLM (baseline), " in r.output and "2 query heads per KV head" in r.output
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    loader = AutoModelForCausalLM.from_pretrained(files[fmt].parent, gguf_file=files[fmt].name,
                                                  dtype=torch.float32).state_dict()
    want = model.state_dict()
    assert ours.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(ours[key], format_roundtrip(value, fmt)), key
        assert torch.equal(ours[key], loader[key]), key
    record = json.loads((tmp_path / "out" / "longctx.json").read_text())
    gguf = record["args"]["gguf"]
    assert record["verb"] == "convert" and record["args"]["from"] == "gguf"
    assert gguf["sha256"] == hashlib.sha256(files[fmt].read_bytes()).hexdigest()
    assert gguf["architecture"] == "llama" and gguf["name"] == "tiny llama" and gguf["tensors"] == len(want)
    quantized = 2 * 7 + 2  # per layer q, k, v, o, gate, up, down; embedding and output
    assert gguf["quantization"] == ({"F32": len(want)} if fmt == "F32" else
                                    {"F32": len(want) - quantized, fmt: quantized})


@pytest.mark.slow
def test_the_converted_checkpoint_computes_and_tokenizes_as_the_original(original, files, tmp_path):
    model, tok = original
    assert run("convert", files["F32"].parent, tmp_path / "out", "--from", "gguf").exit_code == 0  # the folder
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 100000.0}
    assert config["max_position_embeddings"] == 512 and config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    ids = torch.randint(3, len(tok), (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
    converted = AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "The grass is green. The special magic number for 1,234 apples is: 5678901."
    assert converted(text).input_ids == tok(text).input_ids
    assert converted.chat_template == CHAT_TEMPLATE
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (tok.bos_token_id, tok.eos_token_id)
    info = run("info", tmp_path / "out")
    assert "rope                     default, base 100000" in info.output and "context length           512" in \
        info.output


def _one_line(r, message):
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_bad_gguf_input_is_one_line_and_writes_nothing(original, files, tmp_path):
    import gguf

    model, _ = original
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(files["F32"], two / name)
    torn = tmp_path / "torn.gguf"
    torn.write_bytes(files["F32"].read_bytes()[:300])
    other = write_gguf(model, TOKENIZER, tmp_path / "bert.gguf", "F32", architecture="bert")
    q81 = tmp_path / "q81.gguf"
    w = gguf.GGUFWriter(str(q81), "llama")
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
    w.add_tensor("token_embd.weight", torch.zeros(4, 2 * size, dtype=torch.uint8).numpy(),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (tmp_path / "model.bin").write_bytes(b"x")
    for source, message in [
        (tmp_path / "missing.gguf", f"GGUF file '{tmp_path / 'missing.gguf'}' does not exist"),
        (two, "holds 2 .gguf files (a.gguf, b.gguf); give the GGUF file itself"),
        (tmp_path / "model.bin", "is not a .gguf file; --from gguf converts a llama.cpp GGUF file"),
        (torn, "cannot read"),
        (other, "is a GGUF file of architecture 'bert', which transformers cannot load from GGUF; it loads "),
        (q81, "has tensors in Q8_1, which the gguf package cannot de-quantize"),
    ]:
        _one_line(run("convert", source, tmp_path / "out", "--from", "gguf"), message)
        assert not (tmp_path / "out").exists()
