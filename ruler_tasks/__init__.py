"""RULER task generators.

RULER's standard task set (NVIDIA/RULER @ c3f5e3b, `scripts/synthetic.yaml`), byte-identical to upstream for the
same tokenizer, seed, length and data, with exact but much cheaper token counting. Entry point:
`ruler_tasks.prepare.prepare(...)`; the tasks and generators as data: `ruler_tasks.registry`.
"""

from ruler_tasks.errors import RulerInputError

__all__ = ["RulerInputError", "prepare"]


def prepare(*args, **kwargs):
    """See `ruler_tasks.prepare.prepare` (imported lazily: it pulls in transformers)."""
    from ruler_tasks.prepare import prepare as _prepare

    return _prepare(*args, **kwargs)
