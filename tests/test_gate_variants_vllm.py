"""Every gate variant of the paper's design space served by the vLLM plugin (CPU, fp32) as transformers computes
it: prompt log-probs within 1e-4 and the same greedy tokens, on tiny random checkpoints with GQA 2:1 and YaRN x4,
a prompt longer than one KV block and past the original length; and `longctx init` matching the baseline's size.
(baseline, elementwise and headwise are tests/test_gated_vllm.py's.)"""

import pytest
import torch
from conftest import require_vllm
from safetensors.torch import load_file, save_file
from test_gated_vllm import INIT, NEW_TOKENS, PROMPT_LENGTHS, TRAINED, YARN, _hf, _prompts, _vllm

from longctx.init.checkpoint import init_checkpoint
from longctx.init.presets import model_config, parameter_count
from longctx.init.settings import InitSettings
from longctx.models.gates import NAMED

VARIANTS = [n for n in NAMED if n not in ("baseline", "elementwise", "headwise")]
COMBINATIONS = ["position=value,granularity=headwise,heads=shared,form=additive,activation=silu",
                "position=key,granularity=headwise,source=free,activation=ns-sigmoid"]


def _checkpoint(root, variant, tokenizer):
    out = init_checkpoint(InitSettings(output=str(root / variant.replace("=", "-").replace(",", "_")), preset="tiny",
                                       attention=variant, tokenizer=str(tokenizer), config={**YARN, **INIT})).output
    weights = load_file(out / "model.safetensors")
    g = torch.Generator().manual_seed(3)
    for name, w in weights.items():  # zero/one-initialised: random, so that a wrong use of them shows
        if name.endswith(("gate_logits", "head_norm.weight")):
            weights[name] = torch.randn(w.shape, generator=g)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("variant", [*VARIANTS, *COMBINATIONS])
def test_vllm_serves_the_variant_as_transformers_computes_it(variant, tmp_path, reference_tokenizer_dir,
                                                              vllm_engines):
    require_vllm()
    ckpt = _checkpoint(tmp_path, variant, reference_tokenizer_dir)
    prompts = _prompts(32000)
    llm = vllm_engines.get(ckpt, max_model_len=YARN["max_position_embeddings"])
    assert llm.llm_engine.vllm_config.model_config.architecture == "GatedQwen3ForCausalLM"
    assert llm.llm_engine.vllm_config.cache_config.block_size < PROMPT_LENGTHS[0] and PROMPT_LENGTHS[0] > TRAINED
    v_logprobs, v_greedy = _vllm(llm, prompts)
    _, h_logprobs, h_greedy = _hf(ckpt, prompts)
    for v, h in zip(v_logprobs, h_logprobs):
        assert (v - h).abs().max().item() <= 1e-4, variant
    assert v_greedy == h_greedy and all(len(t) == NEW_TOKENS for t in v_greedy)


@pytest.mark.parametrize("variant", [*VARIANTS, *COMBINATIONS])
def test_init_matches_the_baselines_parameters(variant):
    baseline = parameter_count(model_config("tiny", "baseline", 32000))
    gated = parameter_count(model_config("tiny", variant, 32000))
    matched = parameter_count(model_config("tiny", variant, 32000, match_params=True))
    per_unit = 3 * 128 * 2  # one FFN unit of every layer
    assert abs(matched - baseline) <= per_unit / 2 and (gated >= matched)
