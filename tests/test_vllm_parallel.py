"""`--data-parallel-size` and `--tensor-parallel-size` on the real vLLM CPU engine: two replicas (two engine processes,
the requests spread over them: vLLM's offline engine takes one replica) and two tensor-parallel ranks each predict,
greedy, what one engine does, and the run records what ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require_vllm

from longctx.eval.runner import run_ruler
from longctx.eval.settings import RulerRunSettings
from longctx.eval.vllm_replicas import shares


def _run(checkpoint, out: Path, engine=None, **options):
    s = RulerRunSettings(checkpoint=str(checkpoint), lengths=[1024], tasks="niah_single_1,vt", samples=4,
                         backend="vllm", enforce_eager=True, output=str(out), plot=False, **options)
    run_ruler(s, engine=engine, progress=False)
    return out


def _predictions(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run / "pred" / "1024").glob("*.jsonl"))}


@pytest.mark.slow
def test_two_replicas_and_two_tensor_parallel_ranks_predict_what_one_engine_does(ruler_checkpoint, tmp_path,
                                                                                   vllm_engines, monkeypatch):
    require_vllm()
    one = _run(ruler_checkpoint, tmp_path / "one", engine=vllm_engines.get(ruler_checkpoint, max_model_len=2048))
    vllm_engines.close()  # the cores are the replicas' now
    # as a user's run: each replica's engine core in a process of its own (the tests' engines run theirs in-process)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    dp = _run(ruler_checkpoint, tmp_path / "dp", data_parallel_size=2)
    assert _predictions(dp) == _predictions(one)
    ran = json.loads((dp / "scores.json").read_text())["backend"]["ran"]
    assert ran["replicas"] == 2 and ran["dtype"] == "float32", ran
    assert sorted(p.name for p in dp.glob("vllm-engine.log.replica-*")) == ["vllm-engine.log.replica-0",
                                                                          "vllm-engine.log.replica-1"]
    tp = _run(ruler_checkpoint, tmp_path / "tp", tensor_parallel_size=2)
    assert _predictions(tp) == _predictions(one)
    ran = json.loads((tp / "scores.json").read_text())["backend"]["ran"]
    assert ran["environment"]["VLLM_CPU_OMP_THREADS_BIND"].count("|") == 1, ran


@pytest.mark.parametrize("items, count, per, expected", [
    (["0", "1"], 2, 1, [["0"], ["1"]]),
    (["0", "1", "2", "3", "4", "5", "6", "7"], 2, 2, [["0", "1"], ["2", "3"]]),  # GPUs: tp each
    (["0", "1", "2"], 2, 1, [["0"], ["1", "2"]]),  # cores: evenly
    (["0"], 2, 1, [[], ["0"]]),
])
def test_devices_and_cores_are_shared_between_replicas(items, count, per, expected):
    assert shares(items, count, per) == expected


def test_tensor_parallel_ranks_on_a_cpu_share_its_cores(monkeypatch):
    """vLLM's own binding puts one rank per NUMA node and refuses more ranks than nodes: the cores are split."""
    import os

    from longctx.eval.backends import vllm as backend

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(backend, "_numa_nodes", lambda: 1)
    assert backend.cpu_engine_environment({"tensor_parallel_size": 2})["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    monkeypatch.setattr(backend, "_numa_nodes", lambda: 2)  # vLLM's "auto" binds a rank to each node
    assert "VLLM_CPU_OMP_THREADS_BIND" not in backend.cpu_engine_environment({"tensor_parallel_size": 2})
