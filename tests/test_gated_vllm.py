"""HF <-> vLLM parity for the gated-attention family (CPU, fp32): the plugin's contract.

One engine per attention variant (baseline on vLLM's native Qwen3 path, G1 elementwise and G1
headwise through the `longctx` vLLM plugin). Each tiny checkpoint has GQA 2:1 and is YaRN-scaled x4
(trained length 256 -> 1024), so one engine covers: a prompt longer than one KV-cache block (vLLM CPU
uses 128-token blocks), positions past the original length, ragged batches, and 32 greedy tokens.
The headwise checkpoint has untied embeddings (`init --untie-embeddings`, the plugin's own `lm_head`
path); the other two tie them, as the presets do.

References: vLLM 0.32 `model_executor/models/qwen3.py` (the port), transformers 5.19
`Qwen3ForCausalLM` / `longctx.models.gated_qwen3` (the HF side).
"""

import json

import pytest
import torch
from conftest import require_vllm
from safetensors.torch import load_file, save_file

from longctx.init.checkpoint import init_checkpoint
from longctx.init.settings import InitSettings

TRAINED = 256
YARN = {"max_position_embeddings": 4 * TRAINED,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000, "factor": 4.0,
                            "original_max_position_embeddings": TRAINED}}
# initializer_range 0.1 (not 0.02) makes the random model's next-token distribution peaked enough
# that 32 greedy tokens are varied and the top-2 margin (>= ~5e-3) dwarfs fp32 engine differences.
INIT = {"initializer_range": 0.1}
PROMPT_LENGTHS = (600, 23)  # 600: five KV blocks and well past the original 256 positions
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def parity_checkpoints(tmp_path_factory, reference_tokenizer_dir):
    root = tmp_path_factory.mktemp("parity")
    untied = {"headwise": {"tie_word_embeddings": False}}
    paths = {v: init_checkpoint(InitSettings(output=str(root / v), preset="tiny", attention=v,
                                             tokenizer=str(reference_tokenizer_dir),
                                             config={**YARN, **INIT, **untied.get(v, {})})).output
             for v in ("baseline", "elementwise", "headwise")}
    # init starts an untied output matrix as a copy of the embedding; a different one makes an engine that
    # wrongly ties them fail the comparison
    weights = load_file(paths["headwise"] / "model.safetensors")
    shape = weights["lm_head.weight"].shape
    weights["lm_head.weight"] = 0.1 * torch.randn(shape, generator=torch.Generator().manual_seed(2))
    save_file(weights, paths["headwise"] / "model.safetensors", metadata={"format": "pt"})
    return paths


def _prompts(vocab):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def _hf(checkpoint, prompts):
    """Prompt log-probs (of each prompt token given the ones before) and 32 greedy tokens per prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    logprobs, greedy = [], []
    with torch.no_grad():
        for ids in prompts:
            lp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
            logprobs.append(lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])])
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
            greedy.append(out[0, len(ids):].tolist())
    return model, logprobs, greedy


def _vllm(llm, prompts):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=NEW_TOKENS, prompt_logprobs=0, temperature=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    logprobs = [torch.tensor([o.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
                for o, ids in zip(outs, prompts)]
    return logprobs, [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["baseline", "elementwise", "headwise"])
def test_hf_and_vllm_agree(variant, parity_checkpoints, vllm_engines):
    require_vllm()
    ckpt = parity_checkpoints[variant]
    cfg = json.loads((ckpt / "config.json").read_text())
    expected_arch = "Qwen3ForCausalLM" if variant == "baseline" else "GatedQwen3ForCausalLM"
    assert cfg["architectures"] == [expected_arch] and cfg["num_attention_heads"] == 2 * cfg["num_key_value_heads"]
    assert cfg["tie_word_embeddings"] is (variant != "headwise")
    prompts = _prompts(cfg["vocab_size"])

    llm = vllm_engines.get(ckpt, max_model_len=YARN["max_position_embeddings"])
    vconf = llm.llm_engine.vllm_config
    assert vconf.model_config.architecture == expected_arch  # gated: our class, via the entry-point plugin
    assert vconf.cache_config.block_size < PROMPT_LENGTHS[0]
    v_logprobs, v_greedy = _vllm(llm, prompts)

    model, h_logprobs, h_greedy = _hf(ckpt, prompts)
    for v, h in zip(v_logprobs, h_logprobs):
        assert (v - h).abs().max().item() <= 1e-4
    assert v_greedy == h_greedy
    assert all(len(set(toks)) > 4 for toks in h_greedy)  # not a degenerate repeat-one-token check

    # the checks have teeth: YaRN is on past the original length, and the gate changes the output
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([prompts[0]])
    unscaled = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, rope_parameters={"rope_type": "default", "rope_theta": 10000}).eval()
    with torch.no_grad():
        assert (unscaled(ids).logits - model(ids).logits)[0, TRAINED:].abs().max() > 1e-3
        if variant != "baseline":
            handles = [m.gate_score.register_forward_hook(lambda _m, _i, out: torch.ones_like(out))
                       for m in model.modules() if hasattr(m, "gate_score")]
            ungated = model(ids).logits[0].log_softmax(-1)[torch.arange(len(prompts[0]) - 1), ids[0, 1:]]
            for h in handles:
                h.remove()
            assert (ungated - h_logprobs[0]).abs().max() > 1e-2
