"""The settings of `longctx ruler prepare` and `longctx ruler run` (and of a recipe's `ruler` stage)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from longctx.core.errors import InputError, ref
from longctx.core.kinds import (Bool, Choice, Count, Float, Int, JsonObject, Lengths, LocalPath, Names, Overrides,
                                Source, Text, Url)
from longctx.checkpoint.load import trust_remote_code_setting
from longctx.core.settings import REQUIRED, Settings, setting
from ruler_tasks.templates import TEMPLATE_NAMES

BACKENDS = ("vllm", "openai", "hf")
DTYPES = ("auto", "float32", "bfloat16", "float16")
_OPTION = "backend_options"  # the recipe mapping that holds the backend's options


@dataclass(frozen=True)
class RulerTaskSettings(Settings):
    """Which RULER task files to make (shared by `ruler prepare` and `ruler run`)."""

    lengths: list[int] = setting(REQUIRED, Lengths(), "Context lengths, e.g. 4k,8k,16k,32k,64k,128k (k/K = x1024).")
    tasks: list[str] | None = setting(None, Names(), "Comma-separated task names [default: all 13].")
    samples: int = setting(500, Int(minimum=1), "Samples per task and length.")
    seed: int = setting(42, Int(), "Task generation seed.")
    template: str = setting("base", Choice(TEMPLATE_NAMES, "template"),
                            "base: RULER's plain prompt; chat: the tokenizer's chat template, answer prefix in the "
                            "assistant turn.")
    system_prompt: str | None = setting(None, Text(), "chat: a system message before the task [default: none].")
    chat_template_kwargs: dict | None = setting(None, JsonObject(),
                                                "chat: extra variables for the chat template, e.g. "
                                                "'{\"enable_thinking\": false}'.")
    data_dir: str | None = setting(None, LocalPath(directory=True),
                                   "Folder with essay.json, squad.json and hotpotqa.json.")
    essay: str | None = setting(None, Source(), "Essay haystack (RULER's PaulGrahamEssays.json format): a file or "
                                                "hf:<dataset id>.")
    squad: str | None = setting(None, Source(), "SQuAD v2.0 dev (for qa_1): a file or hf:<dataset id>.")
    hotpotqa: str | None = setting(None, Source(), "HotpotQA dev-distractor (for qa_2): a file or hf:<dataset id>.")

    def check(self) -> None:
        from ruler_tasks.errors import RulerInputError
        from ruler_tasks.registry import resolve_tasks

        try:
            specs = resolve_tasks(self.tasks)
        except RulerInputError as e:
            raise self.error(f"{ref('tasks')} is invalid: {e}") from None
        if self.template != "chat":
            for name in ("system_prompt", "chat_template_kwargs"):
                if getattr(self, name) is not None:
                    raise self.error(f"{ref(name)} is for the chat template; add {ref('template')} chat")
        for spec in specs:
            if self.lengths[0] < spec.min_length:
                raise self.error(f"{ref('lengths')} start at {self.lengths[0]}, but RULER's {spec.name} needs at "
                                 f"least {spec.min_length} tokens")


@dataclass(frozen=True)
class PrepareSettings(RulerTaskSettings):
    tokenizer: str | None = setting(None, Text(), "Tokenizer directory (or checkpoint) that counts the lengths.",
                                    cli_required=True, recipe=False)
    output: str | None = setting(None, LocalPath(directory=True), "Output folder: <length>/<task>.jsonl + manifest.",
                                 short="-o", recipe=False, cli_required=True)
    trust_remote_code: bool = trust_remote_code_setting()


# The backends that read each backend option: any other backend refuses it rather than ignore it.
_OPTION_USERS = {"dtype": ("vllm", "hf"), "tensor_parallel_size": ("vllm",), "data_parallel_size": ("vllm",),
                 "gpu_memory_utilization": ("vllm",), "kv_cache_memory": ("vllm",), "enforce_eager": ("vllm",),
                 "engine_args": ("vllm",), "base_url": ("openai",), "model": ("openai",),
                 "trust_served_model": ("openai",), "concurrency": ("openai",), "request_timeout": ("openai",),
                 "max_retries": ("openai",), "device": ("hf",)}


@dataclass(frozen=True)
class RulerRunSettings(RulerTaskSettings):
    checkpoint: str | None = setting(None, Text(), "Checkpoint to evaluate.", cli="argument", recipe=False,
                                     cli_required=True)
    output: str | None = setting(None, LocalPath(directory=True),
                                 "Run directory (resumable: rerun the same command to continue).", short="-o",
                                 recipe=False, cli_required=True)
    trust_remote_code: bool = trust_remote_code_setting()
    backend: str = setting("vllm", Choice(BACKENDS, "backend"),
                           "vllm (offline engine), openai (an OpenAI-compatible server) or hf (transformers).")
    dtype: str | None = setting(None, Choice(DTYPES, "dtype"), "Weights dtype [default: auto, the checkpoint's].",
                                group=_OPTION)
    tensor_parallel_size: int | None = setting(None, Int(minimum=1), "vllm: GPUs per model replica.", group=_OPTION)
    data_parallel_size: int | None = setting(None, Int(minimum=1), "vllm: model replicas.", group=_OPTION)
    gpu_memory_utilization: float | None = setting(None, Float(0, 1, low_open=True, words="a number in (0, 1]"),
                                                   "vllm: share of GPU memory.", group=_OPTION)
    kv_cache_memory: int | None = setting(None, Count(), "vllm: KV-cache size in bytes (e.g. 8e9), instead of the "
                                                         "share.", group=_OPTION)
    enforce_eager: bool = setting(False, Bool(), "vllm: no CUDA graphs.", group=_OPTION)
    engine_args: dict = setting({}, Overrides(), "vllm: an engine argument under vLLM's own name (repeatable), e.g. "
                                                 "max_num_seqs=64, kv_cache_dtype=fp8, "
                                                 "hf_overrides='{\"rope_theta\": 1e6}'.",
                                flag="--engine-arg", group=_OPTION)
    base_url: str | None = setting(None, Url(), "openai: endpoint, e.g. http://127.0.0.1:8000/v1 (credential: "
                                                 "OPENAI_API_KEY, or user:password@ in the URL, not both; recorded "
                                                 "and shown redacted).", group=_OPTION)
    model: str | None = setting(None, Text(), "openai: model name on the server [default: the first it serves].",
                                flag="--served-model", group=_OPTION)
    trust_served_model: bool = setting(False, Bool(), "openai: accept a served model whose name and root do not "
                                                      "name the checkpoint (recorded in the results).",
                                       group=_OPTION)
    concurrency: int = setting(8, Int(minimum=1), "openai: requests in flight.", group=_OPTION)
    request_timeout: float = setting(600.0, Float(0, None, low_open=True, words="a number of seconds > 0"),
                                     "openai: seconds to wait for one response.", group=_OPTION)
    max_retries: int = setting(3, Int(minimum=0), "openai: retries of a failed request (HTTP 429/5xx, connection "
                                                  "errors; Retry-After honoured).", group=_OPTION)
    device: str | None = setting(None, Text(), "hf: torch device [default: cuda when available].", group=_OPTION)
    think_tokens: int | None = setting(None, Int(minimum=0),
                                       "chat: thinking budget, added to each task's generation budget; the answer "
                                       "scored is the text after the last </think> (needed when the chat "
                                       "template makes the model think; 0: this model does not think).")
    plot: bool = setting(True, Bool(), "Write results.png (needs longctx[plot]).", flag="--plot/--no-plot")
    intervals: bool = setting(False, Bool(), "Tables show each score as score ± the half-width of its 95% interval.",
                              flag="--intervals/--no-intervals")

    def check(self) -> None:
        super().check()
        defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                    for f, _ in self.specs()}
        for name, users in _OPTION_USERS.items():
            if getattr(self, name) != defaults[name] and self.backend not in users:
                raise self.error(f"{ref(name)} is an option of {' and '.join(users)}, which {ref('backend')} "
                                 f"{self.backend} does not use; drop it, or choose {ref('backend')} {users[0]}")
        if self.think_tokens is not None and self.template != "chat":
            raise self.error(f"{ref('think_tokens')} is for thinking chat models; add {ref('template')} chat")
        if self.engine_args:
            from longctx.eval.engine_args import typed_engine_args

            try:
                object.__setattr__(self, "engine_args", typed_engine_args(self.engine_args, ref("engine_args")))
            except InputError as e:
                raise self.error(str(e)) from None
        if self.backend == "openai" and not self.base_url:
            raise self.error(f"{ref('backend')} openai needs {ref('base_url')} (e.g. http://127.0.0.1:8000/v1)")

    def check_inputs(self, offline_data: bool = True) -> None:
        from longctx.checkpoint.load import check_device

        # What the machine has, like a file: checked when a recipe loads, not when its ruler stage starts.
        if self.backend == "hf":
            try:
                check_device(self.device, ref("device"))
            except InputError as e:
                raise self.error(str(e)) from None
