"""vLLM plugin: makes `vllm.LLM(model=<gated checkpoint>)` work with no code from the user.

Registered in pyproject.toml as a `vllm.general_plugins` entry point; vLLM calls `register()` in
every process it starts (engine, workers), possibly several times, so it is idempotent and cheap:
it registers the transformers config (vLLM parses config.json with `AutoConfig`) and the vLLM model
class lazily by its "module:Class" name (no model code is imported until a gated checkpoint loads).
Baseline checkpoints are plain Qwen3 and use vLLM's native `Qwen3ForCausalLM`. It is also where a process vLLM
spawned for longctx binds itself to longctx's lifetime (`longctx.core.processes.adopt`).
"""

from __future__ import annotations

from longctx.core.processes import adopt

ARCHITECTURE = "GatedQwen3ForCausalLM"
VLLM_MODEL = "longctx.models.vllm_gated_qwen3:GatedQwen3ForCausalLM"


def register() -> None:
    # First: in an engine or worker process vLLM started for longctx, die with the process that started it
    # (and end now if it has ended); elsewhere nothing (`longctx.core.processes`).
    adopt()
    from longctx.models.gated_qwen3 import register_auto_classes

    register_auto_classes()

    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, VLLM_MODEL)
