"""Gate overhead in transformers: forward+backward step time, gated vs baseline at equal parameters.

Usage:
    python scripts/bench_gate_overhead.py [--attention VARIANT] [--layers 2] [--seq 512]
                                          [--batch 1] [--steps 5] [--threads N]

Builds two models with the paper-1.7b layer shapes (hidden 2048, 16/8 heads, head_dim 128, FFN 6144)
but only --layers layers and a 4096-token vocabulary: the baseline, and the gated model with
`--match-params` (FFN shrunk so the parameter counts are equal, as in the paper), for any variant of the
paper's gate design space (`longctx init --attention`). Runs fp32 on CPU,
alternating the two models step by step (so background load hits both alike), and prints the median
step time of each side and, last, `ratio=<gated/baseline>` (target <= 1.03; the paper reports < 2% on GPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", default="elementwise",
                    help="a gated variant of longctx.models.gates.NAMED (head-shared, value-elementwise, ...) or a "
                         "gate as field=value,...")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import Qwen3ForCausalLM

    from longctx.init.presets import model_config, parameter_count
    from longctx.models.gated_qwen3 import GatedQwen3ForCausalLM
    from longctx.models.gates import gate_name, parse_gate

    args.attention = gate_name(parse_gate(args.attention))  # one line naming what is wrong

    shape = {"num_hidden_layers": args.layers}
    configs = {"baseline": model_config("paper-1.7b", "baseline", 4096, **shape),
               args.attention: model_config("paper-1.7b", args.attention, 4096, match_params=True, **shape)}
    models = {}
    for name, cfg in configs.items():
        torch.manual_seed(0)
        cls = Qwen3ForCausalLM if name == "baseline" else GatedQwen3ForCausalLM
        models[name] = cls._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).train()
        print(f"{name:<12} params {parameter_count(cfg):,}  FFN {cfg.intermediate_size}")
    ids = torch.randint(3, 4096, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))

    def step(model) -> float:
        t = time.perf_counter()
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    for model in models.values():  # warm-up
        step(model)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.steps):
        for name, model in models.items():
            times[name].append(step(model))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"{name:<12} fwd+bwd median {med[name] * 1000:.1f} ms  (min {min(ts) * 1000:.1f}, "
              f"{args.batch}x{args.seq} tokens, {args.layers} layers, {torch.get_num_threads()} threads)")
    print(f"ratio={med[args.attention] / med['baseline']:.4f}")


if __name__ == "__main__":
    main()
