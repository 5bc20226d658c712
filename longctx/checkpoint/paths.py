"""File names a checkpoint's own files give, kept inside the checkpoint folder.

Some files of a checkpoint name other files: a sharded checkpoint's `*.index.json` names its shards
(`weight_map`), `tokenizer_config.json` the fast tokenizer file (`fast_tokenizer_files`) and, like
`config.json`, the Python modules of its own code (`auto_map`, "module.Class"). transformers joins each name
to the folder with `os.path.join` (transformers/utils/hub.py `cached_files`, `get_checkpoint_shard_files`;
dynamic_module_utils.py `get_class_from_dynamic_module`), so an absolute name, or one with `..`, makes it read
a file anywhere on the machine. Here a name is accepted when, normalised lexically (`os.path.normpath`, no
file system access), it is relative and does not lead out of the folder; anything else is refused in one
line before any file is read.

Symlinks: the rule is about names, which come from the (untrusted) content of the files. The file a name
reaches may itself be a symlink: the layout on disk is the user's (or huggingface_hub's: a Hub cache snapshot
holds relative symlinks into `../../blobs`), and the fingerprint covers the content read through it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import json_object


def inside(name: str) -> str | None:
    """`name` normalised (e.g. 'sub/x.safetensors' for 'sub/./x.safetensors') when it is a relative path that
    stays in the folder it is read in; None when it is absolute or leads out of it."""
    norm = os.path.normpath(name) if name else "."
    if os.path.isabs(norm) or norm == os.pardir or norm.startswith(os.pardir + os.sep) or "\0" in norm:
        return None
    return norm


def check_inside(source: Path, what: str, name: str) -> str:
    """`name` normalised (`inside`), or InputError naming the file `source` that gives it, the entry and its
    folder (the folder of `source`)."""
    norm = inside(name)
    if norm is None:
        raise InputError(f"'{source}' names the {what} '{name}', outside the folder '{source.parent}'; a checkpoint's "
                         f"files may only name files inside it: copy that {what} into the folder and name it relative "
                         "to it")
    return norm


def code_modules(auto_map: Any) -> list[str]:
    """The module files ('module.py', 'sub/module.py') an `auto_map` names: its values are 'module.Class'
    or, for a tokenizer, [slow, fast] pairs of those (either may be null), in a dict or (legacy) alone. A
    reference to another Hub repo ('org/name--module.Class') names no file of this folder and is left out."""
    values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    refs = [r for v in values for r in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(r, str)]
    return [r.rpartition(".")[0] + ".py" for r in refs if "--" not in r and "." in r]


def check_code_inside(source: Path, doc: dict[str, Any] | None = None) -> None:
    """InputError when the JSON file `source` (a config.json or tokenizer_config.json; `doc`, its content when
    already read) has an `auto_map` that names a module outside its folder (transformers would import it with
    --trust-remote-code)."""

    for module in code_modules((json_object(source) if doc is None else doc).get("auto_map")):
        check_inside(source, "code module", module)
