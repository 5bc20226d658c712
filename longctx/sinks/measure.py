"""`longctx sinks CKPT -o DIR`: attention sinks, massive activations and gate sparsity into `DIR/sinks.json`.

The paper's explanation for why gated models extend better (Qiu et al. 2025, §4.2-4.3): the sigmoid
output gate makes attention sparse and query-dependent, which removes the attention sink on the first
token and the massive activations of the residual stream that come with it. This measures that mechanism
on held-out text, per layer and averaged over layers (the definitions travel in the file):

- first-token attention (F-Attn): the attention probability on token 0, averaged over heads, query
  positions 1..L-1 (position 0 is excluded: it can only attend to itself, so its value is always 1)
  and windows; in a sliding-window layer a query past the window cannot see token 0 and counts as 0;
- M-Act: the largest |value| of a decoder layer's output hidden state (the residual stream leaving the
  layer) over tokens and channels of one window, averaged over windows (the max over windows is kept
  too); the average over layers is the number the paper's Table 4 reports;
- gate scores (gated models only): mean, median and fraction below 0.1 and 0.5 of sigmoid(gate) over
  tokens, dims and windows, per layer and per head; a baseline model has "no gate" (null in JSON);
- loss: the mean next-token cross-entropy of the windows and its perplexity (Table 4's PPL); it is held-out
  loss only on text the model was not trained on (another seed of a synthetic kind, or other text).

The model is loaded with longctx's attention function (`longctx.sinks.attention`), registered in
transformers' attention-function interface: every layer hands it the query and key it would hand SDPA (after
QK-norm and RoPE, whatever the architecture), it measures first-token attention from them, soft-capped and
windowed as the layer is, and returns the output of transformers' own backend, so the forward is the model's.
So it reads any architecture transformers runs through that interface, from the exact tensors its backend
uses. Long inputs never materialise an attention matrix (except in soft-capped models such as Gemma 2, whose
eager attention forms one), so it runs at 32k tokens on a GPU and at several thousand on CPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import checkpoint_dir, fingerprint, read_config, versions
from longctx.checkpoint.load import load_model, model_config
from longctx.checkpoint.tokenizer import load_tokenizer
from longctx.core.clock import utc_timestamp
from longctx.core.errors import InputError, SettingError, ref
from longctx.core.files import RULER_RUN_KIND, check_output, make_output, write_json
from longctx.core.special_tokens import leading_bos
from longctx.data.sources import iter_documents
from longctx.data.synthetic import KINDS
from longctx.info.describe import model_info
from longctx.rope.config import read_rope
from longctx.rope.settings import check_context
from longctx.sinks.attention import Collector, decoder, register_attention
from longctx.sinks.loss import LossSum, add_window_losses, check_logits
from longctx.sinks.schema import DEFINITIONS, SINKS_FILE, SINKS_FORMAT, SINKS_KIND, SinksResults
from longctx.sinks.settings import DEFAULT_MAX_LENGTH, SinksSettings


@dataclass(frozen=True)
class SinksOutcome:
    results: SinksResults
    file: Path  # sinks.json


def default_data_spec() -> str:
    return f"synthetic:{KINDS[0]}"


def token_windows(tokenizer, spec: str, windows: int, length: int, seed: int = 0) -> tuple[list[list[int]], bool]:
    """`windows` windows of `length` token ids: the documents of `spec` tokenized and concatenated (EOS
    between documents), cut into consecutive pieces, each behind the BOS the tokenizer adds (if any),
    so token 0 is what the model sees first in ordinary use. Returns (windows, whether BOS leads them)."""
    bos = [] if leading_bos(tokenizer) is None else [tokenizer.bos_token_id]
    body = length - len(bos)
    need = windows * body
    stream: list[int] = []
    for doc in iter_documents(spec, seed):
        stream += tokenizer(doc, add_special_tokens=False).input_ids
        if tokenizer.eos_token_id is not None:
            stream.append(tokenizer.eos_token_id)
        if len(stream) >= need:
            break
    if len(stream) < need:
        raise SettingError(f"data '{spec}' gave {len(stream)} tokens, fewer than the {need} needed for {windows} "
                           f"window(s) of {length}{' after a BOS' if bos else ''}; give more text, or lower "
                           f"{ref('tokens')} or {ref('length')}", SinksSettings)
    return [bos + stream[w * body:(w + 1) * body] for w in range(windows)], bool(bos)


def _load_model(ckpt: Path, dtype: str, device: str, trust_remote_code: bool):
    """The model with longctx's attention function, refused unless it has the decoder stack the hooks read."""
    model = load_model(ckpt, dtype=dtype, attn_implementation=register_attention(),
                       trust_remote_code=trust_remote_code)
    if not len(getattr(decoder(model), "layers", None) or ()):
        raise InputError(f"'{ckpt}' is a {type(model).__name__} without a stack of decoder layers (`layers`); "
                         "longctx sinks reads decoder-only language models")
    return model.to(device).eval()


def _forward_all(model, windows: list[list[int]], batch_size: int, chunk: int | None, device: str, progress: bool):
    """Run every window through the decoder with the collector's hooks; (collector, its summary, the windows'
    next-token loss)."""
    import torch
    from tqdm import tqdm

    loss = LossSum(note=check_logits(model, windows[0], device))  # before the collector: it sees no extra forward
    collector = Collector(model, chunk)
    try:
        bar = tqdm(total=len(windows), desc="sinks", unit="window", disable=not progress)
        with torch.inference_mode():
            for start in range(0, len(windows), batch_size):
                ids = torch.tensor(windows[start:start + batch_size], device=device)
                # the decoder alone: logits are formed a chunk of positions at a time for the loss
                hidden = decoder(model)(input_ids=ids, use_cache=False)[0]
                if start == 0:  # a model that bypasses the attention function fails now, not after every window
                    collector.check_seen()
                add_window_losses(model, hidden, ids, loss)
                bar.update(ids.shape[0])
        bar.close()
        return collector, collector.summary(), loss
    finally:
        collector.close()


def measure_sinks(s: SinksSettings, progress: bool = True, log: Callable[[str], None] = print) -> SinksOutcome:
    """Measure first-token attention, M-Act and gate sparsity of `s.checkpoint` into `s.output/sinks.json`
    (the folder is created if needed; other files there are left alone, so a RULER run directory works and
    `longctx compare` then shows these columns).

    Windows: ceil(tokens / length) of `length` tokens [default: the checkpoint's trained length, at most
    4096; beyond the checkpoint's context length is an error that suggests `longctx yarn`]. dtype [default:
    auto (the checkpoint's) on GPU, float32 on CPU]. Memory: the model's forward at batch_size x length with
    SDPA, plus one layer's q and k in fp32 and the score chunk; never an L x L matrix, except in a model with
    attention logit soft-capping (Gemma 2), whose layers run transformers' eager attention, as SDPA cannot cap.
    """
    import torch

    t0 = time.time()
    ckpt, length, tokenizer = _checked_inputs(s)
    device = s.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = s.dtype or ("float32" if device == "cpu" else "auto")
    n_windows = math.ceil(s.tokens / length)
    spec = s.data or default_data_spec()
    windows, bos = token_windows(tokenizer, spec, n_windows, length, s.seed)
    fp = fingerprint(ckpt)
    model = _load_model(ckpt, dtype, device, s.trust_remote_code)
    model_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    log(f"{n_windows} window(s) of {length} tokens ({n_windows * length} tokens) from {spec}, on {device} in "
        f"{model_dtype}")
    t_loaded = time.time()
    collector, stats, loss = _forward_all(model, windows, s.batch_size, s.chunk, device, progress)
    t_done = time.time()

    settings = {"data": spec, "tokens": s.tokens, "windows": n_windows, "length": length,
                "tokens_used": n_windows * length, "bos": bos, "seed": s.seed, "batch_size": s.batch_size,
                "chunk": s.chunk, "dtype": model_dtype, "device": device, **collector.attention_settings()}
    timings = {"load_s": round(t_loaded - t0, 3), "forward_s": round(t_done - t_loaded, 3),
               "total_s": round(t_done - t0, 3), "tokens_per_s": round(n_windows * length / (t_done - t_loaded), 1)}
    results = _results(model_info(ckpt, fp, s.trust_remote_code, name=s.name), settings, collector, stats, loss,
                       timings)
    out = Path(s.output)
    make_output(out, SINKS_KIND)
    write_json(out / SINKS_FILE, results)
    return SinksOutcome(results, out / SINKS_FILE)


def _checked_inputs(s: SinksSettings) -> tuple[Path, int, Any]:
    """The checkpoint, the window length and the tokenizer; every refusal comes before any measuring."""
    s.check_inputs()
    ckpt = checkpoint_dir(s.checkpoint, weights=True)
    rope = read_rope(read_config(ckpt))
    check_output(Path(s.output), (SINKS_KIND, RULER_RUN_KIND), inputs=[("checkpoint", ckpt)])
    length = s.length or min(rope.trained_length or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH)
    check_context(ckpt, rope, length)
    # A config transformers cannot build, and a tokenizer that encodes text to nothing (a folder with
    # tokenizer_config.json only), would otherwise give numbers computed from no text.
    model_config(ckpt, trust_remote_code=s.trust_remote_code)
    return ckpt, length, load_tokenizer(ckpt, s.trust_remote_code)


def _results(model: dict[str, Any], settings: dict[str, Any], collector: Collector, stats: dict[str, Any],
             loss: LossSum, timings: dict[str, float]) -> SinksResults:
    """sinks.json: the collector's per-layer statistics and their averages over layers."""
    gate_total = stats.pop("gate_total", None)
    fta, m_act = stats["first_token_attention"], stats["m_act"]
    return SinksResults(
        format=SINKS_FORMAT, model=model, settings=settings,
        definitions=DEFINITIONS, layers=collector.n_layers, heads=collector.heads, kv_heads=collector.kv_heads,
        **stats,
        averages={"first_token_attention": sum(fta) / len(fta), "m_act": sum(m_act) / len(m_act),
                  **{f"gate_{k}": (gate_total or {}).get(k) for k in ("mean", "median", "below_0_1", "below_0_5")}},
        loss=loss.as_dict(),
        versions=versions(),
        timings=timings,
        created=utc_timestamp(),
    )
