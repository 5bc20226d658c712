"""Model prompt templates: `base` (RULER's default) and `chat` (the tokenizer's own chat template).

RULER builds `model_template.format(task_template=T) + answer_prefix` (scripts/data/template.py and
prepare.py @ c3f5e3b): the answer prefix comes *after* the model wrapper, i.e. in the assistant turn.
`chat` renders the tokenizer's chat template around one user message and uses it the same way.
Braces of the wrapper are escaped because RULER's generators run `str.format` on the whole template.
Differences from upstream's hand-written wrappers: a leading BOS token string rendered by the chat
template is dropped (inference servers add BOS themselves), and the NIAH singular rewrite
("are" -> "is", ...) is applied to the task text only, never to the wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass

from ruler_tasks.errors import RulerInputError

TEMPLATE_NAMES = ("base", "chat")
_SENTINEL = "\x00RULER_TASK_TEMPLATE\x00"


def _esc(s: str) -> str:
    return s.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class ModelTemplate:
    name: str
    head: str = ""  # wrapper text before the task template (raw, unescaped)
    tail: str = ""  # wrapper text between the task template and the answer prefix

    @property
    def is_base(self) -> bool:
        return not self.head and not self.tail

    def compose(self, task_template: str, answer_prefix: str) -> str:
        """The `--template` string RULER's generator would receive."""
        return _esc(self.head) + task_template + _esc(self.tail) + answer_prefix

    def describe(self) -> dict:
        return {"name": self.name, "head": self.head, "tail": self.tail}


def model_template(name: str, tokenizer=None) -> ModelTemplate:
    if name == "base":
        return ModelTemplate("base")
    if name != "chat":
        raise RulerInputError(f"unknown template '{name}'; choose one of: {', '.join(TEMPLATE_NAMES)}")
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise RulerInputError("--template chat needs a tokenizer with a chat template (this one has none); use --template base")
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - a broken template is a user-input problem
        raise RulerInputError(f"the tokenizer's chat template failed to render ({e.__class__.__name__}: {e}); use --template base") from None
    if not isinstance(text, str) or text.count(_SENTINEL) != 1:
        raise RulerInputError("the tokenizer's chat template does not place the user message once; use --template base")
    head, tail = text.split(_SENTINEL)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and head.startswith(bos):
        head = head[len(bos):]
    return ModelTemplate("chat", head, tail)


def split_format(fmt: str, **kwargs) -> tuple[str, str]:
    """(head, tail) with `fmt.format(context=X, **kwargs) == head + X + tail` for any X."""
    s = fmt.format(context=_SENTINEL, **kwargs)
    head, sep, tail = s.partition(_SENTINEL)
    if not sep or _SENTINEL in tail:
        raise ValueError("template must contain {context} exactly once")
    return head, tail
