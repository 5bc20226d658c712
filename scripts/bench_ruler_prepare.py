#!/usr/bin/env python3
"""Benchmark `longctx ruler prepare` against its targets and NVIDIA/RULER's own generators, whole processes.

    python scripts/bench_ruler_prepare.py [--length 128k] [--samples 500] [--workers N]
                                          [--upstream RULER_DIR [--upstream-samples 10]]

Everything runs as a user would run it, each call in a fresh process, with the reference tokenizer (Mistral-7B v1
SentencePiece, rebuilt offline from mistral_common) and the fixture essay/QA data (tests/data/ruler/data); the
cache is a fresh folder, warmed by one call first (a user's second run):

1. start-up: one task (niah_single_1), one sample at 4k: wall (target <= 1.5 s), and whether torch or
   transformers were imported, in the process or its workers (target: neither);
2. all 13 tasks at `--length`, `--samples` each (QA tasks: as many as the data holds, in a second call, as the
   one samples value of a call would be refused by the QA data): wall (target <= 40 s on 2 cores) and the peak
   memory of the largest process (the calling one, or a worker);
3. with `--upstream` (a checkout of NVIDIA/RULER @ c3f5e3b, with its requirements installed: tenacity,
   wonderwords, nltk, transformers): upstream's 13 generators one after another, with the argv its
   scripts/data/prepare.py builds (base template, same tokenizer, seed and data; an empty english_words.json,
   which is what ours reads without one), against ours on the same settings, `--upstream-samples` each; every
   file must be byte-identical.

The last line is `ratio=`: upstream's wall / ours with `--upstream`, else the 40 s target / ours (>= 1: met).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ruler_tasks.constants import TASK_TEMPLATES  # noqa: E402
from ruler_tasks.registry import TASK_NAMES, TASKS  # noqa: E402

DATA = ROOT / "tests" / "data" / "ruler" / "data"
UPSTREAM_FILES = {"essay.json": "PaulGrahamEssays.json", "squad.json": "squad.json", "hotpotqa.json": "hotpotqa.json"}
QA_TASKS = [n for n in TASK_NAMES if TASKS[n].generator == "qa"]
TARGET_ALL_S, TARGET_START_S = 40.0, 1.5


# runs a command and says, on its last stderr line, its wall time and the peak memory of its largest process
_MEASURE = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter(); code = subprocess.run(sys.argv[1:]).returncode\n"
            "wall = time.perf_counter() - t; rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
            "print(f'\\nMEASURED {wall} {rss}', file=sys.stderr); sys.exit(code)")


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Wall seconds of `argv`, the peak KiB of its largest process, and its stderr; the run must succeed."""
    p = subprocess.run([sys.executable, "-c", _MEASURE, *argv], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv[:6])} ...\n{p.stderr[-3000:]}")
    err, _, last = p.stderr.rstrip().rpartition("\n")
    _, wall, rss = last.split()
    return float(wall), int(rss), err


def _ours(tok: Path, out: Path, length: int, tasks: list[str], samples: int, env: dict[str, str],
          workers: int | None, importtime: bool = False) -> tuple[float, int, str]:
    argv = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "longctx", "ruler", "prepare",
            "--tokenizer", str(tok), "--lengths", str(length), "--tasks", ",".join(tasks), "--samples", str(samples),
            "--data-dir", str(DATA), "-o", str(out)]
    if workers:
        argv += ["--workers", str(workers)]
    shutil.rmtree(out, ignore_errors=True)
    return _run(argv, env)


def _usable_questions() -> dict[str, int]:
    from ruler_tasks.data import load_source
    from ruler_tasks.qa import usable_questions

    out = {}
    for name in QA_TASKS:
        dataset = TASKS[name].args["dataset"]
        out[name] = usable_questions(dataset, load_source(dataset, str(DATA / f"{dataset}.json")).obj)
    return out


def _upstream_workdir(ruler: Path, work: Path) -> Path:
    """upstream's scripts/data with the fixture data and the punkt_tab model where its generators read them."""
    scripts = work / "data"
    shutil.copytree(ruler / "scripts" / "data", scripts)
    for ours, theirs in UPSTREAM_FILES.items():
        shutil.copy(DATA / ours, scripts / "synthetic" / "json" / theirs)
    (scripts / "synthetic" / "json" / "english_words.json").write_text("{}")
    punkt = work / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    shutil.copytree(ROOT / "ruler_tasks" / "punkt_tab" / "english", punkt)
    return scripts


def _upstream_argv(scripts: Path, tok: Path, out: Path, task: str, length: int, samples: int) -> list[str]:
    """The command upstream's scripts/data/prepare.py @ c3f5e3b runs for `task` (base template, chunk 0 of 1)."""
    spec = TASKS[task]
    t = TASK_TEMPLATES[spec.generator]
    argv = [sys.executable, str(scripts / "synthetic" / f"{spec.generator}.py"), "--save_dir", str(out),
            "--save_name", task, "--subset", "validation", "--tokenizer_path", str(tok), "--tokenizer_type", "hf",
            "--max_seq_length", str(length), "--tokens_to_generate", str(t["tokens_to_generate"]),
            "--num_samples", str(samples), "--random_seed", "42"]
    for k, v in spec.args.items():
        argv += [f"--{k}", str(v)]
    if spec.generator == "qa":
        argv += ["--pre_samples", "0"]
    return argv + ["--template", t["template"] + t["answer_prefix"]]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    from longctx.core.kinds import Lengths

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", default="128k")
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--workers", type=int, default=None, help="ours: worker processes [default: the cores]")
    ap.add_argument("--upstream", type=Path, default=None, help="a checkout of NVIDIA/RULER @ c3f5e3b")
    ap.add_argument("--upstream-samples", type=int, default=10)
    args = ap.parse_args()
    length = Lengths().parse(args.length)[0]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "LONGCTX_CACHE_DIR": str(tmp / "cache"), "PYTHONPATH": str(ROOT)}
        from longctx.checkpoint.tokenizer import write_reference_tokenizer

        tok = write_reference_tokenizer(tmp / "tok")
        cores = len(os.sched_getaffinity(0))
        print(f"machine: {cores} cores; ours with {args.workers or cores} workers; length {length}; fixture data")

        # 1. start-up, after a first call has filled the cache
        _ours(tok, tmp / "warm", 4096, TASK_NAMES, 1, env, args.workers)
        start, _, err = _ours(tok, tmp / "one", 4096, ["niah_single_1"], 1, env, args.workers, importtime=True)
        heavy = sorted({line.rsplit("|", 1)[1].strip() for line in err.splitlines() if line.startswith("import time")
                        and line.rsplit("|", 1)[1].strip() in ("torch", "transformers")})
        print(f"start-up: one task, one sample at 4k: {start:.2f} s (target <= {TARGET_START_S} s); "
              f"imports torch/transformers: {', '.join(heavy) or 'neither'}")

        # 2. all 13 tasks
        qa = _usable_questions()
        others = [n for n in TASK_NAMES if n not in QA_TASKS]
        wall_main, peak, _ = _ours(tok, tmp / "all", length, others, args.samples, env, args.workers)
        wall_qa = 0.0
        for name in QA_TASKS:
            w, rss, _ = _ours(tok, tmp / f"all-{name}", length, [name], min(args.samples, qa[name]), env,
                              args.workers)
            wall_qa += w
            peak = max(peak, rss)
        ours_all = wall_main + wall_qa
        qa_samples = ", ".join(f"{n} {min(args.samples, qa[n])}" for n in QA_TASKS)
        print(f"all 13 tasks at {length}, {args.samples} samples ({qa_samples}): "
              f"ours {ours_all:.1f} s ({wall_main:.1f} s for {len(others)} tasks, {wall_qa:.1f} s for QA) "
              f"(target <= {TARGET_ALL_S:.0f} s on 2 cores); largest process {peak / 1024:.0f} MiB")

        if args.upstream is None:
            print(f"ratio={TARGET_ALL_S / ours_all:.2f}")
            return

        # 3. upstream side by side
        scripts = _upstream_workdir(args.upstream, tmp / "upstream")
        up_env = {**os.environ, "NLTK_DATA": str(tmp / "upstream" / "nltk_data"), "TOKENIZERS_PARALLELISM": "false"}
        n = args.upstream_samples
        up_wall, up_out = 0.0, tmp / "upstream-out"
        for name in TASK_NAMES:
            w, _, _ = _run(_upstream_argv(scripts, tok, up_out, name, length, min(n, qa.get(name, n))), up_env)
            up_wall += w
            print(f"  upstream {name}: {w:.1f} s")
        ours_wall = 0.0
        for group in ([x for x in TASK_NAMES if x not in QA_TASKS], *[[x] for x in QA_TASKS]):
            w, _, _ = _ours(tok, tmp / "side", length, group, min(n, *(qa.get(x, n) for x in group)), env,
                         args.workers)
            ours_wall += w
            for name in group:
                a, b = up_out / name / "validation.jsonl", tmp / "side" / str(length) / f"{name}.jsonl"
                if _sha(a) != _sha(b):
                    sys.exit(f"{name}: ours differs from upstream's file ({a} vs {b})")
        print(f"{n} samples a task, 13 tasks at {length}: upstream {up_wall:.1f} s, ours {ours_wall:.1f} s, every file "
              f"byte-identical; ratio {up_wall / ours_wall:.1f} (targets: >= 10 at 10 samples, >= 30 at 500)")
        print(f"ratio={up_wall / ours_wall:.1f}")


if __name__ == "__main__":
    main()
