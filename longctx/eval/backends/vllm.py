"""The `vllm` backend: the offline `vllm.LLM` engine in this process. Requests are fed in small chunks while
the engine steps, so tokenizing long prompts overlaps with generation, and finished requests are reported per
step. What the engine prints goes to a log file (`longctx.eval.vllm_engine`); a failure is one line."""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from longctx.checkpoint.load import model_config
from longctx.core.errors import InputError, SettingError, ref
from longctx.core.files import cache_dir, open_in_place
from longctx.core.kinds import Bool, Count, Float, Int, Overrides
from longctx.core.processes import children_bound
from longctx.core.settings import setting
from longctx.eval.backends import Backend, BackendContext, BackendOptions, device_info, dtype_setting, run_dtype
from longctx.eval.engine_args import binding_args, typed_engine_args
from longctx.eval.request import OnResult, Request
from longctx.eval.vllm_engine import (
    ENGINE_LOG,
    EngineFailed,
    abort_requests,
    dead_engine_raises,
    ended_processes,
    engine_call,
    engine_error,
    log_size,
    output_to,
    vllm_logging_to,
)

# KV cache (GiB) for vLLM's CPU build when neither --gpu-memory-utilization nor --kv-cache-memory is given.
CPU_KV_CACHE_GIB = 4


@dataclass(frozen=True)
class VllmOptions(BackendOptions):
    dtype: str | None = dtype_setting()
    tensor_parallel_size: int | None = setting(None, Int(minimum=1), "vllm: GPUs per model replica.")
    data_parallel_size: int | None = setting(None, Int(minimum=1), "vllm: model replicas.")
    gpu_memory_utilization: float | None = setting(None, Float(0, 1, low_open=True, words="a number in (0, 1]"),
                                                   "vllm: share of GPU memory.")
    kv_cache_memory: int | None = setting(None, Count(), "vllm: KV-cache size in bytes (e.g. 8e9), instead of the "
                                                         "share.")
    enforce_eager: bool = setting(False, Bool(), "vllm: no CUDA graphs.")
    engine_args: dict = setting({}, Overrides(), "vllm: an engine argument under vLLM's own name (repeatable), e.g. "
                                                 "max_num_seqs=64, kv_cache_dtype=fp8, "
                                                 "hf_overrides='{\"rope_theta\": 1e6}'.",
                                flag="--engine-arg")

    def typed_engine_args(self) -> dict[str, Any]:
        """`engine_args` with every value of the type vLLM gives it (`longctx.eval.engine_args`; imports vLLM).
        A refusal is a `SettingError` that names settings of `ruler run` beyond these options (`lengths`,
        `trust_remote_code`): its owner is left to the settings it is checked for."""
        if not self.engine_args:
            return {}
        return typed_engine_args(self.engine_args)

    def check_inputs(self, offline_data: bool = True) -> None:
        # the engine arguments are vLLM's, checked by the installed vLLM: when a recipe loads, before a run
        if self.engine_args:
            self.typed_engine_args()


class _StartFailed(Exception):
    """The engine did not start; the text says why in a few words (the log has the rest)."""


# The engine environment longctx sets on a CPU (a value the user exported wins); what ran records them.
CPU_ENVIRONMENT = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_USE_AOT_COMPILE", "VLLM_CPU_NUM_OF_RESERVED_CPU",
                   "VLLM_CPU_OMP_THREADS_BIND")
# Up to this many cores, the one vLLM's CPU worker leaves to its scheduler process costs more than it saves.
FEW_CORES = 4


def cpu_engine_environment(kwargs: dict[str, Any], cores: int | None = None) -> dict[str, str]:
    """The environment variables vLLM's CPU engine gets from longctx:
    - VLLM_CPU_KVCACHE_SPACE: vLLM's CPU build reserves gpu_memory_utilization (default 0.92) of the NUMA node's RAM
      and refuses to start when that much is not free; the KV cache is sized explicitly instead (unless the
      memory options are given).
    - VLLM_USE_AOT_COMPILE=0: vllm-cpu 0.32 compiles ahead of time by default (torch >= 2.10) but cannot load what it
      saved (`'function' object has no attribute 'finalize_loading'`, vllm/compilation/decorators.py), so every
      start compiled again: 168-190 s for SmolLM2-135M on 2 cores. Without it, the compile cache loads: 166 s the
      first time, 77 s after (32 s with enforce_eager).
    - VLLM_CPU_NUM_OF_RESERVED_CPU=0 on a machine of at most FEW_CORES cores (`cores`, default: those this process
      may run on) with one engine rank: vLLM keeps a core per rank off its OpenMP threads for the scheduler process
      (vllm/utils/ompmultiprocessing.py), which idles but for a few percent; on 2 cores that halves the compute
      (SmolLM2-135M, fp32, one 8k prompt: 27.3 s with the core kept, 13.9 s without).
    - VLLM_CPU_OMP_THREADS_BIND: with several ranks (tensor parallel) on fewer NUMA nodes than ranks, vLLM's own
      binding ("auto": one rank per NUMA node) refuses to start ("Not enough allowed NUMA nodes to bind threads of
      2 local CPUWorkers", vllm/v1/worker/cpu_worker.py); the cores this process may use are split between the
      ranks instead ("0|1" for two ranks on two cores)."""
    env = {"VLLM_USE_AOT_COMPILE": "0"}
    allowed = sorted(os.sched_getaffinity(0))
    cores = cores if cores is not None else len(allowed)
    ranks = kwargs.get("tensor_parallel_size", 1) * kwargs.get("data_parallel_size", 1)
    if cores <= FEW_CORES and ranks == 1:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    if ranks > 1 and _numa_nodes() < ranks <= len(allowed):
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            ",".join(map(str, allowed[i * len(allowed) // ranks:(i + 1) * len(allowed) // ranks]))
            for i in range(ranks))
    if not {"gpu_memory_utilization", "kv_cache_memory_bytes"} & set(kwargs):
        env["VLLM_CPU_KVCACHE_SPACE"] = str(CPU_KV_CACHE_GIB)
    return env


def cpu_engine_args(kwargs: dict[str, Any], engine_args: dict[str, Any]) -> dict[str, Any]:
    """Engine arguments vLLM's CPU engine gets from longctx (none elsewhere, nor when the user chose the attention
    backend): vLLM runs MLA (DeepSeek-style attention) with its AMX kernels wherever the processor has AMX tiles,
    and those take bf16/fp16 weights only, so a float32 model fails to start ("expect weight to be bfloat16, ...",
    vllm/v1/attention/backends/mla/amx_mla.py `process_weights_after_loading`); its reference CPU_MLA backend
    runs any dtype. It is chosen for a dtype AMX does not take (a model without MLA ignores the choice:
    vllm/platforms/cpu.py `get_attn_backend_cls`)."""
    if kwargs.get("dtype") in ("bfloat16", "float16") or {"attention_backend", "attention_config"} & set(engine_args):
        return {}
    import torch
    from vllm.platforms import current_platform

    if not (current_platform.is_cpu() and torch.cpu._is_amx_tile_supported()):
        return {}
    return {"attention_backend": "CPU_MLA"}


def _engine_dtype(llm) -> str:
    """The dtype an engine (a `vllm.LLM`, or replicas of one) runs."""
    if hasattr(llm, "llm_engine"):
        return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    return llm.dtype


def _numa_nodes() -> int:
    """The NUMA nodes of this machine (1 where Linux does not say)."""
    return max(1, len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))))


class VllmBackend(Backend):
    """The offline `vllm.LLM` engine."""

    name = "vllm"
    Options = VllmOptions

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
        self.owns_engine = llm is None  # a given engine is the caller's to shut down
        self.chunk = chunk
        self._dtype: str | None = None
        self.log: Path | None = None  # where the engine this backend started writes its output
        self._failed = False  # the engine failed while generating (said in one line already)
        self._start_failure: Exception | None = None  # what `start` met, raised by `generate`
        self.own_args: dict[str, Any] = {}  # engine arguments longctx chose for this machine (`cpu_engine_args`)

    @classmethod
    def create(cls, options: VllmOptions, context: BackendContext) -> VllmBackend:
        # the engine seed stays 0 (greedy decoding; recorded as such): the task seed is not the engine's
        return cls(context.checkpoint_dir, context.max_model_len,
                   tensor_parallel_size=options.tensor_parallel_size or 1,
                   data_parallel_size=options.data_parallel_size or 1,
                   dtype=(options.dtype or "auto") if context.engine is not None else run_dtype(
                       options.dtype, context.checkpoint_dir, context.trust_remote_code),
                   gpu_memory_utilization=options.gpu_memory_utilization, kv_cache_memory=options.kv_cache_memory,
                   enforce_eager=options.enforce_eager, llm=context.engine, log_dir=context.run_dir,
                   trust_remote_code=context.trust_remote_code, engine_args=options.typed_engine_args())

    def config_overrides(self) -> dict[str, Any]:
        overrides = self.engine_args.get("hf_overrides")
        return dict(overrides) if isinstance(overrides, dict) else {}

    def settings(self) -> dict[str, Any]:
        return {"name": self.name, "max_model_len": self.max_model_len, **self.kwargs,
                **({"engine_args": self.engine_args} if self.engine_args else {})}

    def dtype(self) -> str:
        """The dtype the engine runs: "auto" resolved from the checkpoint by vLLM's own rule (fp32 checkpoints
        run in the platform's preferred dtype, see vllm/config/model.py `_get_and_verify_dtype`), without
        starting it; the requested name when that rule cannot be reached (`generate` then checks what ran)."""
        if self._dtype is None:
            if self.llm is not None:
                self._dtype = _engine_dtype(self.llm)
            else:
                self._dtype = self.kwargs["dtype"]
                with contextlib.suppress(Exception), output_to(Path(os.devnull)):  # vLLM's import prints
                    from vllm.config.model import _get_and_verify_dtype


                    config = model_config(self.checkpoint,
                                          trust_remote_code=self.kwargs.get("trust_remote_code", False))
                    config.update(self.config_overrides())  # vLLM applies them to the config
                    self._dtype = str(_get_and_verify_dtype(self.checkpoint, config, self.kwargs["dtype"],
                                                            is_pooling_model=False)).removeprefix("torch.")
        return self._dtype

    def binding(self) -> dict[str, Any]:
        """The options that can change a prediction (a run directory is bound to them): the dtype as the engine
        resolves it, the parallel sizes and the engine arguments that change what the model computes."""
        bound = {"dtype": self.dtype(), "tensor_parallel_size": self.kwargs["tensor_parallel_size"],
                 "data_parallel_size": self.kwargs.get("data_parallel_size", 1)}
        engine_args = binding_args(self.engine_args)
        return {**bound, "engine_args": engine_args} if engine_args else bound

    def check(self) -> None:
        """Refuse, before an engine starts, a config transformers cannot build (vLLM parses config.json with
        AutoConfig too, and says so in ~200 lines)."""
        if self.llm is None:
            model_config(self.checkpoint, trust_remote_code=self.kwargs.get("trust_remote_code", False))

    def _log_path(self) -> Path:
        if self.log_dir is not None:
            return self.log_dir / ENGINE_LOG
        return cache_dir() / "logs" / f"vllm-engine-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"

    def _start(self):
        """`vllm.LLM(...)`, imported and started with its output (~200 lines when it fails) in the log file;
        `_StartFailed` with the cause in a few words when it fails."""
        log = self.log = self.log or self._log_path()
        # vLLM's INFO lines (engine config, kernels, KV cache) bury the progress bars and tables; warnings still
        # show. VLLM_LOGGING_LEVEL=INFO brings them back.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            with output_to(log):
                try:
                    from vllm import LLM
                except ImportError:
                    # `backend` is a setting of the run: named as the run's settings name it (a module that
                    # imports this one, hence here)
                    from longctx.eval.settings import RulerRunSettings

                    raise SettingError("the vllm backend needs vLLM: pip install 'longctx[gpu]' (CUDA) or "
                                       f"'longctx[cpu]'; or use {ref('backend')} hf", RulerRunSettings) from None
                from vllm.platforms import current_platform

                if current_platform.is_cpu():
                    for key, value in cpu_engine_environment(self.kwargs).items():
                        os.environ.setdefault(key, value)
                self.own_args = cpu_engine_args(self.kwargs, self.engine_args)
                replicas = self.kwargs.get("data_parallel_size", 1)
                if replicas > 1:  # vLLM's offline engine takes one replica: one engine process each
                    from longctx.eval.vllm_replicas import Replicas

                    one = {k: v for k, v in self.kwargs.items() if k != "data_parallel_size"}
                    return Replicas({"model": self.checkpoint, "max_model_len": self.max_model_len, **one,
                                     **self.engine_args, **self.own_args}, replicas, log).start()
                # vLLM's engine process (and through it its workers) dies with this process, a kill -9 included
                # (`longctx.core.processes`); started here, in the thread that runs the whole evaluation.
                with children_bound():
                    return LLM(model=self.checkpoint, max_model_len=self.max_model_len, **self.kwargs,
                               **self.engine_args, **self.own_args)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever stops the engine, the user gets one line and the log
            with contextlib.suppress(OSError, InputError), os.fdopen(open_in_place(log), "a", encoding="utf-8") as f:
                f.write("\n[longctx] the engine start raised:\n" + traceback.format_exc())
            raise _StartFailed(engine_error(log, e)) from None

    def needs_start(self) -> bool:
        return self.llm is None and self._start_failure is None

    def start(self, staging: Path) -> None:
        """Start the engine, its output in `staging`; a failure is raised by `generate`."""
        if not self.needs_start():
            return
        self.log = staging / ENGINE_LOG
        try:
            self.llm = self._start()
        except (InputError, _StartFailed) as e:
            self._start_failure = e

    def committed(self, staging: Path, run_dir: Path) -> None:
        if self.log is not None and self.log.parent == staging:
            self.log = run_dir / self.log.name

    def _engine(self):
        if self._start_failure is not None:
            failure, self._start_failure = self._start_failure, None
            raise self._failed_start(failure)
        if self.llm is None:
            try:
                self.llm = self._start()
            except _StartFailed as e:
                raise self._failed_start(e) from None
        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)  # replicas: started here
        if config is not None and config.max_model_len < self.max_model_len:
            raise InputError(f"the given vLLM engine has max_model_len {config.max_model_len} < "
                             f"{self.max_model_len} needed")
        return self.llm

    def _failed_start(self, failure: Exception) -> Exception:
        """The error to raise for a failed engine start: one line naming the cause and where the log is now."""
        if isinstance(failure, InputError):
            return failure
        return InputError(f"vLLM could not start the engine for {self.checkpoint} ({failure}); full output in "
                          f"{self.log}")

    def close(self) -> None:
        """Shut down the engine this backend started, now: its worker processes and KV cache would
        otherwise live on until the interpreter exits (`longctx run` trains the next model after RULER)."""
        if self.llm is not None and self.owns_engine:
            llm, self.llm = self.llm, None
            # a failed engine's shutdown may fail as well: the failure has been said
            with contextlib.suppress(Exception) if self._failed else contextlib.nullcontext():
                if hasattr(llm, "llm_engine"):
                    llm.llm_engine.engine_core.shutdown()
                else:  # replicas
                    llm.close()

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        """Greedy outputs of `requests`, each reported to `on_result` as it finishes. InputError, one line naming
        the cause and the engine's log, when the engine fails while it generates (what was reported stays)."""
        llm = self._engine()  # first: vLLM's import prints, and the engine start captures that
        from vllm import SamplingParams

        # what the engine really uses ("auto" resolved from the checkpoint), while it is up
        self.ran = {"dtype": _engine_dtype(llm), "device": device_info(),
                    **({"environment": env} if (env := {k: os.environ[k] for k in CPU_ENVIRONMENT
                                                        if k in os.environ}) else {}),
                    **({"engine_args": dict(self.own_args)} if self.own_args else {})}
        if self._dtype not in (None, "auto", self.ran["dtype"]):
            raise SettingError(f"vLLM runs {self.checkpoint} in {self.ran['dtype']}, not the {self._dtype} it "
                               f"resolved beforehand and this run directory is bound to; pass {ref('dtype')} "
                               "explicitly", VllmOptions)

        if not hasattr(llm, "llm_engine"):  # replicas (`longctx.eval.vllm_replicas`)
            self.ran["replicas"] = self.kwargs["data_parallel_size"]
            try:
                llm.generate(requests, on_result)
            except InputError:
                self._failed = True
                raise
            return
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
