"""Benchmark `longctx extend` on CPU: tokens/s, peak memory and time outside the training math.

For the tiny Qwen3 (reference 32k tokenizer) at 2k, 4k and 8k tokens per sequence it runs a few
optimizer steps of the real loop, each length in its own process so that peak RSS is that length's.
"Outside" is the share of step wall time not spent in forward, backward and the optimizer step (data
reads, batching, loss bookkeeping, the JSONL log, the progress bar), from the loop's own per-step
`seconds` and `compute_seconds`; the first step (warm-up) is left out. Target: <= 5%.

    .venv/bin/python scripts/bench_extend.py [--lengths 2k,4k,8k] [--steps 4]

The last line is `ratio=<worst outside share / 0.05>` (<= 1 meets the target).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET_OUTSIDE = 0.05


def one_length(seq_len: int, steps: int, root: Path) -> dict:
    from longctx.extend.loop import extend
    from longctx.extend.settings import ExtendSettings
    from longctx.init.presets import write_tiny_qwen3

    ckpt = root / "tiny"
    if not ckpt.exists():
        write_tiny_qwen3(ckpt, max_position_embeddings=1024)
    out = root / f"out-{seq_len}"
    r = extend(ExtendSettings(checkpoint=str(ckpt), output=str(out), seq_len=seq_len, data=["synthetic:mixed"],
                              rope_base=1e6, steps=steps, tokens_per_step=seq_len, lr=1e-4, overwrite=True,
                              cache_dir=str(root / "cache")), progress=False)
    log = [json.loads(line) for line in r.log.read_text().splitlines()][1:]  # without the warm-up step
    seconds = sum(e["seconds"] for e in log)
    compute = sum(e["compute_seconds"] for e in log)
    return {"seq_len": seq_len, "tokens_per_s": len(log) * seq_len / seconds,  # one sequence per step
            "step_s": seconds / len(log), "outside": 1 - compute / seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    from longctx.core.units import parse_lengths

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2k,4k,8k")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per length (the first is not timed)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_length(args.one, args.steps, Path(args.root))), flush=True)
        return

    rows = []
    with tempfile.TemporaryDirectory() as root:
        for n in parse_lengths(args.lengths):
            cmd = [sys.executable, __file__, "--one", str(n), "--steps", str(args.steps), "--root", root]
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
            if r.returncode:
                sys.exit(f"length {n} failed:\n{r.stderr[-3000:]}")
            rows.append(json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:]))
    print(f"torch threads per process: {os.environ.get('OMP_NUM_THREADS', 'default')}; steps timed per length: "
          f"{args.steps - 1}")
    print(f"{'seq_len':>8} {'tokens/s':>10} {'s/step':>8} {'peak RSS MiB':>13} {'outside':>8}")
    for row in rows:
        print(f"{row['seq_len']:>8} {row['tokens_per_s']:>10.0f} {row['step_s']:>8.2f} {row['peak_rss_mib']:>13.0f} "
              f"{row['outside']:>8.2%}")
    worst = max(row["outside"] for row in rows)
    print(f"worst share of step time outside forward/backward/optimizer: {worst:.2%} (target <= {TARGET_OUTSIDE:.0%})")
    print(f"ratio={worst / TARGET_OUTSIDE:.3f}")


if __name__ == "__main__":
    main()
