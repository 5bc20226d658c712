"""Prompt log-probabilities of a checkpoint in transformers and in a vLLM engine, for the parity tests."""

from __future__ import annotations

import torch


def hf_prompt_logprobs(checkpoint, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1, by transformers in fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return torch.tensor([logp[i - 1, ids[i]].item() for i in range(1, len(ids))])


def vllm_prompt_logprobs(llm, ids: list[int]) -> torch.Tensor:
    """The same by the vLLM engine `llm` (its prompt log-probs)."""
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                       use_tqdm=False)
    lp = out[0].prompt_logprobs
    return torch.tensor([lp[i][ids[i]].logprob for i in range(1, len(ids))])
