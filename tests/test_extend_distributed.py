"""`longctx extend` under `torchrun --nproc_per_node 2` (gloo, FSDP2 on CPU) against one process, for a gated variant
(the plain Qwen3 runs on two "nodes" in tests/test_slurm_scripts.py).

Both runs see the same global batch (4 sequences of 512 tokens per step: 2 ranks x 2 accumulation
vs 1 rank x 4), so with the token-averaged loss they compute the same steps up to the order of
floating-point sums: the loss curves must agree to 1e-4 relative and the weights to 1e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from longctx.extend.loop import extend
from longctx.extend.settings import ExtendSettings

pytestmark = pytest.mark.slow

ARGS = ["--rope-base", "1e5", "--seq-len", "512", "--data", "synthetic:mixed", "--steps", "3",
        "--tokens-per-step", "2048", "--lr", "1e-3", "--save-every", "2"]


@pytest.fixture(params=["input-independent"])
def checkpoint(request, tmp_path_factory):
    """A gated tiny model whose gate has free 1-D parameters (the least usual shards). The plain tiny Qwen3 trains
    on two ranks, one per "node", against one process in tests/test_slurm_scripts.py."""
    from longctx.init.checkpoint import init_checkpoint
    from longctx.init.settings import InitSettings

    out = tmp_path_factory.mktemp("gated") / "tiny-input-independent"
    init_checkpoint(InitSettings(output=str(out), preset="tiny", attention=request.param, tokenizer="bpe",
                                 vocab_size=2048, config={"max_position_embeddings": 256}))
    return out


def test_two_gloo_ranks_with_fsdp2_match_one_process(checkpoint, tmp_path):
    cache = tmp_path / "cache"
    single = tmp_path / "single"
    extend(ExtendSettings(checkpoint=str(checkpoint), output=str(single), seq_len=512, data=["synthetic:mixed"],
                          rope_base=1e5, steps=3, tokens_per_step=2048, lr=1e-3, save_every=2, cache_dir=str(cache)),
           progress=False)

    dist = tmp_path / "dist"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
           "-m", "longctx", "extend", str(checkpoint), *ARGS, "-o", str(dist), "--cache-dir", str(cache)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "world size 2 (FSDP2)" in r.stdout and "2 data-parallel rank(s) x 2 accumulation" in r.stdout, r.stdout

    logs = [[json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()] for out in (single, dist)]
    assert [e["step"] for e in logs[1]] == [1, 2, 3]
    for a, b in zip(*logs):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
        assert b["tokens"] == a["tokens"] == b["step"] * 2048
        assert b["padding"] == a["padding"]  # counted over both ranks
    # FSDP2 state: one shard per rank; the final checkpoint is the gathered full model
    assert sorted(p.name for p in (tmp_path / "dist.train" / "step-000003" / "dcp").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]
    wa, wb = load_file(single / "model.safetensors"), load_file(dist / "model.safetensors")
    assert set(wa) == set(wb)
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=1e-5, msg=name)
    assert json.loads((dist / "config.json").read_text())["max_position_embeddings"] == 512
