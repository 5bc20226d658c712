"""The gate design space served by the vLLM plugin (CPU, fp32) as transformers computes it: prompt log-probs
within 1e-4 and the same greedy tokens, on tiny random checkpoints with GQA 2:1 and YaRN x4, a prompt longer than
one KV block and past the original length; and `longctx init` matching the baseline's size for every named row.

An engine takes ~8 s to build here, so vLLM serves a cover of the space rather than every named row: at every
position, each structural field (granularity, heads, source, form) at each of its values, every activation and
every kind at least once (`test_the_served_variants_cover_the_design_space` keeps it so as the space grows).
transformers computes every named row (tests/test_gate_variants.py); baseline, elementwise and headwise are
tests/test_gated_vllm.py's."""

import dataclasses

import pytest
import torch
from conftest import require_vllm
from safetensors.torch import load_file, save_file
from test_gated_vllm import INIT, NEW_TOKENS, PROMPT_LENGTHS, TRAINED, YARN, _hf, _prompts, _vllm

from longctx.core.errors import InputError
from longctx.init.checkpoint import init_checkpoint
from longctx.init.presets import model_config, parameter_count
from longctx.init.settings import InitSettings
from longctx.models.gates import CHOICES, NAMED, GateSpec, parse_gate

SERVED_ELSEWHERE = ["elementwise", "headwise"]  # tests/test_gated_vllm.py
OFF_DEFAULT = "granularity=headwise,heads=shared,source=free,form=additive"  # every structural field changed
SERVED = [f"{OFF_DEFAULT},activation=silu",
          "value-elementwise", f"position=value,{OFF_DEFAULT},activation=identity",
          "key-elementwise", f"position=key,{OFF_DEFAULT},activation=ns-sigmoid",
          "query-elementwise", f"position=query,{OFF_DEFAULT},activation=silu",
          "dense-elementwise", "position=dense,source=free,form=additive,activation=identity",  # G5: no heads left
          "silu", "rmsnorm"]
STRUCTURAL = ("granularity", "heads", "source", "form")


def _valid(**fields) -> bool:
    try:
        GateSpec(**fields)
    except InputError:
        return False
    return True


def test_the_served_variants_cover_the_design_space():
    served = [parse_gate(v) for v in (*SERVED_ELSEWHERE, *SERVED)]
    gates = [s for s in served if s.kind == "gate"]
    missing = [f"kind={k}" for k in CHOICES["kind"] if k not in {s.kind for s in served}]
    missing += [f"activation={a}" for a in CHOICES["activation"] if a not in {s.activation for s in gates}]
    missing += [f"position={p},{f}={v}" for p in CHOICES["position"] for f in STRUCTURAL for v in CHOICES[f]
                if _valid(position=p, **{f: v}) and not any(s.position == p and getattr(s, f) == v for s in gates)]
    assert not missing, f"add a served variant with {missing}"
    assert set(CHOICES) == {"kind", "position", "activation", *STRUCTURAL}, "a new field: say how it is covered"
    assert len({dataclasses.astuple(s) for s in served}) == len(served)


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
@pytest.mark.parametrize("variant", SERVED)
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


@pytest.mark.parametrize("variant", list(dict.fromkeys([*(n for n in NAMED if n != "baseline"), *SERVED])))
def test_init_matches_the_baselines_parameters(variant):
    baseline = parameter_count(model_config("tiny", "baseline", 32000))
    gated = parameter_count(model_config("tiny", variant, 32000))
    matched = parameter_count(model_config("tiny", variant, 32000, match_params=True))
    per_unit = 3 * 128 * 2  # one FFN unit of every layer
    assert abs(matched - baseline) <= per_unit / 2 and (gated >= matched)
