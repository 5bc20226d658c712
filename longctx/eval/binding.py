"""What a RULER run directory is bound to (`run.json`): a rerun into it continues the same evaluation or
is refused, never mixed in.

    run.json  {"format", "binding": {fingerprint, tokenizer, seed, samples, template, backend, sampling},
               "files": {"<length>/<task>.jsonl": sha256 of the task file predictions were made from},
               "model", "backend"}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import write_json

RUN_FILE = "run.json"
RUN_FORMAT = "longctx-ruler-run/1"
# Upstream: temperature 0 (greedy), top_p 1, max_tokens = the task's tokens_to_generate, no stop words.
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": "tokens_to_generate of each task", "stop": []}
_LABELS = {"fingerprint": "checkpoint", "tokenizer": "tokenizer", "seed": "--seed", "samples": "--samples",
           "template": "--template", "backend": "--backend", "sampling": "sampling settings"}


def bind(out: Path, binding: dict[str, Any]) -> dict[str, Any]:
    """The run.json of `out` (created when new), or InputError when it is bound to something else."""
    path = out / RUN_FILE
    if path.is_file():
        try:
            run = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"{path} is unreadable ({e.__class__.__name__}); use another -o") from None
        if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
            raise InputError(f"{path} is not a longctx ruler run file; use another -o")
        old = run.get("binding", {})
        for key, label in _LABELS.items():
            if old.get(key) != binding[key]:
                if key == "fingerprint":
                    raise InputError(f"run directory '{out}' was made for another checkpoint (fingerprint "
                                     f"{str(old.get(key))[:12]}…, this one {binding[key][:12]}…); use another -o")
                a, b = json.dumps(old.get(key)), json.dumps(binding[key])
                raise InputError(f"run directory '{out}' was made with a different {label} ({a[:60]}, now {b[:60]}); "
                                 "use another -o or the same settings")
        return run
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"'{out}' exists and is not a longctx ruler run directory; choose another -o")
    out.mkdir(parents=True, exist_ok=True)
    run = {"format": RUN_FORMAT, "binding": binding, "files": {}}
    write_json(path, run)
    return run


def record_task_files(out: Path, run: dict[str, Any], files: dict[str, dict]) -> None:
    """Record the sha256 of the task files in use; InputError when one changed under predictions made from
    the old one."""
    for rel, entry in files.items():
        old = run["files"].get(rel)
        if old is not None and old != entry["sha256"] and (out / "pred" / rel).is_file():
            raise InputError(f"task file {rel} differs from the one this run directory's predictions were made "
                             "from (task data or generator changed); use another -o")
        run["files"][rel] = entry["sha256"]
