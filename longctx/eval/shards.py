"""A RULER run split across jobs: `longctx ruler run ... --shard I/N -o RUN` predicts shard I of N of the run's
samples in `RUN/shards/I-of-N` (a run directory of its own: resumable, bound to the run's settings and to its
shard), and `longctx ruler merge RUN` puts complete shards together into `RUN` itself, a run directory whose task
files, predictions (byte for byte) and scores are those of the same run done in one go.

Which shard predicts a sample depends on its task file and line only (`owner`): round robin over each task
file's lines from an offset hashed from (length, task), so every shard gets every task at every length (about the
same time each), and adding a length or a task to the run moves no sample to another shard. This is NVIDIA
RULER's `--chunk_idx/--chunk_amount` (pred/call_api.py @ c3f5e3b) across tasks and lengths rather than within
one task file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from longctx.core.errors import InputError, SettingError
from longctx.core.files import (
    OWNER_FILE,
    RULER_RUN_KIND,
    make_temp_dir,
    mark_output,
    output_kind,
    read_json,
    write_json,
)
from longctx.core.kinds import KindError, Shard
from longctx.core.locks import OutputLock
from longctx.core.parse import loads
from longctx.eval.binding import RUN_FILE, RUN_FORMAT, STAGE_TAG, TASKS_DIR, check_run_dir, differences, link_tree
from longctx.eval.predictions import TaskLine, read_predictions, read_task_lines, write_predictions
from longctx.eval.settings import MergeSettings, RulerRunSettings

T = TypeVar("T")
SHARDS_DIR = "shards"
SHARD_FILE = "shard.json"  # written when a shard's every sample is predicted: what ran, its timings
SHARD_FORMAT = "longctx-ruler-shard/1"
_FOLDER = re.compile(r"^(\d+)-of-(\d+)$")
_SHARD = RulerRunSettings.flag("shard")


def split(shard: str) -> tuple[int, int]:
    """'2/8' -> (2, 8)."""
    index, count = shard.split("/")
    return int(index), int(count)


def shard_dir(run_dir: Path, shard: str) -> Path:
    """Where shard `shard` ('I/N') of the run `run_dir` is predicted: RUN_DIR/shards/I-of-N."""
    index, count = split(shard)
    return Path(run_dir) / SHARDS_DIR / f"{index}-of-{count}"


def owner(length: int, task: str, sample: int, count: int) -> int:
    """The shard (1 to `count`) that predicts line `sample` of the task file of `task` at `length`."""
    offset = int.from_bytes(hashlib.sha256(f"{length}/{task}".encode()).digest()[:8], "big")
    return (sample + offset) % count + 1


def samples_of(shard: str, length: int, task: str, lines: int) -> set[int]:
    """The lines of a task file of `lines` lines that shard `shard` predicts."""
    index, count = split(shard)
    return {i for i in range(lines) if owner(length, task, i, count) == index}


def predicted_by_shards(shards: Path, shard: str, task_lines: dict[tuple[int, str], list[TaskLine]]) -> int:
    """How many of the run's samples (`task_lines`: (length, task) -> its task file's lines) the shards of its
    split in the folder `shards` hold a prediction of, each counting only its own samples: the whole run's
    progress, as a shard starts."""
    count = split(shard)[1]
    done = 0
    for index in range(1, count + 1):
        folder = shards / f"{index}-of-{count}"
        for (length, task), lines in task_lines.items():
            preds = read_predictions(folder / "pred" / str(length) / f"{task}.jsonl",
                                     [t.prompt_sha256 for t in lines])
            done += len(preds.keys() & samples_of(f"{index}/{count}", length, task, len(lines)))
    return done


@dataclass
class _Shard:
    folder: Path
    run: dict[str, Any]
    index: int
    count: int
    record: dict[str, Any] | None  # shard.json, when the shard finished

    @property
    def name(self) -> str:
        return f"{self.index}/{self.count}"


def _read_shard(folder: Path) -> _Shard:
    try:
        run = loads((folder / RUN_FILE).read_bytes())
    except (OSError, ValueError):
        run = None
    binding = run.get("binding") if isinstance(run, dict) and run.get("format") == RUN_FORMAT else None
    if not isinstance(binding, dict):
        raise InputError(f"'{folder}' is not a RULER run directory (no readable {RUN_FILE}); merge the folders "
                         f"`longctx ruler run ... {_SHARD} I/N` made")
    try:
        shard = Shard().parse(binding.get("shard"))
    except KindError:
        raise InputError(f"'{folder}' is a whole run, not a shard (made without {_SHARD}); merge the shards of a "
                         "run") from None
    try:
        record = read_json(folder / SHARD_FILE)
    except (OSError, ValueError):
        record = None
    index, count = split(shard)
    return _Shard(folder, run, index, count, record if isinstance(record, dict) else None)


def find_shards(run_dir: Path, given: list[str] | None) -> list[_Shard]:
    """The shards to merge into `run_dir`: the folders `given`, else every folder of RUN_DIR/shards; refused
    unless they are exactly shards 1 to N of one split."""
    if given:
        folders = [Path(g) for g in given]
    else:
        root = run_dir / SHARDS_DIR
        folders = sorted((p for p in root.iterdir() if p.is_dir() and _FOLDER.match(p.name)),
                         key=lambda p: tuple(map(int, _FOLDER.match(p.name).groups()))) if root.is_dir() else []
        if not folders:
            raise InputError(f"no shards in '{root}'; predict them first with `longctx ruler run CHECKPOINT ... "
                             f"{_SHARD} I/N -o {run_dir}`, or name their folders with "
                             f"{MergeSettings.flag('shard_dirs')}")
    shards = [_read_shard(f) for f in folders]
    counts = sorted({s.count for s in shards})
    if len(counts) > 1:
        raise InputError(f"these shards split the run {' and '.join(map(str, counts))} ways "
                         f"({', '.join(f'{s.name} in {s.folder}' for s in shards)}); merge the shards of one split")
    count = counts[0]
    seen: dict[int, _Shard] = {}
    for s in shards:
        if s.index in seen:
            raise InputError(f"shard {s.name} is given twice ('{seen[s.index].folder}' and '{s.folder}'); keep one")
        seen[s.index] = s
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in seen]
    if missing:
        raise InputError(f"shard(s) {', '.join(missing)} of {count} are missing; predict them with `longctx ruler run "
                         f"CHECKPOINT ... {_SHARD} {missing[0]} -o {run_dir}` (the same settings as the others)")
    return [seen[i] for i in range(1, count + 1)]


def _whole(binding: dict[str, Any]) -> dict[str, Any]:
    return {**binding, "shard": None}


def check_one_run(shards: list[_Shard]) -> None:
    """SettingError or InputError, naming the first difference, when the shards are not of one run: the same
    checkpoint, settings, backend options and task files."""
    first = shards[0]
    for s in shards[1:]:
        if s.run["binding"].get("fingerprint") != first.run["binding"].get("fingerprint"):
            raise InputError(f"shard {s.name} ('{s.folder}') was made for another checkpoint than shard {first.name} "
                             f"('{first.folder}'); merge the shards of one run")
        diffs = differences(_whole(first.run["binding"]), _whole(s.run["binding"]))
        if diffs:
            raise SettingError(f"shard {s.name} ('{s.folder}') was made with other settings than shard {first.name} "
                               f"('{first.folder}'): {'; '.join(diffs)}; merge the shards of one run",
                               RulerRunSettings)  # the settings of `ruler run` that made them
        if s.run.get("files") != first.run.get("files"):
            ours, theirs = first.run.get("files") or {}, s.run.get("files") or {}
            which = sorted(k for k in {*ours, *theirs} if ours.get(k) != theirs.get(k))
            raise InputError(f"shard {s.name} ('{s.folder}') predicted other task files than shard {first.name} "
                             f"('{first.folder}'): {', '.join(which[:4])}{' ...' if len(which) > 4 else ''} (other "
                             "lengths, tasks or task data); merge the shards of one run")


@dataclass
class Merged:
    """The records of every task file of the run, in line order, and how many samples the shards hold of all."""

    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lines: dict[str, list[TaskLine]] = field(default_factory=dict)  # the task lines of each task file
    predicted: int = 0
    total: int = 0


def gather(shards: list[_Shard]) -> Merged:
    """Every shard's predictions of its own samples, checked against the first shard's task lines (their
    prompt hashes); InputError naming each unfinished shard, and how much of the whole run is predicted."""
    first = shards[0]
    merged = Merged()
    short: dict[str, list[int]] = {}
    for rel, sha in sorted(first.run.get("files", {}).items()):
        length, _, name = rel.partition("/")
        task = name.removesuffix(".jsonl")
        lines = read_task_lines(first.folder / TASKS_DIR / rel, sha)
        prompts = [t.prompt_sha256 for t in lines]
        records: list[dict[str, Any] | None] = [None] * len(lines)
        for s in shards:
            preds = read_predictions(s.folder / "pred" / rel, prompts)
            own = samples_of(s.name, int(length), task, len(lines))
            for i in own:
                records[i] = preds.get(i)
            got = short.setdefault(s.name, [0, 0])
            got[0] += len(own & preds.keys())
            got[1] += len(own)
        merged.records[rel] = records  # type: ignore[assignment]
        merged.lines[rel] = lines
    merged.predicted = sum(got for got, _ in short.values())
    merged.total = sum(of for _, of in short.values())
    unfinished = [f"{s.name} ({short[s.name][0]} of {short[s.name][1]} predicted)" for s in shards
                  if short[s.name][0] < short[s.name][1] or s.record is None]
    if unfinished:
        raise InputError(f"{merged.predicted} of the run's {merged.total} samples are predicted; not finished: shard "
                         f"{', '.join(unfinished)}; rerun each one's command to finish it (it resumes), then merge")
    return merged


def _whole_run(shards: list[_Shard]) -> dict[str, Any]:
    """run.json of the run the shards make: the first shard's, without its shard."""
    first = shards[0]
    return {"format": RUN_FORMAT, "binding": _whole(first.run["binding"]), "files": dict(first.run["files"]),
            **{k: v for k, v in first.run.items() if k not in ("format", "binding", "files")}}


def _check_target(run_dir: Path, run: dict[str, Any]) -> None:
    """Refuse a `run_dir` bound to another run, or holding anything but shards (and what longctx keeps hidden)."""
    if (run_dir / RUN_FILE).is_file() and output_kind(run_dir) == RULER_RUN_KIND:
        check_run_dir(run_dir, run["binding"])
    elif run_dir.is_dir():
        other = sorted(p.name for p in run_dir.iterdir() if p.name != SHARDS_DIR and not p.name.startswith("."))
        if other or (run_dir / OWNER_FILE).exists():
            held = f"it holds {', '.join(other[:3])}" if other else f"its {OWNER_FILE} is not longctx's"
            raise InputError(f"run directory '{run_dir}' exists and is not a longctx ruler run directory ({held}); "
                             "merge into the folder the shards were given as -o, or a new one")


def _write(run_dir: Path, staging: Path, shards: list[_Shard], merged: Merged, run: dict[str, Any],
           finish: Callable[[Path], T]) -> T:
    """The merged run made in `staging` (task files linked from the first shard's, one canonical prediction file
    per task file, run.json, scores.json, then what `finish(staging)` writes there), then moved into `run_dir`
    (what an earlier merge or run of the same settings left there is replaced); returns what `finish` did."""
    from longctx.eval.scores import SCORES_FILE, score_rows, scores_document
    from ruler_tasks.registry import resolve_tasks

    first = shards[0]
    link_tree(first.folder / TASKS_DIR, staging / TASKS_DIR)  # the task files and their manifest
    for rel in run["files"]:
        write_predictions(staging / "pred" / rel, merged.records[rel])
    held = dict(sorted(((int(rel.partition("/")[0]), rel.partition("/")[2].removesuffix(".jsonl")),
                        merged.lines[rel]) for rel in run["files"]))
    order = (first.record or {}).get("tasks") or []  # the shards' --tasks order, then RULER's
    names = {task for _, task in held}
    specs = [t for t in resolve_tasks([n for n in order if n in names] or None) if t.name in names]
    specs += [t for t in resolve_tasks(None) if t.name in names and t not in specs]
    rows = score_rows(staging, specs, held)
    ran = [(x.record or {}).get("ran") for x in shards]
    write_json(staging / SCORES_FILE, scores_document(
        binding=run["binding"], run=run, template=(first.record or {}).get("template"), rows=rows,
        ran=ran[0] if all(r == ran[0] for r in ran) else {x.name: r for x, r in zip(shards, ran)},
        timings={"shards": {x.name: (x.record or {}).get("timings") for x in shards}}, held=list(held),
        specs=specs))
    write_json(staging / RUN_FILE, run)
    mark_output(staging, RULER_RUN_KIND)
    made = finish(staging)
    for name in (TASKS_DIR, "pred"):
        if (run_dir / name).exists():
            os.rename(run_dir / name, staging / f"{name}.old")
        os.rename(staging / name, run_dir / name)
    for item in sorted((p for p in staging.iterdir() if p.is_file()), key=lambda p: p.name == RUN_FILE):
        os.replace(item, run_dir / item.name)  # run.json last: it names files that are there
    return made


def merge_run(s, finish: Callable[[Path], T], log: Callable[[str], None] | None = None) -> T:
    """`longctx ruler merge`: the complete shards of the run `s.run_dir` (a `MergeSettings`) put together into it,
    scored into scores.json as the same run done in one go would be, and `finish(folder)` (the report: it reads
    the run there and writes beside it) run before the run is moved into place. Every refusal (shards missing,
    twice, of another run or split, unfinished; a run directory of another run) comes before anything is
    written, and a failure to write (a full disk) leaves the run directory as it was. Returns what `finish`
    returned."""
    say = log or (lambda _msg: None)
    run_dir = Path(s.run_dir)
    lock = OutputLock(run_dir, "run directory")
    try:
        shards = find_shards(run_dir, s.shard_dirs)
        check_one_run(shards)
        merged = gather(shards)
        run = _whole_run(shards)
        _check_target(run_dir, run)
        fresh = not run_dir.exists()
        staging = None
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            staging = make_temp_dir(run_dir, "merge", STAGE_TAG)
            made = _write(run_dir, staging, shards, merged, run, finish)
        except OSError as e:
            if fresh:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise InputError(f"cannot write the merged run in '{run_dir}' ({e.strerror or type(e).__name__}); free "
                             "some space or choose another run directory") from None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
    finally:
        lock.release()
    say(f"merged {len(shards)} shards: {merged.total} predictions of {len(run['files'])} task files into {run_dir}")
    return made
