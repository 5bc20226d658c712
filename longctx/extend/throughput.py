"""Throughput accounting of `extend`: model FLOPs utilisation (MFU) and the padding share of each step.

MFU = model FLOPs per second / (peak FLOP/s per device x devices). The model FLOPs of a trained token are
6·N (forward 2·N, backward 4·N; Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, App. B) with N the
parameters that take part in matmuls: every parameter but the input embedding table, which is a lookup
(tied embeddings are counted once, as the LM head they also are). Only non-padding tokens count, and
recomputation (gradient checkpointing) does not: MFU measures useful work, whatever the kernels redo.

6·N leaves out attention scores (QK^T and AV), which grow with the length, so at long lengths it is a lower
bound. `mfu_attention` adds them for the pieces the model actually attends within: per layer and query
head, a query at position p of its piece scores p + 1 keys (at most the sliding window), 2·head_dim FLOPs
each for QK^T and again for AV, three times over for forward + backward. Position ids restart at 0 at every
piece (`longctx.extend.packing`), so this is 12·L·H·head_dim·Σ(p + 1) over the non-padding positions, i.e.
6·L·H·head_dim·n(n + 1) for a piece of n tokens (the causal half of PaLM's attention term).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from longctx.checkpoint.load import sliding_window
from longctx.checkpoint.text_config import built_text_config
from longctx.extend.settings import ExtendSettings

# Peak dense (no sparsity) bf16 tensor-core TFLOP/s of one device, from the vendors' datasheets (the
# datasheets quote "with sparsity" figures: these are half of them). Matched on whole words of
# torch.cuda.get_device_name(); the entry with the most words that all match wins (H100 PCIe over H100).
# NVIDIA H100/H200/GH200 datasheets; A100 datasheet; HGX B200 and GB200 NVL72 pages (per GPU); L40S, L40,
# L4, A10, RTX A6000, RTX 6000 Ada datasheets; Ada (RTX 4090) whitepaper, bf16 with fp32 accumulate;
# AMD Instinct MI300X/MI325X datasheets. MI250X: 383 per module of two GCDs, each GCD its own torch device
# (ROCm names MI250 and MI250X alike, "AMD Instinct MI250X/MI250"; MI250 is 362 per module).
# Left out: GPUs without bf16 tensor cores (V100, T4) and AWS's A10G (no datasheet figure).
PEAK_BF16_TFLOPS: tuple[tuple[tuple[str, ...], str, float], ...] = (
    (("H100", "PCIE"), "H100 PCIe", 756.0),
    (("H100", "NVL"), "H100 NVL", 835.5),
    (("H100",), "H100 SXM", 989.4),  # the SXM parts are named "NVIDIA H100 80GB HBM3"
    (("H800", "PCIE"), "H800 PCIe", 756.0),
    (("H800",), "H800 SXM", 989.4),
    (("H200", "NVL"), "H200 NVL", 835.5),
    (("H200",), "H200 SXM", 989.4),
    (("GH200",), "GH200", 989.4),
    (("GB200",), "GB200", 2500.0),
    (("B200",), "B200", 2250.0),
    (("A100",), "A100", 312.0),
    (("A800",), "A800", 312.0),
    (("L40S",), "L40S", 362.0),
    (("L40",), "L40", 181.0),
    (("L4",), "L4", 121.0),
    (("A10",), "A10", 125.0),
    (("RTX", "4090"), "RTX 4090", 165.2),
    (("RTX", "A6000"), "RTX A6000", 154.8),
    (("RTX", "6000", "ADA"), "RTX 6000 Ada", 364.2),
    (("MI325X",), "MI325X", 1307.4),
    (("MI300X",), "MI300X", 1307.4),
    (("MI250X",), "MI250X (one GCD)", 191.5),
)


def table_entry(device_name: str) -> tuple[str, float] | None:
    """(the table's name, TFLOP/s) of the most specific entry matching `device_name`, or None."""
    words = set(re.split(r"[^0-9A-Z]+", device_name.upper()))
    found = [e for e in PEAK_BF16_TFLOPS if words.issuperset(e[0])]
    if not found:
        return None
    _, name, tflops = max(found, key=lambda e: len(e[0]))
    return name, tflops


def peak_flops(peak_tflops: float | None, device_name: str | None, dtype: str) -> tuple[float | None, str]:
    """(peak FLOP/s of one device or None, where it came from): `peak_tflops` (--peak-tflops) when given, else
    the table for a known GPU computing in bfloat16; `device_name` None means the CPU. The texts name the setting
    as the command line does (they are logged, also by a recipe's run)."""
    flag = ExtendSettings.flag("peak_tflops")
    if peak_tflops is not None:
        return peak_tflops * 1e12, f"from {flag}"
    device = device_name or "cpu"
    entry = table_entry(device_name) if device_name else None
    if entry is None:
        return None, f"no peak known for {device} {dtype}; give {flag}"
    if dtype != "bfloat16":  # the table is bf16 tensor cores; fp32 peaks differ by model and TF32 settings
        return None, f"no peak known for {device} {dtype} (longctx's table is bf16 only); give {flag}"
    name, tflops = entry
    return tflops * 1e12, f"{device} = {name}, bf16 dense, from longctx's table; {flag} to change"


@dataclass(frozen=True)
class ModelFlops:
    """What the FLOPs of a training token depend on (see the module docstring)."""

    params: int  # N: parameters in matmuls
    layers: int | None  # None: the config does not say the attention shape, so no attention FLOPs
    width: int  # query heads x head_dim
    window: int | None = None  # sliding window of `window_layers` of the layers
    window_layers: int = 0

    def matmul_flops(self, tokens: float) -> float:
        return 6.0 * self.params * tokens

    def attention_flops(self, position_ids, tokens) -> float | None:
        """Attention-score FLOPs (forward + backward) of sequences `position_ids` [batch, seq_len] whose first
        `tokens` [batch] positions are not padding; None when the attention shape is unknown."""
        import torch

        if self.layers is None:
            return None
        real = torch.arange(position_ids.shape[-1], device=position_ids.device) < tokens.reshape(-1, 1)
        keys = (position_ids.to(torch.float64) + 1) * real  # keys each query scores, per piece
        pairs = float(keys.sum())
        if self.window is None:
            return 12.0 * self.width * self.layers * pairs
        windowed = float(keys.clamp(max=self.window).sum())
        full = self.layers - self.window_layers
        return 12.0 * self.width * (full * pairs + self.window_layers * windowed)


def matmul_params(lm) -> int:
    """N of 6·N: the parameters of `lm` (a transformers causal LM, before any sharding) without the input
    embedding table, unless it is tied to the LM head."""
    embedding = lm.get_input_embeddings().weight
    head = lm.get_output_embeddings()
    total = sum(p.numel() for p in lm.parameters())  # a shared (tied) tensor is listed once
    tied = head is not None and head.weight is embedding
    return total if tied else total - embedding.numel()


def model_flops(lm) -> ModelFlops:
    """The FLOP counts of `lm` (call before FSDP shards its parameters)."""
    config: Any = built_text_config(lm.config)
    layers, heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and heads and getattr(config, "hidden_size", None):
        head_dim = config.hidden_size // heads
    params = matmul_params(lm)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(head_dim, int)):
        return ModelFlops(params, None, 0)
    window = sliding_window(config)
    return ModelFlops(params, layers, heads * head_dim, window["window"] if window else None,
                      window["layers"] if window else 0)
