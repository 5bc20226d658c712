"""The next-token loss of the windows `longctx sinks` runs, from the decoder's final hidden states (the paper's
Table 4 reports perplexity beside the sink columns, Qiu et al. 2025).

The decoder forward is the one the measurements already run (`decoder(model)`), so the loss costs no second
forward; logits are formed a chunk of positions at a time, so a 32k window never holds 32k x vocab of them.
What a causal LM does to its logits after the output projection is architecture code (Gemma 2's soft-cap,
Cohere's scale, Granite's divisor), so it is a table here, and the model itself is the oracle: before
measuring, its own forward's logits on the first window's prefix are compared with this module's; where they
differ (an architecture with a step the table lacks), no loss is reported and the file says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from longctx.checkpoint.text_config import built_text_config
from longctx.sinks.attention import decoder

# What transformers' causal LMs do to the output projection's logits, by the text config key that turns it on
# (transformers v5: modeling_gemma2.py `Gemma2ForCausalLM.forward`, modeling_cohere.py `CohereForCausalLM.forward`,
# modeling_granite.py `GraniteForCausalLM.forward`).
LOGIT_STEPS: dict[str, Callable[[Any, float], Any]] = {
    "final_logit_softcapping": lambda x, cap: (x / cap).tanh() * cap,
    "logit_scale": lambda x, scale: x * scale,
    "logits_scaling": lambda x, divisor: x / divisor,
}
CHUNK_BYTES = 256 * 2**20  # fp32 logits of one chunk of positions
CHECK_TOKENS = 64  # prefix of the first window on which the model's own logits are compared
CHECK_TOLERANCE = 1e-3  # max |difference| of log-probabilities, relative to 1 + their magnitude


@dataclass
class LossSum:
    """Summed next-token negative log-likelihood (nats) and the number of predicted tokens."""

    nats: float = 0.0
    tokens: int = 0
    note: str | None = None  # why no loss is reported (the logits check failed)

    def as_dict(self) -> dict[str, Any]:
        """sinks.json's `loss`: mean nats per predicted token and its exponential, or nulls and the note."""
        if self.note is not None or not self.tokens:
            return {"mean": None, "perplexity": None, "tokens": 0, "note": self.note}
        mean = self.nats / self.tokens
        return {"mean": mean, "perplexity": math.exp(mean), "tokens": self.tokens, "note": None}


def _logits(model, hidden):
    """The model's logits of `hidden` (final hidden states), in fp32, after its architecture's steps."""
    config = built_text_config(model.config)
    logits = model.get_output_embeddings()(hidden).float()
    for key, step in LOGIT_STEPS.items():
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            logits = step(logits, float(value))
    return logits


def check_logits(model, window: list[int], device: str) -> str | None:
    """None when this module's logits of `window`'s prefix equal the model's own forward's; else why not."""
    import torch

    ids = torch.tensor([window[:CHECK_TOKENS]], device=device)
    with torch.inference_mode():
        own = model(input_ids=ids, use_cache=False).logits.float().log_softmax(-1)
        ours = _logits(model, decoder(model)(input_ids=ids, use_cache=False)[0]).log_softmax(-1)
    if own.shape != ours.shape:
        return f"the model's logits have shape {tuple(own.shape)}, its output projection's {tuple(ours.shape)}"
    gap = ((own - ours).abs() / (1 + own.abs())).max().item()
    if not gap <= CHECK_TOLERANCE:
        return (f"{type(model).__name__} transforms its logits in a way longctx does not know (log-probabilities "
                f"differ by up to {gap:.2g}); no loss is reported")
    return None


def add_window_losses(model, hidden, ids, total: LossSum) -> None:
    """Add the next-token loss of each row of `ids` (positions 1.. predicted from those before) to `total`."""
    import torch

    if total.note is not None:
        return
    vocab = model.get_output_embeddings().weight.shape[0]
    step = max(1, CHUNK_BYTES // (4 * vocab * ids.shape[0]))
    for start in range(0, ids.shape[1] - 1, step):
        end = min(start + step, ids.shape[1] - 1)
        logits = _logits(model, hidden[:, start:end])
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                ids[:, start + 1:end + 1].reshape(-1), reduction="sum")
        total.nats += nll.item()
        total.tokens += ids.shape[0] * (end - start)
