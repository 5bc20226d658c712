"""What `longctx yarn` writes, as vLLM (CPU build, 0.32) reads it.

References: vLLM `model_executor/layers/rotary_embedding/{__init__,yarn_scaling_rope,common}.py`
(`get_rope` -> `YaRNScalingRotaryEmbedding._compute_cos_sin_cache`), and transformers 5.19
`Qwen3ForCausalLM` for the end-to-end log-probabilities.
"""

import pytest
import torch
from conftest import TINY_TRAINED_LENGTH, require_vllm

from longctx.checkpoint.rope import read_rope
from longctx.yarn.reference import rope_cos_sin, yarn_attention_scaling, yarn_inv_freq
from longctx.yarn.scaling import apply_yarn, vllm_settings, yarn_checkpoint
from longctx.yarn.settings import YarnSettings


@pytest.mark.parametrize("factor,base,orig,head_dim", [(4.0, 1e6, 32768, 128), (2.0, 1e4, 4096, 64),
                                                      (8.0, 1e6, 4096, 128)])
def test_vllm_yarn_cos_sin_cache_matches_reference(factor, base, orig, head_dim):
    require_vllm()
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    cfg = apply_yarn({"model_type": "qwen3", "max_position_embeddings": orig, "rope_theta": base,
                      "rope_scaling": None}, factor).config
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


def _hf_prompt_logprobs(checkpoint, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return torch.tensor([logp[i - 1, ids[i]].item() for i in range(1, len(ids))])


def _vllm_prompt_logprobs(llm, ids):
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)
    lp = out[0].prompt_logprobs
    return torch.tensor([lp[i][ids[i]].logprob for i in range(1, len(ids))])


@pytest.mark.slow
def test_yarn_checkpoint_logprobs_agree_in_transformers_and_vllm(tiny_checkpoint, tmp_path, vllm_engines):
    """A tiny Qwen3 scaled x4 by `yarn`: prompt log-probs over a prompt longer than the trained length
    agree between transformers and vLLM to 1e-4 in fp32, and the YaRN scaling is really on."""
    out = tmp_path / "yarn"
    yarn_checkpoint(YarnSettings(checkpoint=str(tiny_checkpoint), factor=4.0, output=str(out)))
    rope = read_rope(__import__("json").loads((out / "config.json").read_text()))
    assert rope.context_length == 4 * TINY_TRAINED_LENGTH
    ids = torch.randint(3, 32000, (int(TINY_TRAINED_LENGTH * 2.5),), generator=torch.Generator().manual_seed(0)).tolist()
    llm = vllm_engines.get(out, max_model_len=rope.context_length)
    vllm_lp = _vllm_prompt_logprobs(llm, ids)
    hf_lp = _hf_prompt_logprobs(out, ids)
    assert (vllm_lp - hf_lp).abs().max().item() <= 1e-4
    # the scaled model differs from the unscaled one past the trained length (scaling not a silent no-op)
    unscaled = _hf_prompt_logprobs(tiny_checkpoint, ids)
    assert (unscaled - hf_lp)[TINY_TRAINED_LENGTH:].abs().max().item() > 1e-3


@pytest.mark.slow
def test_printed_hf_overrides_give_the_scaled_model_in_vllm(tiny_checkpoint, tmp_path, vllm_engines):
    """The `--hf-overrides` form `yarn` prints, applied to the unscaled checkpoint, computes what the
    written YaRN checkpoint computes (same prompt log-probs as transformers on the new directory)."""
    out = tmp_path / "yarn"
    yarn_checkpoint(YarnSettings(checkpoint=str(tiny_checkpoint), factor=4.0, output=str(out)))
    settings = vllm_settings(read_rope(__import__("json").loads((out / "config.json").read_text())))
    ids = torch.randint(3, 32000, (int(TINY_TRAINED_LENGTH * 2.5),), generator=torch.Generator().manual_seed(1)).tolist()
    llm = vllm_engines.get(tiny_checkpoint, max_model_len=settings["max_model_len"],
                           hf_overrides=settings["hf_overrides"])
    assert (_vllm_prompt_logprobs(llm, ids) - _hf_prompt_logprobs(out, ids)).abs().max().item() <= 1e-4
