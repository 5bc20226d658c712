"""vLLM prefill throughput: gated model (longctx plugin) vs native Qwen3 at equal parameters.

Usage:
    python scripts/bench_vllm_gated.py [--attention VARIANT] [--layers 2] [--prompts 8]
                                       [--prompt-len 512] [--reps 3] [--dtype float32]

Writes two random checkpoints with the paper-1.7b layer shapes (--layers layers, 4096-token BPE vocab):
a baseline `Qwen3ForCausalLM` (vLLM's native path) and the gated model with `--match-params`. Each
runs in its own engine (one at a time; CPU, enforce_eager, the same settings for both); prefill
throughput is prompt tokens / wall time of `generate(max_tokens=1)` over the batch, best of --reps.
`--no-match-params` keeps the baseline's FFN (the gate's cost on top). Engines run one after the other: two
live CPU engines slow each other (the first one measured 8-24% slower when both were up), so this
sequential design is the fairer one, but its run-to-run spread on 2 shared cores is about 5%. Prints both sides
and, last, `ratio=<gated/baseline tokens/s>` (targets: >= 0.97 elementwise,
>= 0.99 headwise).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def prefill_tokens_per_s(checkpoint: Path, args) -> float:
    import torch
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(checkpoint), dtype=args.dtype, enforce_eager=True, seed=0, max_model_len=args.prompt_len + 8,
              max_num_batched_tokens=args.prompts * args.prompt_len, max_num_seqs=args.prompts)
    try:
        g = torch.Generator().manual_seed(0)
        prompts = [{"prompt_token_ids": torch.randint(3, 4000, (args.prompt_len,), generator=g).tolist()}
                   for _ in range(args.prompts)]
        params = SamplingParams(max_tokens=1, temperature=0)
        llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
        best = float("inf")
        for _ in range(args.reps):
            t = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            best = min(best, time.perf_counter() - t)
        return args.prompts * args.prompt_len / best
    finally:
        llm.llm_engine.engine_core.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", default="elementwise",
                    help="a gated variant of longctx.models.gates.NAMED (head-shared, value-elementwise, ...) or a "
                         "gate as field=value,...")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-match-params", action="store_true",
                    help="Keep the gated model's FFN at the baseline's size (isolates the gate's own cost).")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from longctx.init.checkpoint import init_checkpoint
    from longctx.init.settings import InitSettings

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("baseline", args.attention):
            ckpt = Path(tmp) / name
            r = init_checkpoint(InitSettings(output=str(ckpt), preset="paper-1.7b", attention=name, tokenizer="bpe",
                                             match_params=name != "baseline" and not args.no_match_params,
                                             dtype="float32", config={"num_hidden_layers": args.layers}))
            results[name] = prefill_tokens_per_s(ckpt, args)
            print(f"{name:<12} {r.architecture:<22} params {r.parameters:,}  FFN {r.intermediate_size}  "
                  f"prefill {results[name]:,.0f} tokens/s ({args.prompts}x{args.prompt_len}, {args.layers} layers)",
                  flush=True)
    print(f"ratio={results[args.attention] / results['baseline']:.4f}")


if __name__ == "__main__":
    main()
