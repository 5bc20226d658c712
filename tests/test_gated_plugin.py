"""The vLLM plugin entry point (`vllm.general_plugins` -> longctx.models.plugin:register)."""

import subprocess
import sys
from importlib.metadata import entry_points

import pytest
from conftest import require_vllm


def test_entry_point_is_installed():
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("longctx_gated_qwen3") == "longctx.models.plugin:register"


@pytest.mark.slow
def test_vllm_loads_the_plugin_lazily_and_idempotently():
    """vLLM calls register() in every process, maybe more than once; the model module loads only on use."""
    require_vllm()
    code = """
import sys
from vllm.plugins import load_general_plugins
load_general_plugins()
from longctx.models.plugin import register
register(); register()
from vllm import ModelRegistry
from transformers import AutoConfig
assert "GatedQwen3ForCausalLM" in ModelRegistry.get_supported_archs()
assert "longctx.models.vllm_gated_qwen3" not in sys.modules
cfg = AutoConfig.for_model("gated_qwen3", elementwise_attn_output_gate=True)
cls = ModelRegistry._try_load_model_cls("GatedQwen3ForCausalLM")
print(type(cfg).__name__, cls.__module__, cls.__name__)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-3:] == ["GatedQwen3Config", "longctx.models.vllm_gated_qwen3", "GatedQwen3ForCausalLM"]
