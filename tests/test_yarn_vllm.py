"""What `longctx yarn` writes, as vLLM (CPU build, 0.32) reads it.

References: vLLM `model_executor/layers/rotary_embedding/{__init__,yarn_scaling_rope,common,
phi3_long_rope_scaled_rope}.py` (`get_rope` -> `YaRNScalingRotaryEmbedding._compute_cos_sin_cache`,
`Phi3LongRoPEScaledRotaryEmbedding`), and transformers 5.19 `Qwen3ForCausalLM`, `LlamaForCausalLM` and
`Phi3ForCausalLM` for the rotary embeddings and the end-to-end log-probabilities.
"""

import json

import pytest
import torch
from conftest import TINY_TRAINED_LENGTH, require_vllm
from logprob_helpers import hf_prompt_logprobs, vllm_prompt_logprobs

from longctx.rope.config import read_rope
from longctx.rope.reference import rope_cos_sin, yarn_attention_scaling, yarn_inv_freq
from longctx.yarn.scaling import apply_yarn, vllm_settings, yarn_checkpoint
from longctx.yarn.settings import YarnSettings


@pytest.mark.parametrize("factor,base,orig,head_dim", [(4.0, 1e6, 32768, 128), (2.0, 1e4, 4096, 64),
                                                      (8.0, 1e6, 4096, 128)])
def test_vllm_yarn_cos_sin_cache_matches_reference(factor, base, orig, head_dim):
    require_vllm()
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    cfg = apply_yarn({"model_type": "qwen3", "max_position_embeddings": orig, "rope_theta": base,
                      "rope_scaling": None}, factor, config_format="v5").config
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(head_dim, cfg["max_position_embeddings"], True, cfg["rope_parameters"], torch.float32)
    cache = rope.cos_sin_cache
    n = int(orig * factor)
    assert cache.shape[0] >= n  # rows for every position up to original × factor
    positions = [0, orig - 1, n - 1]
    cos, sin = rope_cos_sin(yarn_inv_freq(head_dim, base, factor, orig), positions, yarn_attention_scaling(factor))
    half = head_dim // 2
    torch.testing.assert_close(cache[positions, :half], cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(cache[positions, half:], sin, rtol=0, atol=1e-6)


def _prompt(seed):
    """Random token ids, 2.5x the trained length (past the original length, within every scaled length here)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 32000, (int(TINY_TRAINED_LENGTH * 2.5),), generator=generator).tolist()


@pytest.mark.slow
def test_yarn_checkpoint_logprobs_agree_in_transformers_and_vllm(tiny_checkpoint, tmp_path, vllm_engines):
    """A tiny Qwen3 scaled x4 by `yarn`: prompt log-probs over a prompt longer than the trained length
    agree between transformers and vLLM to 1e-4 in fp32, and the YaRN scaling is really on."""
    out = tmp_path / "yarn"
    yarn_checkpoint(YarnSettings(checkpoint=str(tiny_checkpoint), factor=4.0, output=str(out)))
    rope = read_rope(json.loads((out / "config.json").read_text()))
    assert rope.context_length == 4 * TINY_TRAINED_LENGTH
    ids = _prompt(seed=0)
    llm = vllm_engines.get(out, max_model_len=rope.context_length)
    vllm_lp = vllm_prompt_logprobs(llm, ids)
    hf_lp = hf_prompt_logprobs(out, ids)
    assert (vllm_lp - hf_lp).abs().max().item() <= 1e-4
    # the scaled model differs from the unscaled one past the trained length (scaling not a silent no-op)
    unscaled = hf_prompt_logprobs(tiny_checkpoint, ids)
    assert (unscaled - hf_lp)[TINY_TRAINED_LENGTH:].abs().max().item() > 1e-3


@pytest.mark.slow
def test_printed_hf_overrides_give_the_scaled_model_in_vllm(tiny_checkpoint, tmp_path, vllm_engines):
    """The `--hf-overrides` form `yarn` prints, applied to the unscaled checkpoint, computes what the
    written YaRN checkpoint computes (same prompt log-probs as transformers on the new directory)."""
    out = tmp_path / "yarn"
    yarn_checkpoint(YarnSettings(checkpoint=str(tiny_checkpoint), factor=4.0, output=str(out)))
    settings = vllm_settings(read_rope(json.loads((out / "config.json").read_text())))
    ids = _prompt(seed=1)
    llm = vllm_engines.get(tiny_checkpoint, max_model_len=settings["max_model_len"],
                           hf_overrides=settings["hf_overrides"])
    assert (vllm_prompt_logprobs(llm, ids) - hf_prompt_logprobs(out, ids)).abs().max().item() <= 1e-4


# --- a scaling replaced (llama3 -> YaRN) and YaRN in LongRoPE form (Phi-3) ------------------------------
# The tiny llama3 checkpoint (llama3 factor 8 over 256) yarn'd --rescale --factor 16: YaRN from 256 to 4096.
# The tiny phi3 checkpoint yarn'd --factor 4: Phi3Config turns rope_type "yarn" into "longrope"
# (configuration_phi3.py), so `yarn` writes YaRN's frequencies as LongRoPE factors.
REPLACED = {"llama3": 16.0, "phi3": 4.0}


@pytest.fixture(scope="module")
def replaced(tmp_path_factory, architecture_checkpoint):
    """{name: (source checkpoint, scaled checkpoint, factor)} for the two cases of REPLACED, by `yarn`."""
    root = tmp_path_factory.mktemp("replaced")
    out = {}
    for name, factor in REPLACED.items():
        src = architecture_checkpoint(name)
        yarn_checkpoint(YarnSettings(checkpoint=str(src), factor=factor, rescale=name == "llama3",
                                     output=str(root / f"{name}-yarn")))
        out[name] = (src, root / f"{name}-yarn", factor)
    return out


def _reference(name, rope_parameters, factor):
    """The reference inv_freq of the written RoPE: YaRN's, or for the LongRoPE form YaRN's factors evaluated
    the LongRoPE way (each pair's frequency within 1 fp32 ulp of YaRN's, checked here too)."""
    from longctx.rope.reference import longrope_inv_freq, yarn_longrope_factors

    base, n = rope_parameters["rope_theta"], TINY_TRAINED_LENGTH
    yarn = yarn_inv_freq(64, base, factor, n)
    if name != "phi3":
        return yarn
    factors = yarn_longrope_factors(64, base, factor, n)
    assert rope_parameters["short_factor"] == rope_parameters["long_factor"] == factors
    inv = longrope_inv_freq(factors, 64, base)
    assert ((inv - yarn).abs() / yarn).max().item() <= torch.finfo(torch.float32).eps
    return inv


@pytest.mark.parametrize("name", list(REPLACED))
def test_hf_and_vllm_rope_of_replaced_scalings_match_reference(name, replaced):
    """cos/sin of the model's rotary embedding in transformers and of vLLM's `get_rope`, both built from the
    written config, equal the reference at positions 0, original - 1, original and the last one."""
    require_vllm()
    import types

    from transformers import AutoConfig, AutoModelForCausalLM
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    _, out, factor = replaced[name]
    hf = AutoConfig.from_pretrained(out)
    n, length = TINY_TRAINED_LENGTH, int(TINY_TRAINED_LENGTH * factor)
    assert hf.max_position_embeddings == read_rope(json.loads((out / "config.json").read_text())).context_length \
        == length
    scale = yarn_attention_scaling(factor)
    inv = _reference(name, hf.rope_parameters, factor)
    emb = AutoModelForCausalLM.from_config(hf).model.rotary_emb
    for positions in ([0, 1, n - 1, n, length // 2, length - 1], [0, 7, n - 1]):  # long path, short path
        cos, sin = rope_cos_sin(inv, positions, scale)
        hf_cos, hf_sin = emb(torch.zeros(1, len(positions), 64), torch.tensor([positions]))
        for half in (slice(0, 32), slice(32, 64)):  # rotate_half layout: the D/2 frequencies twice
            torch.testing.assert_close(hf_cos[0, :, half], cos, rtol=0, atol=1e-6)
            torch.testing.assert_close(hf_sin[0, :, half], sin, rtol=0, atol=1e-6)

    config = VllmConfig()
    # Phi3LongRoPEScaledRotaryEmbedding takes its long factors when the current max_model_len exceeds the original
    config.model_config = types.SimpleNamespace(max_model_len=length)
    with set_current_vllm_config(config):
        rope = get_rope(64, hf.max_position_embeddings, True, hf.rope_parameters, torch.float32)
    positions = [0, 1, n - 1, n, length // 2, length - 1]
    cos, sin = rope_cos_sin(inv, positions, scale)
    if name == "phi3":
        assert type(rope).__name__ == "Phi3LongRoPEScaledRotaryEmbedding" and rope.use_long_rope
        short, long = rope.long_short_cos_sin_cache[:n], rope.long_short_cos_sin_cache[n:]
        torch.testing.assert_close(short[:n, :32], rope_cos_sin(inv, range(n), scale)[0], rtol=0, atol=1e-6)
        cache = long
    else:
        assert type(rope).__name__ == "YaRNScalingRotaryEmbedding"
        cache = rope.cos_sin_cache
    assert cache.shape[0] >= length
    torch.testing.assert_close(cache[positions, :32], cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(cache[positions, 32:], sin, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REPLACED))
def test_replaced_scalings_logprobs_agree_in_transformers_and_vllm(name, replaced, vllm_engines):
    """Prompt log-probs over a prompt 2.5x the original length agree between transformers and vLLM to 1e-4 in
    fp32, and differ from the source checkpoint's past the original length (the new scaling is on)."""
    src, out, factor = replaced[name]
    length = int(TINY_TRAINED_LENGTH * factor)
    ids = _prompt(seed=2)
    llm = vllm_engines.get(out, max_model_len=length)
    vllm_lp = vllm_prompt_logprobs(llm, ids)
    hf_lp = hf_prompt_logprobs(out, ids)
    assert (vllm_lp - hf_lp).abs().max().item() <= 1e-4
    before = hf_prompt_logprobs(src, ids)
    assert (before - hf_lp)[TINY_TRAINED_LENGTH:].abs().max().item() > 1e-3
