"""RULER task generators.

The 13 standard RULER tasks (NVIDIA/RULER @ c3f5e3b), byte-identical to upstream for the same tokenizer,
seed, length and data, with exact but much cheaper token counting. Entry point:
`ruler_tasks.prepare.prepare(...)`; task registry: `ruler_tasks.registry.TASKS`.
"""

from ruler_tasks.errors import RulerInputError

__all__ = ["RulerInputError", "prepare"]


def prepare(*args, **kwargs):
    """See `ruler_tasks.prepare.prepare` (imported lazily: it pulls in transformers)."""
    from ruler_tasks.prepare import prepare as _prepare

    return _prepare(*args, **kwargs)
