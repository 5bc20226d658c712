"""`longctx init`: presets, attention variants, --match-params, tokenizers, and bad input."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from longctx.cli.main import cli
from longctx.init.presets import model_config, parameter_count
from longctx.models.gates import NAMED


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("attention", ["baseline", "elementwise", "headwise"])
@pytest.mark.slow
def test_init_tiny_writes_a_loadable_checkpoint(attention, tmp_path, reference_tokenizer_dir):
    out = tmp_path / "ckpt"
    r = run("init", out, "--preset", "tiny", "--attention", attention, "--tokenizer", reference_tokenizer_dir)
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.output and "parameters:" in r.output
    names = sorted(p.name for p in out.iterdir())
    for name in ("config.json", "generation_config.json", "longctx.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json"):
        assert name in names
    cfg = json.loads((out / "config.json").read_text())
    gated = attention != "baseline"
    assert cfg["architectures"] == ["GatedQwen3ForCausalLM" if gated else "Qwen3ForCausalLM"]
    assert cfg["model_type"] == ("gated_qwen3" if gated else "qwen3")
    assert (cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (64, 4, 2,
                                                                                                            32000)
    assert cfg["tie_word_embeddings"] is True and cfg["dtype"] == "float32"
    weights = load_file(out / "model.safetensors")
    g = weights.get("model.layers.0.self_attn.g_proj.weight")
    assert (g is None) == (not gated)
    if gated:
        assert g.shape == ((4 * 64, 128) if attention == "elementwise" else (4, 128))
    assert "lm_head.weight" not in weights
    info = json.loads(run("info", out, "--json").output)
    assert info["attention"] == {"baseline": "baseline", "elementwise": "gated-elementwise",
                                 "headwise": "gated-headwise"}[attention]
    prov = json.loads((out / "longctx.json").read_text())
    assert prov["verb"] == "init" and prov["args"]["attention"] == attention and prov["source"] is None
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        logits = model(**tok("hello world", return_tensors="pt")).logits
    assert logits.shape[-1] == 32000 and torch.isfinite(logits).all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.slow
def test_seed_makes_init_reproducible(tmp_path, reference_tokenizer_dir):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert run("init", tmp_path / name, "--preset", "tiny", "--attention", "headwise", "--tokenizer",
                   reference_tokenizer_dir, "--seed", seed).exit_code == 0
    a, b, c = (load_file(tmp_path / n / "model.safetensors") for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.self_attn.g_proj.weight"], c["model.layers.0.self_attn.g_proj.weight"])


def test_bpe_tokenizer_trained_on_the_spot(tmp_path):
    out = tmp_path / "bpe"
    r = run("init", out, "--preset", "tiny", "--attention", "elementwise", "--tokenizer", "bpe", "--vocab-size", 1000)
    assert r.exit_code == 0, r.output
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 1000 == json.loads((out / "config.json").read_text())["vocab_size"]
    assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = "The quick brown fox 12345 naïve ∑ {}"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: every string round-trips
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abc abd abe\n" * 50)
    assert run("init", tmp_path / "small", "--preset", "tiny", "--attention", "baseline", "--tokenizer", "bpe",
               "--vocab-size", 300, "--bpe-corpus", corpus).exit_code == 0
    assert AutoTokenizer.from_pretrained(tmp_path / "small")("abc").input_ids[0] != 1  # adds no BOS by default
    assert run("init", tmp_path / "bos", "--preset", "tiny", "--attention", "baseline", "--tokenizer", "bpe",
               "--vocab-size", 300, "--bpe-corpus", corpus, "--bpe-bos").exit_code == 0
    assert AutoTokenizer.from_pretrained(tmp_path / "bos")("abc").input_ids[0] == 1  # --bpe-bos: <s> before every text


@pytest.mark.slow
def test_reference_tokenizer_is_the_default(tmp_path, reference_tokenizer_dir):
    r = run("init", tmp_path / "ref", "--preset", "tiny", "--attention", "baseline")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "ref" / "tokenizer.json").read_bytes() == (reference_tokenizer_dir / "tokenizer.json").read_bytes()


def test_paper_preset_shapes_and_match_params():
    """Qiu et al. 2025, Table 7, 1.7B-28L: hidden 2048, FFN 6144, 16/8 heads, hd 128, tied, RoPE 10k, 4096."""
    base = model_config("paper-1.7b", "baseline", 32000)
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size, base.num_attention_heads,
            base.num_key_value_heads, base.head_dim, base.max_position_embeddings) == (28, 2048, 6144, 16, 8, 128, 4096)
    assert base.tie_word_embeddings and base.rope_parameters == {"rope_type": "default", "rope_theta": 10000}
    n_base = parameter_count(base)
    unit = 28 * 3 * 2048  # parameters per FFN unit over all layers
    for attention, gate in (("elementwise", 16 * 128 * 2048), ("headwise", 16 * 2048)):
        wide = model_config("paper-1.7b", attention, 32000)
        assert parameter_count(wide) == n_base + 28 * gate
    # every variant: the FFN a multiple of 64 (GPU matmuls tile it; the exact 5461 ran 5.4x slower on an H200),
    # the parameters the baseline's to within half of 64 FFN units
    for attention in (name for name in NAMED if name != "baseline"):
        matched = model_config("paper-1.7b", attention, 32000, match_params=True)
        assert matched.intermediate_size % 64 == 0 and matched.intermediate_size <= 6144, attention
        assert abs(parameter_count(matched) - n_base) <= 64 * unit / 2, attention
    assert model_config("paper-1.7b", "elementwise", 32000, match_params=True).intermediate_size == 5440
    assert model_config("paper-1.7b", "value-elementwise", 32000, match_params=True).intermediate_size == 5824
    assert model_config("paper-1.7b", "headwise", 32000, match_params=True).intermediate_size == 6144
    # the tiny preset (CPU) matches to the nearest FFN unit, as the shipped checkpoints were made
    assert model_config("tiny", "elementwise", 2048, match_params=True, tie_word_embeddings=False
                        ).intermediate_size == 171


def test_match_params_cli(tmp_path, reference_tokenizer_dir):
    r = run("init", tmp_path / "m", "--preset", "tiny", "--attention", "elementwise", "--match-params",
            "--tokenizer", reference_tokenizer_dir)
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["intermediate_size"] == 256 - round(4 * 64 * 128 / (3 * 128))
    n = sum(t.numel() for t in load_file(tmp_path / "m" / "model.safetensors").values())
    assert abs(n - parameter_count(model_config("tiny", "baseline", 32000))) <= 2 * 3 * 128 / 2


def test_untie_embeddings_gives_the_output_layer_its_own_matrix(tmp_path, reference_tokenizer_dir):
    r = run("init", tmp_path / "u", "--preset", "tiny", "--attention", "elementwise", "--match-params",
            "--untie-embeddings", "--tokenizer", reference_tokenizer_dir)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "u" / "config.json").read_text())["tie_word_embeddings"] is False
    weights = load_file(tmp_path / "u" / "model.safetensors")
    assert weights["lm_head.weight"].shape == (32000, 128)
    # it starts as a copy of the input embedding (the tied model it replaces), but is its own tensor
    assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "u")
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    # both sides of a comparison grow by the same matrix, so --match-params still matches the untied baseline
    untied_baseline = parameter_count(model_config("tiny", "baseline", 32000, tie_word_embeddings=False))
    assert untied_baseline == parameter_count(model_config("tiny", "baseline", 32000)) + 32000 * 128
    assert abs(sum(t.numel() for t in weights.values()) - untied_baseline) <= 2 * 3 * 128 / 2
    assert f"baseline at this preset: {untied_baseline:,}" in r.output
    assert json.loads((tmp_path / "u" / "longctx.json").read_text())["args"]["tie_word_embeddings"] is False


@pytest.mark.parametrize("args,message", [
    (["init", "{root}/new", "--preset", "huge", "--attention", "baseline"], "unknown preset 'huge'"),
    (["init", "{root}/new", "--preset", "paper-17b", "--attention", "baseline"], "did you mean 'paper-1.7b'"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "sideways"], "unknown attention variant 'sideways'"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "position=dense,granularity=headwise"],
     "--attention is not an attention variant: a headwise gate needs heads: dense (G5)"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "kind=silu,source=free"],
     "gate kind 'silu' has no parameters to shape: drop source=free"),
    (["init", "{root}/taken", "--preset", "tiny", "--attention", "baseline"], "already exists; pass --overwrite"),
    (["init", "{root}/mine", "--preset", "tiny", "--attention", "baseline", "--overwrite"],
     "exists and was not made by longctx"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "baseline", "--tokenizer", "{root}/nope"],
     "neither reference nor bpe nor an existing tokenizer directory"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "baseline", "--tokenizer", "{root}/taken"],
     "holds no tokenizer files"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "baseline", "--match-params"],
     "--match-params shrinks a gated model"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "baseline", "--bpe-bos"],
     "--bpe-bos makes the BPE that --tokenizer bpe trains add a BOS; a tokenizer given as 'reference' keeps"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "headwise", "--dtype", "int3"], "unknown dtype 'int3'"),
    (["init", "{root}/new", "--attention", "baseline"], "Missing option '--preset'"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "baseline", "--config", "hidden_size=-3"],
     "--config does not give a model (Trying to create tensor with negative dimension"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "headwise", "--config", "num_attention_heads=\"x\""],
     "--config does not give a model (TypeError: Field 'num_attention_heads' expected int"),
    (["init", "{root}/new", "--preset", "tiny", "--attention", "baseline", "--config", "hidden_size"],
     "--config is invalid: 'hidden_size' is not KEY=VALUE"),
])
def test_init_bad_input_is_one_line_exit_2_nothing_written(args, message, tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    from longctx.core.files import OWNER_FILE, mark_output

    (root / "taken").mkdir()
    mark_output(root / "taken", "checkpoint")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("not longctx's")
    r = run(*[a.format(root=root) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in root.iterdir()) == ["mine", "taken"]
    assert [p.name for p in (root / "taken").iterdir()] == [OWNER_FILE]
    assert [p.name for p in (root / "mine").iterdir()] == ["notes.txt"]
