"""What a RULER run directory is bound to (`run.json`): a rerun into it continues the same evaluation or
is refused, never mixed in.

    run.json  {"format", "binding": {fingerprint, tokenizer, seed, samples, template, system_prompt,
                                      chat_template_kwargs, think_tokens, backend, sampling,
                                      engine (the backend options that can change a prediction),
                                      shard ("I/N" of a shard, `longctx.eval.shards`; null for a whole run)},
               "files": {"<length>/<task>.jsonl": sha256 of the task file predictions were made from},
               "model", "backend"}

A run's new task files and its run.json are made in a staging folder (`StagedRun`) and moved into the run
directory only when every check has passed: a refusal leaves the run directory as it was, and a new one is
not made at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longctx.core.errors import InputError, SettingError, ref
from longctx.core.files import RULER_RUN_KIND, link_or_copy, make_temp_dir, mark_output, output_kind, write_json
from longctx.core.locks import OutputLock
from longctx.core.parse import loads
from longctx.core.secrets import redact_url
from longctx.eval.backends import option_users

RUN_FILE = "run.json"
RUN_FORMAT = "longctx-ruler-run/1"
TASKS_DIR = "tasks"
STAGE_TAG = "stage"
# Upstream: temperature 0 (greedy), top_p 1, max_tokens = the task's tokens_to_generate, no stop words.
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": "tokens_to_generate of each task", "stop": []}
# The binding's keys, in the order a refusal lists what changed: the settings of `ruler run` of the same name
# (named with `ref`: the refusal is a `SettingError`), and the values that are not a setting, in words.
_BOUND = ("fingerprint", "tokenizer", "seed", "samples", "template", "system_prompt", "chat_template_kwargs",
          "think_tokens", "backend", "sampling", "engine", "shard")
_WORDS = {"fingerprint": "checkpoint", "tokenizer": "tokenizer", "sampling": "sampling settings",
          "engine": "engine options"}
# The backend options that can change a prediction (each backend's `binding()`) are named as the option of the
# same name; these binding keys are another option's value, or none's.
_ENGINE_WORDS = {"served_model": ref("model"), "served_root": "the served model's root"}


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _engine_label(key: str) -> str:
    """How a refusal names the engine option `key` of a binding."""
    if key in _ENGINE_WORDS:
        return _ENGINE_WORDS[key]
    return ref(key) if key in option_users() else key


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """'--seed 42 -> 1', '--dtype "bfloat16" -> "float32"', ... (settings named with `ref`): every binding value
    a rerun would change (the engine options one by one; a run.json from before they were bound says so)."""
    diffs = []
    for key in _BOUND:
        label = _WORDS.get(key, ref(key))
        if key == "engine" and key not in old:
            diffs.append("engine options (not recorded in this run directory) -> " + _shown(new[key]))
        elif key == "engine":
            was = old[key] if isinstance(old[key], dict) else {}
            diffs += _option_differences(was, new[key])
        elif old.get(key) != new.get(key):
            diffs.append(f"{label} {_shown(old.get(key))} -> {_shown(new.get(key))}")
    return diffs


def _url(value: Any) -> Any:
    """A bound URL as a message may show it: redacted (run.json files written before URLs were redacted
    hold them as given, credentials included)."""
    return redact_url(value) if isinstance(value, str) else value


def _option_differences(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """'--dtype "bfloat16" -> "float32"', '--engine-arg kv_cache_dtype "fp8" -> null', ...."""
    diffs = []
    for k in dict.fromkeys([*was, *now]):
        if k == "engine_args":
            args_was, args_now = (d.get(k) if isinstance(d.get(k), dict) else {} for d in (was, now))
            diffs += [f"{ref('engine_args')} {a} {_shown(args_was.get(a))} -> {_shown(args_now.get(a))}"
                      for a in dict.fromkeys([*args_was, *args_now]) if args_was.get(a) != args_now.get(a)]
        elif was.get(k) != now.get(k):
            old, new = (_url(v) if k == "base_url" else v for v in (was.get(k), now.get(k)))
            diffs.append(f"{_engine_label(k)} {_shown(old)} -> {_shown(new)}")
    return diffs


def check_run_dir(out: Path, binding: dict[str, Any]) -> dict[str, Any]:
    """The run.json content of `out` (a new one, not yet written, when `out` is new or empty), or InputError
    when `out` is bound to something else (a `SettingError` naming the settings that differ, its owner left to
    the caller) or is not a run directory. Writes nothing."""
    path = out / RUN_FILE
    if out.exists() and not out.is_dir():
        raise InputError(f"'{out}' is a file, not a folder; choose another -o")
    if path.is_file():
        try:
            run = loads(path.read_bytes())
        except (OSError, ValueError) as e:
            raise InputError(f"{path} is unreadable ({e.__class__.__name__}); use another -o") from None
        if not isinstance(run, dict) or run.get("format") != RUN_FORMAT or not isinstance(run.get("files", {}), dict):
            raise InputError(f"{path} is not a longctx ruler run file; use another -o")
        old = run.get("binding")
        old = old if isinstance(old, dict) else {}
        if old.get("fingerprint") != binding["fingerprint"]:
            raise InputError(f"run directory '{out}' was made for another checkpoint (fingerprint "
                             f"{str(old.get('fingerprint'))[:12]}…, this one {binding['fingerprint'][:12]}…); "
                             "use another -o")
        diffs = differences(old, binding)
        if diffs:
            raise SettingError(f"run directory '{out}' was made with other settings: {'; '.join(diffs)}; use the "
                               "same settings to continue it, or another -o")
        run.setdefault("files", {})
        return run
    if out.exists() and any(not p.name.startswith(f".{TASKS_DIR}.{STAGE_TAG}-") for p in out.iterdir()):
        raise InputError(f"'{out}' exists and is not a longctx ruler run directory; choose another -o")
    return {"format": RUN_FORMAT, "binding": binding, "files": {}}


def record_task_files(out: Path, run: dict[str, Any], files: dict[str, dict]) -> None:
    """Record the sha256 of the task files in use; InputError when one changed under predictions made from
    the old one."""
    for rel, entry in files.items():
        old = run["files"].get(rel)
        if old is not None and old != entry["sha256"] and (out / "pred" / rel).is_file():
            raise InputError(f"task file {rel} differs from the one this run directory's predictions were made "
                             "from (task data or generator changed); use another -o")
        run["files"][rel] = entry["sha256"]


def link_tree(src: Path, dst: Path) -> None:
    """`dst` as a copy of the folder `src`, its files hard links where the file system allows (task files are
    only ever replaced, never written in place, so the links never change the originals)."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        if any(part.startswith(".") for part in rel.parts):  # another writer's temporary files
            continue
        target = dst / rel
        if p.is_dir() and not p.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
        elif p.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(p, target)


class StagedRun:
    """A staging folder for the task files (`tasks`, made from the run directory's own when it has some), run.json
    and the files the backend writes while starting (its engine's log) of the run directory `out`; `commit(run)`
    moves them into `out` (making it, when new)."""

    def __init__(self, out: Path):
        self.out = out
        # One writer per run directory, from here to the end of the run (`lock`, released by its owner). The lock
        # makes the folders above a new run directory, and removes them again when released unused: a refusal
        # leaves no parents behind.
        self.lock: OutputLock | None = OutputLock(out, "run directory")
        self.fresh = not out.exists()
        where = out.parent if self.fresh else out
        name = out.name if self.fresh else TASKS_DIR
        try:
            self.root: Path | None = make_temp_dir(where, name, STAGE_TAG)
        except OSError as e:
            self.release()
            raise InputError(f"cannot write in '{where}' ({e.strerror or e.__class__.__name__}); "
                             "choose another -o") from None
        self.tasks = self.root / TASKS_DIR
        if not self.fresh and (out / TASKS_DIR).is_dir():
            link_tree(out / TASKS_DIR, self.tasks)

    def commit(self, run: dict[str, Any]) -> None:
        """Move the task files in, then write run.json (so a run.json always names files that are there)."""
        assert self.root is not None
        if self.fresh:
            write_json(self.root / RUN_FILE, run)
            mark_output(self.root, RULER_RUN_KIND)
            self.out.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(self.root, self.out)
            except OSError:
                raise InputError(f"'{self.out}' appeared while this run was preparing it; nothing was written "
                                 "there: rerun, or choose another -o") from None
            self.root = None
            return
        live = self.out / TASKS_DIR
        if self.tasks.is_dir():
            if live.exists():
                os.rename(live, self.root / f"{TASKS_DIR}.old")
            os.rename(self.tasks, live)
        for item in sorted(self.root.iterdir()):  # what the backend wrote while staged (its engine's log)
            if item.is_file() and item.name != RUN_FILE:
                os.replace(item, self.out / item.name)
        write_json(self.out / RUN_FILE, run)
        if output_kind(self.out) != RULER_RUN_KIND:
            mark_output(self.out, RULER_RUN_KIND)
        self.discard()

    def discard(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def release(self) -> None:
        """Let another process write into the run directory."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


@contextlib.contextmanager
def staged_run(out: Path) -> Iterator[StagedRun]:
    """A `StagedRun` for `out` that vanishes unless committed in the block; its lock on the run directory is
    held after the block until `release()`, and released at once if the block fails."""
    stage = StagedRun(out)
    try:
        yield stage
    except BaseException:
        stage.discard()  # first: the lock's release removes the folders it made only when they are empty
        stage.release()
        raise
    finally:
        stage.discard()
