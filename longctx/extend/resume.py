"""The work folder of `extend` (`OUT.train/`) as `--resume` reads it: checked whole before anything is trained.

It holds `settings.json` (what the run is: `record`), `train_log.jsonl` (a JSON object per finished step,
`longctx.extend.output.LOG_KEYS`) and the newest complete `step-NNNNNN/` (`longctx.extend.state`). Every file is
untrusted input checked against the others and against the run's plan: the settings, the step folder's name,
state, schedule, RNG and DCP metadata, and the log (steps 1, 2, ... at least up to the saved step; the lines
after it are the steps to redo). Whatever does not fit is one `InputError` naming the file, before the model
is loaded and before anything in the folder changes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.core.errors import ref
from longctx.core.parse import loads
from longctx.extend.dcp import check_inside, unusable
from longctx.extend.output import LOG_FILE, LOG_KEYS
from longctx.extend.plan import Plan
from longctx.extend.settings import ExtendSettings
from longctx.extend.state import check_step, step_dirs

SETTINGS_FILE = "settings.json"
WORK_KIND = "extend work folder"
# Settings a resumed run may change: they do not change what the run computes. The checkpoint is
# compared by fingerprint instead of by path.
RESUME_FREE_FIELDS = ("checkpoint", "resume", "overwrite", "save_every", "gradient_checkpointing", "cache_dir",
                      "trust_remote_code", "attention", "peak_tflops", "tokenize_workers")


def work_dir(output: str | os.PathLike) -> Path:
    """Where a run keeps its resumable state: beside the output, `OUT.train/`."""
    out = Path(output)
    return out.parent / f"{out.name}.train"


def record(s: ExtendSettings, source_fp: str, data_fp: str) -> dict[str, Any]:
    """What settings.json holds: the settings that decide what the run computes, and the fingerprints of its
    checkpoint and data."""
    return {"settings": _settings_record(s), "source_fingerprint": source_fp, "data_fingerprint": data_fp}


def _settings_record(s: ExtendSettings) -> dict[str, Any]:
    return {k: v for k, v in s.record().items() if k not in RESUME_FREE_FIELDS}


@dataclass(frozen=True)
class Resume:
    """What `check_work` found: `saved` the settings.json record (None: nothing to resume), `step_dir` and `state`
    the newest step folder and its state.json (None: nothing saved yet), `log` the log lines of its steps."""

    saved: dict[str, Any] | None = None
    step_dir: Path | None = None
    state: dict[str, int] | None = None
    log: list[str] = field(default_factory=list)


def _read_json(work: Path, path: Path) -> Any:
    check_inside(work, path, work)
    try:
        return loads(path.read_bytes(), max_bytes=1 << 20)
    except FileNotFoundError:
        raise unusable(work, path, "is missing") from None
    except (OSError, ValueError) as e:
        raise unusable(work, path, f"is damaged (not JSON: {e})") from None


def _read_settings(work: Path, path: Path) -> dict[str, Any]:
    saved = _read_json(work, path)
    if not isinstance(saved, dict):
        raise unusable(work, path, f"is damaged (a JSON {type(saved).__name__}, not an object)")
    for key, kind in (("settings", dict), ("source_fingerprint", str), ("data_fingerprint", str)):
        if key not in saved:
            raise unusable(work, path, f"is damaged (no '{key}')")
        if not isinstance(saved[key], kind):
            raise unusable(work, path, f"is damaged ('{key}' is {saved[key]!r})")
    return saved


def check_resumable(saved: dict[str, Any], s: ExtendSettings, source_fp: str, work: Path) -> None:
    """InputError naming every setting that differs from the run being resumed."""
    now = _settings_record(s)
    diffs = [f"{k} {saved['settings'].get(k)!r} -> {v!r}" for k, v in now.items() if saved["settings"].get(k) != v]
    diffs += [f"{k} {v!r} -> (no such setting)" for k, v in saved["settings"].items() if k not in now]
    if saved["source_fingerprint"] != source_fp:
        diffs.append("checkpoint (other weights or config than the run being resumed)")
    if diffs:
        raise s.error(f"{ref('resume')}: the run in '{work}' used different settings: {'; '.join(diffs)}; "
                      f"rerun with the original settings or pass {ref('overwrite')} (without {ref('resume')}) to "
                      "start over")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_entry(entry: Any, number: int, plan: Plan) -> str | None:
    """What is wrong with log line `number` (None: nothing)."""
    if not isinstance(entry, dict):
        return f"is a JSON {type(entry).__name__}, not an object"
    if set(entry) != set(LOG_KEYS):
        missing, extra = sorted(set(LOG_KEYS) - set(entry)), sorted(set(entry) - set(LOG_KEYS))
        return f"has {'no ' + ', '.join(missing) if missing else 'the unknown ' + ', '.join(extra)}"
    if type(entry["step"]) is not int or entry["step"] != number:
        return f"says step {entry['step']!r} where step {number} belongs"
    if entry["tokens"] != number * plan.tokens_per_step:
        return f"says {entry['tokens']!r} tokens after step {number}; this run has {number * plan.tokens_per_step}"
    for key in LOG_KEYS:
        value = entry[key]
        if not (_is_number(value) or (value is None and key.startswith("mfu"))):
            return f"has {key} {value!r}"
        if key not in ("loss", "grad_norm") and value is not None and not (math.isfinite(value) and value >= 0):
            return f"has {key} {value!r}"
    return None


def _read_log(work: Path, path: Path, step: int, plan: Plan) -> list[str]:
    """The log lines of steps 1..`step`, after checking every line: steps 1, 2, ... up to at least `step` and at
    most the plan's last. A last line cut short (no newline, not JSON: a write that failed) is a step to redo."""
    check_inside(work, path, work)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise unusable(work, path, "is missing") from None
    except (OSError, UnicodeDecodeError) as e:
        raise unusable(work, path, f"is damaged ({e})") from None
    lines = text.split("\n")
    torn = lines.pop()  # "" after the final newline
    for number, line in enumerate(lines, 1):
        try:
            problem = _check_entry(loads(line, max_bytes=1 << 12), number, plan)
        except ValueError as e:
            problem = f"is not JSON ({e})"
        if problem is None and number > plan.steps:
            problem = f"is step {number}, beyond the {plan.steps} steps of this run"
        if problem is not None:
            raise unusable(work, path, f"is damaged: line {number} {problem}")
    if len(lines) < step:
        more = f" and a cut line ({len(torn)} bytes)" if torn else ""
        raise unusable(work, path, f"holds {len(lines)} steps{more}, but the saved state is after step {step}")
    return lines[:step]


def check_work(s: ExtendSettings, plan: Plan, source_fp: str) -> Resume:
    """What `--resume` continues from in `work_dir(s.output)`, the whole folder checked (see the module docstring);
    an empty `Resume` when there is nothing to continue (no --resume, or nothing saved: the run starts over)."""
    work = work_dir(s.output)
    if not s.resume or not work.is_dir():
        return Resume()
    steps = step_dirs(work)
    path = work / SETTINGS_FILE
    if not path.exists() and not path.is_symlink():
        if steps:
            raise unusable(work, path, "is missing")
        return Resume()  # killed before the run had started: nothing to continue
    saved = _read_settings(work, path)
    check_resumable(saved, s, source_fp, work)
    if not steps:
        return Resume(saved)
    state = check_step(work, steps[-1], plan, s)
    return Resume(saved, steps[-1], state, _read_log(work, work / LOG_FILE, state["step"], plan))
