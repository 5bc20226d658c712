"""Throughput accounting of `longctx extend` (longctx/extend/throughput.py): the peak table, the FLOP counts,
and `padding`, `mfu`, `mfu_attention` in train_log.jsonl of a tiny CPU run."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from longctx.extend.loop import LOG_FILE, extend
from longctx.extend.settings import ExtendSettings
from longctx.extend.throughput import ModelFlops, matmul_params, model_flops, peak_flops, table_entry

SEQ_LEN = 512


@pytest.mark.parametrize("device, entry", [
    ("NVIDIA H100 80GB HBM3", ("H100 SXM", 989.4)),
    ("NVIDIA H100 PCIe", ("H100 PCIe", 756.0)),  # the more specific entry wins over "H100"
    ("NVIDIA H100 NVL", ("H100 NVL", 835.5)),
    ("NVIDIA H200", ("H200 SXM", 989.4)),
    ("NVIDIA H200 NVL", ("H200 NVL", 835.5)),
    ("NVIDIA GH200 480GB", ("GH200", 989.4)),
    ("NVIDIA A100-SXM4-80GB", ("A100", 312.0)),
    ("NVIDIA A100 80GB PCIe", ("A100", 312.0)),
    ("NVIDIA A10", ("A10", 125.0)),
    ("NVIDIA L4", ("L4", 121.0)),
    ("NVIDIA L40", ("L40", 181.0)),
    ("NVIDIA L40S", ("L40S", 362.0)),
    ("NVIDIA B200", ("B200", 2250.0)),
    ("NVIDIA GeForce RTX 4090", ("RTX 4090", 165.2)),
    ("NVIDIA RTX A6000", ("RTX A6000", 154.8)),
    ("NVIDIA RTX 6000 Ada Generation", ("RTX 6000 Ada", 364.2)),
    ("AMD Instinct MI300X", ("MI300X", 1307.4)),
    # whole words only: none of these is an A100, A10, L4 or H200
    ("NVIDIA A10G", None),
    ("NVIDIA RTX A1000", None),
    ("Tesla V100-SXM2-16GB", None),
    ("Tesla T4", None),
])
def test_peak_table_matches_device_names(device, entry):
    assert table_entry(device) == entry


def test_peak_flops_source_dtype_and_override():
    peak, source = peak_flops(None, "NVIDIA H100 PCIe", "bfloat16")
    assert peak == 756e12 and "H100 PCIe, bf16 dense, from longctx's table" in source
    assert peak_flops(None, "NVIDIA H100 PCIe", "float32") == (
        None, "no peak known for NVIDIA H100 PCIe float32 (longctx's table is bf16 only); give --peak-tflops")
    assert peak_flops(None, None, "float32") == (None, "no peak known for cpu float32; give --peak-tflops")
    assert peak_flops(None, "Some Future GPU", "bfloat16")[0] is None
    # --peak-tflops wins everywhere, at any dtype
    for device, dtype in [(None, "float32"), ("NVIDIA H100 PCIe", "bfloat16"), ("Some Future GPU", "float32")]:
        assert peak_flops(400.0, device, dtype) == (400e12, "from --peak-tflops")


@pytest.mark.parametrize("tied", [True, False])
def test_matmul_parameters_count_the_lm_head_not_the_lookup(tied):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tied)
    lm = Qwen3ForCausalLM(config)
    total = sum(p.numel() for p in lm.parameters())
    layers = sum(p.numel() for n, p in lm.named_parameters() if ".layers." in n)
    norm = lm.model.norm.weight.numel()
    # the decoder layers, the final norm and the (tied or own) LM head: the same N either way
    assert matmul_params(lm) == layers + norm + 1000 * 64
    assert matmul_params(lm) == (total if tied else total - 1000 * 64)
    flops = model_flops(lm)
    assert (flops.params, flops.layers, flops.width, flops.window) == (matmul_params(lm), 2, 4 * 16, None)
    assert flops.matmul_flops(10) == 60 * matmul_params(lm)


def test_attention_flops_from_position_ids():
    # row 0: pieces of 5 and 3 tokens, then 2 padding; row 1: one piece of 10
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1], list(range(10))])
    tokens = torch.tensor([8, 10])
    flops = ModelFlops(params=0, layers=3, width=8)
    # 6·L·width·n(n+1) per piece: forward 2 matmuls x 2·width FLOPs per causal (query, key) pair, x3 with backward
    want = 6 * 3 * 8 * (5 * 6 + 3 * 4 + 10 * 11)
    assert flops.attention_flops(pos, tokens) == want
    # the same pieces counted by brute force over the causal mask of each piece
    pairs = sum(int(torch.ones(n, n).tril().sum()) for n in (5, 3, 10))
    layers, passes, matmuls = 3, 3, 2  # forward + backward = 3 forward passes; QK^T and AV
    assert want == layers * passes * matmuls * 2 * 8 * pairs
    # a window of 2 on one of the three layers: queries there score at most 2 keys
    windowed = ModelFlops(params=0, layers=3, width=8, window=2, window_layers=1)
    window_pairs = (1 + 2 * 4) + (1 + 2 * 2) + (1 + 2 * 9)
    assert windowed.attention_flops(pos, tokens) == 12 * 8 * (2 * pairs + window_pairs)
    assert ModelFlops(params=0, layers=None, width=0).attention_flops(pos, tokens) is None


# --- a tiny run ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny preset with a 1k BPE vocabulary (as tests/test_extend.py), trained length 256."""
    from longctx.init.checkpoint import init_checkpoint
    from longctx.init.settings import InitSettings

    out = tmp_path_factory.mktemp("throughput-ckpt") / "tiny"
    init_checkpoint(InitSettings(output=str(out), preset="tiny", attention="baseline", tokenizer="bpe",
                                 vocab_size=1024, config={"max_position_embeddings": 256}))
    return out


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """Documents of 10-100 words (shorter than a sequence): whole-document packing leaves gaps."""
    rng = random.Random(0)
    words = "river stone lamp garden window copper silent orange market winter".split()
    path = tmp_path_factory.mktemp("throughput-data") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(10, 100)))}) + "\n"
                            for _ in range(60)))
    return path


def _run(checkpoint, documents, out, cache, **kw):
    from longctx.checkpoint.tokenizer import load_tokenizer
    from longctx.extend.packing import build_packed_dataset
    from longctx.extend.plan import resolve_plan

    s = ExtendSettings(checkpoint=str(checkpoint), output=str(out), seq_len=SEQ_LEN, data=[str(documents)],
                       rope_base=1e5, steps=3, tokens_per_step=2 * SEQ_LEN, lr=1e-3, cache_dir=str(cache), **kw)
    extend(s, progress=False)
    log = [json.loads(line) for line in (out / LOG_FILE).read_text().splitlines()]
    plan = resolve_plan(s, 1)
    # the run's own packed sequences, from the cache it made
    ds = build_packed_dataset(s.data, load_tokenizer(checkpoint), SEQ_LEN, num_tokens=plan.total_tokens,
                              seed=s.seed, packing=s.packing, cache_dir=cache, log=lambda _: None)
    steps = [[ds.get(step * plan.sequences_per_step + j) for j in range(plan.sequences_per_step)]
             for step in range(plan.steps)]
    return log, plan, ds, steps


@pytest.mark.slow
def test_log_has_padding_and_mfu_reproducible_from_its_own_numbers(checkpoint, documents, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    log, plan, ds, steps = _run(checkpoint, documents, tmp_path / "whole", tmp_path / "cache", packing="whole",
                                peak_tflops=0.1)
    assert "MFU against 0.1 TFLOP/s per device x 1 (from --peak-tflops)" in capsys.readouterr().out
    flops = model_flops(AutoModelForCausalLM.from_pretrained(checkpoint))
    assert len(log) == plan.steps == 3 and sum(e["padding"] for e in log) > 0  # whole documents leave gaps
    for entry, seqs in zip(log, steps):
        real = sum(int(q["tokens"]) for q in seqs)
        assert entry["padding"] == round(1 - real / plan.tokens_per_step, 6)
        tokens_per_step = entry["tokens_per_s"] * entry["seconds"]
        assert math.isclose(tokens_per_step, plan.tokens_per_step, rel_tol=2e-3)
        # MFU from the log's own numbers: 6·N·non-padding tokens / seconds / (peak x world size)
        useful = log[0]["tokens"] * (1 - entry["padding"])
        mfu = 6 * flops.params * useful / entry["seconds"] / (0.1e12 * 1)
        assert math.isclose(entry["mfu"], mfu, rel_tol=2e-3, abs_tol=2e-6), (entry, mfu)
        attention = sum(flops.attention_flops(q["position_ids"][None], q["tokens"]) for q in seqs)
        extra = attention / entry["seconds"] / 0.1e12
        assert extra > 0 and math.isclose(entry["mfu_attention"], mfu + extra, rel_tol=2e-3, abs_tol=2e-6)


@pytest.mark.slow
def test_split_packing_pads_only_the_last_sequence_and_without_a_peak_mfu_is_null(checkpoint, documents, tmp_path,
                                                                                    capsys):
    log, plan, ds, steps = _run(checkpoint, documents, tmp_path / "split", tmp_path / "cache")
    assert "MFU not reported: no peak known for cpu float32; give --peak-tflops" in capsys.readouterr().out
    padded = 0
    for entry, seqs in zip(log, steps):
        real = sum(int(q["tokens"]) for q in seqs)
        assert entry["padding"] == round(1 - real / plan.tokens_per_step, 6)
        assert entry["mfu"] is None and entry["mfu_attention"] is None
        padded += plan.tokens_per_step - real
    assert sum(int(q["tokens"]) < SEQ_LEN for seqs in steps for q in seqs) <= 1
    # the run reads less than one epoch: at most the padding of the pack's one padded sequence
    assert plan.steps * plan.sequences_per_step <= len(ds)
    assert padded <= round(ds.stats["padding_fraction"] * len(ds) * SEQ_LEN)
