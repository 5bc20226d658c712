"""Make the lm-eval fixture of tests/test_export_interop.py with real lm-eval (0.4.13), offline.

    .venv/bin/python tests/data/lm_eval/make.py /path/to/lm-eval-venv/bin/lm_eval

A tiny random Qwen3 checkpoint (`longctx.init.presets.write_tiny_qwen3`, the reference 32k tokenizer) is run
through lm-eval's own ruler tasks `niah_single_1` and `ruler_vt`, whose haystacks need no download, at 4096 and
8192 tokens, on documents 0, 1, 500 and 501 of each task (`--samples`: two per length; lm-eval makes 500 per
length). The results file and the per-sample files are copied here with lm-eval's version, and the results file
is also made with `--limit 2` (the first two documents: 8192 gets lm-eval's -1, "no samples at this length").
Run once; the output is committed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from longctx.init.presets import write_tiny_qwen3

HERE = Path(__file__).resolve().parent
TASKS = ["niah_single_1", "ruler_vt"]


def _run(lm_eval: str, model: Path, out: Path, *selection: str) -> Path:
    subprocess.run([lm_eval, "--model", "hf", "--model_args", f"pretrained={model},dtype=float32,max_length=8400",
                    "--tasks", ",".join(TASKS), "--metadata", json.dumps({"max_seq_lengths": [4096, 8192]}),
                    "--device", "cpu", "--batch_size", "1", "--output_path", str(out), "--log_samples",
                    *selection], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TQDM_DISABLE": "1"})
    return next(out.rglob("results_*.json"))


def main(lm_eval: str) -> None:
    version = subprocess.run([str(Path(lm_eval).parent / "python"), "-c",
                              "import importlib.metadata as m; print(m.version('lm_eval'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = write_tiny_qwen3(tmp / "tiny-qwen3", max_position_embeddings=8400)
        chosen = json.dumps({t: [0, 1, 500, 501] for t in TASKS})
        results = _run(lm_eval, model, tmp / "both", "--samples", chosen)
        shutil.copy(results, HERE / "results-two-lengths.json")
        for f in sorted(results.parent.glob("samples_*.jsonl")):
            task = f.name.removeprefix("samples_").rsplit("_", 1)[0]
            shutil.copy(f, HERE / f"samples-{task}.jsonl")
        shutil.copy(_run(lm_eval, model, tmp / "limit", "--limit", "2"), HERE / "results-limit-2.json")
    (HERE / "VERSION").write_text(f"lm-eval {version}\n")


if __name__ == "__main__":
    main(sys.argv[1])
