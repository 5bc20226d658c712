"""Prediction JSONL per (length, task): appended and flushed per line, resumable.

A line is `{"index", "pred", "outputs", "length", "task", "max_length", "prompt_tokens", "prompt_sha256"}`
(`prompt_sha256`: `prompt_hash` of the prompt sent, so runs can be paired on the same prompts; thinking models
add `raw` and `thinking_closed`). On reopen a
torn last line (a run killed mid-write) is cut off, and indices already present are skipped, so a
resumed run neither loses nor duplicates a prediction.

A score comes only from what longctx generated and what the task file holds: the references are the task
file's `outputs` (`read_task_lines`), never a prediction line's, and a prediction counts only when its
`prompt_sha256` is the hash of its task line's prompt (`read_predictions(path, prompts)`); any other is
predicted again. The run directory is trusted for `pred` itself: a prediction line whose hash matches is
scored as it stands, whoever wrote it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from longctx.core.errors import InputError
from longctx.core.files import open_in_place, write_atomic
from longctx.core.parse import loads


def prompt_hash(prompt: str) -> str:
    """The sha256 (hex) of a prompt as sent: `input + answer_prefix` of its task-file line."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def _is_record(rec) -> bool:
    """A prediction line as `PredictionWriter` writes them (anything else, e.g. a line edited by hand, is
    skipped: its sample is predicted again)."""
    return (isinstance(rec, dict) and isinstance(rec.get("index"), int) and not isinstance(rec["index"], bool)
            and rec["index"] >= 0 and isinstance(rec.get("pred"), str) and isinstance(rec.get("outputs"), list))


@dataclass(frozen=True)
class TaskLine:
    """What a task file's line holds that a prediction is scored against."""

    outputs: list[str]  # the reference answers
    prompt_sha256: str  # `prompt_hash` of its prompt, `input + answer_prefix`


def read_task_lines(path: Path, sha256: str | None = None) -> list[TaskLine]:
    """The lines of the task file `path`, in order; InputError when it is unreadable, a line is not a task
    record, or (`sha256` given: the hash run.json records) the file is not the one recorded."""
    digest = hashlib.sha256()
    lines: list[TaskLine] = []
    try:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):  # noqa: B007 - the message names the line that is bad
                digest.update(raw)
                row = loads(raw)
                outputs, prompt = row["outputs"], row["input"] + row["answer_prefix"]
                if not (isinstance(outputs, list) and outputs and all(isinstance(o, str) for o in outputs)):
                    raise TypeError
                lines.append(TaskLine(outputs, prompt_hash(prompt)))
    except OSError as e:
        raise InputError(f"task file {path} is unreadable ({e.strerror or e.__class__.__name__})") from None
    except (ValueError, KeyError, TypeError):
        raise InputError(f"task file {path}: line {number} is not a RULER task record") from None
    if sha256 is not None and digest.hexdigest() != sha256:
        raise InputError(f"task file {path} is not the one run.json records (sha256 {digest.hexdigest()[:12]}…, "
                         f"recorded {str(sha256)[:12]}…)")
    return lines


def read_predictions(path: Path, prompts: list[str] | None = None) -> dict[int, dict]:
    """index -> record for the complete lines of `path` (first record wins on a duplicate index). With
    `prompts` (sample i's prompt sha256 at [i]), only records of those samples whose `prompt_sha256` is
    their prompt's count."""
    out: dict[int, dict] = {}
    if not path.is_file():
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn last line
            try:
                rec = loads(line)
            except ValueError:
                continue
            if not _is_record(rec):
                continue
            if prompts is None or (rec["index"] < len(prompts) and rec.get("prompt_sha256") == prompts[rec["index"]]):
                out.setdefault(rec["index"], rec)
    return out


def predictions_text(records: list[dict]) -> str:
    """A prediction file's canonical content: one line per record, as `PredictionWriter` writes it."""
    return "".join(json.dumps(rec) + "\n" for rec in records)


def write_predictions(path: Path, records: list[dict]) -> None:
    """`path` replaced, atomically, by the canonical file of `records` (in the order given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, predictions_text(records))


def _repair(path: Path) -> None:
    """Cut a torn last line (no trailing newline) so appends start on a fresh line."""
    if not path.is_file() and not path.is_symlink():
        return
    with os.fdopen(open_in_place(path, read=True), "rb+") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
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
            f = os.fdopen(open_in_place(path), "a", encoding="utf-8", newline="\n")
            self._files[path] = f
        f.write(predictions_text([record]))
        f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
