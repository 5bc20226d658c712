"""`prepare()`: generate RULER task files `out_dir/<length>/<task>.jsonl` plus `out_dir/manifest.json`.

Task files are reused, never regenerated, when their inputs are unchanged: a whole request (tokenizer,
lengths, tasks, samples, seed, template, data files by size and mtime) that the manifest already
answered returns at once when every file it lists still has its sha256; otherwise each file is reused
when its own key (the same inputs, data by checksum) and sha256 match, and generated when not. Any
different input (tokenizer, seed, samples, template, data checksum, task version) regenerates. Files are
streamed to a temporary file beside the target and renamed at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from longctx.core.errors import ref
from longctx.core.files import check_output, make_output, remove_leftovers, write_json
from longctx.core.hashing import hash_json, sha256_file, tokenizer_fingerprint
from longctx.core.parse import loads
from longctx.core.processes import available_cores
from ruler_tasks.constants import UPSTREAM_COMMIT
from ruler_tasks.data import load_source, resolve_sources
from ruler_tasks.errors import RulerInputError
from ruler_tasks.making import Inputs, Job, make_files, tokenizer_json
from ruler_tasks.punkt import PUNKT_SHA256
from ruler_tasks.registry import TASK_NAMES, TaskSpec, get_task, resolve_tasks
from ruler_tasks.templates import TEMPLATE_NAMES, model_template
from ruler_tasks.words import wonderwords_version

MANIFEST = "manifest.json"
FORMAT = "longctx-ruler-tasks/1"
TASKS_KIND = "ruler tasks"  # its `longctx.core.files` output marker
# Seconds a sample of `TaskSpec.work` 1 takes per token of length (about 10 ms at 128k, one core), and the work
# below which the default number of workers is one: starting a worker process costs about half a second.
_SAMPLE_S_PER_TOKEN = 0.01 / 131072
_WORKERS_FROM_S = 2.0


@dataclass
class TaskTiming:
    task: str
    length: int
    samples: int
    setup_s: float
    loop_s: float
    reused: bool

    @property
    def s_per_sample(self) -> float:
        return self.loop_s / max(self.samples, 1)


@dataclass
class PrepareResult:
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    timings: list[TaskTiming] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)


def load_tokenizer(path):
    """The fast tokenizer in folder `path`, for library callers that hand `prepare` a folder. A tokenizer that
    needs its own code is refused: load it with `longctx.checkpoint.tokenizer.load_tokenizer(path,
    trust_remote_code=True)` (the rule every longctx verb applies) and pass the tokenizer instead. (`longctx ruler
    prepare` loads it through longctx's cache: `longctx.checkpoint.prompt_tokenizer`.)"""
    p = Path(str(path))
    if not p.exists():
        raise RulerInputError(f"tokenizer path '{path}' does not exist (give a directory with tokenizer files)")
    try:
        settings = loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        settings = {}
    if isinstance(settings, dict) and settings.get("auto_map"):
        raise RulerInputError(f"the tokenizer in '{path}' needs its own code (tokenizer_config.json auto_map); "
                              "load it with longctx.checkpoint.tokenizer.load_tokenizer(path, "
                              "trust_remote_code=True) and pass the tokenizer")
    try:
        from transformers import AutoTokenizer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(str(p), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - any load failure is a bad path for the user
        msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        raise RulerInputError(f"could not load a tokenizer from '{path}' ({msg}); give a transformers tokenizer "
                              "directory") from None
    check_tokenizer(tok, path)
    return tok


def check_fast(tok, path) -> None:
    """RulerInputError unless `tok` is a fast (Rust `tokenizers`) tokenizer: the exact length fitting and the
    task files' tokenizer fingerprint read its definition."""
    if not getattr(tok, "is_fast", False):
        raise RulerInputError(f"the tokenizer in '{path}' is not a fast (tokenizers) tokenizer; add a tokenizer.json")


def check_tokenizer(tok, path) -> None:
    """RulerInputError when `tok` encodes a plain English sentence to no tokens or to special tokens only:
    transformers builds such a tokenizer, without a warning, from a folder with a tokenizer_config.json but no
    vocabulary (tokenizer.json, tokenizer.model, vocab.json), and everything computed from its text is garbage."""
    ids = list(tok("The quick brown fox jumps over the lazy dog.", add_special_tokens=False).input_ids)
    if ids and not set(ids) <= set(getattr(tok, "all_special_ids", None) or []):
        return
    got = "no tokens" if not ids else "special tokens only"
    raise RulerInputError(f"the tokenizer in '{path}' encodes a plain English sentence to {got}; copy the "
                          "model's full tokenizer (tokenizer.json or tokenizer.model) into it")


def _validate(lengths, samples, seed, template, specs: Sequence[TaskSpec]) -> list[int]:
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise RulerInputError(f"{ref('samples')} must be a positive integer (got {samples!r})")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RulerInputError(f"{ref('seed')} must be an integer (got {seed!r})")
    if template not in TEMPLATE_NAMES:
        raise RulerInputError(f"unknown template '{template}'; choose one of: {', '.join(TEMPLATE_NAMES)}")
    if isinstance(lengths, int):
        lengths = [lengths]
    out = []
    for L in lengths or []:
        if isinstance(L, bool) or not isinstance(L, int) or L < 1:
            raise RulerInputError(f"lengths must be positive integers (got {L!r})")
        if L not in out:
            out.append(L)
    if not out:
        raise RulerInputError(f"give at least one length (e.g. {ref('lengths')} 4k,8k)")
    for spec in specs:
        for L in out:
            if L < spec.min_length:
                raise RulerInputError(f"task {spec.name} needs a length of at least {spec.min_length} tokens (got {L})")
    return out


def _stat(paths) -> list:
    """Each given source path by its files' names, sizes and mtimes (cheap: nothing is read)."""
    out = []
    for src in paths:
        if src is None:
            out.append(None)
            continue
        p = Path(str(src))
        items = sorted(p.iterdir()) if p.is_dir() else [p] if p.exists() else []
        out.append([str(src), [(x.name, x.stat().st_size, x.stat().st_mtime_ns) for x in items if x.is_file()]])
    return out


def _read_manifest(out: Path) -> dict:
    try:
        manifest = loads((out / MANIFEST).read_bytes()) if (out / MANIFEST).is_file() else {}
    except (OSError, ValueError):  # torn, or over a parse limit: regenerated
        manifest = {}
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else {"format": FORMAT}


def _intact(out: Path, manifest: dict, rels: list[str]) -> bool:
    files = manifest.get("files", {})
    return all(rel in files and (out / rel).is_file() and sha256_file(out / rel) == files[rel].get("sha256")
               for rel in rels)


def _english_words(path) -> tuple[list | None, str | None]:
    if path is None:
        return None, None
    raw = Path(path).read_bytes()
    try:
        words = list(loads(raw).values())
    except Exception:  # noqa: BLE001
        raise RulerInputError(f"english words file '{path}' is not RULER's english_words.json (a JSON "
                              "object)") from None
    return words, hashlib.sha256(raw).hexdigest()


def prepare(
    tokenizer: Any,
    lengths: Iterable[int],
    *,
    tasks: Sequence[str] | str | None = None,
    samples: int = 500,
    seed: int = 42,
    template: str = "base",
    data_dir: str | os.PathLike | None = None,
    essay: str | None = None,
    squad: str | None = None,
    hotpotqa: str | None = None,
    out_dir: str | os.PathLike = "ruler_data",
    english_words: str | os.PathLike | None = None,
    progress: bool = True,
    system_prompt: str | None = None,
    chat_template_kwargs: dict | None = None,
    thinking: bool | None = None,
    workers: int | None = None,
    on_checked: Callable[[], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> PrepareResult:
    """Write `out_dir/<length>/<task>.jsonl` for every length x task, plus `out_dir/manifest.json`.

    Maps 1:1 onto `longctx ruler prepare --tokenizer --lengths --tasks --samples --seed --template
    --system-prompt --chat-template-kwargs --data-dir --essay --squad --hotpotqa --workers -o` (`out_dir`);
    everything after `lengths` is given by name. `tokenizer` is a tokenizer directory or an already loaded fast
    tokenizer. The files are made by `workers` processes (default: the cores available, or this process alone
    for a couple of seconds of work), the same bytes for any number (`ruler_tasks.making`). Bad input raises
    `RulerInputError` before anything is written; the few refusals only generation can find (no sample fits
    the length) remove the folder this call made. `thinking` overrides what the chat template says of thinking
    (`model_template`). `out_dir` is checked, locked and marked like any verb's output
    (`longctx.core.files.check_output`): a folder of other files is refused, one this function wrote (a `ruler
    tasks` output, or an older one with its manifest) is reused and updated.

    For a caller that does something else meanwhile in another thread (`longctx ruler` starts its engine):
    `on_checked()` is called once the inputs have passed every check made before writing, and the files are then
    made in worker processes only; `stop()` true makes the call end at the next sample with
    `ruler_tasks.making.Stopped`, the files in progress removed.
    """
    specs = resolve_tasks(tasks)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise RulerInputError(f"{ref('workers')} must be a positive integer (got {workers!r})")
    lengths = _validate(list(lengths) if not isinstance(lengths, int) else lengths, samples, seed, template, specs)
    needed = list(dict.fromkeys(n for s in specs for n in s.needs))
    origins = resolve_sources(needed, data_dir, essay, squad, hotpotqa)
    loaded = not isinstance(tokenizer, (str, os.PathLike))
    tok = tokenizer if loaded else load_tokenizer(tokenizer)
    # the tokenizer's folder (as given, or the one a loaded tokenizer came from) is an input: never written
    source = Path(str(getattr(tok, "name_or_path", "") if loaded else tokenizer))
    check_fast(tok, source)
    # a chat template that does not work: refused before writing
    mtemplate = model_template(template, tok, system_prompt, chat_template_kwargs, thinking)
    fp = tokenizer_fingerprint(tok)
    words, words_sha = _english_words(english_words)
    out = Path(out_dir)
    request = _request(fp, lengths=lengths, specs=specs, samples=samples, seed=seed, template=template,
                       words_sha=words_sha, sources=(data_dir, essay, squad, hotpotqa),
                       mtemplate=mtemplate, thinking=thinking)
    inputs = _Inputs(tok, fp, getattr(tok, "name_or_path", None) if loaded else str(tokenizer), lengths, specs,
                     samples, seed, mtemplate, words, words_sha)
    # The output is checked, locked and marked as `ruler run` takes its run directory: never a folder of the
    # user's own files, one writer at a time.
    with check_output(out, TASKS_KIND, inputs=[("tokenizer", source)] if source.is_dir() else [],
                      legacy=_made_by_prepare):
        return _write_tasks(inputs, out, request, origins, progress, workers, on_checked, stop)


@dataclass(frozen=True)
class _Inputs:
    """What `prepare` generates from, checked: the tokenizer (its fingerprint, the path it is recorded by), the
    lengths and tasks, samples, seed, model template and english words."""

    tok: Any
    fp: str
    path_name: str | None
    lengths: list[int]
    specs: list[TaskSpec]
    samples: int
    seed: int
    mtemplate: Any
    words: list | None
    words_sha: str | None


def _write_tasks(i: _Inputs, out: Path, request: str, origins: dict[str, str], progress: bool, workers: int | None,
                 on_checked: Callable[[], None] | None, stop: Callable[[], bool] | None) -> PrepareResult:
    """The task files of `i` in `out` (locked by the caller): the manifest's own when it answered this very
    `request` and every file is intact, else each reused or generated; the data each needs loaded and checked
    first."""
    rels = [f"{L}/{s.name}.jsonl" for L in i.lengths for s in i.specs]
    manifest = _read_manifest(out)
    if manifest.get("request") == request and _intact(out, manifest, rels):
        if on_checked is not None:
            on_checked()
        return PrepareResult(out, [out / r for r in rels],
                             [TaskTiming(s.name, L, i.samples, 0.0, 0.0, True) for L in i.lengths for s in i.specs],
                             manifest)
    data = {n: load_source(n, o) for n, o in origins.items()}
    for spec in i.specs:  # what a generator must check of its data before any file is made (QA: enough questions)
        check = getattr(importlib.import_module(f"ruler_tasks.{spec.generator.module}"), "check_data", None)
        if check is not None:
            check(spec, data, i.samples)
    if on_checked is not None:
        on_checked()
    new = _first_missing(out)
    make_output(out, TASKS_KIND)
    try:
        result = _generate(i, data=data, out=out, manifest=manifest, progress=progress, workers=workers,
                           stop=stop, in_workers=on_checked is not None)
    except RulerInputError:
        if new is not None:  # a folder this call made: a refusal leaves nothing behind
            shutil.rmtree(new, ignore_errors=True)
        raise
    manifest["request"] = request
    write_json(out / MANIFEST, manifest)
    return result


def _request(fp: str, *, lengths: list[int], specs: list[TaskSpec], samples: int, seed: int, template: str,
             words_sha: str | None, sources: tuple, mtemplate, thinking: bool | None) -> str:
    """The hash of a whole request: the manifest that answered it answers it again while its files are intact."""
    asked = {"tokenizer": fp, "lengths": lengths, "tasks": [(s.name, s.version) for s in specs],
             "samples": samples, "seed": seed, "template": template, "english_words": words_sha,
             "sources": _stat(sources), "wonderwords": wonderwords_version()}
    # only when set: requests without them keep the hash (and the manifests) they always had
    if mtemplate.system_prompt is not None:
        asked["system_prompt"] = mtemplate.system_prompt
    if mtemplate.chat_template_kwargs:
        asked["chat_template_kwargs"] = mtemplate.chat_template_kwargs
    if thinking is not None:
        asked["thinking"] = thinking
    return hash_json(asked)


def _made_by_prepare(folder: Path) -> bool:
    """A task folder written before outputs were marked (a manifest of this format): it is reused, and marked."""
    return (folder / MANIFEST).is_file() and _read_manifest(folder) != {"format": FORMAT}


def _first_missing(path: Path) -> Path | None:
    """The outermost folder `path.mkdir(parents=True)` would make (None when `path` exists)."""
    if path.exists():
        return None
    while not path.parent.exists() and path.parent != path:
        path = path.parent
    return path


def _generate(i: _Inputs, *, data: dict[str, Any], out: Path, manifest: dict, progress: bool, workers: int | None,
              stop: Callable[[], bool] | None = None, in_workers: bool = False) -> PrepareResult:
    """Every (length, task) file: reused when its key and sha256 match, else made (`ruler_tasks.making`)."""
    from ruler_tasks.counting import counting_strategy

    pipeline = tokenizer_json(i.tok)
    files = manifest.setdefault("files", {})
    manifest.update({"upstream": f"NVIDIA/RULER@{UPSTREAM_COMMIT}",
                     "tokenizer": {"path": i.path_name, "fingerprint": i.fp, "counting": counting_strategy(pipeline)},
                     "template": i.mtemplate.describe(), "seed": i.seed, "samples": i.samples,
                     "english_words_sha256": i.words_sha, "wonderwords": wonderwords_version(),
                     "punkt_tab_sha256": PUNKT_SHA256})
    manifest.setdefault("data", {}).update({n: d.manifest_entry() for n, d in data.items()})
    timings: dict[str, TaskTiming] = {}
    jobs, keys = [], {}
    for L in i.lengths:
        (out / str(L)).mkdir(exist_ok=True)
        for spec in i.specs:
            rel = f"{L}/{spec.name}.jsonl"
            keys[rel] = key = hash_json({
                "task": spec.name, "version": spec.version, "args": dict(spec.args), "length": L,
                "samples": i.samples, "seed": i.seed, "template": i.mtemplate.describe(), "tokenizer": i.fp,
                "data": {n: data[n].sha256 for n in spec.needs},
                "wonderwords": wonderwords_version(), "punkt": PUNKT_SHA256,
                "english_words": i.words_sha if spec.generator.english_words else None,
            })
            entry = files.get(rel)
            if (entry and entry.get("key") == key and (out / rel).is_file()
                    and sha256_file(out / rel) == entry.get("sha256")):
                timings[rel] = TaskTiming(spec.name, L, i.samples, 0.0, 0.0, True)
            else:
                jobs.append(Job(rel, L, spec.name))
    # the longest first: the last to finish are short, and no worker waits long for the others
    jobs.sort(key=lambda j: -j.length * get_task(j.task).work)
    if workers is None:  # every core, when the work is worth starting processes for
        work_s = sum(get_task(j.task).work * j.length for j in jobs) * i.samples * _SAMPLE_S_PER_TOKEN
        workers = available_cores() if work_s >= _WORKERS_FROM_S else 1
    for L in i.lengths:
        remove_leftovers(out / str(L), None, "tmp")  # what a killed call left
    inputs = Inputs(pipeline, i.mtemplate, i.samples, i.seed, i.words,
                    {n: d if d.origin.startswith("hf:") else replace(d, obj=None) for n, d in data.items()}, out)
    with _progress(progress, len(jobs) * i.samples) as bar:
        for job, made in make_files(inputs, jobs, workers=workers, data=data, on_sample=bar, stop=stop,
                                    in_workers=in_workers):
            spec = get_task(job.task)
            timings[job.rel] = TaskTiming(spec.name, job.length, i.samples, made.setup_s, made.loop_s, False)
            files[job.rel] = {"key": keys[job.rel], "sha256": made.sha256, "task": spec.name, "version": spec.version,
                              "length": job.length, "samples": made.samples, "metric": spec.metric,
                              "tokens_to_generate": spec.tokens_to_generate, "search": made.stats.get("search"),
                              "size": made.stats.get("size"), "retries": made.stats.get("retries") or 0}
            # by length and task, whichever file came first and whatever was made before
            manifest["files"] = files = dict(sorted(files.items(), key=lambda kv: _file_order(kv[0])))
            write_json(out / MANIFEST, manifest)
    rels = [f"{L}/{s.name}.jsonl" for L in i.lengths for s in i.specs]
    return PrepareResult(out, [out / r for r in rels], [timings[r] for r in rels], manifest)


def _file_order(rel: str) -> tuple:
    """Where the task file `rel` ("<length>/<task>.jsonl") comes in the manifest: by length, then RULER's task order."""
    length, _, name = rel.partition("/")
    task = name.removesuffix(".jsonl")
    return (int(length) if length.isdigit() else 0, TASK_NAMES.index(task) if task in TASK_NAMES else len(TASK_NAMES),
            rel)


@contextlib.contextmanager
def _progress(show: bool, total: int) -> Iterator[Callable[[int], None] | None]:
    """A progress bar over the samples to write (None when not shown): called with how many more are written."""
    if not show or not total:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc="task files", unit="sample", leave=False)
    try:
        yield bar.update
    finally:
        bar.close()
