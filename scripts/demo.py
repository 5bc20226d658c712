"""The tiny CPU end-to-end demo: what longctx can do so far, in a few minutes on 2 cores.

    bash scripts/setup.sh && .venv/bin/python scripts/demo.py [OUT_DIR]

1. `longctx init`: a tiny baseline Qwen3 and a tiny gated-attention (elementwise) model with the same
   parameter count (trained length 4096, RoPE base 1e4, the real 32k SentencePiece tokenizer),
2. `longctx yarn`: both scaled x4 to 16k (printing what changed and the vLLM settings),
3. `longctx info` on the scaled gated checkpoint,
4. `longctx ruler prepare`: RULER prompts (4 synthetic tasks, 3 samples each) at 4k and 16k,
5. vLLM (CPU) loads the scaled gated checkpoint through longctx's plugin and answers one 16k prompt.
The models are random, so the answers are nonsense: the point is that every step runs for real.
Outputs go to OUT_DIR (default: demo-out/), replaced on every run.
"""

import json
import os
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
    gated = out / "elementwise-4k-yarn4x"
    longctx("info", gated)
    tasks = out / "ruler-tasks"
    longctx("ruler", "prepare", "--tokenizer", gated, "--lengths", "4k,16k", "--tasks", "niah_single_1,vt,cwe,fwe",
            "--samples", "3", "-o", tasks)

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default sizing fails on small CPU hosts
    from vllm import LLM, SamplingParams

    sample = json.loads((tasks / "16384" / "niah_single_1.jsonl").read_text().splitlines()[0])
    llm = LLM(model=str(gated), max_model_len=16384, dtype="float32", enforce_eager=True, seed=0)
    print(f"\nvLLM serves {llm.llm_engine.model_config.architectures[0]} through longctx's vllm.general_plugins entry point")
    result = llm.generate([sample["input"] + sample["answer_prefix"]],
                          SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)[0]
    print(f"niah_single_1 @16k: {len(result.prompt_token_ids)} prompt tokens; expected {sample['outputs']}, "
          f"the random model says {result.outputs[0].text!r}")
    print(f"\ndemo outputs: {out.resolve()}")


if __name__ == "__main__":
    main()
