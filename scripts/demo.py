"""The tiny CPU end-to-end demo: the whole pipeline on random tiny models, in a few minutes on 2 cores.

    bash scripts/setup.sh && .venv/bin/python scripts/demo.py [OUT_DIR]

1. `longctx init`: a tiny baseline Qwen3 and a tiny gated-attention (elementwise) model with the same
   parameter count (trained length 4096, RoPE base 1e4, the real 32k SentencePiece tokenizer),
2. `longctx yarn`: both scaled x4 to 16k (printing what changed and the vLLM settings),
3. `longctx info` on the scaled gated checkpoint,
4. `longctx ruler`: RULER (4 synthetic tasks, 2 samples each, 4k and 16k) on both scaled checkpoints
   through vLLM (CPU) -- the gated one through longctx's vLLM plugin -- with results tables and plots,
5. `longctx compare`: the two runs side by side.
The models are random, so the scores are ~0: the point is that every step runs for real.
Outputs go to OUT_DIR (default: demo-out/), replaced on every run.
"""

import shutil
import subprocess
import sys
from pathlib import Path


def longctx(*args):
    cmd = [str(Path(sys.executable).parent / "longctx"), *map(str, args)]
    print(f"\n$ longctx {' '.join(map(str, args))}", flush=True)
    subprocess.run(cmd, check=True)


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-out")
    shutil.rmtree(out, ignore_errors=True)
    for attention in ("baseline", "elementwise"):
        ckpt = out / f"{attention}-4k"
        longctx("init", ckpt, "--preset", "tiny", "--attention", attention, *(
            ["--match-params"] if attention != "baseline" else []))
        longctx("yarn", ckpt, "--factor", "4")
    longctx("info", out / "elementwise-4k-yarn4x")
    runs = []
    for attention in ("baseline", "elementwise"):
        run = out / "runs" / attention
        longctx("ruler", out / f"{attention}-4k-yarn4x", "--lengths", "4k,16k", "--tasks",
                "niah_single_1,niah_multikey_2,vt,fwe", "--samples", "2", "--dtype", "float32", "--enforce-eager",
                "-o", run)
        runs.append(run)
    longctx("compare", *runs, "--reference", "4k", "-o", out / "compare")
    print(f"\ndemo outputs: {out.resolve()}")


if __name__ == "__main__":
    main()
