"""Building any verb's settings imports nothing heavy: no torch, transformers, vLLM, numpy or HTTP client, so that
`--help`, a recipe's validation and a launch line's parsing start at once (`scripts/bench_settings.py` measures
the time). Each settings type is built in a fresh process, from a sample that sets its options."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_settings import COMMANDS, SAMPLES

HEAVY = ("torch", "transformers", "vllm", "accelerate", "datasets", "numpy", "scipy", "matplotlib", "httpx",
         "httpcore", "huggingface_hub", "safetensors", "tokenizers")
CODE = """
import importlib, json, sys
module, name, values = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cls = getattr(importlib.import_module(module), name)
cls(**values)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[4])))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("cls", sorted({*COMMANDS.values()}, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_building_settings_imports_nothing_heavy(cls):
    sample = json.dumps(SAMPLES[cls][0], default=str)
    out = subprocess.run([sys.executable, "-c", CODE, cls.__module__, cls.__name__, sample, json.dumps(HEAVY)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [], f"building {cls.__name__} imports {out.stdout.strip()}"
