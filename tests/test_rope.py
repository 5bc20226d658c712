"""RoPE/YaRN settings and reference math.

Golden numbers: computed by hand from Peng et al., arXiv 2309.00071 §3.2 (eq. 17-20) in fp32. Equivalence:
transformers 5.19 `modeling_rope_utils._compute_yarn_parameters`
(`ROPE_INIT_FUNCTIONS["yarn"]`) and `Qwen3RotaryEmbedding.forward`.
"""

import itertools
import json
import math

import pytest
import torch
from transformers import AutoConfig, Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from longctx.core.errors import InputError
from longctx.rope.config import read_rope, set_rope_base, write_rope
from longctx.rope.reference import (
    rope_cos_sin,
    yarn_attention_scaling,
    yarn_correction_range,
    yarn_inv_freq,
)
from longctx.yarn.scaling import apply_yarn

QWEN3_LIKE = {  # what Qwen3 ships (transformers 4.x style): "rope_scaling": null, int base
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 128, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 64, "intermediate_size": 256, "num_hidden_layers": 1, "vocab_size": 100,
    "max_position_embeddings": 32768, "rope_theta": 1000000, "rope_scaling": None,
}


# --- golden values (Peng et al. §3.2) ------------------------------------------------------------


@pytest.mark.parametrize("dim,base,orig,untrunc,trunc", [
    (128, 1e6, 32768, (23.5959, 39.6509), (23, 40)),
    (128, 1e4, 4096, (20.9445, 45.0269), (20, 46)),
    (128, 1e6, 40960, None, (24, 41)),  # a wrong original length moves the ramp
    (128, 1e6, 131072, None, (30, 47)),
])
def test_correction_range_golden(dim, base, orig, untrunc, trunc):
    assert yarn_correction_range(dim, base, orig, truncate=True) == trunc
    if untrunc:
        low, high = yarn_correction_range(dim, base, orig, truncate=False)
        assert (round(low, 4), round(high, 4)) == untrunc


def test_inv_freq_golden_d128_base1e6_32k_x4():
    inv = yarn_inv_freq(128, 1e6, 4.0, 32768)
    theta = 1.0 / (1e6 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    assert inv.dtype == torch.float32 and inv.shape == (64,)
    assert inv[0].item() == 1.0
    assert inv[22].item() == pytest.approx(8.659643e-3, rel=1e-6)  # i < low keeps θ
    assert inv[22].item() == theta[22].item()
    assert inv[31].item() == pytest.approx(theta[31].item() * 0.647059, rel=1e-5)  # on the ramp
    assert torch.equal(inv[40:], theta[40:] / 4)  # i >= high get θ/s
    assert inv[63].item() == pytest.approx(3.102344e-7, rel=1e-6)
    # truncate off changes only the ramp (pairs 24..39 here); the largest change is 4.66% (pair 39: ramp
    # 16/17 vs 0.9594), which is pinned.
    off = yarn_inv_freq(128, 1e6, 4.0, 32768, truncate=False)
    rel = (off - inv).abs() / inv
    assert torch.equal(rel[:24], torch.zeros(24)) and torch.equal(rel[40:], torch.zeros(24))
    assert (rel[24:40] > 0).all() and rel.max().item() == pytest.approx(0.0466, abs=5e-4)


def test_attention_scaling_golden():
    assert yarn_attention_scaling(4.0) == pytest.approx(1.1386294361, abs=1e-10)
    assert yarn_attention_scaling(2.0) == pytest.approx(1.0693147181, abs=1e-10)
    assert yarn_attention_scaling(4.0) ** 2 == pytest.approx(1.296477, abs=1e-6)
    assert yarn_attention_scaling(1.0) == 1.0


# --- equivalence with transformers' own YaRN initialiser ------------------------------------------


@pytest.mark.parametrize("factor,base,head_dim,truncate,partial",
                         list(itertools.product([2.0, 4.0, 8.0], [1e4, 1e6], [64, 128], [True, False], [1.0]))
                         + [(4.0, 1e6, 128, True, 0.5), (4.0, 1e4, 64, False, 0.5)])
def test_matches_transformers_yarn_init(factor, base, head_dim, truncate, partial):
    orig = 32768
    cfg = Qwen3Config(hidden_size=256, num_attention_heads=2, head_dim=head_dim,
                      max_position_embeddings=int(orig * factor),
                      rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": factor,
                                       "original_max_position_embeddings": orig, "truncate": truncate,
                                       "partial_rotary_factor": partial})
    hf_inv, hf_scale = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    ours = yarn_inv_freq(int(head_dim * partial), base, factor, orig, truncate=truncate)
    torch.testing.assert_close(ours, hf_inv.float(), rtol=1e-6, atol=0)
    assert abs(yarn_attention_scaling(factor) - hf_scale) <= 1e-9


def test_cos_sin_match_qwen3_rotary_embedding_at_long_positions():
    """Qwen3RotaryEmbedding.forward (fp32, autocast off) vs ours at positions 0, N-1, N*s-1."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    orig, factor = 32768, 4.0
    cfg = Qwen3Config(hidden_size=256, num_attention_heads=2, head_dim=128, max_position_embeddings=131072,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": factor,
                                       "original_max_position_embeddings": orig})
    emb = Qwen3RotaryEmbedding(cfg)
    positions = [0, orig - 1, int(orig * factor) - 1]
    hf_cos, hf_sin = emb(torch.zeros(1, 3, 128), torch.tensor([positions]))
    cos, sin = rope_cos_sin(yarn_inv_freq(128, 1e6, factor, orig), positions, yarn_attention_scaling(factor))
    # HF repeats the D/2 frequencies twice (rotate_half layout)
    torch.testing.assert_close(hf_cos[0, :, :64], cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(hf_sin[0, :, 64:], sin, rtol=0, atol=1e-6)


# --- reading both config formats ---------------------------------------------------------------------


def test_read_qwen3_null_rope_scaling():
    r = read_rope(QWEN3_LIKE)
    assert (r.rope_type, r.theta, r.factor, r.trained_length, r.context_length) == ("default", 1000000, None, 32768,
                                                                                    32768)
    assert r.config_format == "v4" and not r.theta_is_default


def test_read_legacy_type_key_and_v5_dict():
    legacy = {**QWEN3_LIKE, "max_position_embeddings": 131072,
              "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}}
    r = read_rope(legacy)
    assert (r.rope_type, r.factor, r.original_max_position_embeddings, r.context_length) == ("yarn", 4.0, 32768,
                                                                                            131072)
    v5 = {k: v for k, v in legacy.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                             "original_max_position_embeddings": 32768, "beta_fast": 16.0}
    r5 = read_rope(v5)
    assert (r5.rope_type, r5.theta, r5.factor, r5.extra) == ("yarn", 1000000, 4.0, {"beta_fast": 16.0})


def test_top_level_original_overrides_dict_like_transformers(tmp_path):
    cfg = {**QWEN3_LIKE, "max_position_embeddings": 131072, "original_max_position_embeddings": 8192,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    assert read_rope(cfg).original_max_position_embeddings == 8192
    # transformers 5.19 applies the top-level value when it computes the frequencies
    hf_inv, _ = ROPE_INIT_FUNCTIONS["yarn"](_reload(cfg, tmp_path), "cpu")
    torch.testing.assert_close(hf_inv.float(), yarn_inv_freq(64, 1e6, 4.0, 8192), rtol=1e-6, atol=0)


def test_missing_base_uses_model_default_or_fails():
    cfg = {k: v for k, v in QWEN3_LIKE.items() if k not in ("rope_theta", "rope_scaling")}
    r = read_rope(cfg)
    assert r.theta == 10000 and r.theta_is_default  # Qwen3Config.default_theta, as transformers would use
    with pytest.raises(InputError, match="no RoPE base"):
        read_rope({**cfg, "model_type": "not-a-model"})
    # per-layer-type parameters (issue 30: read, no longer refused): those of the layers that see the whole sequence
    nested = read_rope({**cfg, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}})
    assert (nested.rope_type, nested.theta, nested.theta_is_default) == ("default", 10000, False)


# --- writing: what transformers reads back ------------------------------------------------------------


def _reload(cfg, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return AutoConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("fmt", ["v5", "v4", "both"])
def test_yarn_config_round_trip_through_transformers(fmt, tmp_path):
    res = apply_yarn(QWEN3_LIKE, 4.0, config_format=fmt)
    cfg = res.config
    assert cfg["max_position_embeddings"] == 131072
    assert "original_max_position_embeddings" not in cfg
    if fmt in ("v5", "both"):
        assert cfg["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 1000000, "factor": 4.0,
                                          "original_max_position_embeddings": 32768}
    if fmt in ("v4", "both"):
        assert cfg["rope_theta"] == 1000000 and cfg["rope_scaling"]["factor"] == 4.0
    hf = _reload(cfg, tmp_path)
    assert hf.max_position_embeddings == 131072
    rp = hf.rope_parameters
    assert (rp["rope_type"], rp["rope_theta"], rp["factor"], rp["original_max_position_embeddings"]) == (
        "yarn", 1000000, 4.0, 32768)
    inv, scale = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    torch.testing.assert_close(inv.float(), yarn_inv_freq(64, 1e6, 4.0, 32768), rtol=1e-6, atol=0)
    assert scale == pytest.approx(1.1386294361, abs=1e-9)
    # and our reader agrees with what we wrote
    back = read_rope(cfg)
    assert (back.rope_type, back.theta, back.factor, back.original_max_position_embeddings) == ("yarn", 1000000, 4.0,
                                                                                               32768)


def test_yarn_refusals_and_rescale():
    once = apply_yarn(QWEN3_LIKE, 4.0).config
    with pytest.raises(InputError, match="already YaRN-scaled.*--rescale"):
        apply_yarn(once, 2.0)
    again = apply_yarn(once, 2.0, rescale=True)  # recomputed from the original 32768, not from 131072
    assert again.rope.original_max_position_embeddings == 32768 and again.config["max_position_embeddings"] == 65536
    with pytest.raises(InputError, match="unknown RoPE type 'wibble'"):
        apply_yarn({**QWEN3_LIKE, "rope_scaling": {"rope_type": "wibble", "factor": 2.0}}, 4.0)
    with pytest.raises(InputError, match="already linear-scaled.*--rescale --original-max-position-embeddings N"):
        apply_yarn({**QWEN3_LIKE, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 4.0)
    with pytest.raises(InputError, match="factor must be > 1"):
        apply_yarn(QWEN3_LIKE, 1.0)


def test_yarn_explicit_original_and_optional_keys():
    res = apply_yarn(QWEN3_LIKE, 2.0, original=16384, beta_fast=16, truncate=False, config_format="v5")
    assert res.config["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 1000000, "factor": 2.0,
                                             "original_max_position_embeddings": 16384, "beta_fast": 16.0,
                                             "truncate": False}
    assert res.config["max_position_embeddings"] == 32768
    src = {**QWEN3_LIKE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                                          "attention_factor": 1.0}}
    res = apply_yarn(src, 4.0, rescale=True, config_format="v5")
    assert "attention_factor" not in res.config["rope_parameters"] and "attention_factor" in res.notes[0]


def test_set_rope_base_writes_integral_base_as_int(tmp_path):
    v4, _ = set_rope_base({**QWEN3_LIKE, "rope_theta": 10000, "max_position_embeddings": 4096}, 1e6, 32768)
    assert (v4["rope_theta"], v4["rope_scaling"]) == (1000000, None) and isinstance(v4["rope_theta"], int)
    assert "rope_parameters" not in v4  # the form the config had
    cfg, _ = set_rope_base({**QWEN3_LIKE, "rope_theta": 10000, "max_position_embeddings": 4096}, 1e6, 32768, "v5")
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 1000000}
    assert isinstance(cfg["rope_parameters"]["rope_theta"], int)
    assert "rope_theta" not in cfg and "rope_scaling" not in cfg and cfg["max_position_embeddings"] == 32768
    hf = _reload(cfg, tmp_path)
    assert hf.rope_parameters["rope_theta"] == 1000000 and hf.max_position_embeddings == 32768
    with pytest.raises(InputError, match="YaRN-scaled"):
        set_rope_base(apply_yarn(QWEN3_LIKE, 4.0).config, 1e7, 65536)


def test_write_rope_removes_stale_fields():
    stale = {**QWEN3_LIKE, "original_max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default"}}
    out = write_rope(stale, read_rope(QWEN3_LIKE), "v5")
    assert "original_max_position_embeddings" not in out and "rope_scaling" not in out and "rope_theta" not in out
    assert out["rope_parameters"] == {"rope_type": "default", "rope_theta": 1000000}
    assert math.isclose(read_rope(out).theta, 1e6)
