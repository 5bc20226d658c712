"""`longctx ruler prepare`, and the tokenizer both RULER verbs cut task files with.

The tokenizer is loaded by `longctx.checkpoint.tokenizer.load_tokenizer`, the loader (and the remote-code rule)
of every verb, the first time a folder's content is seen, and from longctx's cache after that
(`longctx.checkpoint.prompt_tokenizer`: no transformers, no torch); it must be a fast one: the task generators fit
lengths exactly with its Rust definition.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from longctx.checkpoint.hub import resolve_checkpoint
from longctx.checkpoint.prompt_tokenizer import cached_tokenizer
from longctx.checkpoint.tokenizer import load_tokenizer, require_tokenizer_files
from longctx.core.errors import InputError, SettingError
from longctx.eval.settings import PrepareSettings
from ruler_tasks.prepare import PrepareResult, check_fast, prepare


def load_task_tokenizer(path: str | os.PathLike, trust_remote_code: bool) -> Any:
    """The fast tokenizer in folder `path` (code it ships runs only with `trust_remote_code`), as prompts need it."""
    if not Path(path).exists():
        raise InputError(f"tokenizer path '{path}' does not exist (give a tokenizer or checkpoint folder, or a Hub "
                         "id)")
    require_tokenizer_files(path)
    tokenizer = cached_tokenizer(path, trust_remote_code, lambda: load_tokenizer(path, trust_remote_code))
    check_fast(tokenizer, path)
    return tokenizer


def prepare_tasks(s: PrepareSettings) -> PrepareResult:
    """Write the task files `s` asks for into `s.output` (`ruler_tasks.prepare.prepare`)."""
    tokenizer = load_task_tokenizer(resolve_checkpoint(s.tokenizer, tokenizer_only=True), s.trust_remote_code)
    try:
        return prepare(tokenizer, s.lengths, tasks=s.tasks, samples=s.samples, seed=s.seed, template=s.template,
                       data_dir=s.data_dir, essay=s.essay, squad=s.squad, hotpotqa=s.hotpotqa, out_dir=s.output,
                       system_prompt=s.system_prompt, chat_template_kwargs=s.chat_template_kwargs, workers=s.workers)
    except SettingError as e:  # its names are these settings' (a RulerInputError names the parameters)
        e.owner = e.owner or type(s)
        raise
