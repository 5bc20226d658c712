"""Making task files: each (length, task) file is one job, made in this process or in worker processes.

A job's file depends only on the job and the inputs every maker has (the tokenizer's Rust pipeline, the model
template, seed, samples, word lists and data): each task seeds its own random streams, as upstream's generator,
run once per task, does. So the files are the same bytes whichever worker makes them, in whatever order, for any
number of workers. Workers are spawned processes (the caller may hold torch and its threads, which a fork would
copy mid-state) that die with the process that started them (`longctx.core.processes`); each loads the tokenizer
once and a data file the first time one of its jobs needs it, and keeps what it computes (token-count caches,
essay sentences) for its next jobs. Every file is written to a temporary file beside it and renamed when whole; a
stopped or failed call stops every worker at its next sample, and each removes its temporary file.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import multiprocessing
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.core.files import open_atomic
from longctx.core.processes import can_spawn, worker_pool
from ruler_tasks.counting import TokenCounter, backend_of
from ruler_tasks.data import DataSource, load_source
from ruler_tasks.registry import get_task


class Stopped(Exception):
    """The call a job belongs to has stopped (another job failed, or it was interrupted)."""


@dataclass(frozen=True)
class Job:
    """One task file to make: `out/rel` for `task` at `length`."""

    rel: str
    length: int
    task: str


@dataclass
class Made:
    """What making a job's file gave: its sha256, samples, the generator's stats, and times (set-up: everything
    before the first sample came out, the length search included; loop: the rest)."""

    sha256: str
    samples: int
    stats: dict
    setup_s: float
    loop_s: float


@dataclass
class Inputs:
    """What every maker makes files from: the tokenizer's Rust pipeline (as `tokenizers` serializes it), the model
    template, samples, seed, english words and the data sources (a file source without its content: a worker reads
    it itself, and checks its sha256)."""

    tokenizer_json: str
    template: Any
    samples: int
    seed: int
    words: list | None
    sources: dict[str, DataSource]
    out: Path


@dataclass
class Maker:
    """Makes jobs' files in this process, keeping the tokenizer, data and caches between jobs."""

    inputs: Inputs
    counter: Any = None
    data: dict[str, DataSource] = field(default_factory=dict)

    def _source(self, name: str) -> DataSource:
        src = self.data.get(name)
        if src is None:
            given = self.inputs.sources[name]
            src = given
            if given.obj is None:
                with warnings.catch_warnings():  # the caller said what it had to say of this file
                    warnings.simplefilter("ignore")
                    src = load_source(name, given.origin)
                if src.sha256 != given.sha256:
                    from ruler_tasks.errors import RulerInputError

                    raise RulerInputError(f"{name} file '{given.origin}' changed while the task files were being "
                                          "made; run again")
            self.data[name] = src
        return src

    def make(self, job: Job, on_sample: Callable[[], None] | None = None,
             stopped: Callable[[], bool] | None = None) -> Made:
        from ruler_tasks._common import GenContext

        i = self.inputs
        if self.counter is None:
            from tokenizers import Tokenizer

            self.counter = TokenCounter(Tokenizer.from_str(i.tokenizer_json))
        spec = get_task(job.task)
        # The tokenizer, word lists and counting caches are hundreds of thousands of long-lived objects; every
        # cyclic-GC pass over them costs milliseconds, and generation allocates enough to trigger many. Frozen
        # (`gc.freeze`), the collector skips them; new garbage is still collected.
        gc.freeze()
        t0 = time.perf_counter()
        ctx = GenContext(spec.name, dict(spec.args), job.length, i.samples, i.seed, self.counter, i.template,
                         spec.tokens_to_generate, {n: self._source(n) for n in spec.needs},
                         english_words=i.words)
        records = importlib.import_module(f"ruler_tasks.{spec.generator.module}").generate(ctx)
        h = hashlib.sha256()
        n, t_first = 0, None
        with open_atomic(i.out / job.rel) as f:
            for rec in records:
                if t_first is None:
                    t_first = time.perf_counter()
                line = json.dumps(rec) + "\n"
                f.write(line)
                h.update(line.encode("utf-8"))
                n += 1
                if on_sample is not None:
                    on_sample()
                if stopped is not None and stopped():
                    raise Stopped
        t1 = time.perf_counter()
        # the first sample's own cost is counted in set-up: small next to the search
        return Made(h.hexdigest(), n, {k: ctx.stats.get(k) for k in ("search", "size", "retries")},
                    (t_first or t1) - t0, t1 - (t_first or t1))


def tokenizer_json(tokenizer: Any) -> str:
    """The Rust pipeline of a fast tokenizer, as makers load it."""
    return backend_of(tokenizer).to_str()


def make_files(inputs: Inputs, jobs: Sequence[Job], *, workers: int, data: dict[str, DataSource] | None = None,
               on_sample: Callable[[int], None] | None = None, stop: Callable[[], bool] | None = None,
               in_workers: bool = False) -> Iterator[tuple[Job, Made]]:
    """Each job's file made, as (job, what it gave), in the order they finish: in this process when one worker (or
    one job) is asked for (with the sources already loaded in `data`) or no process can be spawned
    (`longctx.core.processes.can_spawn`), else in up to `workers` processes;
    `in_workers`: in worker processes whatever their number (this process then only waits, while its other
    threads work). `jobs` come in the order they should start (the longest first keeps the workers busy to the
    end). `on_sample(k)`: k more samples are written. `stop()` true (asked at each sample): `Stopped` is raised."""
    if not can_spawn() or (not in_workers and (workers <= 1 or len(jobs) <= 1)):
        maker = Maker(inputs, data=dict(data or {}))
        thawed = gc.get_freeze_count() == 0  # what `Maker.make` freezes is this process's to collect again after
        try:
            for job in jobs:
                yield job, maker.make(job, (lambda: on_sample(1)) if on_sample is not None else None, stop)
        finally:
            if thawed:
                gc.unfreeze()
        return
    if jobs:
        yield from _in_workers(inputs, jobs, max(1, min(workers, len(jobs))), on_sample, stop)


_WORKER: tuple[Maker, Any, Any] | None = None


def _set_worker(inputs: Inputs, written: Any, stop: Any) -> None:
    global _WORKER
    _WORKER = (Maker(inputs), written, stop)


def _worker_make(job: Job) -> Made:
    assert _WORKER is not None
    maker, written, stop = _WORKER

    def one() -> None:
        with written.get_lock():
            written.value += 1

    return maker.make(job, one, stop.is_set)


def _in_workers(inputs: Inputs, jobs: Sequence[Job], workers: int, on_sample: Callable[[int], None] | None,
                stop_asked: Callable[[], bool] | None) -> Iterator[tuple[Job, Made]]:
    mp = multiprocessing.get_context("spawn")
    written, stop = mp.Value("q", 0), mp.Event()
    seen = 0
    with worker_pool(workers, _set_worker, (inputs, written, stop)) as pool:
        try:
            futures: dict[Future, Job] = {pool.submit(_worker_make, job): job for job in jobs}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                if stop_asked is not None and stop_asked():
                    raise Stopped
                if on_sample is not None and written.value > seen:
                    now = written.value
                    on_sample(now - seen)
                    seen = now
                for fut in sorted(done, key=lambda f: jobs.index(futures[f])):
                    yield futures[fut], fut.result()
        except BaseException:
            stop.set()  # each running job ends at its next sample, and removes its temporary file
            raise
