"""The tiny CPU end-to-end demo: what longctx can do so far, in about a minute on 2 cores.

    bash scripts/setup.sh && .venv/bin/python scripts/demo.py [OUT_DIR]

1. writes a tiny random Qwen3 checkpoint (trained length 4096, RoPE base 1e4, real 32k tokenizer),
2. shows it with `longctx info`,
3. YaRN-scales it x4 with `longctx yarn` (printing what changed and the vLLM settings),
4. shows the scaled checkpoint, and checks that transformers reads back exactly what was written.
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
    from longctx.models.presets import write_tiny_qwen3

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-out")
    shutil.rmtree(out, ignore_errors=True)
    base = out / "tiny-4k"
    print(f"writing a tiny Qwen3 checkpoint to {base}", flush=True)
    write_tiny_qwen3(base)
    longctx("info", base)
    longctx("yarn", base, "--factor", "4")
    scaled = out / "tiny-4k-yarn4x"
    longctx("info", scaled)

    from transformers import AutoConfig

    rp = AutoConfig.from_pretrained(scaled).rope_parameters
    assert (rp["rope_type"], rp["factor"], rp["original_max_position_embeddings"]) == ("yarn", 4.0, 4096), rp
    print(f"\ntransformers reads {scaled}: {rp}")
    print(f"demo outputs: {out.resolve()}")


if __name__ == "__main__":
    main()
