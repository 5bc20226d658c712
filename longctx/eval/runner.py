"""`run_ruler()`: task files -> predictions -> scores, resumable, for one checkpoint.

Run directory layout:
  run.json                       what the directory is bound to (model fingerprint, tokenizer, task
                                 settings, backend, sampling) and the sha256 of every task file used
  tasks/<length>/<task>.jsonl    RULER task files made with the checkpoint's tokenizer (reused)
  pred/<length>/<task>.jsonl     predictions, one line per sample, flushed per line
  scores.json                    per task x length score, nulls, samples (read by longctx.report)
A rerun continues where the last one stopped; a rerun with another checkpoint, tokenizer, task
settings, backend or sampling is refused, never mixed in.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.errors import InputError
from longctx.eval.backends import HfBackend, OpenAIBackend, Request, VllmBackend, check_backend
from longctx.eval.predictions import PredictionWriter, read_predictions
from longctx.eval.scoring import score_predictions

RUN_FILE = "run.json"
RUN_FORMAT = "longctx-ruler-run/1"
SCORES_FORMAT = "longctx-ruler-scores/1"
# Upstream: temperature 0 (greedy), top_p 1, max_tokens = the task's tokens_to_generate, no stop words.
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": "tokens_to_generate of each task", "stop": []}
_BINDING_LABELS = {"fingerprint": "checkpoint", "tokenizer": "tokenizer", "seed": "--seed", "samples": "--samples",
                   "template": "--template", "backend": "--backend", "sampling": "sampling settings"}


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


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def model_info(ckpt: Path, cfg: dict, rope, fp: str) -> dict[str, Any]:
    from longctx.checkpoint import PROVENANCE_FILE, attention_variant

    parent = None
    prov = ckpt / PROVENANCE_FILE
    if prov.is_file():
        try:
            p = json.loads(prov.read_text())
            if p.get("verb") == "yarn":
                parent = p.get("source_fingerprint")
        except (OSError, json.JSONDecodeError, AttributeError):
            pass
    try:
        attention = attention_variant(cfg)
    except Exception:  # noqa: BLE001 - informative only
        attention = None
    return {"checkpoint": str(ckpt.resolve()), "name": ckpt.resolve().name, "fingerprint": fp,
            "architecture": (cfg.get("architectures") or [None])[0], "attention": attention,
            "rope_type": rope.rope_type, "yarn_factor": rope.factor if rope.rope_type == "yarn" else None,
            "context_length": rope.context_length, "trained_length": rope.trained_length,
            "parent_fingerprint": parent}


def check_length(ckpt: Path, rope, longest: int) -> None:
    ctx = rope.context_length
    if ctx is None or longest <= ctx:
        return
    base = rope.trained_length or ctx
    factor = 2 ** math.ceil(math.log2(longest / base))
    rescale = " --rescale" if rope.rope_type == "yarn" else ""
    raise InputError(f"length {longest} is beyond what '{ckpt}' can do (context length {ctx} tokens, prompt + "
                     f"generation); extend it first: longctx yarn {ckpt} --factor {factor}{rescale}")


def special_tokens_added(tok) -> int:
    with_special = tok("a").input_ids
    without = tok("a", add_special_tokens=False).input_ids
    return max(0, len(with_special) - len(without))


def _bind(out: Path, binding: dict[str, Any]) -> dict[str, Any]:
    """The run.json of `out` (created when new), or InputError when it is bound to something else."""
    path = out / RUN_FILE
    if path.is_file():
        try:
            run = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"{path} is unreadable ({e.__class__.__name__}); use another -o") from None
        if not isinstance(run, dict) or run.get("format") != RUN_FORMAT:
            raise InputError(f"{path} is not a longctx ruler run file; use another -o")
        old = run.get("binding", {})
        for key, label in _BINDING_LABELS.items():
            if old.get(key) != binding[key]:
                if key == "fingerprint":
                    raise InputError(f"run directory '{out}' was made for another checkpoint (fingerprint "
                                     f"{str(old.get(key))[:12]}…, this one {binding[key][:12]}…); use another -o")
                a, b = json.dumps(old.get(key)), json.dumps(binding[key])
                raise InputError(f"run directory '{out}' was made with a different {label} ({a[:60]}, now {b[:60]}); "
                                 "use another -o or the same settings")
        return run
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"'{out}' exists and is not a longctx ruler run directory; choose another -o")
    out.mkdir(parents=True, exist_ok=True)
    run = {"format": RUN_FORMAT, "binding": binding, "files": {}}
    _write_json(path, run)
    return run


def _stat_sources(sources) -> list:
    out = []
    for src in sources:
        if src is None:
            out.append(None)
            continue
        p = Path(str(src))
        items = sorted(p.iterdir()) if p.is_dir() else [p] if p.exists() else []
        out.append([str(src), [(x.name, x.stat().st_size, x.stat().st_mtime_ns) for x in items if x.is_file()]])
    return out


def _prepare_key(binding: dict, lengths: list[int], specs, sources) -> str:
    """What `prepare` would be asked for: when a run directory was prepared with the same key and its task
    files still have the recorded sha256, preparing again is skipped (it costs a tokenizer load and hashing)."""
    from ruler_tasks.words import wonderwords_version

    key = {"tokenizer": binding["tokenizer"], "seed": binding["seed"], "samples": binding["samples"],
           "template": binding["template"], "lengths": lengths, "tasks": [(s.name, s.version) for s in specs],
           "sources": _stat_sources(sources), "wonderwords": wonderwords_version()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _reusable_tasks(out: Path, run: dict, prep_key: str) -> dict | None:
    """The task manifest when the tasks were prepared with `prep_key` and are unchanged, else None."""
    if run.get("prepared") != prep_key:
        return None
    try:
        manifest = json.loads((out / "tasks" / "manifest.json").read_text())
        for rel, sha in run["files"].items():
            h = hashlib.sha256()
            with open(out / "tasks" / rel, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            if h.hexdigest() != sha or manifest["files"][rel]["sha256"] != sha:
                return None
    except (OSError, KeyError, json.JSONDecodeError):
        return None
    return manifest


def run_ruler(
    checkpoint: str | os.PathLike,
    lengths: Sequence[int],
    out_dir: str | os.PathLike,
    *,
    tasks: Sequence[str] | str | None = None,
    samples: int = 500,
    seed: int = 42,
    template: str = "base",
    data_dir: str | os.PathLike | None = None,
    essay: str | None = None,
    squad: str | None = None,
    hotpotqa: str | None = None,
    backend: str = "vllm",
    backend_options: dict[str, Any] | None = None,
    engine=None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    on_prediction: Callable[[dict], None] | None = None,
) -> RunOutcome:
    """Evaluate `checkpoint` on RULER at `lengths`; maps 1:1 onto `longctx ruler CKPT ...`.

    `engine`: an existing `vllm.LLM` to reuse (tests, benchmarks). `on_prediction(record)` is called
    after each prediction is written. Bad input raises `InputError`/`RulerInputError` before any
    prediction is made.
    """
    from longctx.checkpoint import checkpoint_dir, fingerprint, read_config, versions
    from longctx.rope import read_rope
    from ruler_tasks.constants import UPSTREAM_COMMIT
    from ruler_tasks.prepare import load_tokenizer, prepare, tokenizer_fingerprint
    from ruler_tasks.registry import resolve_tasks

    t_start = time.perf_counter()
    say = log or (lambda _msg: None)
    check_backend(backend)
    opts = dict(backend_options or {})
    ckpt = checkpoint_dir(checkpoint)
    cfg = read_config(ckpt)
    rope = read_rope(cfg)
    specs = resolve_tasks(tasks)
    lengths = sorted(set(int(L) for L in lengths))
    if not lengths or lengths[0] < 1:
        raise InputError("give at least one positive length (e.g. --lengths 4k,8k)")
    check_length(ckpt, rope, lengths[-1])
    out = Path(out_dir)
    out_real, ck_real = out.resolve(), ckpt.resolve()
    if out_real == ck_real or out_real.is_relative_to(ck_real) or ck_real.is_relative_to(out_real):
        raise InputError(f"output '{out}' would overlap the checkpoint '{ckpt}'; choose another -o")

    # the backend first: an unreachable endpoint is refused before anything is generated or written
    if backend == "openai":
        bk = OpenAIBackend(**{k: v for k, v in opts.items() if k in (
            "base_url", "model", "concurrency", "timeout", "retries", "connect_attempts", "retry_wait", "api_key_env")},
            seed=seed)
        bk.check()
    tok = load_tokenizer(ckpt)
    fp = fingerprint(ckpt)
    n_special = special_tokens_added(tok)
    ctx = rope.context_length
    max_model_len = lengths[-1] + n_special if ctx is None else min(ctx, lengths[-1] + n_special)
    if backend == "vllm":
        bk = VllmBackend(str(ckpt), max_model_len, llm=engine, seed=0, **{k: v for k, v in opts.items() if k in (
            "tensor_parallel_size", "data_parallel_size", "dtype", "gpu_memory_utilization", "kv_cache_memory",
            "enforce_eager", "chunk")})
    elif backend == "hf":
        bk = HfBackend(str(ckpt), max_model_len, seed=0, **{k: v for k, v in opts.items() if k in ("dtype", "device")})
    backend_settings = bk.settings()
    binding = {"fingerprint": fp, "tokenizer": tokenizer_fingerprint(tok), "seed": seed, "samples": samples,
               "template": template, "backend": backend, "sampling": SAMPLING}
    run = _bind(out, binding)

    t0 = time.perf_counter()
    prep_key = _prepare_key(binding, lengths, specs, (data_dir, essay, squad, hotpotqa))
    manifest = _reusable_tasks(out, run, prep_key)
    if manifest is None:
        manifest = prepare(ckpt, lengths, [s.name for s in specs], samples, seed, template, data_dir, essay, squad,
                           hotpotqa, out / "tasks", progress=progress).manifest
    run["prepared"] = prep_key
    t_prep = time.perf_counter() - t0
    files = manifest["files"]
    for L in lengths:
        for s in specs:
            rel = f"{L}/{s.name}.jsonl"
            sha = files[rel]["sha256"]
            old = run["files"].get(rel)
            if old is not None and old != sha and (out / "pred" / rel).is_file():
                raise InputError(f"task file {rel} differs from the one this run directory's predictions were made "
                                 "from (task data or generator changed); use another -o")
            run["files"][rel] = sha
    run["model"] = model_info(ckpt, cfg, rope, fp)
    run["backend"] = backend_settings
    _write_json(out / RUN_FILE, run)

    # the longest engine input: RULER counts the prompt + generation without special tokens (BOS)
    if lengths[-1] + n_special > max_model_len:
        need = 0
        for s in specs:
            with open(out / "tasks" / str(lengths[-1]) / f"{s.name}.jsonl", encoding="utf-8") as f:
                need = max([need, *(json.loads(line)["length"] + n_special for line in f)])
        if need > max_model_len:
            raise InputError(f"a {lengths[-1]}-token sample needs {need} tokens with the {n_special} special "
                             f"token(s) the engine adds, beyond the checkpoint's {max_model_len}; use a shorter "
                             f"length or extend the checkpoint with longctx yarn")

    done = {(L, s.name): set(read_predictions(out / "pred" / str(L) / f"{s.name}.jsonl"))
            for L in lengths for s in specs}
    reused = sum(len(v) for v in done.values())
    total = sum(files[f"{L}/{s.name}.jsonl"]["samples"] for L in lengths for s in specs)
    pending = total - reused
    say(f"max_model_len {max_model_len}; {total} samples, {reused} already predicted, {pending} to go "
        f"({backend})")

    def requests() -> Iterator[Request]:
        for L in lengths:
            for s in specs:
                skip = done[(L, s.name)]
                with open(out / "tasks" / str(L) / f"{s.name}.jsonl", encoding="utf-8") as f:
                    # Predictions are keyed by the sample's line number, not the task file's `index`: upstream
                    # NIAH overwrites `index` with the answer's character offset, which repeats across samples.
                    for sample, line in enumerate(f):
                        if sample in skip:
                            continue
                        row = json.loads(line)
                        yield Request((L, s.name, sample, row["outputs"], row["length"]),
                                      row["input"] + row["answer_prefix"], s.tokens_to_generate)

    writer = PredictionWriter()
    bar = None
    if progress and pending:
        from tqdm import tqdm

        bar = tqdm(total=pending, desc="predict", unit="sample")
    count = 0

    def on_result(r: Request, text: str, prompt_tokens: int | None) -> None:
        nonlocal count
        L, task, index, outputs, length = r.key
        rec = {"index": index, "pred": text, "outputs": outputs, "length": length, "task": task, "max_length": L,
               "prompt_tokens": prompt_tokens}
        writer.write(out / "pred" / str(L) / f"{task}.jsonl", rec)
        count += 1
        if bar is not None:
            bar.update(1)
        if on_prediction is not None:
            on_prediction(rec)

    t0 = time.perf_counter()
    try:
        if pending:
            bk.generate(requests(), on_result)
    finally:
        writer.close()
        bk.close()
        if bar is not None:
            bar.close()
    t_gen = time.perf_counter() - t0

    t0 = time.perf_counter()
    rows = []
    for L in lengths:
        for s in specs:
            preds = read_predictions(out / "pred" / str(L) / f"{s.name}.jsonl")
            expected = files[f"{L}/{s.name}.jsonl"]["samples"]
            if len(preds) != expected:
                raise RuntimeError(f"{L}/{s.name}: {len(preds)} predictions for {expected} samples")
            ordered = [preds[i] for i in sorted(preds)]
            sc = score_predictions([p["pred"] for p in ordered], [p["outputs"] for p in ordered], s.metric)
            rows.append({"task": s.name, "length": L, "metric": s.metric, "score": sc.score, "nulls": sc.nulls,
                         "samples": sc.samples})
    t_score = time.perf_counter() - t0
    task_set = hashlib.sha256(json.dumps({**{k: binding[k] for k in ("tokenizer", "seed", "samples", "template")},
                                          "files": {f"{L}/{s.name}.jsonl": run["files"][f"{L}/{s.name}.jsonl"]
                                                    for L in lengths for s in specs}},
                                         sort_keys=True).encode()).hexdigest()
    timings = {"prepare_s": round(t_prep, 3), "generate_s": round(t_gen, 3), "score_s": round(t_score, 3),
               "total_s": round(time.perf_counter() - t_start, 3), "new_predictions": count,
               "reused_predictions": reused}
    doc = {"format": SCORES_FORMAT, "model": run["model"], "backend": backend_settings, "sampling": SAMPLING,
           "template": manifest.get("template"), "upstream": f"NVIDIA/RULER@{UPSTREAM_COMMIT}",
           "task_set": task_set, "lengths": lengths, "tasks": [s.name for s in specs], "scores": rows,
           "seeds": {"tasks": seed, "engine": 0}, "versions": versions(),
           "task_versions": {s.name: s.version for s in specs}, "timings": timings}
    _write_json(out / "scores.json", doc)
    return RunOutcome(out, lengths, [s.name for s in specs], max_model_len, count, reused, timings,
                      out / "scores.json")
