"""The settings of `longctx ruler prepare` and `longctx ruler run` (and of a recipe's `ruler` stage)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from longctx.checkpoint.load import trust_remote_code_setting
from longctx.core.errors import SettingError, ref
from longctx.core.kinds import (
    Bool,
    Choice,
    Int,
    JsonObject,
    Lengths,
    LocalPath,
    LocalPaths,
    Names,
    Seed,
    Shard,
    Source,
    Text,
)
from longctx.core.settings import REQUIRED, Settings, setting
from longctx.eval.backends import (
    BUILTIN_BACKENDS,
    OPTIONS_GROUP,
    BackendOptions,
    backend_class,
    option_fields,
    option_users,
    registry,
    registry_problems,
)
from ruler_tasks.errors import RulerInputError
from ruler_tasks.registry import TASK_NAMES, resolve_tasks
from ruler_tasks.templates import TEMPLATE_NAMES


def _plot():
    return setting(True, Bool(), "Write results.png (needs longctx[plot]).", flag="--plot/--no-plot")


def _intervals():
    return setting(False, Bool(), "Tables show each score as score ± the half-width of its 95% interval.",
                   flag="--intervals/--no-intervals")


@dataclass(frozen=True)
class RulerTaskSettings(Settings):
    """Which RULER task files to make (shared by `ruler prepare` and `ruler run`)."""

    lengths: list[int] = setting(REQUIRED, Lengths(), "Context lengths, e.g. 4k,8k,16k,32k,64k,128k (k/K = x1024).")
    tasks: list[str] | None = setting(None, Names(), f"Comma-separated task names [default: all {len(TASK_NAMES)}].")
    samples: int = setting(500, Int(minimum=1), "Samples per task and length.")
    seed: int = setting(42, Seed(), "Task generation seed.")
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
    workers: int | None = setting(None, Int(minimum=1), "Processes that write the task files (the same bytes for "
                                                        "any count) [default: every CPU core; one for a couple of "
                                                        "seconds of work].")

    def check(self) -> None:
        try:
            specs = resolve_tasks(self.tasks)
        except RulerInputError as e:
            raise self.error(f"{ref('tasks')} is invalid: {e.text}") from None  # its refs name these settings
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


@dataclass(frozen=True)
class _RulerRun(RulerTaskSettings):
    """`ruler run`'s own settings; `RulerRunSettings` adds every registered backend's options."""

    checkpoint: str | None = setting(None, Text(), "Checkpoint to evaluate.", cli="argument", recipe=False,
                                     cli_required=True)
    output: str | None = setting(None, LocalPath(directory=True),
                                 "Run directory (resumable: rerun the same command to continue).", short="-o",
                                 recipe=False, cli_required=True)
    trust_remote_code: bool = trust_remote_code_setting()
    backend: str = setting("vllm", Choice(tuple(registry()), "backend"),
                           "vllm (offline engine), openai (an OpenAI-compatible server) or hf (transformers)" + (
                               "; or one a package adds: " + ", ".join(list(registry())[len(BUILTIN_BACKENDS):])
                               if len(registry()) > len(BUILTIN_BACKENDS) else "") + ".")
    name: str | None = setting(None, Text(), "The model's name in tables [default: its Hub id, or its folder's name; "
                                             "in a recipe, the run's].", recipe=False)
    think_tokens: int | None = setting(None, Int(minimum=0),
                                       "chat: thinking budget, added to each task's generation budget; the answer "
                                       "scored is the text after the last </think> (needed when the chat "
                                       "template makes the model think; 0: this model does not think).")
    plot: bool = _plot()
    intervals: bool = _intervals()
    shard: str | None = setting(None, Shard(), "Predict only shard I of N of the run's samples (every task and "
                                               "length), in RUN_DIR/shards/I-of-N; when all N are done, `longctx "
                                               "ruler merge RUN_DIR` scores the run.", recipe=False)

    def check(self) -> None:
        super().check()
        if registry_problems():  # a package's backend that is not there: said whichever backend is chosen
            raise self.error(registry_problems()[0])
        for name, users in option_users().items():
            if getattr(self, name) != self.default(name) and self.backend not in users:
                raise self.error(f"{ref(name)} is an option of {' and '.join(users)}, which {ref('backend')} "
                                 f"{self.backend} does not use; drop it, or choose {ref('backend')} {users[0]}")
        if self.think_tokens is not None and self.template != "chat":
            raise self.error(f"{ref('think_tokens')} is for thinking chat models; add {ref('template')} chat")
        self.backend_options()

    def backend_options(self) -> BackendOptions:
        """The chosen backend's options, from these settings (its refusals name these settings)."""
        cls = backend_class(self.backend).Options
        try:
            return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})
        except SettingError as e:
            raise self.error(e.text, e.cli_text) from None

    def check_inputs(self, offline_data: bool = True) -> None:
        try:
            self.backend_options().check_inputs(offline_data)
        except SettingError as e:
            raise self.error(e.text, e.cli_text) from None


RulerRunSettings = dataclasses.make_dataclass(
    "RulerRunSettings", option_fields(), bases=(_RulerRun,), frozen=True,
    namespace={"__module__": __name__, "__doc__": "The settings of `ruler run`: its own and every backend's options "
                                                  f"(recipe group `{OPTIONS_GROUP}`)."})


@dataclass(frozen=True)
class MergeSettings(Settings):
    """The settings of `longctx ruler merge`."""

    run_dir: str = setting(REQUIRED, LocalPath(directory=True), "The run directory the shards were given as -o: "
                                                                "its shards are put together in it.",
                          cli="argument", recipe=False)
    shard_dirs: list[str] | None = setting(None, LocalPaths(), "A shard's folder (repeatable) [default: every "
                                                                "folder of RUN_DIR/shards].", flag="--shard-dir",
                                           recipe=False)
    plot: bool = _plot()
    intervals: bool = _intervals()
