"""The GPU check: longctx's CUDA paths, measured in one command, one table (printed and written as JSON).

    python scripts/gpu_check.py                          # on a CUDA machine: the full check (about 6 min, one H200)
    python scripts/gpu_check.py --smoke                  # the same code paths with tiny shapes, on CPU (CI runs it)
    python scripts/gpu_check.py --parts correctness,gate-cost --json check.json --work-dir /dev/shm/check

Parts, in order; each runs in a process of its own under its own time budget, and one that fails or runs out of
time prints its error while the rest still run (the exit status is 1 then):

- `correctness`: every attention variant's tiny model (the baseline and each gate of `longctx.models.gates.NAMED`,
  every position G1-G5) gives the same fp32 logits on the device as on CPU (max abs difference <= 1e-4, TF32 off);
  on the shipped trained checkpoints a bf16-autocast training step's loss is finite and within 1% of fp32's.
- `extend-<attention>`: `longctx extend` (the library call the verb makes) on the paper-1.7b preset, random weights
  made here, RoPE base 1e4 -> 1e6, one 32k-token sequence per step, bf16, gradient checkpointing, a few optimizer
  steps; once per attention implementation this machine has (sdpa with its dense document mask, flex_attention,
  flash_attention_2): tokens/s, MFU (counted as docs/extend.md#log-and-mfu says), peak memory, padding share.
- `gate-cost`: forward+backward at 32k tokens of the paper-1.7b layer shapes, baseline vs elementwise vs headwise at
  matched parameters (FFN shrunk, `longctx init --match-params`), alternated step by step: median step times and
  their ratios (the paper: under 2% of wall time).
- `sinks`: `longctx sinks` on the paper-1.7b preset YaRN-scaled x8 (`longctx yarn`), one 32k window: wall time,
  peak memory.
- `ruler-hf`: `longctx ruler run --backend hf` on the shipped tiny gated checkpoint YaRN-scaled x32, 2 tasks at
  32k, fp32, on the device and on CPU: time per sample, and the predictions equal.

Smoke mode (`--smoke`) runs every part on the tiny preset at 256-2048 tokens, on CPU when there is no GPU: the
numbers mean nothing, the code paths are the full check's. Without CUDA only `--smoke` runs.

Work files (checkpoints, training state: about 30 GB in the full check) go to `--work-dir` [default: a temporary
folder], which is removed at the end unless `--keep`.

What the check needs beyond longctx's own folder (run from a checkout, nothing installed): torch with CUDA, accelerate,
safetensors, tokenizers, huggingface_hub, numpy, scipy, click, tqdm, pyyaml, and these pure-Python wheels, which a
machine without a network (the GPU machine of docs/gpu.md: torch 2.11, transformers 5.17) takes from a folder:

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d wheels \
        transformers==5.19.0 wonderwords==3.0.1 nltk==3.10.4 regex==2026.11.19 mistral_common==1.13.1
    pip install --no-index --no-deps --target /tmp/site wheels/*.whl && export PYTHONPATH=/tmp/site

(transformers 5.19 is the release longctx pins; wonderwords and nltk are what `ruler_tasks` imports; regex is what
transformers 5.19 wants newer than some images have; mistral_common's SentencePiece model is the reference
tokenizer of the `gpu`-marked tests: docs/gpu.md). The wheels never enter the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import json
import math
import multiprocessing
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout: longctx and ruler_tasks import from it
    sys.path.insert(0, str(ROOT))

# Trained (docs: checkpoints/README.md): their losses and greedy answers are not a random model's near-ties.
SHIPPED = [ROOT / "checkpoints" / "tiny-baseline", ROOT / "checkpoints" / "tiny-gated"]
SHIPPED_GATED = SHIPPED[1]
LOGIT_TOLERANCE = 1e-4  # max |logit difference|, device vs CPU, fp32 with TF32 off
BF16_LOSS_TOLERANCE = 0.01  # |bf16 loss - fp32 loss| / fp32 loss


@dataclass(frozen=True)
class Shapes:
    """The sizes one mode runs at."""

    preset: str  # longctx init preset of the extend, gate-cost and sinks parts
    trained_length: int  # the preset checkpoint's max_position_embeddings
    seq_len: int  # extend's sequence length and gate-cost's tokens
    extend_steps: int
    gate_layers: int  # decoder layers of the gate-cost models (the preset's layer shapes)
    gate_steps: int
    sinks_factor: float  # YaRN factor over trained_length: the sinks window
    ruler_factor: float  # YaRN factor over the shipped tiny checkpoint's 1024 tokens: the RULER length
    ruler_samples: int
    logit_tokens: int
    total_budget_s: float  # the whole check, its start-up included: a part gets at most what is left


FULL = Shapes(preset="paper-1.7b", trained_length=4096, seq_len=32768, extend_steps=4, gate_layers=4, gate_steps=5,
              sinks_factor=8, ruler_factor=32, ruler_samples=2, logit_tokens=512, total_budget_s=480)
SMOKE = Shapes(preset="tiny", trained_length=256, seq_len=512, extend_steps=2, gate_layers=2, gate_steps=1,
               sinks_factor=8, ruler_factor=2, ruler_samples=1, logit_tokens=64, total_budget_s=300)
RULER_TASKS = ["niah_single_1", "vt"]  # need no essay or QA data
RESULT_FORMAT = "longctx-gpu-check/1"
STARTUP_BUDGET_S = 300  # the process the parts are forked from: importing torch and transformers


@dataclass
class Context:
    """What a part is given: the device it measures, its sizes and the work folder the parts share."""

    device: str
    shapes: Shapes
    work: Path

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass
class Outcome:
    """What a part found: its numbers and the checks that failed (none: it passed)."""

    metrics: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    skipped: str | None = None  # why the part could not run here (not a failure)


# ---------------------------------------------------------------------------------------------- shared helpers


def _sync(ctx: Context) -> None:
    import torch

    if ctx.cuda:
        torch.cuda.synchronize()


def _reset_peak(ctx: Context) -> None:
    import torch

    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(ctx: Context) -> float | None:
    """The device memory torch's allocator held at most since the last reset (None on CPU)."""
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if ctx.cuda else None


def _ieee_fp32() -> None:
    """fp32 matmuls and convolutions as IEEE fp32 (no TF32), so device and CPU logits can agree to 1e-4."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _preset_checkpoint(ctx: Context) -> Path:
    """The preset's baseline checkpoint (random weights, the shipped BPE tokenizer), made once per work folder."""
    from longctx.init.checkpoint import init_checkpoint
    from longctx.init.settings import InitSettings

    out = ctx.work / f"{ctx.shapes.preset}-baseline"
    if not out.exists():
        init_checkpoint(InitSettings(output=str(out), preset=ctx.shapes.preset, attention="baseline",
                                     tokenizer=str(SHIPPED_GATED), seed=0,
                                     config={"max_position_embeddings": ctx.shapes.trained_length}))
    return out


def _yarned(ctx: Context, ckpt: Path, factor: float, name: str) -> Path:
    """`longctx yarn CKPT --factor FACTOR`, once per work folder."""
    from longctx.yarn.scaling import yarn_checkpoint
    from longctx.yarn.settings import YarnSettings

    out = ctx.work / name
    if not out.exists():
        yarn_checkpoint(YarnSettings(checkpoint=str(ckpt), factor=factor, output=str(out)))
    return out


def _timed(ctx: Context, fn: Callable[[], None]) -> float:
    """Seconds `fn` takes, the device's queued work included."""
    _sync(ctx)
    t = time.perf_counter()
    fn()
    _sync(ctx)
    return time.perf_counter() - t


# ---------------------------------------------------------------------------------------------- the parts


def part_correctness(ctx: Context) -> Outcome:
    """Every variant's tiny model: fp32 logits on the device vs CPU. The shipped checkpoints: a bf16-autocast
    training step (forward and backward) vs fp32."""
    import torch

    from longctx.checkpoint.load import load_model
    from longctx.checkpoint.tokenizer import load_tokenizer
    from longctx.extend.model import make_training_module
    from longctx.init.presets import model_config
    from longctx.models.gated_qwen3 import causal_lm_class
    from longctx.models.gates import NAMED
    from longctx.sinks.measure import token_windows

    _ieee_fp32()
    out = Outcome()
    vocab, n = 512, ctx.shapes.logit_tokens
    ids = torch.randint(0, vocab, (2, n), generator=torch.Generator().manual_seed(0))
    worst = ("", 0.0)
    for variant in NAMED:
        config = model_config("tiny", variant, vocab, attn_implementation="sdpa")
        torch.manual_seed(0)
        model = causal_lm_class(config)(config).float().eval()
        with torch.inference_mode():
            on_cpu = model(ids).logits
            on_device = model.to(ctx.device)(ids.to(ctx.device)).logits.cpu()
        diff = float((on_device - on_cpu).abs().max())
        if not diff <= LOGIT_TOLERANCE:
            out.problems.append(f"{variant}: fp32 logits on {ctx.device} differ from CPU's by {diff:.2e} "
                                f"(> {LOGIT_TOLERANCE:g})")
        if diff >= worst[1]:
            worst = (variant, diff)
    out.metrics.update(variants=len(NAMED), max_logit_diff=f"{worst[1]:.1e}", worst_variant=worst[0],
                       logit_tolerance=LOGIT_TOLERANCE)

    # bf16 on the shipped trained checkpoints: a random model's loss sits at ln(vocab) whatever the precision
    for ckpt in SHIPPED:
        tok = load_tokenizer(ckpt)
        windows, _ = token_windows(tok, "synthetic:pretrain", 2, n)
        ids = torch.tensor(windows, device=ctx.device)
        labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100, device=ctx.device)], dim=1)
        positions = torch.arange(n, device=ctx.device).expand(2, n)
        losses, grads = {}, {}
        for dtype in ("float32", "bfloat16"):
            module = make_training_module(load_model(ckpt, dtype="float32", device=ctx.device,
                                                     attn_implementation="sdpa").train())
            with torch.autocast(ctx.device.split(":")[0], dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                loss = module(ids, positions, labels) / int((labels != -100).sum())
            loss.backward()
            losses[dtype] = float(loss.detach())
            grads[dtype] = torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None])
            if not (math.isfinite(losses[dtype]) and bool(torch.isfinite(grads[dtype]).all())):
                out.problems.append(f"{ckpt.name}: a {dtype} training step gave a loss of {losses[dtype]} or "
                                    "gradients that are not finite")
        gap = abs(losses["bfloat16"] - losses["float32"]) / abs(losses["float32"])
        if not gap <= BF16_LOSS_TOLERANCE:
            out.problems.append(f"{ckpt.name}: bf16 loss {losses['bfloat16']:.4f} vs fp32 {losses['float32']:.4f} "
                                f"({gap:.2%} apart, > {BF16_LOSS_TOLERANCE:.0%})")
        cosine = float(torch.nn.functional.cosine_similarity(grads["bfloat16"], grads["float32"], dim=0))
        out.metrics[ckpt.name] = (f"loss fp32 {losses['float32']:.4f} bf16 {losses['bfloat16']:.4f} ({gap:.2%}), "
                                  f"gradient cosine {cosine:.4f}")
    return out


def part_extend(ctx: Context, attention: str) -> Outcome:
    """`extend` at `ctx.shapes.seq_len` with one attention implementation; the numbers of its training log."""
    import torch

    from longctx.extend.loop import extend
    from longctx.extend.settings import ExtendSettings

    ckpt = _preset_checkpoint(ctx)
    out = ctx.work / f"extend-{attention}"
    s = ExtendSettings(checkpoint=str(ckpt), output=str(out), seq_len=ctx.shapes.seq_len, rope_base=1e6,
                       data=["synthetic:pretrain"], steps=ctx.shapes.extend_steps, tokens_per_step=ctx.shapes.seq_len,
                       attention=attention, dtype="bfloat16" if ctx.cuda else "float32", gradient_checkpointing=True,
                       tokenize_workers=1, cache_dir=str(ctx.work / "data-cache"), overwrite=True)
    _reset_peak(ctx)
    try:
        r = extend(s)  # its progress bar: what a part stopped for its budget had done
        steps = [json.loads(line) for line in r.log.read_text().splitlines()]
    finally:  # the training state of a 1.7B model is 20 GB
        for path in (out, Path(f"{out}.train")):
            shutil.rmtree(path, ignore_errors=True)
    later = steps[1:] or steps  # the first step compiles kernels (FlexAttention) and warms the allocator
    o = Outcome(metrics={
        "tokens_per_s": round(statistics.median(e["tokens_per_s"] for e in later)),
        "mfu": _median_share(e["mfu"] for e in later),
        "mfu_attention": _median_share(e["mfu_attention"] for e in later),
        "peak_gib": _peak_gib(ctx),
        "padding": f"{statistics.mean(e['padding'] for e in steps):.1%}",
        "first_step_s": round(steps[0]["seconds"], 1),
        "step_s": round(statistics.median(e["seconds"] for e in later), 2),
        "loss": f"{steps[0]['loss']:.3f}->{steps[-1]['loss']:.3f}",
    })
    if not all(torch.isfinite(torch.tensor(e["loss"])) for e in steps):
        o.problems.append(f"a loss that is not finite: {[e['loss'] for e in steps]}")
    return o


def _median_share(values) -> str | None:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.1%}" if values else None


def part_gate_cost(ctx: Context) -> Outcome:
    """Forward+backward of baseline, elementwise and headwise models at matched parameters, alternated."""
    import torch

    from longctx.extend.model import make_training_module
    from longctx.init.presets import model_config, parameter_count
    from longctx.models.gated_qwen3 import causal_lm_class

    sh = ctx.shapes
    vocab, n = 2048, sh.seq_len
    modules, params = {}, {}
    for variant in ("baseline", "elementwise", "headwise"):
        config = model_config(sh.preset, variant, vocab, match_params=variant != "baseline",
                              num_hidden_layers=sh.gate_layers, attn_implementation="sdpa")
        torch.manual_seed(0)
        modules[variant] = make_training_module(causal_lm_class(config)(config).float().to(ctx.device).train())
        params[variant] = parameter_count(config)
    ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(0)).to(ctx.device)
    positions = torch.arange(n, device=ctx.device).unsqueeze(0)
    labels = torch.roll(ids, -1, dims=1)

    def step(module) -> None:
        with torch.autocast(ctx.device.split(":")[0], dtype=torch.bfloat16, enabled=ctx.cuda):
            loss = module(ids, positions, labels)
        loss.backward()
        module.zero_grad(set_to_none=True)

    _reset_peak(ctx)
    for module in modules.values():  # warm-up: kernels chosen, allocator filled
        step(module)
    times: dict[str, list[float]] = {v: [] for v in modules}
    for _ in range(sh.gate_steps):  # alternated, so that a slow spell hits every model alike
        for variant, module in modules.items():
            times[variant].append(_timed(ctx, lambda m=module: step(m)))
    med = {v: statistics.median(ts) for v, ts in times.items()}
    return Outcome(metrics={
        "tokens": n, "layers": sh.gate_layers,
        **{f"{v}_ms": round(med[v] * 1000, 1) for v in modules},
        "elementwise_ratio": round(med["elementwise"] / med["baseline"], 4),
        "headwise_ratio": round(med["headwise"] / med["baseline"], 4),
        "params_vs_baseline": "/".join(f"{params[v] / params['baseline']:.4f}" for v in ("elementwise", "headwise")),
        "peak_gib": _peak_gib(ctx),
    })


def part_sinks(ctx: Context) -> Outcome:
    """`sinks` on the YaRN-scaled preset checkpoint, one window of trained_length x sinks_factor tokens."""
    from longctx.sinks.measure import measure_sinks
    from longctx.sinks.settings import SinksSettings

    sh = ctx.shapes
    length = int(sh.trained_length * sh.sinks_factor)
    ckpt = _yarned(ctx, _preset_checkpoint(ctx), sh.sinks_factor, f"{sh.preset}-yarn")
    _reset_peak(ctx)
    t = time.perf_counter()
    r = measure_sinks(SinksSettings(checkpoint=str(ckpt), output=str(ctx.work / "sinks"), length=length,
                                    tokens=length, device=ctx.device, plot=False), progress=False, log=lambda _: None)
    wall = time.perf_counter() - t
    timings = r.results["timings"]
    return Outcome(metrics={"window": length, "wall_s": round(wall, 1), "load_s": timings["load_s"],
                            "forward_s": timings["forward_s"], "tokens_per_s": round(timings["tokens_per_s"]),
                            "peak_gib": _peak_gib(ctx), "dtype": r.results["settings"]["dtype"]})


def part_ruler_hf(ctx: Context) -> Outcome:
    """`ruler run --backend hf` on the device and on CPU over the same task files; predictions compared."""
    from longctx.eval.runner import run_ruler
    from longctx.eval.settings import RulerRunSettings

    sh = ctx.shapes
    length = int(1024 * sh.ruler_factor)
    ckpt = _yarned(ctx, SHIPPED_GATED, sh.ruler_factor, "tiny-gated-yarn")
    preds, per_sample = {}, {}
    for device in dict.fromkeys([ctx.device, "cpu"]):
        out = ctx.work / f"ruler-{device.replace(':', '')}"
        r = run_ruler(RulerRunSettings(checkpoint=str(ckpt), output=str(out), backend="hf", device=device,
                                       dtype="float32", lengths=[length], tasks=RULER_TASKS,
                                       samples=sh.ruler_samples, plot=False), progress=False, log=lambda _: None)
        preds[device] = {p.relative_to(out / "pred").as_posix(): [json.loads(line)["pred"]
                                                                   for line in p.read_text().splitlines()]
                         for p in sorted((out / "pred").rglob("*.jsonl"))}
        done = r.timings["new_predictions"]
        per_sample[device] = round(r.timings["generate_s"] / done, 2) if done else None
    o = Outcome(metrics={"length": length, "samples": sum(map(len, preds[ctx.device].values())),
                         "s_per_sample": per_sample[ctx.device], "cpu_s_per_sample": per_sample["cpu"]})
    differ = [f"{name}[{i}]" for name, got in preds[ctx.device].items()
              for i, (a, b) in enumerate(zip(got, preds["cpu"][name])) if a != b]
    o.metrics["predictions_equal"] = not differ and preds[ctx.device].keys() == preds["cpu"].keys()
    if not o.metrics["predictions_equal"]:
        o.problems.append(f"predictions on {ctx.device} differ from CPU's: {', '.join(differ) or 'other files'}")
    return o


def part_gpu_tests(ctx: Context) -> Outcome:
    """The test suite's gpu-marked tests (`pytest -m gpu`) in the test files that have them; on CPU they skip."""
    if importlib.util.find_spec("pytest") is None:
        return Outcome(skipped="pytest is not installed (pip install 'longctx[dev]')")
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")
                   if "pytest.mark.gpu" in p.read_text())
    report = ctx.work / "gpu-tests.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-n", "0", "-p", "no:cacheprovider",
                          "--tb=short", f"--junitxml={report}", *files], cwd=ROOT, capture_output=True, text=True)
    print(run.stdout[-6000:], run.stderr[-2000:], sep="\n", flush=True)
    if not report.exists():
        return Outcome(problems=[f"pytest ended with exit status {run.returncode} and no report: "
                                 f"{(run.stderr or run.stdout).strip().splitlines()[-1:]}"])
    suite = ElementTree.parse(report).getroot().find("testsuite")
    o = Outcome(metrics={key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")})
    for case in suite.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            o.problems.append(f"{case.get('name')}: {message[0][:240] if message else 'failed'}")
    return o


@dataclass(frozen=True)
class Part:
    name: str
    run: Callable[[Context], Outcome]
    budget_s: float  # full check, one H200
    smoke_budget_s: float  # smoke mode, 2 CPU cores


EXTEND_ATTENTION = ("sdpa", "flex_attention", "flash_attention_2")  # each one the machine has is an extend part
# sdpa's dense document mask rules out its flash kernel: the slowest of them (docs/gpu.md)
EXTEND_BUDGETS = {"sdpa": 200, "flex_attention": 150}


def parts(attention: list[str]) -> list[Part]:
    """Every part, in the order they run, given the attention implementations extend can use here."""
    return [
        Part("correctness", part_correctness, 30, 60),
        *[Part(f"extend-{a}", functools.partial(part_extend, attention=a), EXTEND_BUDGETS.get(a, 150), 90)
          for a in attention],
        Part("gate-cost", part_gate_cost, 45, 60),
        Part("sinks", part_sinks, 40, 60),
        Part("ruler-hf", part_ruler_hf, 60, 60),
        Part("gpu-tests", part_gpu_tests, 120, 60),  # last: the one whose time on a GPU is not known yet
    ]


# ---------------------------------------------------------------------------------------------- running the parts

# What the parts import, loaded once by the process they are forked from (importing them takes longer than a
# smoke-mode part runs). Importing them starts no CUDA, so each forked part starts CUDA afresh.
PRELOAD = ["torch", "transformers", "longctx.extend.loop", "longctx.sinks.measure", "longctx.eval.runner",
           "longctx.eval.backends.hf", "longctx.yarn.scaling", "longctx.init.checkpoint", "longctx.models.gated_qwen3"]


def probe(device: str | None, result_file: Path) -> None:
    """(In a child) what this machine is: the device to measure, its name, the versions, the attention
    implementations extend can use on it."""
    import torch
    import transformers

    from longctx.core.errors import InputError
    from longctx.extend.model import attention_implementation

    cuda = torch.cuda.is_available()
    device = device or ("cuda" if cuda else "cpu")
    on_cuda = device.startswith("cuda")
    attention = []
    for name in EXTEND_ATTENTION:
        with contextlib.suppress(InputError):
            attention.append(attention_implementation(name, on_cuda, 1)[0])
    result_file.write_text(json.dumps({
        "device": device, "cuda_available": cuda,
        "device_name": torch.cuda.get_device_name(device) if on_cuda and cuda else f"CPU ({os.cpu_count()} cores)",
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "attention": attention}))


def run_part(name: str, ctx: Context, attention: list[str], result_file: Path) -> None:
    """(In a child) run one part and write its Outcome, or its error, to `result_file`."""
    part = next(p for p in parts(attention) if p.name == name)
    try:
        o = part.run(ctx)
        record = {"status": "failed" if o.problems else "skipped" if o.skipped else "ok", **asdict(o)}
    except BaseException as e:  # noqa: BLE001 - any failure of a part is its result; the other parts still run
        traceback.print_exc()
        record = {"status": "failed", "metrics": {}, "problems": [f"{type(e).__name__}: {e}"]}
    result_file.write_text(json.dumps(record))


def _child(target: Callable[..., None], args: tuple) -> None:
    from longctx.core.processes import die_with_parent

    os.setsid()  # a group of its own: stopped with every process it started
    die_with_parent()  # the fork server, which ends with the check
    target(*args)


def _spawn(forks, target: Callable[..., None], args: tuple, result_file: Path, budget: float) -> dict[str, Any]:
    """Run `target(*args, result_file)` in a process forked by `forks` (a forkserver context) for at most `budget`
    seconds; what it wrote to `result_file`, with "seconds", or a failure."""
    result_file.unlink(missing_ok=True)
    t = time.perf_counter()
    child = forks.Process(target=_child, args=(target, (*args, result_file)))
    child.start()
    try:
        child.join(timeout=budget)
    finally:
        if child.is_alive():  # out of time, or the check was interrupted
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.kill()
            child.join()
            timed_out = True
        else:
            timed_out = False
    seconds = round(time.perf_counter() - t, 1)
    if timed_out:
        return {"status": "timeout", "seconds": seconds, "metrics": {},
                "problems": [f"ran past its budget of {budget:g} s and was stopped"]}
    if not result_file.exists():
        return {"status": "failed", "seconds": seconds, "metrics": {},
                "problems": [f"its process ended with exit status {child.exitcode} and no result"]}
    return {**json.loads(result_file.read_text()), "seconds": seconds}


def table(report: dict[str, Any]) -> str:
    """The parts' results as one Markdown table."""
    lines = ["| part | status | seconds | budget | result |", "| --- | --- | --- | --- | --- |"]
    for p in report["parts"]:
        shown = ", ".join(f"{k} {v}" for k, v in p["metrics"].items() if v is not None)
        if p["problems"]:
            shown = "; ".join([*p["problems"], *([shown] if shown else [])])
        lines.append(f"| {p['name']} | {p['status']} | {p['seconds']} | {p['budget_s']:g} | {shown} |")
    return "\n".join(lines)


def _refuse(text: str) -> int:
    print(f"gpu_check: {text}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.error = lambda message: sys.exit(_refuse(f"{message} (--help lists the options)"))  # one line, not usage
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (the CPU smoke mode CI runs)")
    ap.add_argument("--parts", help="comma-separated part names [default: all]")
    ap.add_argument("--json", default="gpu-check.json", help="where the report is written [default: %(default)s]")
    ap.add_argument("--work-dir", help="folder for checkpoints and training state; one that exists is kept "
                                       "[default: a temporary folder, removed at the end]")
    ap.add_argument("--keep", action="store_true", help="keep the work folder the check made")
    ap.add_argument("--device", help="torch device [default: cuda when available, else cpu (smoke only)]")
    ap.add_argument("--budget-scale", type=float, default=1.0,
                    help="multiply every part's time budget and the total (a slower GPU) [default: %(default)s]")
    ap.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS",
                    help="one part's time budget (repeatable)")
    args = ap.parse_args(argv)
    if not args.budget_scale > 0:
        return _refuse(f"--budget-scale {args.budget_scale:g} must be above 0")
    budgets = {}
    for item in args.budget:
        name, _, seconds = item.partition("=")
        try:
            budgets[name.strip()] = float(seconds)
        except ValueError:
            return _refuse(f"--budget {item}: give PART=SECONDS, e.g. gpu-tests=300")
        if not budgets[name.strip()] > 0:
            return _refuse(f"--budget {item}: the seconds must be above 0")
    args.budget = budgets
    every = [p.name for p in parts(list(EXTEND_ATTENTION))]
    args.parts = [n.strip() for n in args.parts.split(",")] if args.parts else None
    for option, names in (("--parts", args.parts or []), ("--budget", args.budget)):
        unknown = [n for n in names if n not in every]
        if unknown:
            return _refuse(f"{option}: no part {', '.join(unknown)}; the parts are {', '.join(every)}")
    if args.work_dir and Path(args.work_dir).exists() and not Path(args.work_dir).is_dir():
        return _refuse(f"--work-dir {args.work_dir} is not a folder")
    if not Path(args.json).resolve().parent.is_dir():  # found now, not after minutes of parts
        return _refuse(f"--json {args.json}: its folder does not exist")

    made = not (args.work_dir and Path(args.work_dir).exists())
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="longctx-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LONGCTX_CACHE_DIR", str(work / "cache"))  # the parts' tokenizer and data caches
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(PRELOAD)
    started = time.perf_counter()
    try:
        return _check(args, forks, work, started)
    finally:
        if made and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _check(args: argparse.Namespace, forks, work: Path, started: float) -> int:
    machine = _spawn(forks, probe, (args.device,), work / "machine.json", STARTUP_BUDGET_S)
    if "device" not in machine:
        return _refuse(f"could not start the parts' process: {'; '.join(machine.get('problems', []))}")
    device = machine.pop("device")
    on_cuda = device.startswith("cuda")
    if on_cuda and not machine["cuda_available"]:
        return _refuse(f"--device {device}: torch sees no CUDA device here; run with --smoke for the CPU smoke mode")
    if not on_cuda and not args.smoke:
        return _refuse("the full check needs a CUDA device (torch sees none here); run with --smoke for the CPU "
                       "smoke mode")
    chosen = parts(machine["attention"])
    if args.parts:
        absent = [n for n in args.parts if n not in {p.name for p in chosen}]
        if absent:
            return _refuse(f"--parts: {', '.join(absent)} cannot run here: extend has "
                           f"{', '.join(machine['attention'])} on {device}")
        chosen = [p for p in chosen if p.name in args.parts]

    report = {"format": RESULT_FORMAT, "mode": "smoke" if args.smoke else "full",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": shlex.join(["python", "scripts/gpu_check.py", *sys.argv[1:]]), **machine,
              "startup_s": machine.pop("seconds"), "parts": []}
    print(f"gpu_check: {report['mode']} check on {report['device_name']} (torch {report['torch']}, transformers "
          f"{report['transformers']}); work folder {work}", flush=True)
    shapes = SMOKE if args.smoke else FULL
    ctx = Context(device, shapes, work)
    total = shapes.total_budget_s * args.budget_scale
    for p in chosen:
        left = total - (time.perf_counter() - started)
        budget = min(args.budget.get(p.name, (p.smoke_budget_s if args.smoke else p.budget_s) * args.budget_scale),
                     left)
        if left <= 0:
            result = {"name": p.name, "budget_s": 0, "status": "not run", "seconds": 0, "metrics": {},
                      "problems": [f"the check's total budget of {total:g} s was spent before it"]}
        else:
            print(f"gpu_check: {p.name} (budget {budget:.0f} s)", flush=True)
            result = {"name": p.name, "budget_s": round(budget, 2),
                      **_spawn(forks, run_part, (p.name, ctx, machine["attention"]), work / f"{p.name}.json", budget)}
        report["parts"].append(result)
        print(f"gpu_check: {p.name} {result['status']} in {result['seconds']} s", flush=True)
    report["seconds"] = round(time.perf_counter() - started, 1)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    counts = {status: sum(p["status"] == status for p in report["parts"])
              for status in ("ok", "skipped", "failed", "timeout", "not run")}
    print(f"gpu_check: {', '.join(f'{n} {status}' for status, n in counts.items() if n)} of {len(report['parts'])} "
          f"parts in {report['seconds']} s; report in {args.json}")
    return 0 if counts["ok"] + counts["skipped"] == len(report["parts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
