"""Prediction backends: the interface every backend implements (`Backend`), the options it declares
(`BackendOptions`), and the registry that names them (`BUILTIN_BACKENDS`, plus the `longctx.backends` entry
points of installed packages).

A backend is one file: a `Backend` subclass whose `Options` is its options dataclass. `ruler`'s settings take
every registered backend's options as their own (`--dtype` on the command line, `backend_options.dtype` in a
recipe), and refuse an option that the chosen backend does not declare. Adding one:

    # mypkg/echo.py
    @dataclass(frozen=True)
    class EchoOptions(BackendOptions):
        answer: str = setting("", Text(), "echo: the text every request gets.")

    class EchoBackend(Backend):
        name, Options = "echo", EchoOptions
        def generate(self, requests, on_result): ...

    # and one line: in BUILTIN_BACKENDS below, or in the package's entry points
    [project.entry-points."longctx.backends"]
    echo = "mypkg.echo:EchoBackend"

Every backend does greedy decoding of a raw prompt string (`input + answer_prefix`, no server-side chat
template: the template, if any, is already in the task file), with the task's `tokens_to_generate` as
`max_tokens` and no stop words, as upstream RULER does. Results are reported through a callback as soon as
each request finishes, so the runner can write them at once. A backend module imports only light modules at its
top (settings are built from the registry on every command line); engines and clients are imported inside.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from longctx.checkpoint.directory import require_weights
from longctx.checkpoint.load import check_weight_shapes, model_config, text_generation_class
from longctx.core.errors import InputError
from longctx.core.kinds import Choice
from longctx.core.settings import Settings, setting
from longctx.eval.request import OnResult, Request

# name -> "module:class" of the backends longctx ships, in the order `--help` lists their options
BUILTIN_BACKENDS = {
    "vllm": "longctx.eval.backends.vllm:VllmBackend",
    "openai": "longctx.eval.backends.openai:OpenAIBackend",
    "hf": "longctx.eval.backends.hf:HfBackend",
}
# The entry-point group through which an installed package adds a backend (name = "module:class").
ENTRY_POINT_GROUP = "longctx.backends"
# The recipe mapping of a ruler section that holds the backend's options.
OPTIONS_GROUP = "backend_options"
DTYPES = ("auto", "float32", "bfloat16", "float16")


def dtype_setting() -> Any:
    """The `dtype` option, one field for every backend that loads weights itself (they share its flag)."""
    return setting(None, Choice(DTYPES, "dtype"), "Weights dtype [default: auto, the checkpoint's: what its config "
                                                  "says, float32 when it says none].")


def run_dtype(option: str | None, checkpoint: str | os.PathLike, trust_remote_code: bool = False) -> str:
    """The dtype a backend runs `checkpoint` in for the `dtype` option: the option, or for `auto` (and none) the
    checkpoint's own, as its config says (float32 when it names none). Every backend resolves `auto` here, so
    it means the same everywhere: vLLM's own `auto` would run a float32 checkpoint in bfloat16
    (vllm/config/model.py `_get_and_verify_dtype`)."""
    if option not in (None, "auto"):
        return option
    config = model_config(checkpoint, trust_remote_code=trust_remote_code)
    return str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")


@dataclass(frozen=True)
class BackendOptions(Settings):
    """A backend's own options: settings fields (`setting(...)`), which `ruler` shows as `--flag` and as
    `backend_options.key` in a recipe. `check()` sees only these options; `check_inputs()` what the machine has
    (a device, an installed engine)."""


@dataclass(frozen=True)
class BackendContext:
    """What a backend is made for: the checkpoint as the user named it and the folder it resolved to, the tokens
    a request may need (prompt + generation), the tokenizer the task files are cut with (loaded once, by the
    runner), the seed, the run directory (for logs), code trust, an engine to reuse (tests, benchmarks) and
    where to say a line while generating."""

    checkpoint: str
    checkpoint_dir: str
    max_model_len: int
    tokenizer: Any = None
    seed: int = 0
    run_dir: str | None = None
    trust_remote_code: bool = False
    engine: Any = None
    log: Callable[[str], None] | None = None


class Backend:
    """The interface of a prediction backend. Subclasses set `name` and `Options` and implement `create`,
    `generate` and `binding`; the rest has defaults.

    Class attributes the runner reads before making one: `loads_weights` (the checkpoint's weight files must be
    there; a server's are its own), `needs_transformers_model` (the checkpoint must be one transformers builds;
    otherwise its weights are checked only where transformers knows the architecture)."""

    name: ClassVar[str]
    Options: ClassVar[type[BackendOptions]] = BackendOptions
    loads_weights: ClassVar[bool] = True
    needs_transformers_model: ClassVar[bool] = False
    # how the endpoint authenticates, as `credential: ...` shows it; None: nothing authenticates
    credential: str | None = None
    # what `generate` ran on (the resolved dtype, the device): recorded as scores.json's backend.ran
    ran: dict[str, Any] | None = None

    @classmethod
    def create(cls, options: BackendOptions, context: BackendContext) -> Backend:
        """The backend for `context` with `options`."""
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        """What run.json and scores.json record as the backend."""
        return {"name": self.name}

    def binding(self) -> dict[str, Any]:
        """The options that can change a prediction: a run directory is bound to them, and a rerun with others
        is refused (`longctx.eval.binding`)."""
        raise NotImplementedError

    def config_overrides(self) -> dict[str, Any]:
        """Config values the backend sets over the checkpoint's config.json when it loads it (vLLM's
        hf_overrides): the weights are checked against the config with them."""
        return {}

    def check(self) -> None:
        """Refusals before anything is generated or the run directory is made (an unreachable server, a config
        the engine cannot read)."""

    def needs_start(self) -> bool:
        """Whether `start` has something to do (the runner then writes the task files meanwhile)."""
        return False

    def start(self, staging: Path) -> None:
        """Begin what takes time before the first request (an engine start, a model load): the runner calls it
        while the task files are being written, so the first request comes as soon as both are ready. What it
        writes goes into the folder `staging`, which becomes part of the run directory (`committed`), or is
        removed when the run is refused. A failure is kept and raised by `generate`, after the task files are in
        place: the run directory then holds them and the log that says what failed. Optional: `generate` starts
        whatever `start` did not."""

    def committed(self, staging: Path, run_dir: Path) -> None:
        """The files `start` wrote in `staging` are now in `run_dir`."""

    def generate(self, requests: Iterable[Request], on_result: OnResult) -> None:
        """Greedy completions of `requests`, each reported to `on_result(request, text, prompt tokens or None)`
        as it finishes."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what the backend holds (an engine and its processes, a client's connections)."""


def _import(target: str, where: str) -> type[Backend]:
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - a package's broken backend is said when ruler runs, not a traceback
        raise InputError(f"backend '{where}' ({target}) cannot be loaded: {type(e).__name__}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise InputError(f"backend '{where}' ({target}) is not a longctx.eval.backends.Backend subclass")
    return cls


@functools.cache
def _loaded() -> tuple[dict[str, type[Backend]], tuple[str, ...]]:
    out = {name: _import(target, name) for name, target in BUILTIN_BACKENDS.items()}
    problems = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in out:
            problems.append(f"the package entry point {ENTRY_POINT_GROUP}:{ep.name} ({ep.value}) names a backend "
                            "longctx already has; rename it")
            continue
        try:
            out[ep.name] = _import(ep.value, ep.name)
        except InputError as e:
            problems.append(str(e))
    return out, tuple(problems)


def registry() -> dict[str, type[Backend]]:
    """name -> backend class: the built-in ones, then those of installed packages (entry points) that load and
    do not reuse a built-in name (`registry_problems` says why one was left out)."""
    return _loaded()[0]


def registry_problems() -> tuple[str, ...]:
    """Why installed packages' backends were left out of the registry, one line each."""
    return _loaded()[1]


def backend_class(name: str) -> type[Backend]:
    return registry()[name]


def option_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """Every registered backend's option fields, once each (a field two backends declare must be the same
    setting), as `dataclasses.make_dataclass` takes them, in the recipe group `OPTIONS_GROUP`."""
    seen: dict[str, tuple[str, Any, dataclasses.Field]] = {}
    for name, cls in registry().items():
        for f in dataclasses.fields(cls.Options):
            spec = f.metadata["spec"]
            if f.name in seen:
                other = seen[f.name][2].metadata["spec"]
                if (type(other.kind), other.help, other.flag) != (type(spec.kind), spec.help, spec.flag):
                    raise InputError(f"backend '{name}' declares option {f.name} unlike another backend does; "
                                     "give it another name")
                continue
            meta = {"spec": dataclasses.replace(spec, group=OPTIONS_GROUP)}
            default = (dataclasses.field(default_factory=f.default_factory, metadata=meta)
                       if f.default_factory is not dataclasses.MISSING else
                       dataclasses.field(default=f.default, metadata=meta))
            seen[f.name] = (f.name, f.type, default)
    return list(seen.values())


def option_users() -> dict[str, list[str]]:
    """option name -> the backends that declare it."""
    out: dict[str, list[str]] = {}
    for name, cls in registry().items():
        for f in dataclasses.fields(cls.Options):
            out.setdefault(f.name, []).append(name)
    return out


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


def _check_weights(cls: type[Backend], backend: Backend, context: BackendContext) -> None:
    """InputError when the checkpoint has no weight files and the backend loads them, or its weight files do not
    hold the model its config.json describes (with the backend's config overrides applied, as it applies them):
    the same refusal whatever the backend, before the run directory is made, rather than from the model load
    after it."""
    if cls.loads_weights:
        require_weights(Path(context.checkpoint_dir), context.checkpoint)
    config = model_config(context.checkpoint_dir, trust_remote_code=context.trust_remote_code)
    overrides = backend.config_overrides()
    if overrides:
        config.update(overrides)
    # An engine may run architectures transformers has no model for (vLLM's own model registry): their weights
    # are the engine's to check. A backend that runs transformers needs one, and check_weight_shapes refuses the
    # config without it.
    if text_generation_class(config) is not None or cls.needs_transformers_model:
        check_weight_shapes(context.checkpoint_dir, config, context.trust_remote_code)


def make_backend(name: str, options: BackendOptions, context: BackendContext) -> Backend:
    """The backend `name` with `options` for `context`, checked before anything is generated or written: the
    checkpoint's weights against its config, then the backend's own `check()` (an endpoint probed, a device,
    the config)."""
    cls = backend_class(name)
    backend = cls.create(options, context)
    try:
        _check_weights(cls, backend, context)
        backend.check()
    except BaseException:
        backend.close()
        raise
    return backend
