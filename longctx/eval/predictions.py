"""Prediction JSONL per (length, task): appended and flushed per line, resumable.

A line is `{"index", "pred", "outputs", "length", "task", "max_length", "prompt_tokens", "prompt_sha256"}`
(`prompt_sha256`: `prompt_hash` of the prompt sent, so runs can be paired on the same prompts; thinking models
add `raw` and `thinking_closed`). On reopen a
torn last line (a run killed mid-write) is cut off, and indices already present are skipped, so a
resumed run neither loses nor duplicates a prediction.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def prompt_hash(prompt: str) -> str:
    """The sha256 (hex) of a prompt as sent: `input + answer_prefix` of its task-file line."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def _is_record(rec) -> bool:
    """A prediction line as `PredictionWriter` writes them (anything else, e.g. a line edited by hand, is
    skipped: its sample is predicted again)."""
    return (isinstance(rec, dict) and isinstance(rec.get("index"), int) and not isinstance(rec["index"], bool)
            and rec["index"] >= 0 and isinstance(rec.get("pred"), str) and isinstance(rec.get("outputs"), list))


def read_predictions(path: Path) -> dict[int, dict]:
    """index -> record for the complete lines of `path` (first record wins on a duplicate index)."""
    out: dict[int, dict] = {}
    if not path.is_file():
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn last line
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if _is_record(rec):
                out.setdefault(rec["index"], rec)
    return out


def _repair(path: Path) -> None:
    """Cut a torn last line (no trailing newline) so appends start on a fresh line."""
    if not path.is_file():
        return
    size = path.stat().st_size
    if size == 0:
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        # find the last newline
        pos = size
        block = 1 << 16
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                f.truncate(start + i + 1)
                return
            pos = start
        f.truncate(0)


class PredictionWriter:
    """Append-only writers for many files, one line per prediction, flushed at once."""

    def __init__(self):
        self._files: dict[Path, object] = {}

    def write(self, path: Path, record: dict) -> None:
        f = self._files.get(path)
        if f is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            _repair(path)
            f = open(path, "a", encoding="utf-8", newline="\n")
            self._files[path] = f
        f.write(json.dumps(record) + "\n")
        f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
