"""Make the expected files of tests/test_export_interop.py with NVIDIA RULER's own scripts/eval/evaluate.py.

    python tests/data/ruler_export/make.py /path/to/NVIDIA/RULER   # a checkout of c3f5e3b, pandas and nltk installed

For each length of `samples.SAMPLES` it writes upstream's prediction files (`<task>.jsonl`: index, pred, input,
outputs, others, as scripts/pred/call_api.py writes them) into a temporary folder, runs evaluate.py there
(`--benchmark synthetic`) and copies what it wrote (`summary*.csv`, `submission.csv`) to `expected/<length>/`.
evaluate.py imports NeMo only for reading and writing JSON lines (`read_manifest`, `write_manifest`) and asks nltk
for punkt it does not use here: both are stood in for in the temporary folder. Run once; the output is committed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from samples import ASKED, SAMPLES  # noqa: E402

MANIFEST_UTILS = '''import json


def read_manifest(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_manifest(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\\n")
'''


def main(ruler: Path) -> None:
    commit = subprocess.run(["git", "-C", str(ruler), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shim = tmp / "shim" / "nemo" / "collections" / "asr" / "parts" / "utils"
        shim.mkdir(parents=True)
        for d in [shim, *shim.parents][:5]:
            (d / "__init__.py").touch()
        (shim / "manifest_utils.py").write_text(MANIFEST_UTILS)
        (tmp / "nltk_data" / "tokenizers" / "punkt").mkdir(parents=True)
        env = {**os.environ, "PYTHONPATH": str(tmp / "shim"), "NLTK_DATA": str(tmp / "nltk_data")}
        for length, tasks in SAMPLES.items():
            data = tmp / str(length)
            data.mkdir()
            for task in [t for t in ASKED if t in tasks]:
                rows = [{"index": i, "pred": p, "input": f"prompt {i}", "outputs": refs, "others": {},
                         "truncation": -1, "length": -1} for i, (p, refs) in enumerate(tasks[task])]
                (data / f"{task}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            subprocess.run([sys.executable, str(ruler / "scripts" / "eval" / "evaluate.py"), "--data_dir", str(data),
                            "--benchmark", "synthetic"], cwd=ruler / "scripts" / "eval", env=env, check=True,
                           capture_output=True)
            out = HERE / "expected" / str(length)
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            for f in sorted(data.glob("*.csv")):
                shutil.copy(f, out / f.name)
    (HERE / "expected" / "SOURCE").write_text(f"NVIDIA/RULER scripts/eval/evaluate.py @ {commit.strip()}\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
