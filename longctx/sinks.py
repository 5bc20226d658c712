"""`longctx sinks`: attention sinks, massive activations and gate sparsity (Qiu et al. 2025, §4.2-4.3, Table 4).

The paper's explanation for why gated models extend better: the sigmoid output gate makes attention
sparse and query-dependent, which removes the attention sink on the first token and the massive
activations of the residual stream that come with it. This module measures that mechanism on held-out
text (definitions: shared/reference/gated.md §5), per layer and averaged over layers:

- first-token attention (F-Attn): the attention probability on token 0, averaged over heads, query
  positions 1..L-1 (position 0 is excluded: it can only attend to itself, so its value is always 1)
  and windows;
- M-Act: the largest |value| of a decoder layer's output hidden state (the residual stream leaving the
  layer) over tokens and channels of one window, averaged over windows (the max over windows is kept
  too); the average over layers is the number the paper reports;
- gate scores (gated models only): mean, median and fraction below 0.1 and 0.5 of sigmoid(gate) over
  tokens, dims and windows, per layer and per head; a baseline model has "no gate" (null in JSON).

Long inputs never materialise an attention matrix. Hooks take each layer's queries and keys after
QK-norm (q_norm/k_norm outputs), apply the layer's own RoPE from the cos/sin the layer receives (YaRN's
attention scaling is already inside cos/sin, so inside q and k, exactly as in the model), and compute
p(token 0 | query i) = exp(s_i0 - logsumexp_{j<=i} s_ij), s = q.k * scaling, for chunks of queries
(GQA: each query head uses its KV head). So it runs at 32k tokens on a GPU and at several thousand
on CPU, with any attention backend. Writes sinks.json (`SinksResults`), sinks.md (a table shaped like
the paper's Table 4, then per-layer tables) and sinks.png (F-Attn and M-Act by layer).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from longctx.errors import InputError
from longctx.report import ModelInfo, markdown_row, read_versioned_json

SINKS_FORMAT = "longctx-sinks/1"
SINKS_FILE = "sinks.json"
DEFAULT_TOKENS = 16384
DEFAULT_MAX_LENGTH = 4096  # the paper's pretraining length; the default window never exceeds it
SCORE_BUDGET_BYTES = 256 * 2**20  # fp32 scores of one query chunk (all heads, all windows of a batch)
DTYPES = ("auto", "float32", "bfloat16", "float16")
GATE_BINS = 10_000  # histogram bins over [0, 1] for the gate median (error <= 1/GATE_BINS)

DEFINITIONS = {
    "first_token_attention": "mean attention probability on token 0 over heads, query positions 1..L-1 "
                             "(position 0 excluded: it attends only to itself) and windows; per layer, "
                             "and averaged over layers",
    "m_act": "max |hidden state| of each decoder layer's output (the residual stream) over tokens and "
             "channels of a window, averaged over windows (m_act_max: the max over windows); per layer, "
             "and averaged over layers",
    "gate": "sigmoid gate scores over tokens, dims and windows: mean, median (from a histogram of "
            f"{GATE_BINS} bins over [0, 1]), fraction below 0.1 and below 0.5; per layer, per head, and over "
            "all layers; null for a model without an output gate",
}


class GateStats(TypedDict):
    variant: str  # elementwise | headwise
    mean: list[float]  # per layer
    median: list[float]
    below_0_1: list[float]
    below_0_5: list[float]
    per_head: dict[str, list[list[float]]]  # stat name (as above) -> [layer][head]


class SinksResults(TypedDict):
    """`sinks.json`. Per-layer lists are indexed by layer (0 = closest to the embeddings)."""

    format: str
    model: ModelInfo
    settings: dict[str, Any]  # data, tokens asked, windows, length, tokens used, BOS, batch, chunk, dtype, device
    definitions: dict[str, str]
    layers: int
    heads: int
    kv_heads: int
    first_token_attention: list[float]
    first_token_attention_per_head: list[list[float]]  # [layer][head]
    m_act: list[float]
    m_act_max: list[float]
    gate: GateStats | None
    # first_token_attention, m_act (means over layers); gate_mean, gate_median, gate_below_0_1,
    # gate_below_0_5 over all layers (null without a gate)
    averages: dict[str, float | None]
    versions: dict[str, str | None]
    timings: dict[str, float]
    created: str


# --- the first-token probability without an attention matrix --------------------------------------


def first_token_probs(query, key, scaling: float, chunk: int | None = None):
    """p(token 0 | query i) of causal softmax attention, without materialising the L x L matrix.

    query (B, H, L, D) and key (B, KV, L, D), both after QK-norm and RoPE (as the attention backend
    receives them); H a multiple of KV (query head h uses KV head h // (H/KV), transformers'
    `repeat_kv`). Scores are computed in fp32 for `chunk` queries at a time against the keys they may
    see (j <= i): p = exp(s_i0 - logsumexp_{j<=i} s_ij). Returns (B, H, L) fp32.

    Memory beyond q and k: fp32 copies of q and k (B*L*(H+KV)*D*4 bytes) plus ~2 score buffers of
    B*H*chunk*L*4 bytes; `chunk` defaults to the largest that keeps one buffer under 256 MiB.
    """
    import torch

    b, h, n, d = query.shape
    kv = key.shape[1]
    if chunk is None:
        chunk = max(1, min(n, SCORE_BUDGET_BYTES // (4 * b * h * n)))
    q = query.float().reshape(b, kv, h // kv, n, d)
    k = key.float().unsqueeze(2)  # (B, KV, 1, L, D): broadcast over the query heads of each group
    out = q.new_empty(b, kv, h // kv, n)
    pos = torch.arange(n, device=q.device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        scores = torch.matmul(q[..., start:stop, :], k[..., :stop, :].transpose(-1, -2)) * scaling
        scores.masked_fill_(pos[None, :stop] > pos[start:stop, None], float("-inf"))
        out[..., start:stop] = torch.exp(scores[..., 0] - torch.logsumexp(scores, dim=-1))
    return out.reshape(b, h, n)


# --- hooks: collect the metrics during an ordinary forward ----------------------------------------


class _Collector:
    """Forward hooks on a Qwen3-architecture decoder stack that reduce each layer's tensors to sums
    as the forward goes, so nothing per layer outlives the layer (memory: one layer's q and k)."""

    def __init__(self, model, chunk: int | None):
        import torch
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

        self.torch, self.rope, self.chunk = torch, apply_rotary_pos_emb, chunk
        layers = list(model.base_model.layers)
        attn = layers[0].self_attn
        self.n_layers, self.heads = len(layers), attn.config.num_attention_heads
        self.kv_heads = attn.config.num_key_value_heads
        device = next(model.parameters()).device
        self.fta_sum = torch.zeros(self.n_layers, self.heads, dtype=torch.float64, device=device)
        self.fta_count = 0  # query positions counted per head (windows x (L-1))
        self.m_act: list[list] = [[] for _ in layers]  # per layer: per-window maxima (tensors)
        self.variant = getattr(attn, "variant", "baseline") if hasattr(attn, "gate_score") else "baseline"
        if self.variant != "baseline":
            z = lambda dt: torch.zeros(self.n_layers, self.heads, dtype=dt, device=device)  # noqa: E731
            self.g_sum, self.g_n = z(torch.float64), z(torch.int64)
            self.g_01, self.g_05 = z(torch.int64), z(torch.int64)
            self.g_hist = torch.zeros(self.n_layers, self.heads, GATE_BINS, dtype=torch.int64, device=device)
        self._qk: dict[str, Any] = {}
        self.handles = []
        for i, layer in enumerate(layers):
            a = layer.self_attn
            self.handles += [
                a.q_norm.register_forward_hook(lambda _m, _i, out: self._qk.__setitem__("q", out)),
                a.k_norm.register_forward_hook(lambda _m, _i, out: self._qk.__setitem__("k", out)),
                a.register_forward_hook(lambda m, _a, kw, _o, i=i: self._attention(i, m, kw), with_kwargs=True),
                layer.register_forward_hook(lambda _m, _i, out, i=i: self._layer_output(i, out)),
            ]
            if self.variant != "baseline":
                self.handles.append(a.gate_score.register_forward_hook(lambda _m, _i, out, i=i: self._gate(i, out)))

    def close(self):
        for h in self.handles:
            h.remove()

    def _attention(self, i: int, module, kwargs):
        # q_norm/k_norm outputs are (B, L, heads, D); the attention transposes them to (B, heads, L, D)
        # before RoPE, and so do we: the same function on the same cos/sin gives the same q and k.
        q, k = self._qk.pop("q").transpose(1, 2), self._qk.pop("k").transpose(1, 2)
        cos, sin = kwargs["position_embeddings"]
        q, k = self.rope(q, k, cos, sin)
        p = first_token_probs(q, k, module.scaling, self.chunk)
        self.fta_sum[i] += p[:, :, 1:].sum(dim=(0, 2), dtype=self.torch.float64)
        if i == 0:
            self.fta_count += p.shape[0] * (p.shape[2] - 1)

    def _layer_output(self, i: int, out):
        hidden = out[0] if isinstance(out, tuple) else out
        self.m_act[i].append(hidden.detach().abs().amax(dim=(1, 2)).float())

    def _gate(self, i: int, out):
        torch = self.torch
        scores = out.detach().float()
        scores = scores.reshape(*scores.shape[:2], self.heads, -1)  # (B, L, heads, D or 1)
        for h in range(self.heads):  # one head at a time bounds the histogram's index buffer
            x = scores[:, :, h]
            self.g_sum[i, h] += x.sum(dtype=torch.float64)
            self.g_n[i, h] += x.numel()
            self.g_01[i, h] += (x < 0.1).sum()
            self.g_05[i, h] += (x < 0.5).sum()
            bins = (x * GATE_BINS).long().clamp_(0, GATE_BINS - 1).flatten()
            self.g_hist[i, h] += torch.bincount(bins, minlength=GATE_BINS)

    def summary(self) -> dict[str, Any]:
        torch = self.torch
        fta_heads = (self.fta_sum / self.fta_count).cpu()
        maxima = [torch.cat(m).cpu() for m in self.m_act]
        out: dict[str, Any] = {
            "first_token_attention": fta_heads.mean(dim=1).tolist(),
            "first_token_attention_per_head": fta_heads.tolist(),
            "m_act": [m.mean().item() for m in maxima],
            "m_act_max": [m.max().item() for m in maxima],
            "gate": None,
        }
        if self.variant != "baseline":
            s, n, b01, b05, hist = (t.cpu() for t in (self.g_sum, self.g_n, self.g_01, self.g_05, self.g_hist))
            per_head = {"mean": s / n, "median": _hist_median(hist), "below_0_1": b01 / n, "below_0_5": b05 / n}
            layer = {"mean": s.sum(1) / n.sum(1), "median": _hist_median(hist.sum(1)),
                     "below_0_1": b01.sum(1) / n.sum(1), "below_0_5": b05.sum(1) / n.sum(1)}
            total = {"mean": s.sum() / n.sum(), "median": _hist_median(hist.sum((0, 1))),
                     "below_0_1": b01.sum() / n.sum(), "below_0_5": b05.sum() / n.sum()}
            out["gate"] = {"variant": self.variant, **{k: v.tolist() for k, v in layer.items()},
                           "per_head": {k: v.tolist() for k, v in per_head.items()}}
            out["gate_total"] = {k: float(v) for k, v in total.items()}
        return out


def _hist_median(hist):
    """Median of values in [0, 1] from counts in GATE_BINS equal bins (last dim), linear within a bin."""
    import torch

    hist = hist.double()
    cum = hist.cumsum(-1)
    half = cum[..., -1:] / 2
    idx = torch.searchsorted(cum.contiguous(), half).clamp_(max=hist.shape[-1] - 1)
    below = torch.where(idx > 0, cum.gather(-1, (idx - 1).clamp(min=0)), torch.zeros_like(half))
    inside = hist.gather(-1, idx).clamp(min=1)
    return ((idx + (half - below) / inside) / hist.shape[-1]).squeeze(-1)


# --- data ------------------------------------------------------------------------------------------


def default_data_spec() -> str:
    from longctx.train.synthetic import KINDS

    return f"synthetic:{KINDS[0]}"


def token_windows(tokenizer, spec: str, windows: int, length: int, seed: int = 0) -> tuple[list[list[int]], bool]:
    """`windows` windows of `length` token ids: the documents of `spec` tokenized and concatenated (EOS
    between documents), cut into consecutive pieces, each behind the BOS the tokenizer adds (if any),
    so token 0 is what the model sees first in ordinary use. Returns (windows, whether BOS leads them)."""
    from longctx.eval.runner import special_tokens_added
    from longctx.train.data import iter_documents

    bos = [tokenizer.bos_token_id] if special_tokens_added(tokenizer) and tokenizer.bos_token_id is not None else []
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
        raise InputError(f"data '{spec}' gave {len(stream)} tokens, fewer than the {need} needed for {windows} "
                         f"window(s) of {length}{' after a BOS' if bos else ''}; give more text, or lower --tokens "
                         "or --length")
    return [bos + stream[w * body:(w + 1) * body] for w in range(windows)], bool(bos)


# --- the analysis ----------------------------------------------------------------------------------


def _load_model(ckpt: Path, dtype: str, device: str, attn_implementation: str):
    import torch
    from transformers import AutoModelForCausalLM

    import longctx.models.gated_qwen3  # noqa: F401  (registers the gated family with the Auto classes)

    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch_dtype, attn_implementation=attn_implementation)
    except (OSError, ValueError, KeyError) as e:
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot load the model in '{ckpt}': {first_line}") from None
    layers = getattr(model.base_model, "layers", None)
    attn = getattr(layers[0], "self_attn", None) if layers else None
    if not all(hasattr(attn, a) for a in ("q_norm", "k_norm", "scaling", "config")):
        raise InputError(f"'{ckpt}' is a {type(model).__name__}; longctx sinks reads Qwen3-architecture models "
                         "(Qwen3 and the gated_qwen3 family)")
    if any(layer.self_attn.sliding_window for layer in layers):
        raise InputError(f"'{ckpt}' has sliding-window attention layers; longctx sinks needs full causal attention")
    return model.to(device).eval()


def analyze_sinks(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *, data: str | None = None,
                  tokens: int = DEFAULT_TOKENS, length: int | None = None, batch_size: int = 1,
                  chunk: int | None = None, dtype: str | None = None, device: str | None = None,
                  seed: int = 0, plot: bool = True, progress: bool = True,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure first-token attention, M-Act and gate sparsity of `checkpoint`; write sinks.json, sinks.md
    and sinks.png into `out_dir` (created if needed; other files there are left alone, so a RULER run
    directory works and `longctx compare` then shows these columns).

    data: a `longctx.train.data.iter_documents` spec [default: the first built-in synthetic corpus].
    tokens: analyse ceil(tokens / length) windows of `length` tokens [default 16384].
    length: window length [default: the checkpoint's trained length, at most 4096]; beyond the
      checkpoint's context length is an error that suggests `longctx yarn`.
    batch_size: windows per forward [1]. chunk: queries per score chunk [default: one chunk's fp32
      scores stay under 256 MiB]. dtype: float32/bfloat16/float16/auto [default: auto (the
      checkpoint's) on GPU, float32 on CPU]. device [default: cuda when available].
    Memory: the model's forward at batch_size x length with SDPA, plus one layer's q and k in fp32 and
    the score chunk (see `first_token_probs`); never an L x L matrix.
    log: where the resolved settings are said before the long work (progress: a tqdm bar per window).
    Returns {"results": SinksResults, "files", "markdown", "notes"}.
    """
    import torch

    from longctx.checkpoint import checkpoint_dir, fingerprint, read_config, versions
    from longctx.eval.runner import check_length, model_info
    from longctx.report import write_atomic
    from longctx.rope import read_rope

    t0 = time.time()
    ckpt = checkpoint_dir(checkpoint)
    cfg = read_config(ckpt)
    rope = read_rope(cfg)
    out = Path(out_dir)
    if out.resolve() == ckpt.resolve():
        raise InputError(f"output '{out}' is the checkpoint directory; choose another -o")
    if out.exists() and not out.is_dir():
        raise InputError(f"output '{out}' exists and is not a directory; choose another -o")
    if length is None:
        length = min(rope.trained_length or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH)
    if length < 2:
        raise InputError(f"--length {length} is too short: first-token attention needs at least 2 tokens")
    check_length(ckpt, rope, length)
    if tokens < 1 or batch_size < 1 or (chunk is not None and chunk < 1):
        raise InputError("--tokens, --batch-size and --chunk must be positive")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or ("float32" if device == "cpu" else "auto")
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}")
    n_windows = math.ceil(tokens / length)

    from transformers import AutoTokenizer

    from longctx.train.data import check_data_specs

    try:
        tokenizer = AutoTokenizer.from_pretrained(ckpt)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load the tokenizer in '{ckpt}' ({type(e).__name__}); the checkpoint needs its "
                         "tokenizer files") from None
    spec = data or default_data_spec()
    check_data_specs([spec])
    windows, bos = token_windows(tokenizer, spec, n_windows, length, seed)
    fp = fingerprint(ckpt)
    model = _load_model(ckpt, dtype, device, "sdpa")
    log(f"{n_windows} window(s) of {length} tokens ({n_windows * length} tokens) from {spec}, on {device} in "
        f"{str(next(model.parameters()).dtype).removeprefix('torch.')}")
    t_loaded = time.time()

    collector = _Collector(model, chunk)
    try:
        from tqdm import tqdm

        bar = tqdm(total=n_windows, desc="sinks", unit="window", disable=not progress)
        with torch.inference_mode():
            for start in range(0, n_windows, batch_size):
                ids = torch.tensor(windows[start:start + batch_size], device=device)
                model.base_model(input_ids=ids, use_cache=False)  # no lm_head: 32k x vocab logits are not needed
                bar.update(ids.shape[0])
        bar.close()
        stats = collector.summary()
    finally:
        collector.close()
    t_done = time.time()

    gate_total = stats.pop("gate_total", None)
    fta, m_act = stats["first_token_attention"], stats["m_act"]
    results = SinksResults(
        format=SINKS_FORMAT, model=model_info(ckpt, cfg, rope, fp),
        settings={"data": spec, "tokens": tokens, "windows": n_windows, "length": length,
                  "tokens_used": n_windows * length, "bos": bos, "seed": seed, "batch_size": batch_size,
                  "chunk": chunk, "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                  "device": device, "attn_implementation": "sdpa"},
        definitions=DEFINITIONS, layers=collector.n_layers, heads=collector.heads, kv_heads=collector.kv_heads,
        **stats,
        averages={"first_token_attention": sum(fta) / len(fta), "m_act": sum(m_act) / len(m_act),
                  **{f"gate_{k}": (gate_total or {}).get(k) for k in ("mean", "median", "below_0_1", "below_0_5")}},
        versions=versions(),
        timings={"load_s": round(t_loaded - t0, 3), "forward_s": round(t_done - t_loaded, 3),
                 "total_s": round(t_done - t0, 3), "tokens_per_s": round(n_windows * length / (t_done - t_loaded), 1)},
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    markdown = sinks_markdown([results]) + "\n\n" + layer_markdown(results)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / SINKS_FILE, json.dumps(results, indent=2) + "\n")
    write_atomic(out / "sinks.md", markdown + "\n")
    files, notes = [out / SINKS_FILE, out / "sinks.md"], []
    if plot:
        try:
            files.append(plot_sinks([results], out / "sinks.png"))
        except InputError as e:
            notes.append(f"no plot: {e}")
    return {"results": results, "files": files, "markdown": markdown, "notes": notes}


# --- reading, tables, plots --------------------------------------------------------------------------


def load_sinks(path: str | os.PathLike) -> SinksResults:
    """A sinks.json (or the directory holding one), or InputError saying what is wrong."""
    p = Path(path)
    if p.is_dir():
        p = p / SINKS_FILE
    if not p.is_file():
        raise InputError(f"{p} does not exist; run 'longctx sinks CKPT -o DIR' first")
    return read_versioned_json(p, SINKS_FORMAT, "sinks")  # type: ignore[return-value]


def _num(v: float | None, digits: int = 3) -> str:
    return "no gate" if v is None else f"{v:.{digits}f}"


def _m_act(v: float) -> str:
    """Whole numbers as the paper prints M-Act (1053, 94); 3 significant digits below 10 (tiny models)."""
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.3g}"


SUMMARY_COLUMNS = ["Model", "First-token attn", "M-Act", "Gate mean", "Gate median", "Gate <0.1", "Gate <0.5"]


def sinks_markdown(runs: Sequence[SinksResults], names: Sequence[str] | None = None) -> str:
    """The paper's Table 4 shape: a row per checkpoint, averages over layers."""
    names = names or [r["model"].get("name", "?") for r in runs]
    lines = [markdown_row(SUMMARY_COLUMNS), markdown_row(["---"] * len(SUMMARY_COLUMNS))]
    for name, r in zip(names, runs):
        a = r["averages"]
        lines.append(markdown_row([name, _num(a["first_token_attention"]), _m_act(a["m_act"]),
                           *[_num(a[f"gate_{k}"]) for k in ("mean", "median", "below_0_1", "below_0_5")]]))
    return "\n".join(lines)


def layer_markdown(r: SinksResults) -> str:
    """Per layer: first-token attention, M-Act (mean and max over windows), gate stats; then, for a gated
    model, the gate mean per head."""
    g = r["gate"]
    head = ["Layer", "First-token attn", "M-Act", "M-Act (max)", "Gate mean", "Gate median", "Gate <0.1", "Gate <0.5"]
    lines = [markdown_row(head), markdown_row(["---"] * len(head))]
    for i in range(r["layers"]):
        gate = [_num(g[k][i]) if g else "no gate" for k in ("mean", "median", "below_0_1", "below_0_5")]
        lines.append(markdown_row([str(i), _num(r["first_token_attention"][i]), _m_act(r["m_act"][i]),
                           _m_act(r["m_act_max"][i]), *gate]))
    if g:
        heads = [f"h{h}" for h in range(r["heads"])]
        lines += ["", f"Gate mean per head ({g['variant']}):", "", markdown_row(["Layer", *heads]),
                  markdown_row(["---"] * (len(heads) + 1))]
        lines += [markdown_row([str(i), *map(_num, row)]) for i, row in enumerate(g["per_head"]["mean"])]
    s = r["settings"]
    lines += ["", f"{s['windows']} window(s) of {s['length']} tokens from {s['data']}"
                  f"{' (BOS first)' if s['bos'] else ''}; first-token attention excludes query position 0."]
    return "\n".join(lines)


def plot_sinks(runs: Sequence[SinksResults | str | os.PathLike], out: str | os.PathLike,
               names: Sequence[str] | None = None) -> Path:
    """Two panels, one line per checkpoint: first-token attention by layer, M-Act by layer (log scale).
    `runs` are results or sinks.json paths (or their directories)."""
    from longctx.report import pyplot

    docs = [r if isinstance(r, dict) else load_sinks(r) for r in runs]
    names = names or [d["model"].get("name", "?") for d in docs]
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for name, d in zip(names, docs):
        layers = list(range(d["layers"]))
        ax1.plot(layers, d["first_token_attention"], marker="o", markersize=3, label=name)
        ax2.plot(layers, d["m_act"], marker="o", markersize=3, label=name)
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("attention on token 0")
    ax1.set_title("First-token attention")
    ax2.set_yscale("log")
    ax2.set_ylabel("max |hidden state|")
    ax2.set_title("Massive activations (M-Act)")
    for ax in (ax1, ax2):
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp.png")  # written beside, renamed: never half a PNG
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)
    return out


# --- compare ----------------------------------------------------------------------------------------

COMPARE_COLUMNS = ["First-token attn", "M-Act", "Gate mean"]


def sinks_for_runs(runs: Sequence[dict], dirs: Sequence[Path], extra: Sequence[str | os.PathLike] = ()
                   ) -> tuple[list[SinksResults | None], list[str]]:
    """The sinks results of each RULER run's checkpoint, matched by model fingerprint: `<run_dir>/sinks.json`
    or one of `extra` (sinks.json files or directories holding one). Returns (per run: results or None, notes)."""
    notes: list[str] = []
    by_fp: dict[str, SinksResults] = {}
    for path in extra:
        doc = load_sinks(path)
        by_fp[doc["model"].get("fingerprint")] = doc
    found: list[SinksResults | None] = []
    for run, d in zip(runs, dirs):
        fp = run["model"].get("fingerprint")
        doc = by_fp.get(fp)
        if doc is None and (Path(d) / SINKS_FILE).is_file():
            doc = load_sinks(d)
            if doc["model"].get("fingerprint") != fp:
                notes.append(f"{Path(d) / SINKS_FILE} is for another checkpoint than the run; ignored")
                doc = None
        found.append(doc)
    return found, notes


def compare_cells(doc: SinksResults | None) -> list[str]:
    """The COMPARE_COLUMNS cells of one run: '-' without sinks results, 'no gate' for a baseline."""
    if doc is None:
        return ["-"] * len(COMPARE_COLUMNS)
    a = doc["averages"]
    return [_num(a["first_token_attention"]), _m_act(a["m_act"]), _num(a["gate_mean"])]
