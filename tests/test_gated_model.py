"""The gated-attention family in transformers (longctx.models.gated_qwen3).

Reference: Qiu et al. 2025 (arXiv 2505.06708) §2.2, `Y' = Y * sigmoid(X W_g)` at position G1, and the
official code `qiuzh20/gated_attention` (`modeling_qwen3.py`); transformers 5.19 `Qwen3ForCausalLM` is
the baseline every gated model must reduce to when its gate is 1.
"""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from longctx.core.errors import InputError
from longctx.init.presets import TINY_QWEN3
from longctx.models.gated_qwen3 import (
    GatedQwen3Attention,
    GatedQwen3Config,
    GatedQwen3ForCausalLM,
    record_gate_scores,
)
from longctx.models.variants import gate_flags

SMALL = {**TINY_QWEN3, "vocab_size": 512}
GATED = ["elementwise", "headwise"]


def _model(variant, seed=0, attn="sdpa", **overrides):
    torch.manual_seed(seed)
    cfg = GatedQwen3Config(**{**SMALL, **overrides}, **gate_flags(variant))
    return GatedQwen3ForCausalLM._from_config(cfg, attn_implementation=attn).eval()


def _ids(n=40, seed=0):
    return torch.randint(3, SMALL["vocab_size"], (2, n), generator=torch.Generator().manual_seed(seed))


def _gate_forced_to_one(model):
    """Forward hooks that replace every sigmoid gate score by 1 (remove them to undo)."""
    return [m.gate_score.register_forward_hook(lambda _m, _i, out: torch.ones_like(out))
            for m in model.modules() if isinstance(m, GatedQwen3Attention)]


@pytest.mark.parametrize("variant", GATED)
def test_weight_names_and_shapes(variant):
    m = _model(variant)
    sd = m.state_dict()
    H, hd, D = SMALL["num_attention_heads"], SMALL["head_dim"], SMALL["hidden_size"]
    assert sd["model.layers.1.self_attn.g_proj.weight"].shape == ((H * hd, D) if variant == "elementwise" else (H, D))
    assert sd["model.layers.0.self_attn.q_proj.weight"].shape == (H * hd, D)  # q_proj stays baseline-sized
    assert not any("gate_proj" in k and "self_attn" in k for k in sd)
    assert m.config.architectures is None or m.config.architectures == ["GatedQwen3ForCausalLM"]
    # init: normal(0, initializer_range) like every other Linear (sigma starts near 0.5)
    assert abs(sd["model.layers.0.self_attn.g_proj.weight"].std().item() - 0.02) < 0.004


@pytest.mark.parametrize("variant", GATED)
def test_gate_forced_to_one_equals_qwen3_on_the_same_weights(variant):
    gated = _model(variant)
    qwen3 = Qwen3ForCausalLM._from_config(Qwen3Config(**SMALL), attn_implementation="sdpa").eval()
    result = qwen3.load_state_dict(gated.state_dict(), strict=False)
    assert result.unexpected_keys and all("g_proj" in k for k in result.unexpected_keys)
    assert not result.missing_keys
    ids = _ids()
    with torch.no_grad():
        ref = qwen3(ids).logits
        gated_logits = gated(ids).logits
        handles = _gate_forced_to_one(gated)
        forced = gated(ids).logits
        for h in handles:
            h.remove()
    torch.testing.assert_close(forced, ref, rtol=0, atol=1e-5)
    assert (gated_logits - ref).abs().max() > 1e-3  # the gate really acts when it is not forced


def test_baseline_config_is_qwen3():
    gated = _model("baseline")
    qwen3 = Qwen3ForCausalLM._from_config(Qwen3Config(**SMALL), attn_implementation="sdpa").eval()
    assert set(gated.state_dict()) == set(qwen3.state_dict())
    qwen3.load_state_dict(gated.state_dict())
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(gated(ids).logits, qwen3(ids).logits, rtol=0, atol=1e-6)


@pytest.mark.parametrize("variant", GATED)
def test_eager_and_sdpa_agree_and_attentions_are_recorded(variant):
    eager, sdpa = _model(variant, attn="eager"), _model(variant, attn="sdpa")
    ids = _ids()
    with torch.no_grad():
        out = eager(ids, output_attentions=True)
        torch.testing.assert_close(out.logits, sdpa(ids).logits, rtol=0, atol=1e-5)
    assert len(out.attentions) == SMALL["num_hidden_layers"] and out.attentions[0].shape == (2, 4, 40, 40)


@pytest.mark.parametrize("variant", GATED)
def test_gradient_checkpointing_gives_the_same_gradients(variant):
    ids = _ids(24)
    grads = []
    for checkpointing in (False, True):
        m = _model(variant).train()
        if checkpointing:
            m.gradient_checkpointing_enable()
        m(ids, labels=ids).loss.backward()
        g = m.model.layers[0].self_attn.g_proj.weight.grad
        assert g is not None and g.abs().sum() > 0
        grads.append(g.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("variant", GATED)
def test_save_load_round_trip_through_auto_classes(variant, tmp_path):
    m = _model(variant)
    m.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "gated_qwen3" and cfg["architectures"] == ["GatedQwen3ForCausalLM"]
    assert cfg[f"{variant}_attn_output_gate"] is True
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(loaded) is GatedQwen3ForCausalLM and type(AutoConfig.from_pretrained(tmp_path)) is GatedQwen3Config
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, m(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("variant", GATED)
def test_yarn_rope_parameters_work_like_qwen3(variant, tmp_path):
    yarn = {"max_position_embeddings": 256,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000, "factor": 4.0,
                                "original_max_position_embeddings": 64}}
    gated = _model(variant, **yarn)
    qwen3 = Qwen3ForCausalLM._from_config(Qwen3Config(**{**SMALL, **yarn}), attn_implementation="sdpa").eval()
    qwen3.load_state_dict(gated.state_dict(), strict=False)
    plain = _model(variant)  # same seed, same weights, no YaRN
    ids = _ids(200)  # past the original length
    with torch.no_grad():
        handles = _gate_forced_to_one(gated)
        torch.testing.assert_close(gated(ids).logits, qwen3(ids).logits, rtol=0, atol=1e-5)
        for h in handles:
            h.remove()
        assert (gated(ids).logits - plain(ids).logits)[:, 64:].abs().max() > 1e-3
    gated.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["rope_parameters"] == {**yarn["rope_parameters"], "rope_theta": 10000}
    assert "rope_scaling" not in cfg


@pytest.mark.parametrize("variant", GATED)
def test_generate_with_kv_cache_matches_full_recompute(variant):
    m = _model(variant)
    ids = _ids(12)[:1]
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        seq = ids
        for _ in range(8):
            seq = torch.cat([seq, m(seq).logits[:, -1:].argmax(-1)], dim=1)
    assert out.tolist() == seq.tolist()


@pytest.mark.parametrize("variant", GATED)
def test_record_gate_scores(variant):
    m = _model(variant)
    ids = _ids(10)
    with record_gate_scores(m) as scores, torch.no_grad():
        m(ids)
    H, hd = SMALL["num_attention_heads"], SMALL["head_dim"]
    assert sorted(scores) == [0, 1]
    assert scores[0].shape == ((2, 10, H * hd) if variant == "elementwise" else (2, 10, H))
    assert 0 < scores[0].min() and scores[0].max() < 1
    # sigma(X W_g) with X the input_layernorm output (the same input as q/k/v)
    layer = m.model.layers[0]
    with torch.no_grad():
        x = layer.input_layernorm(m.model.embed_tokens(ids))
        torch.testing.assert_close(scores[0], torch.sigmoid(layer.self_attn.g_proj(x)), rtol=0, atol=1e-6)
    # hooks are removed afterwards
    assert not m.model.layers[0].self_attn.gate_score._forward_hooks
    with record_gate_scores(_model("baseline")) as none:
        pass
    assert none == {}


def test_both_gates_is_an_input_error():
    with pytest.raises(InputError, match="both headwise_attn_output_gate and elementwise_attn_output_gate"):
        GatedQwen3Config(**SMALL, headwise_attn_output_gate=True, elementwise_attn_output_gate=True)
    with pytest.raises(InputError, match="unknown attention variant 'sideways'"):
        gate_flags("sideways")


IMPORTS = {
    "longctx first": "import longctx; import transformers",
    "transformers first": "import transformers; import longctx",
    # a longctx module that imports transformers (and then the gated module) must not hit a cycle
    "presets first": "from longctx.init.presets import model_config; model_config('tiny', 'headwise', 64)",
}


@pytest.mark.parametrize("order", list(IMPORTS))
@pytest.mark.slow
def test_import_longctx_registers_auto_classes(order, tmp_path):
    _model("headwise").save_pretrained(tmp_path)
    code = (f"{IMPORTS[order]}\nfrom transformers import AutoModelForCausalLM\n"
            f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\n"
            "print(type(m).__name__, m.config.attention_variant)")
    r = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["GatedQwen3ForCausalLM", "headwise"]


@pytest.mark.slow
def test_import_longctx_stays_light():
    code = "import sys, longctx; print('transformers' in sys.modules, 'torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr
