"""Prediction backends: `vllm` (offline engine in this process), `openai` (any OpenAI-compatible
completions endpoint, e.g. `vllm serve`), `hf` (transformers `generate`).

Every backend does greedy decoding of a raw prompt string (`input + answer_prefix`, no server-side
chat template: the template, if any, is already in the task file), with the task's
`tokens_to_generate` as `max_tokens` and no stop words, as upstream RULER does. Results are streamed
back through a callback as soon as each request finishes, so the runner can write them at once.
Heavy imports (vllm, torch models) happen inside the backend that needs them.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from itertools import islice
from typing import Any

from longctx.core.errors import InputError
from longctx.eval.settings import RulerRunSettings


@dataclass(frozen=True)
class Request:
    key: Any  # the runner's identifier (length, task, index)
    prompt: str
    max_tokens: int


# on_result(request, text, prompt_tokens or None)
OnResult = Callable[[Request, str, "int | None"], None]


# KV cache (GiB) for vLLM's CPU build when neither --gpu-memory-utilization nor --kv-cache-memory is given.
CPU_KV_CACHE_GIB = 4


class VllmBackend:
    """The offline `vllm.LLM` engine. Requests are fed in small chunks while the engine steps, so
    tokenizing long prompts overlaps with generation, and finished requests are reported per step."""

    name = "vllm"

    def __init__(self, checkpoint: str, max_model_len: int, *, tensor_parallel_size: int = 1,
                 data_parallel_size: int = 1, dtype: str = "auto", gpu_memory_utilization: float | None = None,
                 kv_cache_memory: int | None = None, enforce_eager: bool = False, seed: int = 0, llm=None,
                 chunk: int = 64):
        self.checkpoint = checkpoint
        self.max_model_len = max_model_len
        self.kwargs: dict[str, Any] = {"tensor_parallel_size": tensor_parallel_size, "dtype": dtype, "seed": seed,
                                       "enforce_eager": enforce_eager}
        if data_parallel_size != 1:
            self.kwargs["data_parallel_size"] = data_parallel_size
        if gpu_memory_utilization is not None:
            self.kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_memory is not None:
            self.kwargs["kv_cache_memory_bytes"] = kv_cache_memory
        self.llm = llm
        self.owns_engine = llm is None  # a given engine is the caller's to shut down
        self.chunk = chunk

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "max_model_len": self.max_model_len, **self.kwargs}

    def _engine(self):
        if self.llm is None:
            # vLLM's INFO lines (engine config, kernels, KV cache) bury the progress bars and tables;
            # warnings still show. VLLM_LOGGING_LEVEL=INFO brings them back.
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
            try:
                from vllm import LLM
            except ImportError:
                raise InputError("the vllm backend needs vLLM: pip install 'longctx[gpu]' (CUDA) or "
                                 "'longctx[cpu]'; or use --backend hf") from None
            if not {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(self.kwargs):
                from vllm.platforms import current_platform

                if current_platform.is_cpu():
                    # vLLM's CPU build reserves gpu_memory_utilization (default 0.92) of the NUMA node's RAM
                    # and refuses to start when that much is not free; size the KV cache explicitly instead.
                    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
            self.llm = LLM(model=self.checkpoint, max_model_len=self.max_model_len, **self.kwargs)
        have = self.llm.llm_engine.model_config.max_model_len
        if have < self.max_model_len:
            raise InputError(f"the given vLLM engine has max_model_len {have} < {self.max_model_len} needed")
        return self.llm

    def close(self) -> None:
        """Shut down the engine this backend started, now: its worker processes and KV cache would
        otherwise live on until the interpreter exits (`longctx run` trains the next model after RULER)."""
        if self.llm is not None and self.owns_engine:
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        from vllm import SamplingParams

        llm = self._engine()
        engine = llm.llm_engine
        window = 2 * max(int(getattr(engine.vllm_config.scheduler_config, "max_num_seqs", 256) or 256), self.chunk)
        it = iter(requests)
        inflight: dict[str, Request] = {}
        internal: dict[str, str] = {}

        def top_up() -> bool:
            batch = list(islice(it, self.chunk))
            if not batch:
                return False
            params = [SamplingParams(temperature=0.0, top_p=1.0, max_tokens=r.max_tokens) for r in batch]
            ids = llm.enqueue([r.prompt for r in batch], params, use_tqdm=False)
            for rid, r in zip(map(str, ids), batch):
                # enqueue returns the engine's internal id "<counter>-<8 random chars>"; outputs carry the
                # external "<counter>" (older vLLM returned that one directly)
                inflight[rid.rsplit("-", 1)[0]] = r
                internal[rid.rsplit("-", 1)[0]] = rid
            return True

        more = top_up()
        try:
            while inflight:
                for out in engine.step():
                    if out.finished:
                        r = inflight.pop(str(out.request_id))
                        internal.pop(str(out.request_id), None)
                        toks = len(out.prompt_token_ids) if out.prompt_token_ids is not None else None
                        on_result(r, out.outputs[0].text, toks)
                if more and len(inflight) < window:
                    more = top_up()
        except BaseException:
            if inflight:
                engine.abort_request([internal[k] for k in inflight], internal=True)
                while engine.has_unfinished_requests():  # drain so a shared engine stays usable
                    engine.step()
            raise


class HfBackend:
    """transformers `generate`, one prompt at a time (greedy): for models vLLM cannot run, and cross-checks."""

    name = "hf"

    def __init__(self, checkpoint: str, max_model_len: int, *, dtype: str = "auto", device: str | None = None,
                 seed: int = 0):
        self.checkpoint = checkpoint
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.model = self.tok = None

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "max_model_len": self.max_model_len, "dtype": self.dtype}

    def close(self) -> None:
        self.model = self.tok = None  # the weights are freed with the last reference

    def _load(self):
        import torch

        from longctx.checkpoint.load import load_model
        from longctx.checkpoint.tokenizer import load_tokenizer

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = load_tokenizer(self.checkpoint)
        self.model = load_model(self.checkpoint, dtype=self.dtype, device=device).eval()

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        import torch

        if self.model is None:
            self._load()
        torch.manual_seed(self.seed)
        device = self.model.device
        for r in requests:
            ids = self.tok(r.prompt, return_tensors="pt").input_ids.to(device)
            n = ids.shape[1]
            if n + r.max_tokens > self.max_model_len:
                raise InputError(f"a prompt of {n} tokens + {r.max_tokens} to generate exceeds max_model_len "
                                 f"{self.max_model_len}")
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_tokens,
                                          do_sample=False, pad_token_id=self.tok.pad_token_id or self.tok.eos_token_id)
            on_result(r, self.tok.decode(out[0, n:], skip_special_tokens=True), n)


class OpenAIBackend:
    """An OpenAI-compatible `/v1/completions` endpoint over plain HTTP, `concurrency` requests in flight.

    The API key comes from `OPENAI_API_KEY` (or the variable named by `api_key_env`); it is never
    printed or stored. The endpoint is probed (`GET /models`) with a bounded retry before anything runs.
    """

    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, *, concurrency: int = 8, timeout: float = 600.0,
                 retries: int = 3, connect_attempts: int = 3, retry_wait: float = 1.0,
                 api_key_env: str = "OPENAI_API_KEY", seed: int = 0):
        if not base_url:
            raise InputError("the openai backend needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.concurrency = max(1, concurrency)
        self.timeout = timeout
        self.retries = retries
        self.connect_attempts = connect_attempts
        self.retry_wait = retry_wait
        self.api_key_env = api_key_env
        self.seed = seed
        self._checked = False

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "base_url": self.base_url, "model": self.model, "concurrency": self.concurrency}

    def close(self) -> None:
        """Nothing to release: every request opens its own connection."""

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=self._headers())
        with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
            return json.loads(resp.read())

    def check(self) -> None:
        """Probe the endpoint (bounded retry) and pick the served model when none was given."""
        if self._checked:
            return
        last = None
        for attempt in range(self.connect_attempts):
            try:
                models = self._call("GET", "/models", timeout=10)
                break
            except urllib.error.HTTPError as e:
                if e.code in (401, 403):
                    raise InputError(f"endpoint {self.base_url} refused the request (HTTP {e.code}); "
                                     f"set {self.api_key_env}") from None
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError, ValueError) as e:
                last = str(getattr(e, "reason", e))
            if attempt + 1 < self.connect_attempts:
                time.sleep(self.retry_wait * 2**attempt)
        else:
            raise InputError(f"endpoint {self.base_url} is unreachable after {self.connect_attempts} attempts "
                             f"({last}); start the server or fix --base-url")
        ids = [m.get("id") for m in models.get("data", [])]
        if self.model is None:
            if not ids:
                raise InputError(f"endpoint {self.base_url} serves no model; pass --served-model")
            self.model = ids[0]
        self._checked = True

    def _complete(self, r: Request) -> tuple[str, int | None]:
        body = {"model": self.model, "prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0.0,
                "top_p": 1.0, "seed": self.seed}
        for attempt in range(self.retries + 1):
            try:
                resp = self._call("POST", "/completions", body)
                return resp["choices"][0]["text"], (resp.get("usage") or {}).get("prompt_tokens")
            except urllib.error.HTTPError as e:
                if e.code < 500 and e.code != 429:
                    detail = e.read().decode(errors="replace")[:300].replace("\n", " ")
                    raise InputError(f"endpoint {self.base_url} rejected a request (HTTP {e.code}: {detail})") from None
                err: Exception = e
            except (urllib.error.URLError, OSError) as e:
                err = e
            if attempt == self.retries:
                raise InputError(f"endpoint {self.base_url} failed {self.retries + 1} times ({err}); "
                                 "rerun to resume") from None
            time.sleep(self.retry_wait * 2**attempt)
        raise AssertionError("unreachable")

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        self.check()
        it: Iterator[Request] = iter(requests)
        with ThreadPoolExecutor(self.concurrency) as pool:
            pending = {}
            for r in islice(it, 2 * self.concurrency):
                pending[pool.submit(self._complete, r)] = r
            try:
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        r = pending.pop(fut)
                        text, toks = fut.result()
                        on_result(r, text, toks)
                        nxt = next(it, None)
                        if nxt is not None:
                            pending[pool.submit(self._complete, nxt)] = nxt
            except BaseException:
                for fut in pending:
                    fut.cancel()
                raise


def make_backend(s: RulerRunSettings, checkpoint: str, max_model_len: int, engine=None):
    """The backend `s` asks for, with the options it gives (an openai endpoint is probed at once, so an
    unreachable one is refused before anything is generated or written)."""
    if s.backend == "openai":
        backend = OpenAIBackend(s.base_url, s.model, concurrency=s.concurrency, seed=s.seed)
        backend.check()
        return backend
    if s.backend == "hf":
        return HfBackend(checkpoint, max_model_len, dtype=s.dtype or "auto", device=s.device)
    return VllmBackend(checkpoint, max_model_len, tensor_parallel_size=s.tensor_parallel_size or 1,
                       data_parallel_size=s.data_parallel_size or 1, dtype=s.dtype or "auto",
                       gpu_memory_utilization=s.gpu_memory_utilization, kv_cache_memory=s.kv_cache_memory,
                       enforce_eager=s.enforce_eager, llm=engine)
