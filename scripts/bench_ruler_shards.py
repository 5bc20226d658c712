"""RULER spread over processes and servers on this machine: the same run as 1 shard vs 2 shards at once, and
through 1 vs 2 vLLM servers; then `ruler merge` of 6,500 predictions (13 tasks x 250 samples x 2 lengths).

    .venv/bin/python scripts/bench_ruler_shards.py [--samples 150] [--backend vllm|hf] [--skip-endpoints]

Shards: `longctx ruler CKPT ... --backend vllm` (or hf) on a tiny random Qwen3 (the tests' shape), three ways: one
run with every core, one run with half the cores (one "device"), and `--shard 1/2` and `--shard 2/2` at once with
half the cores each (two "devices"; `share_environment`, as a recipe's shards). Each side's wall time from the
first process start to the last end (task files, engine start, predictions; the merge is not counted), and its
predicting alone (scores.json's and shard.json's `generate_s`, the slower shard's): what grows with the run, while
the start does not. Shards (and replicas, and servers) are for more devices than one engine uses: on a GPU node
one engine uses one GPU, and the comparison that says what N of them give is one device against two. With every
core given to one engine (vLLM uses both cores of this machine) there is no idle device to gain.

Endpoints: the same run through `--backend openai`, three ways: one `vllm serve` with every core, one with half of
them, two with half each (started before the run); the run's predicting (`generate_s`). The client (longctx) runs
on the same cores. Every side must give the same predictions (checked).

Merge: the two shards of a run of every task, 250 samples at 4k and 8k (the tests' SQuAD excerpt holds 431
questions), predicted through a stand-in server that answers at once, put together by `ruler merge` in this
process (the merge's time, not an interpreter's start).

Prints every side with both ratios, the merge time, and last `ratio=`: the smaller of the two one-device-to-two
speed-ups, predicting (goal: >= 1.8; merging 6,500 predictions <= 2 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench_common import one_line_errors

from longctx.eval.vllm_replicas import share_environment

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "ruler" / "data"  # the tests' essay, SQuAD and HotpotQA excerpts
TASKS = "niah_single_1,vt"


def _longctx(*args, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "longctx", *map(str, args)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"bench_ruler_shards: a run failed:\n{err[-2000:]}")


def _predictions(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted((run / "pred").rglob("*.jsonl"))}


def _env(threads: int, **more: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", **more}


def _predicting(scores: Path) -> float:
    return json.loads(scores.read_text())["timings"]["generate_s"]


def shards(ckpt: Path, root: Path, samples: int, cores: int, backend: str) -> float:
    """Three sides: one shard on every core, one shard on half the cores (one device), two shards at once on half
    the cores each (two devices). Returns the two devices' speed-up over one, predicting."""
    args = [ckpt, "--lengths", "1k", "--tasks", TASKS, "--samples", samples, "--backend", backend, "--no-plot",
            "--data-dir", DATA, *(["--enforce-eager"] if backend == "vllm" else [])]
    wall, predicting = {}, {}
    for side, envs in (("all", [_env(cores)]), ("half", [{**_env(1), **share_environment(0, 2, 1)}]),
                       ("two", [{**_env(1), **share_environment(i, 2, 1)} for i in range(2)])):
        shard = (lambda i: ["--shard", f"{i + 1}/2"]) if side == "two" else (lambda i: [])
        t0 = time.perf_counter()
        _wait([_longctx("ruler", *args, "-o", root / side, *shard(i), env=env) for i, env in enumerate(envs)])
        wall[side] = time.perf_counter() - t0
        predicting[side] = (max(_predicting(root / side / "shards" / f"{i}-of-2" / "shard.json") for i in (1, 2))
                            if side == "two" else _predicting(root / side / "scores.json"))
    _wait([_longctx("ruler", "merge", root / "two", "--no-plot", env=_env(cores))])
    if not _predictions(root / "two") == _predictions(root / "half") == _predictions(root / "all"):
        sys.exit("bench_ruler_shards: the merged shards' predictions differ from the single run's")
    half = max(1, cores // 2)
    print(f"shards ({samples} samples x 2 tasks at 1k, {backend} backend), whole processes / predicting (the slower "
          f"shard): 1 shard on {cores} cores {wall['all']:.1f} / {predicting['all']:.1f} s; 1 shard on {half} core(s) "
          f"{wall['half']:.1f} / {predicting['half']:.1f} s; 2 shards at once on {half} core(s) each "
          f"{wall['two']:.1f} / {predicting['two']:.1f} s")
    print(f"shards, predicting: 2 shards vs 1 on every core: ratio {predicting['all'] / predicting['two']:.2f}; "
          f"vs 1 on one share of the cores (one device to two): ratio {predicting['half'] / predicting['two']:.2f}",
          flush=True)
    return predicting["half"] / predicting["two"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(ckpt: Path, log: Path, **env: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt),
                             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
                             "--seed", "0", "--max-model-len", "2048"],
                            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0", **env},
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600
    while True:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2).read()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"bench_ruler_shards: vllm serve did not start; see {log}")
            time.sleep(1)


def endpoints(ckpt: Path, root: Path, samples: int, cores: int) -> float:
    """Three sides: one server on every core, one on half the cores (one device), two on half the cores each (two
    devices); the run's wall time (the predicting: `generate_s`) each. Returns the two devices' speed-up."""
    args = [ckpt, "--lengths", "1k", "--tasks", TASKS, "--samples", samples, "--backend", "openai", "--no-plot",
            "--data-dir", DATA, "--concurrency", "8"]
    predicting = {}
    for side, servers in (("all", [{}]), ("half", [share_environment(0, 2, 1)]),
                          ("two", [share_environment(i, 2, 1) for i in range(2)])):
        started = [_serve(ckpt, root / f"serve-{side}-{i}.log", **env) for i, env in enumerate(servers)]
        try:
            urls = [a for _, url in started for a in ("--base-url", url)]
            _wait([_longctx("ruler", *args, *urls, "-o", root / f"endpoints-{side}", env=_env(1))])
            predicting[side] = _predicting(root / f"endpoints-{side}" / "scores.json")
        finally:
            for proc, _ in started:
                proc.terminate()
                proc.wait(60)
    if not (_predictions(root / "endpoints-two") == _predictions(root / "endpoints-half")
            == _predictions(root / "endpoints-all")):
        sys.exit("bench_ruler_shards: two servers' predictions differ from one server's")
    print(f"endpoints ({samples} samples x 2 tasks at 1k, openai backend, concurrency 8 per server), predicting: "
          f"1 server on {cores} cores {predicting['all']:.1f} s; 1 server on half of them {predicting['half']:.1f} s; "
          f"2 servers on half each {predicting['two']:.1f} s; ratio vs every core "
          f"{predicting['all'] / predicting['two']:.2f}, vs one share (one device to two) "
          f"{predicting['half'] / predicting['two']:.2f}", flush=True)
    return predicting["half"] / predicting["two"]


class _Instant:
    """An OpenAI-compatible server on 127.0.0.1 that serves `root` and answers every completion at once."""

    def __init__(self, root: str):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": root, "root": root, "max_model_len": 16384}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send({"choices": [{"index": 0, "text": " 42"}],
                            "usage": {"prompt_tokens": len(body["prompt"]) // 4}})

            def _send(self, doc):
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def merge(ckpt: Path, root: Path) -> float:
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import MergeSettings, RulerRunSettings
    from longctx.eval.shards import merge_run

    server = _Instant(str(ckpt))
    run = root / "merge"
    for i in (1, 2):
        run_ruler(RulerRunSettings(checkpoint=str(ckpt), lengths=[4096, 8192], samples=250, data_dir=str(DATA),
                                   backend="openai", base_url=server.url, concurrency=32, output=str(run),
                                   shard=f"{i}/2"), progress=False)
    server.httpd.shutdown()
    t0 = time.perf_counter()
    merge_run(MergeSettings(run_dir=str(run)), lambda folder: None)
    took = time.perf_counter() - t0
    count = sum(len(p.read_text().splitlines()) for p in (run / "pred").rglob("*.jsonl"))
    print(f"merge: {count} predictions of 2 shards in {took:.2f} s (goal <= 2 s)", flush=True)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    one_line_errors(ap)
    ap.add_argument("--samples", type=int, default=150, help="samples per task of the timed runs [default: 150]")
    ap.add_argument("--backend", choices=("vllm", "hf"), default="vllm", help="the shards' backend [default: vllm]")
    ap.add_argument("--skip-endpoints", action="store_true", help="skip the two vLLM servers (minutes to start)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args()
    if a.samples < 2:
        ap.error(f"--samples must be at least 2, got {a.samples}")

    from longctx.checkpoint.tokenizer import write_reference_tokenizer
    from longctx.init.presets import write_tiny_qwen3

    root = Path(tempfile.mkdtemp(prefix="bench-ruler-shards-"))
    try:
        write_reference_tokenizer(root / "tok")
        ckpt = write_tiny_qwen3(root / "tiny", root / "tok", max_position_embeddings=16384)
        cores = len(os.sched_getaffinity(0))
        ratios = [shards(ckpt, root, a.samples, cores, a.backend)]
        if not a.skip_endpoints:
            ratios.append(endpoints(ckpt, root, a.samples, cores))
        merge(ckpt, root)
        print(f"ratio={min(ratios):.2f}")
    finally:
        if a.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
