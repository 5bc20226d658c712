"""The answer of a thinking model: the text after its thought (`<think>...</think>`).

As the Qwen3 model card ("Qwen/Qwen3-8B" README on the Hugging Face Hub, Quickstart, "parsing thinking
content") does, the thought ends at the LAST `</think>` (the card searches the output ids backwards for the
`</think>` token) and the answer is what follows. Where the card takes the whole output as the answer when
there is no `</think>`, here an unfinished thought (the budget ran out mid-thought) gives no answer: the
thought's text, which restates the context, must not be scored as one.
"""

from __future__ import annotations

THINK_END = "</think>"


def answer_after_thinking(text: str) -> tuple[str, bool]:
    """(the text after the last `</think>`, True); ("", False) when `text` has no `</think>`."""
    i = text.rfind(THINK_END)
    if i < 0:
        return "", False
    return text[i + len(THINK_END):], True
