"""`prepare()`: generate RULER task files `out_dir/<length>/<task>.jsonl` plus `out_dir/manifest.json`.

Re-running with identical inputs reuses complete files (same key and same sha256 in the manifest);
any different input (tokenizer, seed, samples, template, data checksum, task version) regenerates.
Files are streamed to a temporary file beside the target and renamed at the end.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from ruler_tasks.constants import UPSTREAM_COMMIT
from ruler_tasks.errors import RulerInputError
from ruler_tasks.registry import TaskSpec, resolve_tasks
from ruler_tasks.templates import TEMPLATE_NAMES, model_template

MANIFEST = "manifest.json"
FORMAT = "longctx-ruler-tasks/1"
_MODULES = {"niah": "niah", "variable_tracking": "variable_tracking", "common_words_extraction": "common_words",
            "freq_words_extraction": "freq_words", "qa": "qa"}


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
    p = Path(str(path))
    if not p.exists():
        raise RulerInputError(f"tokenizer path '{path}' does not exist (give a directory with tokenizer files)")
    try:
        from transformers import AutoTokenizer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001 - any load failure is a bad path for the user
        msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        raise RulerInputError(f"could not load a tokenizer from '{path}' ({msg}); give a transformers tokenizer directory") from None
    if not getattr(tok, "is_fast", False):
        raise RulerInputError(f"the tokenizer in '{path}' is not a fast (tokenizers) tokenizer; add a tokenizer.json")
    return tok


def tokenizer_fingerprint(tok) -> str:
    from ruler_tasks.counting import backend_of

    h = hashlib.sha256()
    h.update(backend_of(tok).to_str().encode())
    h.update(b"\0" + str(getattr(tok, "chat_template", None) or "").encode())
    h.update(b"\0" + str(getattr(tok, "bos_token", None) or "").encode())
    return h.hexdigest()


def _validate(lengths, samples, seed, template, specs: Sequence[TaskSpec]) -> list[int]:
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise RulerInputError(f"--samples must be a positive integer (got {samples!r})")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RulerInputError(f"--seed must be an integer (got {seed!r})")
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
        raise RulerInputError("give at least one length (e.g. --lengths 4k,8k)")
    for spec in specs:
        for L in out:
            if L < spec.min_length:
                raise RulerInputError(f"task {spec.name} needs a length of at least {spec.min_length} tokens (got {L})")
    return out


def _write_json_atomic(path: Path, obj) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prepare(
    tokenizer: str | os.PathLike,
    lengths: Iterable[int],
    tasks: Sequence[str] | str | None = None,
    samples: int = 500,
    seed: int = 42,
    template: str = "base",
    data_dir: str | os.PathLike | None = None,
    essay: str | None = None,
    squad: str | None = None,
    hotpotqa: str | None = None,
    out_dir: str | os.PathLike = "ruler_data",
    *,
    english_words: str | os.PathLike | None = None,
    progress: bool = True,
) -> PrepareResult:
    """Write `out_dir/<length>/<task>.jsonl` for every length x task, plus `out_dir/manifest.json`.

    Maps 1:1 onto `longctx ruler prepare --tokenizer --lengths --tasks --samples --seed --template
    --data-dir --essay --squad --hotpotqa -o`. Bad input raises `RulerInputError` before anything is written.
    """
    from ruler_tasks.counting import TokenCounter
    from ruler_tasks.data import load_source, resolve_sources
    from ruler_tasks.punkt import PUNKT_SHA256
    from ruler_tasks.words import wonderwords_version

    specs = resolve_tasks(tasks)
    lengths = _validate(list(lengths) if not isinstance(lengths, int) else lengths, samples, seed, template, specs)
    needed = []
    for s in specs:
        for n in s.needs:
            if n not in needed:
                needed.append(n)
    origins = resolve_sources(needed, data_dir, essay, squad, hotpotqa)
    tok = load_tokenizer(tokenizer)
    mtemplate = model_template(template, tok)
    data = {n: load_source(n, o) for n, o in origins.items()}
    words = None
    words_sha = None
    if english_words is not None:
        raw = Path(english_words).read_bytes()
        try:
            words = list(json.loads(raw).values())
        except Exception:  # noqa: BLE001
            raise RulerInputError(f"english words file '{english_words}' is not RULER's english_words.json (a JSON object)") from None
        words_sha = hashlib.sha256(raw).hexdigest()
    counter = TokenCounter(tok)
    fp = tokenizer_fingerprint(tok)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mpath = out / MANIFEST
    try:
        manifest = json.loads(mpath.read_text()) if mpath.is_file() else {}
    except (OSError, json.JSONDecodeError):
        manifest = {}
    if manifest.get("format") != FORMAT:
        manifest = {"format": FORMAT}
    files = manifest.setdefault("files", {})
    common = {
        "upstream": f"NVIDIA/RULER@{UPSTREAM_COMMIT}",
        "tokenizer": {"path": str(tokenizer), "fingerprint": fp, "counting": counter.strategy},
        "template": mtemplate.describe(),
        "seed": seed,
        "samples": samples,
        "data": {n: d.manifest_entry() for n, d in data.items()},
        "english_words_sha256": words_sha,
        "wonderwords": wonderwords_version(),
        "punkt_tab_sha256": PUNKT_SHA256,
    }
    manifest.update({k: v for k, v in common.items() if k not in ("data",)})
    manifest.setdefault("data", {}).update(common["data"])
    result = PrepareResult(out_dir=out, manifest=manifest)

    # The tokenizer, word lists and counting caches are hundreds of thousands of long-lived objects;
    # every cyclic-GC pass over them costs milliseconds, and generation allocates enough to trigger
    # many. Frozen (`gc.freeze`), the collector skips them; new garbage is still collected.
    refreeze = gc.get_freeze_count() == 0
    try:
        for L in lengths:
            (out / str(L)).mkdir(exist_ok=True)
            for spec in specs:
                rel = f"{L}/{spec.name}.jsonl"
                path = out / rel
                key_obj = {
                    "task": spec.name, "version": spec.version, "args": dict(spec.args), "length": L,
                    "samples": samples, "seed": seed, "template": mtemplate.describe(), "tokenizer": fp,
                    "data": {n: data[n].sha256 for n in spec.needs},
                    "wonderwords": wonderwords_version(), "punkt": PUNKT_SHA256,
                    "english_words": words_sha if spec.generator == "common_words_extraction" else None,
                }
                key = hashlib.sha256(json.dumps(key_obj, sort_keys=True).encode()).hexdigest()
                entry = files.get(rel)
                if entry and entry.get("key") == key and path.is_file() and _sha256_file(path) == entry.get("sha256"):
                    result.files.append(path)
                    result.timings.append(TaskTiming(spec.name, L, samples, 0.0, 0.0, True))
                    continue
                gc.freeze()  # includes the caches earlier tasks filled
                t0 = time.perf_counter()
                from ruler_tasks._common import GenContext

                ctx = GenContext(spec.name, dict(spec.args), L, samples, seed, counter, mtemplate,
                                 spec.tokens_to_generate, {n: data[n] for n in spec.needs}, english_words=words)
                gen = importlib.import_module(f"ruler_tasks.{_MODULES[spec.generator]}").generate(ctx)
                h = hashlib.sha256()
                fd, tmp = tempfile.mkstemp(prefix=f".{spec.name}.", suffix=".tmp", dir=path.parent)
                n = 0
                t_first = None
                bar = None
                try:
                    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                        if progress:
                            from tqdm import tqdm

                            bar = tqdm(total=samples, desc=f"{L} {spec.name}", unit="sample", leave=False)
                        for rec in gen:
                            if t_first is None:
                                t_first = time.perf_counter()
                            line = json.dumps(rec) + "\n"
                            f.write(line)
                            h.update(line.encode("utf-8"))
                            n += 1
                            if bar is not None:
                                bar.update(1)
                    os.replace(tmp, path)
                except BaseException:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                    raise
                finally:
                    if bar is not None:
                        bar.close()
                t1 = time.perf_counter()
                # setup = everything before the first sample came out (search included); loop = the rest,
                # counted as n samples (the first sample's own cost is in setup: small next to the search).
                setup = (t_first or t1) - t0
                timing = TaskTiming(spec.name, L, samples, setup, t1 - (t_first or t1), False)
                files[rel] = {"key": key, "sha256": h.hexdigest(), "task": spec.name, "version": spec.version,
                              "length": L, "samples": n, "metric": spec.metric,
                              "tokens_to_generate": spec.tokens_to_generate, "search": ctx.stats.get("search"),
                              "size": ctx.stats.get("size"), "retries": ctx.stats.get("retries", 0)}
                _write_json_atomic(mpath, manifest)
                result.files.append(path)
                result.timings.append(timing)
    finally:
        if refreeze:
            gc.unfreeze()
    _write_json_atomic(mpath, manifest)
    return result
