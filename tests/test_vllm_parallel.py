"""`--data-parallel-size` and `--tensor-parallel-size` on the real vLLM CPU engine: two replicas (two engine processes,
the requests spread over them: vLLM's offline engine takes one replica) and two tensor-parallel ranks each predict,
greedy, what one engine does, and the run records what ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require_vllm

from longctx.eval import vllm_replicas
from longctx.eval.request import Request
from longctx.eval.runner import run_ruler
from longctx.eval.settings import RulerRunSettings
from longctx.eval.vllm_replicas import Replicas, shares


def _run(checkpoint, out: Path, engine=None, **options):
    s = RulerRunSettings(checkpoint=str(checkpoint), lengths=[1024], tasks="niah_single_1,vt", samples=4,
                         backend="vllm", enforce_eager=True, output=str(out), plot=False, **options)
    run_ruler(s, engine=engine, progress=False)
    return out


def _predictions(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run / "pred" / "1024").glob("*.jsonl"))}


@pytest.mark.slow
def test_two_replicas_and_two_tensor_parallel_ranks_predict_what_one_engine_does(ruler_checkpoint, tmp_path,
                                                                                   vllm_engines):
    require_vllm()
    one = _run(ruler_checkpoint, tmp_path / "one", engine=vllm_engines.get(ruler_checkpoint, max_model_len=2048))
    vllm_engines.close()  # the cores are the replicas' now
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


def _echo_replica(conn, log, env, engine):
    """A stand-in for a replica's process: it starts a process of its own first, as vLLM does for its engine core
    in a user's run (the tests' engines run theirs in-process, so the real replicas there start none), then answers
    each prompt with its process id and the prompt reversed."""
    import multiprocessing
    import os

    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    child.join()
    conn.send(("ready", "float32"))
    while (batch := conn.recv()) is not None:
        conn.send(("done", [(rid, f"{os.getpid()}:{prompt[::-1]}", len(prompt)) for rid, prompt, _ in batch]))


@pytest.mark.slow
def test_replicas_may_start_processes_and_every_request_is_answered_once(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_replicas, "_replica", _echo_replica)
    replicas = Replicas({"model": "m"}, 2, tmp_path / "vllm-engine.log").start()
    got = []
    try:
        replicas.generate([Request(i, f"prompt {i}", 8) for i in range(200)],
                          lambda r, text, tokens: got.append((r.key, text.partition(":")[2], tokens)))
        pids = {p.pid for p in replicas.procs}
    finally:
        replicas.close()
    assert sorted(got) == [(i, f"prompt {i}"[::-1], len(f"prompt {i}")) for i in range(200)]
    assert len(pids) == 2 and not replicas.procs
