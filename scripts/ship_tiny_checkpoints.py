"""Copy the tiny models `recipes/tiny-pretrain.yaml` trained into `checkpoints/` as bf16 safetensors, with
their provenance, so that `recipes/tiny-cpu.yaml` (the demo, docs/demo.md) need not pretrain.

    longctx run recipes/tiny-pretrain.yaml                   # writes runs/tiny-pretrain/
    .venv/bin/python scripts/ship_tiny_checkpoints.py [runs/tiny-pretrain] [checkpoints]

For each model (baseline, gated) it takes the recipe's last checkpoint (`<model>/extend/<model>-extend`),
casts the weights to bfloat16 (2 bytes a parameter; nothing else changes), and adds a `shipped` record
to `longctx.json`: the recipe file and its sha256, the git commit, the RULER scores the run measured at
the training length. `checkpoints/SHA256SUMS` lists every shipped file (the tests check it).
"""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import longctx.models  # noqa: F401  (registers the gated architecture with transformers)
from longctx.checkpoint.directory import copy_side_files, is_tokenizer_file, write_provenance

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "tiny-pretrain.yaml"
MODELS = ("baseline", "gated")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ruler_scores(run: Path, model: str) -> dict:
    results = run / model / "ruler" / f"{model}-extend" / "results.json"
    data = json.loads(results.read_text())
    return {"file": str(results.relative_to(run)), "scores": data["scores"], "avg": data["avg"]}


def main() -> None:
    run = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "runs" / "tiny-pretrain")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else ROOT / "checkpoints")
    sources = {m: run / m / "extend" / f"{m}-extend" for m in MODELS}
    missing = [str(p) for p in sources.values() if not (p / "config.json").is_file()]
    if missing:
        print(f"Error: no trained checkpoint at {', '.join(missing)}; run longctx run {RECIPE} first", file=sys.stderr)
        sys.exit(2)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out.mkdir(parents=True, exist_ok=True)
    sums = []
    for model, src in sources.items():
        dst = out / f"tiny-{model}"
        shutil.rmtree(dst, ignore_errors=True)
        m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
        m.save_pretrained(dst)
        copy_side_files(src, dst, keep=lambda p: is_tokenizer_file(p) or p.name == "generation_config.json")
        write_provenance(dst, "shipped", {"recipe": str(RECIPE.relative_to(ROOT)), "recipe_sha256": sha256(RECIPE),
                                          "commit": commit, "dtype": "bfloat16",
                                          "ruler_at_training_length": ruler_scores(run, model)}, src)
        sums += [f"{sha256(f)}  {f.relative_to(out)}" for f in sorted(dst.iterdir()) if f.name != "longctx.json"]
        print(f"wrote {dst} ({sum(p.numel() for p in m.parameters()):,} parameters, bfloat16)")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")


if __name__ == "__main__":
    main()
