"""`--data-parallel-size N` for the offline vLLM engine: N engine processes, each a whole model on its share of the
devices, the requests spread over them.

vLLM's offline `LLM` refuses `data_parallel_size > 1` ("not supported for single-process usage and may hang",
vllm/entrypoints/llm.py) and points to its explicit multi-process example
(examples/features/data_parallel/data_parallel_offline.py), which starts one `LLM` per process; this is that, with
the requests handed out as replicas ask for them (a replica that is faster gets more) and each answer reported as
its batch finishes. A replica is a process spawned from this one and bound to it (`longctx.core.processes`), not a
daemon (vLLM starts its engine core and workers from it); its output goes to `<log>.replica-<i>`. Devices: with
CUDA, replica i gets GPUs [i*tp, (i+1)*tp) of those visible; on a CPU, its share of this process's cores (its
OpenMP threads bound there: `VLLM_CPU_OMP_THREADS_BIND`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import traceback
from collections.abc import Callable, Iterable
from itertools import islice
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.processes import children_bound

# Requests handed to a replica at once, and batches a replica holds (one running, one waiting): enough to keep its
# engine batching, few enough that a slow replica does not hold work a free one could do.
BATCH = 16
QUEUED = 2


def shares(items: list[str], count: int, per: int = 1) -> list[list[str]]:
    """`items` (devices or cores) split into `count` shares of `per` each where there are enough (GPUs), else
    evenly (cores); empty shares where there are none."""
    if len(items) >= count * per and per > 1:
        return [items[i * per:(i + 1) * per] for i in range(count)]
    return [items[i * len(items) // count:(i + 1) * len(items) // count] for i in range(count)]


def share_environment(index: int, count: int, tensor_parallel: int) -> dict[str, str]:
    """The environment of process `index` of `count` that share this machine (engine replicas, shards predicted at
    once): its GPUs, or on a CPU its cores (its OpenMP threads, and vLLM's ranks bound to them: vLLM's own
    binding would put every engine's threads on every core of the NUMA node)."""
    import torch

    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = [d.strip() for d in visible.split(",") if d.strip()] if visible else \
            [str(i) for i in range(torch.cuda.device_count())]
        return {"CUDA_VISIBLE_DEVICES": ",".join(shares(gpus, count, tensor_parallel)[index])}
    cores = [str(c) for c in sorted(os.sched_getaffinity(0))]
    mine = shares(cores, count)[index] or cores
    ranks = shares(mine, tensor_parallel)
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(r) for r in ranks if r) or ",".join(mine),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_NUM_THREADS": str(len(mine))}


def _replica(conn: Connection, log: str, env: dict[str, str], engine: dict[str, Any]) -> None:
    """A replica's process: its engine started with `engine` (`vllm.LLM` keyword arguments), then every batch it
    is sent completed greedily and sent back as (id, text, prompt tokens), until it is sent None."""
    os.environ.update(env)
    from longctx.eval.vllm_engine import output_to

    try:
        with output_to(Path(log)):
            from vllm import LLM, SamplingParams

            llm = LLM(**engine)
            conn.send(("ready", str(llm.llm_engine.model_config.dtype).removeprefix("torch.")))
            while (batch := conn.recv()) is not None:
                params = [SamplingParams(temperature=0.0, top_p=1.0, max_tokens=m) for _, _, m in batch]
                outs = llm.generate([p for _, p, _ in batch], params, use_tqdm=False)
                conn.send(("done", [(rid, o.outputs[0].text, len(o.prompt_token_ids or []) or None)
                                    for (rid, _, _), o in zip(batch, outs)]))
            llm.llm_engine.engine_core.shutdown()
    except BaseException as e:  # noqa: BLE001 - said to the parent in one line; the log has the rest
        with contextlib.suppress(OSError), open(log, "a", encoding="utf-8") as f:
            f.write("\n[longctx] the replica raised:\n" + traceback.format_exc())
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__))


class Replicas:
    """`count` engine processes of `engine` (the `vllm.LLM` keyword arguments of one replica), started by
    `start()`; `generate` spreads requests over them; `close` ends them."""

    def __init__(self, engine: dict[str, Any], count: int, log: Path):
        self.engine, self.count, self.log = engine, count, log
        self.procs: list[multiprocessing.Process] = []
        self.conns: list[Connection] = []
        self.dtype: str | None = None

    def logs(self) -> list[Path]:
        return [self.log.with_name(f"{self.log.name}.replica-{i}") for i in range(self.count)]

    def start(self) -> Replicas:
        """Spawn the replicas and wait until every engine has started; InputError naming the first that failed."""
        ctx = multiprocessing.get_context("spawn")
        tp = self.engine.get("tensor_parallel_size", 1)
        with children_bound():
            for i, log in enumerate(self.logs()):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_replica, args=(theirs, str(log), share_environment(i, self.count, tp),
                                                          self.engine), name=f"longctx-replica-{i}")
                proc.start()
                theirs.close()
                self.procs.append(proc)
                self.conns.append(ours)
        try:
            for i in range(self.count):
                kind, said = self._receive(i)
                if kind != "ready":
                    raise InputError(f"vLLM replica {i + 1} of {self.count} could not start ({said}); full output "
                                     f"in {self.logs()[i]}")
                self.dtype = said
        except BaseException:
            self.close()
            raise
        return self

    def _receive(self, i: int) -> tuple[str, Any]:
        try:
            return self.conns[i].recv()
        except (EOFError, OSError):
            self.procs[i].join(5)
            return "error", f"its process ended with exit code {self.procs[i].exitcode}"

    def generate(self, requests: Iterable[Any], on_result: Callable[[Any, str, int | None], None]) -> None:
        """Greedy completions of `requests` (`longctx.eval.request.Request`), each batch handed to the replica
        that asks for work, each answer reported as its batch returns. InputError naming the replica and its log
        when one fails (what was reported stays)."""
        it = iter(requests)
        waiting: dict[int, Any] = {}
        held = [0] * self.count

        def hand(i: int) -> None:
            batch = list(islice(it, BATCH))
            if batch:
                ids = [id(r) for r in batch]
                waiting.update(zip(ids, batch))
                self.conns[i].send([(rid, r.prompt, r.max_tokens) for rid, r in zip(ids, batch)])
                held[i] += 1

        for i in range(self.count):
            for _ in range(QUEUED):
                hand(i)
        while any(held):
            for conn in wait([c for c, h in zip(self.conns, held) if h]):
                i = self.conns.index(conn)
                kind, said = self._receive(i)
                if kind != "done":
                    raise InputError(f"vLLM replica {i + 1} of {self.count} stopped while generating ({said}); the "
                                     "predictions made so far are kept: rerun the same command to continue; full "
                                     f"output in {self.logs()[i]}")
                held[i] -= 1
                for rid, text, tokens in said:
                    on_result(waiting.pop(rid), text, tokens)
                hand(i)

    def close(self) -> None:
        """End every replica: asked to stop, then killed when it does not within a minute."""
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for proc in self.procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
