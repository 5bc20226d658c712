#!/usr/bin/env python3
"""Benchmark `ruler_tasks.prepare` against upstream RULER's measured speed.

Generates the 13 RULER tasks at 32k and 128k with the golden tokenizer (Mistral-7B v1 SentencePiece,
rebuilt offline from mistral_common) and the fixture essay/QA data (tests/data/ruler/data), then prints
seconds per sample and start-up per task beside the upstream figures measured on this machine kind
(NVIDIA/RULER @ c3f5e3b's generators timed on this machine kind, n=20, one core; the figures below).
The last line is `ratio=<upstream s/sample / ours>` over the tasks with an upstream 128k figure.

    python scripts/bench_ruler_prepare.py [--samples 20] [--lengths 32768,131072] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# upstream loop s/sample and setup s (wall - loop), RULER @ c3f5e3b, 2-core Xeon, n=20
UPSTREAM = {
    (32768, "niah_single_1"): (0.059, 12.8), (32768, "niah_multikey_2"): (0.059, 12.3),
    (32768, "niah_multikey_3"): (0.020, 12.0), (32768, "vt"): (0.036, 5.4),
    (32768, "cwe"): (0.023, 4.5), (32768, "fwe"): (0.052, 4.6),
    (131072, "niah_single_1"): (0.338, 15.3), (131072, "niah_multikey_2"): (0.355, 14.3),
    (131072, "niah_multikey_3"): (0.127, 12.1), (131072, "vt"): (0.206, 7.6),
    (131072, "cwe"): (0.181, 5.2), (131072, "fwe"): (0.324, 5.0),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--tasks", default=None, help="comma-separated subset (default: all 13)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer dir (default: rebuild the golden one)")
    ap.add_argument("--out", default=None, help="output dir (default: a temp dir, removed)")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]

    from ruler_tasks.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        tok = args.tokenizer
        if tok is None:
            from longctx.checkpoint.tokenizer import write_reference_tokenizer

            tok = str(write_reference_tokenizer(Path(tmp) / "tok"))
        out = args.out or str(Path(tmp) / "out")
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = prepare(tok, lengths, tasks=args.tasks, samples=args.samples, seed=42, template="base",
                          data_dir=ROOT / "tests" / "data" / "ruler" / "data", out_dir=out, progress=False)
        wall = time.perf_counter() - t0

    print(f"ruler_tasks.prepare: {args.samples} samples/task, lengths {lengths}, total wall {wall:.1f} s "
          f"(includes imports + tokenizer load once), cpus={os.cpu_count()}")
    print(f"{'length':>7} {'task':<16} {'ours s/sample':>13} {'upstream':>9} {'ratio':>7} {'ours setup s':>12} "
          f"{'upstream setup':>14}")
    sums: dict[int, list[float]] = {}  # length -> [upstream, ours] over tasks with an upstream figure
    for t in res.timings:
        up = UPSTREAM.get((t.length, t.task))
        ours = t.s_per_sample
        ratio = f"{up[0] / ours:7.1f}" if up and ours > 0 else "      -"
        print(f"{t.length:>7} {t.task:<16} {ours:13.4f} {(f'{up[0]:.3f}' if up else '-'):>9} {ratio} "
              f"{t.setup_s:12.2f} {(f'{up[1]:.1f}' if up else '-'):>14}")
        if up:
            acc = sums.setdefault(t.length, [0.0, 0.0])
            acc[0] += up[0]
            acc[1] += ours
    for L, (u, o) in sorted(sums.items()):
        if L != max(lengths) and o > 0:
            print(f"aggregate at {L}: upstream {u:.3f} s, ours {o:.4f} s, ratio {u / o:.1f}")
    up_sum, our_sum = sums.get(max(lengths), [0.0, 0.0])
    if our_sum > 0:
        print(f"aggregate over tasks with an upstream figure at {max(lengths)}: upstream {up_sum:.3f} s, "
              f"ours {our_sum:.4f} s")
        print(f"ratio={up_sum / our_sum:.1f}")
    else:
        print("ratio=nan")


if __name__ == "__main__":
    main()
