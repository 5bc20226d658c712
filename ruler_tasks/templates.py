"""Model prompt templates: `base` (RULER's default) and `chat` (the tokenizer's own chat template).

RULER builds `model_template.format(task_template=T) + answer_prefix` (scripts/data/template.py and
prepare.py @ c3f5e3b): the answer prefix comes *after* the model wrapper, i.e. in the assistant turn.
`chat` renders the tokenizer's chat template around one user message (after an optional system message,
with optional extra template variables) and uses it the same way, except for a template that makes the
model think first (see `model_template`): there the answer prefix ends the user turn instead.
Braces of the wrapper are escaped because RULER's generators run `str.format` on the whole template.
Differences from upstream's hand-written wrappers: a leading BOS token string rendered by the chat
template is dropped when the tokenizer adds that BOS itself (as every backend encodes the prompt), and the NIAH
singular rewrite ("are" -> "is", ...) is applied to the task text only, never to the wrapper.
"""

from __future__ import annotations

import inspect
import json
import sys
import time
from dataclasses import dataclass, field

from longctx.core.errors import ref
from longctx.core.special_tokens import leading_bos
from ruler_tasks.errors import RulerInputError

TEMPLATE_NAMES = ("base", "chat")
_SENTINEL = "\x00RULER_TASK_TEMPLATE\x00"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Names `apply_chat_template` takes as its own parameters, or sets itself (`messages`): as template variables
# they would change how the template is called (e.g. no generation prompt), not what it renders.
_RESERVED_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})


# The most CPU time a chat template's own code may take to render one conversation: a real one takes milliseconds;
# one with huge loops (Jinja's sandbox caps each `range` at 100,000 items, not loops nested in loops) would never
# finish.
RENDER_LIMIT_S = 10.0
# The most characters a chat template may write around one message: a real one writes hundreds (a long system
# prompt, thousands); a loop that writes without end would fill the memory long before its time runs out.
RENDER_LIMIT_CHARS = 1 << 24
JINJA_FILENAME = "<template>"  # the file name of the code Jinja compiles a template from a string to


class _RenderTimeout(BaseException):
    """A render past `RENDER_LIMIT_S` (a BaseException: the template's own `except Exception` cannot catch it)."""


class _RenderTooLarge(BaseException):
    """A render past `RENDER_LIMIT_CHARS` (a BaseException, as `_RenderTimeout`)."""


def _bounded(render, *args):
    """`render(*args)`, stopped with `_RenderTimeout` once the template's own code has used `RENDER_LIMIT_S` seconds
    of this thread's CPU time. Jinja compiles a template to Python, so a trace function (sys.settrace) sees every line
    it runs and can end it. Only the template's frames are traced and timed: what transformers does around them
    (imports, compiling the template) and what other processes do to this machine (an engine starting beside it)
    do not count, so a template never times out for being rendered on a busy machine. The previous trace function
    (a debugger, coverage) is restored after. What the template writes is counted as its render functions yield it
    (Jinja's compiled template is a generator of text pieces), and stopped with `_RenderTooLarge` past
    `RENDER_LIMIT_CHARS`."""
    since: float | None = None  # the clock starts when the template's code first runs
    used = 0.0
    written = 0

    def charge() -> None:
        nonlocal since, used
        now = time.thread_time()
        if since is not None:
            used += now - since  # Jinja's runtime and the filters the template calls between its lines included
        since = now
        if used > RENDER_LIMIT_S:
            raise _RenderTimeout

    def in_template(frame, event, arg):
        nonlocal written
        charge()
        if event == "return" and frame.f_code.co_flags & inspect.CO_GENERATOR and isinstance(arg, str):
            written += len(arg)  # a piece of the output yielded (a macro's return is yielded again: not counted)
            if written > RENDER_LIMIT_CHARS:
                raise _RenderTooLarge
        return in_template

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != JINJA_FILENAME:
            return None  # not the template's code: not traced line by line
        charge()
        return in_template

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return render(*args)
    finally:
        sys.settrace(previous)


def _esc(s: str) -> str:
    return s.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class ModelTemplate:
    name: str
    head: str = ""  # wrapper text before the task template (raw, unescaped)
    tail: str = ""  # wrapper text after the task template: the end of the user turn and the generation prompt
    system_prompt: str | None = None
    chat_template_kwargs: dict | None = field(default=None, hash=False)
    thinking: bool = False  # the model thinks (<think>...</think>) before it answers

    @property
    def is_base(self) -> bool:
        return not self.head and not self.tail

    def compose(self, task_template: str, answer_prefix: str) -> str:
        """The `--template` string RULER's generator would receive.

        Without thinking: head + task + tail + answer prefix, as upstream (the prefix starts the answer).
        With thinking the prefix would land inside the thought (or be thought over), so it ends the user turn:
        head + task + answer prefix + tail; the model sees the expected form of the answer, thinks, answers.
        RULER's `split_answer_prefix` still cuts the prompt where the prefix starts, so a record's
        `input + answer_prefix` is this whole prompt, and its `answer_prefix` is the prefix plus the tail.
        """
        if self.thinking:
            return _esc(self.head) + task_template + answer_prefix + _esc(self.tail)
        return _esc(self.head) + task_template + _esc(self.tail) + answer_prefix

    def describe(self) -> dict:
        """What identifies the prompts (task-file keys, manifest): name, head and tail, plus the chat settings and
        the thinking flag only when set, so that templates without them keep the keys they always had."""
        d = {"name": self.name, "head": self.head, "tail": self.tail}
        if self.system_prompt is not None:
            d["system_prompt"] = self.system_prompt
        if self.chat_template_kwargs:
            d["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        if self.thinking:
            d["thinking"] = True
        return d


def _why(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return f"{e.__class__.__name__}: {msg[0]}" if msg else e.__class__.__name__


def _check_kwargs(kwargs) -> dict | None:
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise RulerInputError(f"{ref('chat_template_kwargs')} must be a JSON object (got {kwargs!r})")
    bad = sorted(set(kwargs) & _RESERVED_KWARGS)
    if bad:
        raise RulerInputError(f"{ref('chat_template_kwargs')} cannot set {', '.join(bad)}: RULER's chat rendering "
                              "sets how the template is called; give only the template's own variables")
    try:
        json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise RulerInputError(f"{ref('chat_template_kwargs')} must hold JSON values only ({e})") from None
    return dict(kwargs) or None


def _template_source(tokenizer) -> str:
    """The chat template `apply_chat_template` renders: the string, or the "default" entry of a dict of named
    templates (every entry when there is none)."""
    src = getattr(tokenizer, "chat_template", None)
    if isinstance(src, dict):
        return src["default"] if isinstance(src.get("default"), str) else "".join(map(str, src.values()))
    return src if isinstance(src, str) else ""


def _thinks(tail: str, source: str) -> bool:
    """Whether the rendered generation prompt `tail` makes the model think before answering (rule: see
    `model_template`)."""
    opened, closed = tail.rfind(THINK_OPEN), tail.rfind(THINK_CLOSE)
    if opened > closed:  # an open thought the model goes on with (thinking-only templates)
        return True
    if closed >= 0:  # a closed, usually empty, thought: thinking switched off (Qwen3, enable_thinking=False)
        return False
    return THINK_CLOSE in source  # a hybrid template whose default is to think: the model opens <think> itself


def model_template(name: str, tokenizer=None, system_prompt: str | None = None,
                   chat_template_kwargs: dict | None = None, thinking: bool | None = None) -> ModelTemplate:
    """The wrapper `name` ("base" or "chat") for `tokenizer`.

    `chat` renders the tokenizer's chat template (`apply_chat_template(..., add_generation_prompt=True)`) around
    one user message, after a system message `system_prompt` when given, with `chat_template_kwargs` as extra
    template variables (transformers passes extra keyword arguments on to the Jinja template), e.g.
    {"enable_thinking": false} for Qwen3. Both are refused for `base`.

    `thinking` (the model thinks before answering) is read from the generation prompt, the rendered text after
    the user message (`tail`): an open `<think>` with no `</think>` after it (Qwen3-*-Thinking-2507,
    DeepSeek-R1 style templates) -> thinking; a closed `<think>...</think>` (Qwen3 with enable_thinking=False
    renders an empty one) -> not thinking; neither -> thinking when the template source has a `</think>`
    (hybrid templates such as Qwen3's, whose default is to think: the model opens `<think>` itself), else not.
    `thinking` given says it instead (a template that mentions `</think>` only to drop old thoughts from the
    history, for a model that does not think).
    """
    kwargs = _check_kwargs(chat_template_kwargs)
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise RulerInputError(f"{ref('system_prompt')} must be text (got {system_prompt!r})")
    if name == "base":
        if system_prompt is not None or kwargs or thinking:
            raise RulerInputError(f"{ref('system_prompt')}, {ref('chat_template_kwargs')} and {ref('think_tokens')} "
                                  f"are for the chat template; add {ref('template')} chat, or drop them")
        return ModelTemplate("base")
    if name != "chat":
        raise RulerInputError(f"unknown template '{name}'; choose one of: {', '.join(TEMPLATE_NAMES)}")
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise RulerInputError(f"{ref('template')} chat needs a tokenizer with a chat template (this one has none); "
                              f"use {ref('template')} base")
    user = [{"role": "user", "content": _SENTINEL}]
    system = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []

    def render(messages, extra):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **(extra or {}))

    try:
        text = _bounded(render, system + user, kwargs)
    except _RenderTimeout:
        raise RulerInputError(f"the tokenizer's chat template did not finish rendering one message within "
                              f"{RENDER_LIMIT_S:g} s of CPU time (the limit); fix its loops, or use "
                              f"{ref('template')} base") from None
    except _RenderTooLarge:
        raise RulerInputError(f"the tokenizer's chat template wrote more than {RENDER_LIMIT_CHARS:,} characters "
                              f"around one message (the limit); fix what it writes in its loops, or use "
                              f"{ref('template')} base") from None
    except Exception as e:  # noqa: BLE001 - a template that does not render is a user-input problem
        raise RulerInputError(_render_failure(render, e, system, user, kwargs)) from None
    if not isinstance(text, str) or text.count(_SENTINEL) != 1:
        raise RulerInputError(f"the tokenizer's chat template does not place the user message once; "
                              f"use {ref('template')} base")
    head, tail = text.split(_SENTINEL)
    # A BOS the template writes and the tokenizer adds again when it encodes the prompt (every backend encodes it
    # with the tokenizer's special tokens) would be there twice: it is left to the tokenizer. A token the
    # tokenizer does not add (ChatML's <|im_start|>, named BOS by SmolLM2's tokenizer) stays.
    bos = getattr(tokenizer, "bos_token", None)
    if bos and head.startswith(bos) and leading_bos(tokenizer) is not None:
        head = head[len(bos):]
    thinks = _thinks(tail, _template_source(tokenizer)) if thinking is None else thinking
    return ModelTemplate("chat", head, tail, system_prompt, kwargs, thinks)


def _render_failure(render, e: Exception, system: list, user: list, kwargs: dict | None) -> str:
    """One line: which of our additions the template refuses (rendered again without each), and what to do."""
    def works(messages, extra) -> bool:
        try:
            _bounded(render, messages, extra)
        except (Exception, _RenderTimeout):  # noqa: BLE001
            return False
        return True

    if system and works(user, kwargs):
        return f"the tokenizer's chat template refuses a system message ({_why(e)}); drop {ref('system_prompt')}"
    if kwargs and works(system + user, None):
        return (f"the tokenizer's chat template fails with {ref('chat_template_kwargs')} {json.dumps(kwargs)} "
                f"({_why(e)}); change or drop {ref('chat_template_kwargs')}")
    if (system or kwargs) and works(user, None):
        return (f"the tokenizer's chat template fails with {ref('system_prompt')} and {ref('chat_template_kwargs')} "
                f"together ({_why(e)}); drop one of them")
    return f"the tokenizer's chat template failed to render ({_why(e)}); use {ref('template')} base"


def split_format(fmt: str, **kwargs) -> tuple[str, str]:
    """(head, tail) with `fmt.format(context=X, **kwargs) == head + X + tail` for any X."""
    s = fmt.format(context=_SENTINEL, **kwargs)
    head, sep, tail = s.partition(_SENTINEL)
    if not sep or _SENTINEL in tail:
        raise ValueError("template must contain {context} exactly once")
    return head, tail
