"""`longctx ruler CKPT --lengths 4k,...,128k -o RUN_DIR`: task files -> predictions -> scores, resumable.

Run directory layout:
  run.json                       what the directory is bound to (`longctx.eval.binding`)
  tasks/<length>/<task>.jsonl    RULER task files made with the checkpoint's tokenizer (reused)
  pred/<length>/<task>.jsonl     predictions, one line per sample, flushed per line
  scores.json                    per task x length score, nulls, samples (read by longctx.report)
A rerun continues where the last one stopped; a rerun with another checkpoint, tokenizer, task
settings, backend or sampling is refused, never mixed in. Every refusal (missing or broken data, a sample
beyond the checkpoint, a directory bound to other settings) comes before anything is written to the run
directory or logged: new task files are made in a staging folder and moved in with run.json after the checks.
A score comes only from what longctx generated and what the task file holds: references are read from the
task files (the ones run.json records), and a prediction whose `prompt_sha256` is not its task line's prompt
hash is predicted again (`longctx.eval.predictions`); the run directory is trusted for `pred` itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.checkpoint.directory import checkpoint_dir, fingerprint, read_config
from longctx.core.errors import InputError, SettingError, ref
from longctx.core.files import check_apart, json_object, write_json
from longctx.core.hashing import tokenizer_fingerprint
from longctx.core.parse import loads
from longctx.core.special_tokens import special_tokens_added
from longctx.eval.backends import BackendContext, make_backend
from longctx.eval.binding import SAMPLING, TASKS_DIR, StagedRun, check_run_dir, record_task_files, staged_run
from longctx.eval.predictions import PredictionWriter, TaskLine, prompt_hash, read_predictions, read_task_lines
from longctx.eval.request import Request
from longctx.eval.scores import SCORES_FILE, score_rows, scores_document
from longctx.eval.settings import RulerRunSettings
from longctx.eval.shards import SHARD_FILE, SHARD_FORMAT, predicted_by_shards, samples_of, shard_dir
from longctx.eval.tasks import load_task_tokenizer
from longctx.eval.thinking import THINK_END, answer_after_thinking
from longctx.info.describe import model_info, sliding_note
from longctx.rope.config import read_rope
from longctx.rope.settings import check_context
from ruler_tasks.prepare import prepare
from ruler_tasks.registry import resolve_tasks
from ruler_tasks.templates import model_template


@dataclass
class RunOutcome:
    run_dir: Path
    lengths: list[int]
    tasks: list[str]
    max_model_len: int
    new_predictions: int = 0
    reused_predictions: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    scores_file: Path | None = None


def _check_engine_room(tasks: Path, lengths: list[int], specs, extra: int, max_model_len: int, why: str) -> None:
    """RULER counts a sample's prompt + generation without special tokens (BOS): refuse one that, with the
    `extra` tokens `why` names, does not fit the checkpoint (`tasks`: the task folder, before it is moved into
    the run)."""
    if lengths[-1] + extra <= max_model_len:
        return
    need = 0
    for s in specs:
        with open(tasks / str(lengths[-1]) / f"{s.name}.jsonl", encoding="utf-8") as f:
            need = max([need, *(loads(line)["length"] + extra for line in f)])
    if need > max_model_len:
        raise InputError(f"a {lengths[-1]}-token sample needs {need} tokens with {why}, beyond the checkpoint's "
                         f"{max_model_len}; use a shorter length or extend the checkpoint with longctx yarn")


def _requests(out: Path, lengths: list[int], specs, done: dict, think_tokens: int) -> Iterator[Request]:
    for L in lengths:
        for s in specs:
            skip = done[(L, s.name)]
            with open(out / TASKS_DIR / str(L) / f"{s.name}.jsonl", encoding="utf-8") as f:
                # Predictions are keyed by the sample's line number, not the task file's `index`: upstream
                # NIAH overwrites `index` with the answer's character offset, which repeats across samples.
                for sample, line in enumerate(f):
                    if sample in skip:
                        continue
                    row = loads(line)
                    prompt = row["input"] + row["answer_prefix"]
                    yield Request((L, s.name, sample, row["outputs"], row["length"], prompt_hash(prompt)), prompt,
                                  s.tokens_to_generate + think_tokens)


def whole_characters(text: str) -> str:
    """`text` with each lone UTF-16 surrogate (a server's JSON may carry "\\ud800"; no file encoding takes one, so
    it would break every later reader of the prediction) as U+FFFD, and a surrogate pair as the character it
    encodes."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _predict(bk, out: Path, *, lengths, specs, done, pending: int, progress: bool,
             on_prediction: Callable[[dict], None] | None, think_tokens: int | None,
             label: str = "predict") -> tuple[int, dict[int, dict[str, Any]]]:
    """Generate every missing prediction, written as it arrives; returns how many were made and, per length
    that made some, its wall time (from its first request handed to the backend to its last answer), prompt
    tokens and prompt tokens/s. Lengths are fed in order, but an engine batches across them: where their spans
    overlap, a length's tokens/s would count the others' work, so it is left out (None) for every length.

    With `think_tokens` (a thinking model), `pred` is the answer after the thought, `raw` the whole output."""
    writer = PredictionWriter()
    first: dict[int, float] = {}
    per_length: dict[int, dict[str, Any]] = {}

    def fed(requests: Iterator[Request]) -> Iterator[Request]:
        for r in requests:
            first.setdefault(r.key[0], time.perf_counter())
            yield r

    bar = None
    if progress and pending:
        from tqdm import tqdm

        bar = tqdm(total=pending, desc=label, unit="sample")
    count = 0

    def on_result(r: Request, text: str, prompt_tokens: int | None) -> None:
        nonlocal count
        L, task, index, outputs, length, prompt_sha = r.key
        text = whole_characters(text)
        rec = {"index": index, "pred": text, "outputs": outputs, "length": length, "task": task, "max_length": L,
               "prompt_tokens": prompt_tokens, "prompt_sha256": prompt_sha}
        if think_tokens is not None:
            rec["pred"], rec["thinking_closed"] = answer_after_thinking(text)
            rec["raw"] = text
        writer.write(out / "pred" / str(L) / f"{task}.jsonl", rec)
        count += 1
        stats = per_length.setdefault(L, {"predictions": 0, "prompt_tokens": 0})
        stats["predictions"] += 1
        stats["prompt_tokens"] += prompt_tokens or 0
        stats["wall_s"] = time.perf_counter() - first[L]
        if bar is not None:
            bar.update(1)
        if on_prediction is not None:
            on_prediction(rec)

    try:
        if pending:
            bk.generate(fed(_requests(out, lengths, specs, done, think_tokens or 0)), on_result)
    finally:
        writer.close()
        bk.close()
        if bar is not None:
            bar.close()
    spans = sorted((first[L], first[L] + stats["wall_s"]) for L, stats in per_length.items())
    apart = all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))
    for stats in per_length.values():
        stats["wall_s"] = round(stats["wall_s"], 3)
        stats["prompt_tokens_per_s"] = (round(stats["prompt_tokens"] / stats["wall_s"], 1)
                                        if stats["wall_s"] and apart else None)
    return count, per_length


def _task_lines(out: Path, lengths, specs, files: dict, run: dict) -> dict[tuple[int, str], list[TaskLine]]:
    """(length, task) -> the lines of its task file in the run directory (the file run.json records)."""
    lines = {}
    for L in lengths:
        for s in specs:
            rel = f"{L}/{s.name}.jsonl"
            lines[(L, s.name)] = read_task_lines(out / TASKS_DIR / rel, run["files"][rel])[:files[rel]["samples"]]
    return lines


def _predicted(out: Path, task_lines: dict[tuple[int, str], list[TaskLine]],
               say: Callable[[str], None]) -> dict[tuple[int, str], set[int]]:
    """(length, task) -> the samples with a prediction made from their task line's prompt. A prediction of
    another prompt (its `prompt_sha256` is not its line's, or it has none) is not one: its sample is
    predicted again, and one line says how many there are, where."""
    done, stale = {}, {}
    for (L, task), lines in task_lines.items():
        path = out / "pred" / str(L) / f"{task}.jsonl"
        done[(L, task)] = set(read_predictions(path, [t.prompt_sha256 for t in lines]))
        other = {i for i in read_predictions(path) if i < len(lines)} - done[(L, task)]
        if other:
            stale[f"{task} at {L}"] = len(other)
    if stale:
        say(f"note: {sum(stale.values())} prediction(s) were not made from their task line's prompt (prompt_sha256 "
            f"differs or is missing: {', '.join(f'{k}: {n}' for k, n in stale.items())}); they are predicted again")
    return done


def _all_predicted(out: Path, run: dict[str, Any], lengths: list[int], specs, shard: str | None) -> bool:
    """Whether the run directory already holds, for every asked (length, task), the task file run.json records
    and as many predictions as it has lines (of `shard`'s lines, for a shard): counted, not parsed (a 128k task
    file is hundreds of MB, and it is read and checked once more after). A prediction of another prompt found
    then is predicted again, and the engine starts when it is first asked."""
    for length in lengths:
        for spec in specs:
            rel = f"{length}/{spec.name}.jsonl"
            task = out / TASKS_DIR / rel
            if rel not in run["files"] or not task.is_file():
                return False
            with open(task, "rb") as f:
                lines = sum(block.count(b"\n") for block in iter(lambda f=f: f.read(1 << 24), b""))
            wanted = lines if shard is None else len(samples_of(shard, length, spec.name, lines))
            if len(read_predictions(out / "pred" / rel)) < wanted:
                return False
    return True


def _held(out: Path, run: dict[str, Any], task_lines: dict[tuple[int, str], list[TaskLine]],
          say: Callable[[str], None]) -> dict[tuple[int, str], list[TaskLine]]:
    """Every (length, task) the run directory holds whole: this call's, and those an earlier call with other
    `--lengths` or `--tasks` predicted in it (run.json records their task files), so that scores and results cover
    every length the directory holds. One an earlier call left part-predicted is left out, and one line says so."""
    held = dict(task_lines)
    partial = []
    for rel, sha in run["files"].items():
        length, _, name = rel.partition("/")
        key = (int(length), name.removesuffix(".jsonl"))
        if key in held or not (out / TASKS_DIR / rel).is_file():
            continue
        lines = read_task_lines(out / TASKS_DIR / rel, sha)
        made = len(read_predictions(out / "pred" / rel, [t.prompt_sha256 for t in lines]))
        if made == len(lines):
            held[key] = lines
        else:
            partial.append(f"{key[1]} at {key[0]} ({made} of {len(lines)})")
    if partial:
        say(f"note: not scored, predicted in part by an earlier call: {', '.join(partial)}; rerun with their "
            f"{ref('lengths')} and {ref('tasks')} to finish them")
    return dict(sorted(held.items()))


def _check_thinking(thinks: bool, s: RulerRunSettings) -> None:
    """A model whose chat template makes it think first needs a thinking budget (RULER's answer budgets of
    32-128 tokens end mid-thought), or the user's word that it does not think (--think-tokens 0)."""
    if thinks and s.think_tokens is None:
        raise s.error(f"the chat template of '{s.checkpoint}' makes the model think before it answers, and RULER's "
                      f"answer budgets (32-128 tokens) end mid-thought; give a thinking budget with "
                      f"{ref('think_tokens')} N (e.g. 2048), turn thinking off (e.g. {ref('chat_template_kwargs')} "
                      f"'{{\"enable_thinking\": false}}'), or pass {ref('think_tokens')} 0 if this model does not "
                      "think")


@contextlib.contextmanager
def _named_as(s: RulerRunSettings) -> Iterator[None]:
    """A `SettingError` raised on behalf of `s` without an owner (a `RulerInputError`, the run directory's
    binding, a backend's refusal that names a setting of the run) names the settings of `s`: `--think-tokens`
    on the command line, `ruler.think_tokens` in a recipe."""
    try:
        yield
    except SettingError as e:
        e.owner = e.owner or type(s)
        raise


@dataclass
class _OpenRun:
    """A run directory ready for predictions (`_open_run`): its task files and run.json in place, the backend
    made and checked, the run directory locked by `stage` until it is released."""

    out: Path
    lengths: list[int]
    specs: list
    bk: Any
    binding: dict[str, Any]
    run: dict[str, Any]
    files: dict[str, dict]
    template: Any
    max_model_len: int
    t_prep: float
    t_start: float | None  # until the backend had started, with the task files written meanwhile
    stage: StagedRun


def run_ruler(s: RulerRunSettings, *, engine=None, progress: bool = True, log: Callable[[str], None] | None = None,
              on_prediction: Callable[[dict], None] | None = None, overlap: bool = True) -> RunOutcome:
    """Evaluate `s.checkpoint` on RULER at `s.lengths` into `s.output`.

    `engine`: an existing `vllm.LLM` to reuse (tests, benchmarks). `on_prediction(record)` is called
    after each prediction is written. `overlap`: the backend starts (an engine, a model load) while the task
    files are written, rather than when the first prediction is asked for. Bad input raises
    `InputError`/`RulerInputError` before anything is written to `s.output` (a new one is not made) or passed to
    `log`; a `SettingError` names the settings of `s`.
    """
    t_start = time.perf_counter()
    say = log or (lambda _msg: None)
    if s.shard is not None:  # a shard is a run directory of its own inside the run's
        s = dataclasses.replace(s, output=str(shard_dir(Path(s.output), s.shard)))
    with _named_as(s):
        r = _open_run(s, engine, progress, say, overlap)
        try:  # the run directory is this process's until the scores are written (`stage.lock`)
            return _predict_and_score(s, r, progress, on_prediction, say, t_start)
        finally:
            r.stage.release()


def _open_run(s: RulerRunSettings, engine, progress: bool, say: Callable[[str], None], overlap: bool) -> _OpenRun:
    """The checks of `s` against the checkpoint, the backend made and checked, the task files and run.json
    staged and moved into the run directory. Every refusal comes before anything is written to the run
    directory or printed: the new task files and run.json are made in a staging folder and moved in once the
    checks that need them have passed."""
    s.check_inputs()  # what the machine has (a device, the installed engine's arguments), as a recipe checks it
    ckpt = checkpoint_dir(s.checkpoint)
    rope = read_rope(read_config(ckpt))
    specs = resolve_tasks(s.tasks)
    check_context(ckpt, rope, s.lengths[-1])
    check_apart(Path(s.output), [("checkpoint", ckpt)])
    bk = None
    try:
        tok = load_task_tokenizer(ckpt, s.trust_remote_code)
        _check_thinking(model_template(s.template, tok, s.system_prompt, s.chat_template_kwargs).thinking, s)
        fp = fingerprint(ckpt)
        n_special = special_tokens_added(tok)
        extra = n_special + (s.think_tokens or 0)  # a think_tokens of 0: a model that does not think
        ctx = rope.context_length
        max_model_len = s.lengths[-1] + extra if ctx is None else min(ctx, s.lengths[-1] + extra)
        context = BackendContext(s.checkpoint, str(ckpt), max_model_len, tokenizer=tok, seed=s.seed,
                                 run_dir=s.output, trust_remote_code=s.trust_remote_code, engine=engine, log=say)
        bk = make_backend(s.backend, s.backend_options(), context)
        why = f"the {n_special} special token(s) the engine adds" + (
            f" and {s.think_tokens} thinking tokens" if s.think_tokens else "")
        return _stage_run(s, ckpt, fp=fp, tok=tok, specs=specs, bk=bk, room=(extra, why, max_model_len),
                          progress=progress, overlap=overlap)
    except BaseException:
        if bk is not None:
            bk.close()
        raise


def _stage_run(s: RulerRunSettings, ckpt: Path, *, fp: str, tok, specs, bk, room: tuple[int, str, int],
               progress: bool, overlap: bool) -> _OpenRun:
    """The run directory bound to this run (refused when it is bound to another), its task files made in a
    staging folder and checked against the engine's room (`room`: the tokens a sample needs beyond its length,
    what they are, the engine's max_model_len), then moved in with run.json."""
    out, lengths = Path(s.output), s.lengths
    extra, why, max_model_len = room
    binding = {"fingerprint": fp, "tokenizer": tokenizer_fingerprint(tok), "seed": s.seed,
               "samples": s.samples, "template": s.template, "system_prompt": s.system_prompt,
               "chat_template_kwargs": s.chat_template_kwargs, "think_tokens": s.think_tokens,
               "backend": s.backend, "sampling": SAMPLING, "engine": bk.binding(), "shard": s.shard}
    run = check_run_dir(out, binding)
    # a rerun whose every prediction is made starts no engine: nothing would be asked of it
    overlap = overlap and not _all_predicted(out, run, lengths, specs, s.shard)
    with staged_run(out) as stage:
        made = _tasks_and_start(s, tok, specs, stage, bk, progress=progress, overlap=overlap)
        manifest = made.manifest
        files = {f"{L}/{t.name}.jsonl": manifest["files"][f"{L}/{t.name}.jsonl"] for L in lengths for t in specs}
        record_task_files(out, run, files)
        _check_engine_room(stage.tasks, lengths, specs, extra, max_model_len, why)
        run["model"] = model_info(ckpt, fp, s.trust_remote_code, name=s.name)
        run["backend"] = bk.settings()
        staging = stage.root
        stage.commit(run)
        bk.committed(staging, out)
    return _OpenRun(out, lengths, specs, bk, binding, run, files, manifest.get("template"), max_model_len,
                    made.prepare_s, made.start_s, stage)


class _Interruptible:
    """While its block runs in the main thread, `interrupt()` from another thread ends the block at once with
    KeyboardInterrupt (a SIGINT to the main thread: it breaks the wait of a starting engine, which then shuts
    down as on Ctrl-C), and `interrupted` says it was this. Elsewhere (another thread, a SIGINT handler of the
    caller's own) `interrupt()` does nothing and the block runs to its end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.interrupted = False

    def __enter__(self) -> _Interruptible:
        with self.lock:
            self.running = (threading.current_thread() is threading.main_thread()
                            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.running = False

    def interrupt(self) -> None:
        with self.lock:
            if self.running:
                self.interrupted, self.running = True, False
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


@dataclass
class _Made:
    manifest: dict[str, Any]
    prepare_s: float  # until the task files were written
    start_s: float | None  # until the backend had started (None: it starts when it generates)


def _tasks_and_start(s: RulerRunSettings, tok, specs, stage: StagedRun, bk, *, progress: bool,
                     overlap: bool) -> _Made:
    """The task files written into the staging folder and, with `overlap`, the backend started (`Backend.start`)
    at the same time: the files are written by worker processes, driven from another thread, once every check
    made before writing has passed (a refusal comes before the backend starts); this thread starts the backend,
    as vLLM's engine must be started from the thread that lives as long as it (`longctx.core.processes`). A
    refusal or failure while writing is raised once the start has ended; an interruption stops both."""
    t0 = time.perf_counter()

    def write(**hooks: Any) -> dict[str, Any]:
        return prepare(tok, s.lengths, tasks=[t.name for t in specs], samples=s.samples, seed=s.seed,
                       template=s.template, data_dir=s.data_dir, essay=s.essay, squad=s.squad, hotpotqa=s.hotpotqa,
                       out_dir=stage.tasks, system_prompt=s.system_prompt,
                       chat_template_kwargs=s.chat_template_kwargs,
                       thinking=None if s.think_tokens is None else s.think_tokens > 0, workers=s.workers,
                       **hooks).manifest

    if not (overlap and bk.needs_start()):
        manifest = write(progress=progress)
        return _Made(manifest, time.perf_counter() - t0, None)
    checked, stop = threading.Event(), threading.Event()
    box: dict[str, Any] = {}
    starting = _Interruptible()

    def run() -> None:
        try:
            box["manifest"] = write(progress=False, on_checked=checked.set, stop=stop.is_set)
            box["prepare_s"] = time.perf_counter() - t0
        except BaseException as e:  # noqa: BLE001 - handed to the thread that waits for it
            box["error"] = e
            starting.interrupt()  # a refusal found while writing need not wait for the engine to start
        finally:
            checked.set()

    thread = threading.Thread(target=run, name="longctx-ruler-tasks", daemon=True)
    thread.start()
    try:
        checked.wait()
        if "error" not in box:
            with starting:
                bk.start(stage.root)
        start_s = time.perf_counter() - t0
        thread.join()
    except BaseException:
        stop.set()
        thread.join()
        if starting.interrupted and "error" in box:
            raise box["error"] from None
        raise
    if "error" in box:
        raise box["error"]
    return _Made(box["manifest"], box["prepare_s"], start_s)


def _predict_and_score(s: RulerRunSettings, r: _OpenRun, progress: bool,
                       on_prediction: Callable[[dict], None] | None, say: Callable[[str], None],
                       t_start: float) -> RunOutcome:
    """Every missing prediction made, then every (task, length) scored into scores.json."""
    out, lengths, specs, bk = r.out, r.lengths, r.specs, r.bk
    say(f"lengths: {', '.join(map(str, lengths))}")
    note = sliding_note(r.run["model"]["name"], r.run["model"].get("sliding_window"), lengths)
    if note:
        say(f"note: {note}")
    task_lines = _task_lines(out, lengths, specs, r.files, r.run)
    done = _predicted(out, task_lines, say)
    if s.shard is None:
        skip, total = done, sum(len(lines) for lines in task_lines.values())
    else:  # the samples of the other shards are theirs to predict
        mine = {key: samples_of(s.shard, key[0], key[1], len(lines)) for key, lines in task_lines.items()}
        skip = {key: done[key] | (set(range(len(task_lines[key]))) - mine[key]) for key in mine}
        done = {key: done[key] & mine[key] for key in mine}
        total = sum(len(v) for v in mine.values())
        whole = sum(len(v) for v in task_lines.values())
        say(f"shard {s.shard}: {total} of the run's {whole} samples, in {out}; the run has "
            f"{predicted_by_shards(out.parent, s.shard, task_lines)} of {whole} predicted across its shards")
    reused = sum(len(v) for v in done.values())
    if bk.credential is not None:
        say(f"credential: {bk.credential}")
    say(f"max_model_len {r.max_model_len}; {total} samples, {reused} already predicted, {total - reused} to go "
        f"({s.backend})")
    if r.t_start is not None:
        say(f"task files ready in {r.t_prep:.1f} s, {s.backend} started in {r.t_start:.1f} s, the two at once")
    t0 = time.perf_counter()
    count, per_length = _predict(bk, out, lengths=lengths, specs=specs, done=skip, pending=total - reused,
                                 progress=progress, on_prediction=on_prediction, think_tokens=s.think_tokens or None,
                                 label="predict" if s.shard is None else f"predict {s.shard}")
    t_gen = time.perf_counter() - t0
    # what ran: this call's engine, or (everything reused) the one that made the predictions before
    if s.shard is None:
        before = json_object(out / SCORES_FILE).get("backend")
        before = before.get("ran") if isinstance(before, dict) else None
    else:
        before = json_object(out / SHARD_FILE).get("ran")
    ran = bk.ran or before
    timings = {"prepare_s": round(r.t_prep, 3),
               **({"backend_start_s": round(r.t_start, 3)} if r.t_start is not None else {}),
               "generate_s": round(t_gen, 3),
               "prompt_tokens_per_s": (round(sum(v["prompt_tokens"] for v in per_length.values()) / t_gen, 1)
                                       if count and t_gen else None),
               "new_predictions": count, "reused_predictions": reused,
               "per_length": {str(L): v for L, v in per_length.items()}}
    if s.shard is not None:  # every sample of the shard predicted: `longctx ruler merge` scores the run
        write_json(out / SHARD_FILE, {"format": SHARD_FORMAT, "shard": s.shard, "template": r.template,
                                      "tasks": [t.name for t in specs], "ran": ran,
                                      "timings": {**timings, "total_s": round(time.perf_counter() - t_start, 3)}})
        return RunOutcome(out, lengths, [t.name for t in specs], r.max_model_len, count, reused,
                          {**timings, "total_s": round(time.perf_counter() - t_start, 3)})

    t0 = time.perf_counter()
    held = _held(out, r.run, task_lines, say)
    names = {task for _, task in held}
    # this call's tasks in its order, then those earlier calls left, in RULER's
    scored = [*specs, *[t for t in resolve_tasks(None) if t.name in names and t not in specs]]
    rows = score_rows(out, scored, held)
    unfinished = sum(row.get("unfinished_thinking", 0) for row in rows)
    if unfinished:
        flag = type(s).flag("think_tokens")
        say(f"note: {unfinished} of {total} outputs did not close their thought ({THINK_END}) within "
            f"{flag} {s.think_tokens} and score as wrong; a larger {flag} gives them room")
    timings = {**timings, "score_s": round(time.perf_counter() - t0, 3),
               "total_s": round(time.perf_counter() - t_start, 3)}
    write_json(out / SCORES_FILE, scores_document(binding=r.binding, run=r.run, template=r.template, rows=rows,
                                                  ran=ran, timings=timings, held=list(held), specs=scored))
    return RunOutcome(out, lengths, [t.name for t in specs], r.max_model_len, count, reused, timings,
                      out / SCORES_FILE)
