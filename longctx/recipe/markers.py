"""A stage folder's marker (`stage.json`): the hash of what the stage ran from, whether it completed, and the
sha256 of every file it wrote; and the files in a stage folder that its stage did not write.

A stage whose marker matches, is complete and whose files are as it wrote them is skipped; one that was
interrupted resumes; a changed setting, input or file reruns it. Rerunning a stage replaces its folder, so a file
found there that the stage did not write is refused, never deleted; longctx's own bookkeeping (the marker,
ownership marks, locks, writers' temporaries) is not counted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError
from longctx.core.files import OWNER_FILE, temporary_target, write_json
from longctx.core.hashing import tree_files, tree_hashes
from longctx.core.locks import LOCK_FILE
from longctx.core.parse import loads
from longctx.recipe.stage import Step

MARKER = "stage.json"


def read_marker(d: Path) -> dict[str, Any] | None:
    try:
        m = loads((d / MARKER).read_text(encoding="utf-8"))
        return m if isinstance(m, dict) else None
    except (OSError, ValueError):  # none, torn or over a limit: the stage has not run
        return None


def _bookkeeping(name: str) -> bool:
    """A file longctx keeps beside a stage's outputs, not an output itself: the stage marker, an ownership mark,
    a lock, a writer's temporary."""
    return (name in (MARKER, OWNER_FILE) or name.endswith(LOCK_FILE)
            or temporary_target(name, any_process=True) is not None)


def stage_hashes(d: Path) -> dict[str, str]:
    """sha256 of every file in the stage folder `d` but the bookkeeping, by relative path."""
    return tree_hashes(d, _bookkeeping)


def changed_file(step: Step, marker: dict[str, Any]) -> str | None:
    """How the files of the complete stage in `step.dir` differ from what it recorded writing (the first
    difference), or None when they do not."""
    recorded = marker.get("files")
    if not isinstance(recorded, dict):
        return "it has no record of the files it wrote"
    found = stage_hashes(step.dir)
    for rel in sorted(set(recorded) | set(found)):
        if rel not in found:
            return f"{rel} was removed"
        if rel not in recorded:
            return f"{rel} was added"
        if found[rel] != recorded[rel]:
            return f"{rel} was changed"
    return None


def foreign_files(step: Step) -> list[str]:
    """Files in the stage folder that its stage did not write (relative paths): with a record of what it wrote
    (a complete stage), those not in it; otherwise the entries beside its outputs that are neither one of them
    (nor named after one, as extend's `OUTPUT.train`) nor bookkeeping."""
    marker = read_marker(step.dir)
    recorded = marker.get("files") if marker and marker.get("complete") else None
    if isinstance(recorded, dict):
        return [rel for rel in tree_files(step.dir, _bookkeeping) if rel not in recorded]
    if step.dir in step.outputs:  # the folder is the output itself (compare): nothing tells its files apart
        return []
    outputs = {p.name for p in step.outputs if p.parent == step.dir}
    return sorted(n for n in os.listdir(step.dir) if not _bookkeeping(n)
                  and not any(n == o or n.startswith(f"{o}.") for o in outputs))


def check_foreign(step: Step) -> None:
    """InputError when the folder of `step`, which runs again (and so is replaced), holds a file its stage did
    not write."""
    if step.status != "run" or not step.dir.is_dir():
        return
    foreign = foreign_files(step)
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise InputError(f"'{step.dir / foreign[0]}'{more} was not written by the {step.stage} stage, whose folder "
                         f"a rerun replaces ({step.reason}); move it out of '{step.dir}' first")


def record_files(d: Path) -> None:
    """Record anew the files of the complete stage in `d`, after a later stage added one of its own there."""
    marker = read_marker(d)
    if marker is not None and marker.get("complete"):
        write_json(d / MARKER, {**marker, "files": stage_hashes(d)})
