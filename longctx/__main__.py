"""`python -m longctx ...`: what `torchrun -m longctx extend ...` and `accelerate launch -m longctx ...` run.

A process multiprocessing spawns runs its parent's main module first (as `__mp_main__`): by its path when the
module has no `__spec__`, and not at all when it was run with -m (multiprocessing/spawn.py `_fixup_main_from_name`
skips a `__main__` module). So run as the program, this module drops its spec, and a process spawned for longctx's
work (vLLM's engine, a tokenize worker) imports `longctx` before anything else, which binds it to this process
(`longctx._adopt_when_started_for_longctx`) while it is still starting.
"""

import longctx  # noqa: F401  (first: in a spawned process, binds it to its parent)

if __name__ == "__main__":
    __spec__ = None
    from longctx.cli.main import main

    main()
