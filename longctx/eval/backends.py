"""Prediction backends: `vllm` (offline engine in this process), `openai` (any OpenAI-compatible
completions endpoint, e.g. `vllm serve`), `hf` (transformers `generate`).

Every backend does greedy decoding of a raw prompt string (`input + answer_prefix`, no server-side
chat template: the template, if any, is already in the task file), with the task's
`tokens_to_generate` as `max_tokens` and no stop words, as upstream RULER does. Results are streamed
back through a callback as soon as each request finishes, so the runner can write them at once.
Heavy imports (vllm, torch models) happen inside the backend that needs them.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.eval.request import OnResult, Request
from longctx.eval.settings import RulerRunSettings
from longctx.eval.vllm_engine import (ENGINE_LOG, EngineFailed, abort_requests, dead_engine_raises, ended_processes,
                                      engine_call, engine_error, log_size, output_to, vllm_logging_to)


def device_info(device: Any = None) -> dict[str, Any]:
    """What a model ran on: {"type", "name", "count"} (CUDA: the device's name and how many are visible; CPU:
    the processor and its cores)."""
    import platform

    import torch

    on_cuda = (str(device).startswith("cuda") if device is not None else torch.cuda.is_available())
    if on_cuda and torch.cuda.is_available():
        index = torch.device(device).index if device is not None and torch.device(device).index is not None else 0
        return {"type": "cuda", "name": torch.cuda.get_device_name(index), "count": torch.cuda.device_count()}
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "count": os.cpu_count()}


# KV cache (GiB) for vLLM's CPU build when neither --gpu-memory-utilization nor --kv-cache-memory is given.
CPU_KV_CACHE_GIB = 4
class VllmBackend:
    """The offline `vllm.LLM` engine. Requests are fed in small chunks while the engine steps, so
    tokenizing long prompts overlaps with generation, and finished requests are reported per step."""

    name = "vllm"
    credential = None  # no endpoint: nothing authenticates

    def __init__(self, checkpoint: str, max_model_len: int, *, tensor_parallel_size: int = 1,
                 data_parallel_size: int = 1, dtype: str = "auto", gpu_memory_utilization: float | None = None,
                 kv_cache_memory: int | None = None, enforce_eager: bool = False, seed: int = 0, llm=None,
                 chunk: int = 64, log_dir: str | os.PathLike | None = None, trust_remote_code: bool = False,
                 engine_args: dict[str, Any] | None = None):
        self.checkpoint = checkpoint
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.max_model_len = max_model_len
        self.kwargs: dict[str, Any] = {"tensor_parallel_size": tensor_parallel_size, "dtype": dtype, "seed": seed,
                                       "enforce_eager": enforce_eager}
        if data_parallel_size != 1:
            self.kwargs["data_parallel_size"] = data_parallel_size
        if gpu_memory_utilization is not None:
            self.kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_memory is not None:
            self.kwargs["kv_cache_memory_bytes"] = kv_cache_memory
        if trust_remote_code:
            self.kwargs["trust_remote_code"] = True
        self.engine_args = dict(engine_args or {})  # typed by longctx.eval.engine_args
        self.llm = llm
        self.ran: dict[str, Any] | None = None  # what generate() ran: the resolved dtype, the device
        self.owns_engine = llm is None  # a given engine is the caller's to shut down
        self.chunk = chunk
        self._dtype: str | None = None
        self.log: Path | None = None  # where the engine this backend started writes its output
        self._failed = False  # the engine failed while generating (said in one line already)

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "max_model_len": self.max_model_len, **self.kwargs,
                **({"engine_args": self.engine_args} if self.engine_args else {})}

    def dtype(self) -> str:
        """The dtype the engine runs: "auto" resolved from the checkpoint by vLLM's own rule (fp32 checkpoints
        run in the platform's preferred dtype, see vllm/config/model.py `_get_and_verify_dtype`), without
        starting it; the requested name when that rule cannot be reached (`generate` then checks what ran)."""
        if self._dtype is None:
            if self.llm is not None:
                self._dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
            else:
                self._dtype = self.kwargs["dtype"]
                with contextlib.suppress(Exception), output_to(Path(os.devnull)):  # vLLM's import prints
                    from longctx.checkpoint.load import model_config
                    from vllm.config.model import _get_and_verify_dtype

                    config = model_config(self.checkpoint,
                                          trust_remote_code=self.kwargs.get("trust_remote_code", False))
                    if isinstance(self.engine_args.get("hf_overrides"), dict):  # vLLM applies them to the config
                        config.update(self.engine_args["hf_overrides"])
                    self._dtype = str(_get_and_verify_dtype(self.checkpoint, config, self.kwargs["dtype"],
                                                            is_pooling_model=False)).removeprefix("torch.")
        return self._dtype

    def binding(self) -> dict[str, Any]:
        """The options that can change a prediction (a run directory is bound to them): the dtype as the engine
        resolves it, the parallel sizes and the engine arguments that change what the model computes."""
        from longctx.eval.engine_args import binding_args

        bound = {"dtype": self.dtype(), "tensor_parallel_size": self.kwargs["tensor_parallel_size"],
                 "data_parallel_size": self.kwargs.get("data_parallel_size", 1)}
        engine_args = binding_args(self.engine_args)
        return {**bound, "engine_args": engine_args} if engine_args else bound

    def check(self) -> None:
        """Refuse, before an engine starts, a config transformers cannot build (vLLM parses config.json with
        AutoConfig too, and says so in ~200 lines)."""
        from longctx.checkpoint.load import model_config

        if self.llm is None:
            model_config(self.checkpoint, trust_remote_code=self.kwargs.get("trust_remote_code", False))

    def _log_path(self) -> Path:
        from longctx.core.files import cache_dir

        if self.log_dir is not None:
            return self.log_dir / ENGINE_LOG
        return cache_dir() / "logs" / f"vllm-engine-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"

    def _start(self):
        """`vllm.LLM(...)`, imported and started with its output (~200 lines when it fails) in a log file; a
        failure is one line that names the cause and the file."""
        from longctx.core.processes import children_bound

        log = self.log = self._log_path()
        try:
            with output_to(log):
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
                # vLLM's engine process (and through it its workers) dies with this process, a kill -9 included
                # (`longctx.core.processes`); started here, in the thread that runs the whole evaluation.
                with children_bound():
                    return LLM(model=self.checkpoint, max_model_len=self.max_model_len, **self.kwargs,
                               **self.engine_args)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever stops the engine, the user gets one line and the log
            with contextlib.suppress(OSError), open(log, "a", encoding="utf-8") as f:
                f.write("\n[longctx] the engine start raised:\n" + traceback.format_exc())
            raise InputError(f"vLLM could not start the engine for {self.checkpoint} ({engine_error(log, e)}); "
                             f"full output in {log}") from None

    def _engine(self):
        if self.llm is None:
            # vLLM's INFO lines (engine config, kernels, KV cache) bury the progress bars and tables;
            # warnings still show. VLLM_LOGGING_LEVEL=INFO brings them back.
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
            self.llm = self._start()
        have = self.llm.llm_engine.model_config.max_model_len
        if have < self.max_model_len:
            raise InputError(f"the given vLLM engine has max_model_len {have} < {self.max_model_len} needed")
        return self.llm

    def close(self) -> None:
        """Shut down the engine this backend started, now: its worker processes and KV cache would
        otherwise live on until the interpreter exits (`longctx run` trains the next model after RULER)."""
        if self.llm is not None and self.owns_engine:
            llm, self.llm = self.llm, None
            # a failed engine's shutdown may fail as well: the failure has been said
            with contextlib.suppress(Exception) if self._failed else contextlib.nullcontext():
                llm.llm_engine.engine_core.shutdown()

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        """Greedy outputs of `requests`, each reported to `on_result` as it finishes. InputError, one line naming
        the cause and the engine's log, when the engine fails while it generates (what was reported stays)."""
        llm = self._engine()  # first: vLLM's import prints, and the engine start captures that
        from vllm import SamplingParams

        # what the engine really uses ("auto" resolved from the checkpoint), while it is up
        self.ran = {"dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch."), "device": device_info()}
        if self._dtype not in (None, "auto", self.ran["dtype"]):
            raise InputError(f"vLLM runs {self.checkpoint} in {self.ran['dtype']}, not the {self._dtype} it resolved "
                             "beforehand and this run directory is bound to; pass --dtype explicitly")

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
            ids = engine_call(llm.enqueue, [r.prompt for r in batch], params, use_tqdm=False)
            for rid, r in zip(map(str, ids), batch):
                # enqueue returns the engine's internal id "<counter>-<8 random chars>"; outputs carry the
                # external "<counter>" (older vLLM returned that one directly)
                inflight[rid.rsplit("-", 1)[0]] = r
                internal[rid.rsplit("-", 1)[0]] = rid
            return True

        since = log_size(self.log)
        try:
            with vllm_logging_to(self.log), dead_engine_raises(engine.engine_core):
                more = top_up()
                while inflight:
                    for out in engine_call(engine.step):
                        if out.finished:
                            r = inflight.pop(str(out.request_id))
                            internal.pop(str(out.request_id), None)
                            toks = len(out.prompt_token_ids) if out.prompt_token_ids is not None else None
                            on_result(r, out.outputs[0].text, toks)
                    if more and len(inflight) < window:
                        more = top_up()
        except EngineFailed as failed:
            self._failed = True
            with contextlib.suppress(Exception):  # what the engine still holds, if it lives
                abort_requests(engine, [internal[k] for k in inflight])
            cause = engine_error(self.log, failed.__cause__, since, ended_processes(engine.engine_core))
            where = f"; full output in {self.log}" if self.log is not None else ""
            raise InputError(f"the vLLM engine for {self.checkpoint} stopped while generating ({cause}); the "
                             f"predictions made so far are kept: rerun the same command to continue{where}") from None
        except BaseException:
            abort_requests(engine, [internal[k] for k in inflight])
            raise


class HfBackend:
    """transformers `generate`, one prompt at a time (greedy): for models vLLM cannot run, and cross-checks."""

    name = "hf"
    credential = None  # no endpoint: nothing authenticates

    def __init__(self, checkpoint: str, max_model_len: int, *, dtype: str = "auto", device: str | None = None,
                 seed: int = 0, trust_remote_code: bool = False):
        self.checkpoint = checkpoint
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.trust_remote_code = trust_remote_code
        self.model = self.tok = None
        self.ran: dict[str, Any] | None = None  # what generate() ran: the resolved dtype, the device

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "max_model_len": self.max_model_len, "dtype": self.dtype,
                **({"trust_remote_code": True} if self.trust_remote_code else {})}

    def binding(self) -> dict[str, Any]:
        """The options that can change a prediction: the dtype ("auto": the checkpoint's, which transformers
        loads; float32 when it names none) and the device it runs on."""
        import torch

        from longctx.checkpoint.load import model_config

        dtype = self.dtype
        if dtype == "auto":
            config = model_config(self.checkpoint, trust_remote_code=self.trust_remote_code)
            dtype = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
        return {"dtype": dtype, "device": self.device or ("cuda" if torch.cuda.is_available() else "cpu")}

    def close(self) -> None:
        self.model = self.tok = None  # the weights are freed with the last reference

    def check(self) -> None:
        """Refuse, before anything is generated, a device torch does not have and a config transformers cannot
        build."""
        from longctx.checkpoint.load import check_device, model_config

        check_device(self.device)
        model_config(self.checkpoint, trust_remote_code=self.trust_remote_code)

    def _load(self):
        import torch

        from longctx.checkpoint.load import load_model
        from longctx.checkpoint.tokenizer import load_tokenizer

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tok = self.tok or load_tokenizer(self.checkpoint, self.trust_remote_code)
        self.model = load_model(self.checkpoint, dtype=self.dtype, device=device,
                                trust_remote_code=self.trust_remote_code).eval()

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        import torch

        if self.model is None:
            self._load()
        torch.manual_seed(self.seed)
        device = self.model.device
        self.ran = {"dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
                    "device": device_info(device)}
        for r in requests:
            ids = self.tok(r.prompt, return_tensors="pt").input_ids.to(device)
            n = ids.shape[1]
            if n == 0:  # generate() cannot start from nothing
                raise InputError(f"the tokenizer of '{self.checkpoint}' encodes a prompt to no tokens")
            if n + r.max_tokens > self.max_model_len:
                raise InputError(f"a prompt of {n} tokens + {r.max_tokens} to generate exceeds max_model_len "
                                 f"{self.max_model_len}")
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_tokens,
                                          do_sample=False, pad_token_id=self.tok.pad_token_id or self.tok.eos_token_id)
            on_result(r, self.tok.decode(out[0, n:], skip_special_tokens=True), n)


def _check_weights(s: RulerRunSettings, checkpoint: str) -> None:
    """InputError when the checkpoint has no weight files and the backend loads them (hf, vllm), or its weight
    files do not hold the model its config.json describes (with vLLM's `hf_overrides` applied, as vLLM applies
    them): the same refusal whatever the backend, before the run directory is made, rather than from the model
    load after it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from longctx.checkpoint.directory import require_weights
    from longctx.checkpoint.load import check_weight_shapes, model_config

    if s.backend != "openai":  # a served model's weights are the server's
        require_weights(Path(checkpoint), s.checkpoint)
    config = model_config(checkpoint, trust_remote_code=s.trust_remote_code)
    overrides = s.engine_args.get("hf_overrides") if s.backend == "vllm" else None
    if isinstance(overrides, dict):
        config.update(overrides)
    # vLLM runs architectures transformers has no causal LM for (its own model registry): their weights are
    # vLLM's to check. The hf backend needs one, and check_weight_shapes refuses the config without it.
    builds = type(config) in MODEL_FOR_CAUSAL_LM_MAPPING or "AutoModelForCausalLM" in (
        getattr(config, "auto_map", None) or {})
    if builds or s.backend == "hf":
        check_weight_shapes(checkpoint, config, s.trust_remote_code)


def make_backend(s: RulerRunSettings, checkpoint: str, max_model_len: int, engine=None,
                 log: Callable[[str], None] | None = None):
    """The backend `s` asks for, with the options it gives, checked before anything is generated or written:
    the checkpoint's weights against its config (every backend); an openai endpoint is probed; hf: the device
    and the config; vllm (unless `engine` is given): the config. `log` receives what a backend says while it
    generates (an openai endpoint that asks for a long wait).

    Whatever the backend, the task files are cut with the checkpoint's tokenizer, so it is checked for every
    one: an empty tokenizer (a folder with tokenizer_config.json only) encodes RULER's haystack to no tokens,
    and the task generators divide by the tokens per haystack unit (ZeroDivisionError).
    """
    from longctx.checkpoint.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(checkpoint, s.trust_remote_code)
    _check_weights(s, checkpoint)
    if s.backend == "openai":
        from longctx.eval.openai_backend import OpenAIBackend

        backend = OpenAIBackend(s.base_url, s.model, checkpoint=s.checkpoint, checkpoint_dir=checkpoint,
                                max_model_len=max_model_len, trust_served_model=s.trust_served_model,
                                concurrency=s.concurrency, timeout=s.request_timeout, retries=s.max_retries,
                                seed=s.seed, log=log)
        backend.check()
        return backend
    if s.backend == "hf":
        backend = HfBackend(checkpoint, max_model_len, dtype=s.dtype or "auto", device=s.device,
                            trust_remote_code=s.trust_remote_code)
        backend.tok = tokenizer
    else:
        backend = VllmBackend(checkpoint, max_model_len, tensor_parallel_size=s.tensor_parallel_size or 1,
                              data_parallel_size=s.data_parallel_size or 1, dtype=s.dtype or "auto",
                              gpu_memory_utilization=s.gpu_memory_utilization, kv_cache_memory=s.kv_cache_memory,
                              enforce_eager=s.enforce_eager, llm=engine, log_dir=s.output,
                              trust_remote_code=s.trust_remote_code, engine_args=s.engine_args)
    backend.check()
    return backend
