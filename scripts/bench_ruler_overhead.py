"""Harness overhead of `longctx ruler` vs a bare `vllm.LLM.generate` on the same prompts.

Both sides share one vLLM engine (tiny random Qwen3, fp32, CPU) and the same prompts (RULER task
files at --length, made once with the model's tokenizer). Side A is the library call behind
`longctx ruler CKPT ...` into a fresh run directory whose task files are already there (reused after a
checksum), i.e. streaming requests to the engine, writing every prediction, scoring and writing the
report files. Side B is one `LLM.generate(prompts, params)` call. Rounds alternate A/B after a warm-up;
the ratio is of the medians. Target: ratio <= 1.10.

Side A also pays a fixed ~1.2 s per run (tokenizer load, fingerprint, imports): with 4 x 16 prompts that
alone gives ratio ~1.26, with the default 4 x 64 it is ~1.0; a real run (13 tasks x 500 samples per length)
makes it negligible.

    python scripts/bench_ruler_overhead.py                      # 2k, 4 tasks x 64 samples, 3 rounds
    python scripts/bench_ruler_overhead.py --samples 16 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--tasks", default="niah_single_1,niah_multikey_2,vt,fwe")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams

    from longctx.checkpoint.tokenizer import write_reference_tokenizer
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import RulerRunSettings
    from longctx.init.presets import write_tiny_qwen3
    from longctx.report.run import write_report
    from ruler_tasks.registry import TASKS

    root = Path(tempfile.mkdtemp(prefix="bench-ruler-"))
    try:
        write_reference_tokenizer(root / "tok")
        ckpt = write_tiny_qwen3(root / "tiny", root / "tok", max_position_embeddings=4096)
        llm = LLM(model=str(ckpt), dtype="float32", max_model_len=4096, seed=0)
        tasks = args.tasks.split(",")
        warm = root / "warm"
        def settings(out: Path) -> RulerRunSettings:
            return RulerRunSettings(checkpoint=str(ckpt), lengths=[args.length], output=str(out), tasks=tasks,
                                    samples=args.samples)

        run_ruler(settings(warm), engine=llm, progress=False)
        prompts, params = [], []
        for t in tasks:
            for line in (warm / "tasks" / str(args.length) / f"{t}.jsonl").read_text().splitlines():
                row = json.loads(line)
                prompts.append(row["input"] + row["answer_prefix"])
                params.append(SamplingParams(temperature=0.0, top_p=1.0, max_tokens=TASKS[t].tokens_to_generate))

        def side_a(i: int) -> float:
            out = root / f"a{i}"
            out.mkdir()
            shutil.copytree(warm / "tasks", out / "tasks")
            shutil.copy(warm / "run.json", out / "run.json")
            t0 = time.perf_counter()
            r = run_ruler(settings(out), engine=llm, progress=False)
            t1 = time.perf_counter()
            write_report(out)
            t2 = time.perf_counter()
            parts.append({**{k: r.timings[k] for k in ("prepare_s", "generate_s", "score_s")},
                          "setup_s": round(t1 - t0 - r.timings["prepare_s"] - r.timings["generate_s"]
                                           - r.timings["score_s"], 3), "report_s": round(t2 - t1, 3)})
            return t2 - t0

        def side_b() -> float:
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            return time.perf_counter() - t0

        side_b()  # warm-up
        a, b, parts = [], [], []
        for i in range(args.rounds):
            b.append(side_b())
            a.append(side_a(i))
        print(f"prompts={len(prompts)} length={args.length} tasks={','.join(tasks)} rounds={args.rounds}")
        print(f"longctx ruler (library): median {statistics.median(a):.2f} s  runs {' '.join(f'{x:.2f}' for x in a)}")
        print(f"bare LLM.generate:       median {statistics.median(b):.2f} s  runs {' '.join(f'{x:.2f}' for x in b)}")
        print(f"longctx ruler breakdown (median run): {parts[a.index(statistics.median(a))]}")
        print(f"ratio={statistics.median(a) / statistics.median(b):.3f}")
        llm.llm_engine.engine_core.shutdown()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
