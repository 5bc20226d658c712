"""Issue 30's smaller items, each one line with what to do: a vLLM engine that dies while it generates, a repo
root whose checkpoints sit in subfolders, and a checkpoint without weight files given to a verb that needs them.

Hub ids are resolved from a Hub cache laid out on disk as huggingface_hub writes one (tests/test_hub.py `_repo`),
with HF_HUB_OFFLINE=1: nothing downloads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require_vllm, user_environment

from longctx.cli.main import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_exit_2(r, *messages: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    assert r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    for message in messages:
        assert message in r.stderr, (message, r.stderr)
    return r.stderr


# --- a vLLM engine that dies after it started ---------------------------------------------------------------


def _engine_processes(pid: int) -> list:
    """The vLLM engine processes `pid` started (vLLM titles them VLLM::EngineCore: vllm-project/vllm v0.32.0
    vllm/v1/engine/core.py `run_engine_core`, vllm/utils/system_utils.py `set_process_title`)."""
    import psutil

    found = []
    for child in psutil.Process(pid).children():
        try:
            if "VLLM::EngineCore" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def test_the_cause_of_a_failure_while_generating_is_what_the_log_got_since_it_began(tmp_path):
    """The engine's log holds its start too: an exception line from before generation began is not the cause of a
    failure during it; with none since, how its processes ended is, and a process killed by a signal is its own
    cause."""
    from longctx.eval.vllm_engine import engine_error

    log = tmp_path / "vllm-engine.log"
    log.write_text("(EngineCore pid=7) ValueError: a warning the start logged\n")
    since = log.stat().st_size
    dead = Exception("EngineCore encountered an issue. See stack trace (above) for the root cause.")
    killed = "its process EngineCore was killed by SIGKILL"
    assert engine_error(log, dead, since, killed) == killed
    with log.open("a") as f:
        f.write("(EngineCore pid=7) ERROR 12-02 10:00:00 [core.py:1] Traceback (most recent call last):\n"
                "(EngineCore pid=7) ERROR 12-02 10:00:00 [core.py:1] RuntimeError: CUDA error: illegal memory access\n")
    exited = "its process EngineCore ended with exit code 1"
    assert engine_error(log, dead, since, exited) == "RuntimeError: CUDA error: illegal memory access"
    assert engine_error(log, RuntimeError("out of memory"), since, killed) == "RuntimeError: out of memory"
    # a process killed by a signal wrote nothing: an exception the client's threads logged as it shut down is not
    # the cause
    with log.open("a") as f:
        f.write("BrokenPipeError: [Errno 32] Broken pipe\n")
    assert engine_error(log, dead, since, killed) == killed


@pytest.mark.slow
def test_a_killed_engine_is_named_killed_when_another_thread_reaps_it_first():
    """vLLM's monitor thread reads `exitcode` as soon as an engine process ends; when its waitpid wins, ours gets
    ECHILD and multiprocessing says "no exit code yet" until the status is stored a moment later. The signal
    must still be named (a CI run once said only "its process EngineCore ended")."""
    import multiprocessing
    import signal
    import threading
    from types import SimpleNamespace

    from longctx.eval.vllm_engine import ended_processes

    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,), name="EngineCore")
    proc.start()
    try:
        pid = proc.pid
        proc.kill()
        _, status = os.waitpid(pid, 0)  # the other thread's waitpid wins the race ...

        def store() -> None:  # ... and stores the status a moment later, as Popen.poll does
            time.sleep(0.2)
            proc._popen.returncode = os.waitstatus_to_exitcode(status)

        threading.Thread(target=store).start()
        client = SimpleNamespace(resources=SimpleNamespace(engine_manager=SimpleNamespace(processes=[proc])))
        assert ended_processes(client) == ("its process EngineCore was killed by SIGKILL (as the kernel's "
                                           "out-of-memory killer does)")
        assert proc.exitcode == -signal.SIGKILL
    finally:
        if proc.exitcode is None:
            proc.kill()


@pytest.mark.slow
def test_an_engine_that_dies_while_generating_is_one_line_and_keeps_the_predictions(tmp_path,
                                                                                     reference_tokenizer_dir):
    """The engine process killed (kill -9) after the first predictions are written: `longctx ruler` says so in
    one line naming the engine's log, exits 2 and keeps what it predicted. Before: vLLM's client waited for
    output forever (a killed process sends no ENGINE_CORE_DEAD), and an exception in the engine process was a
    raw EngineDeadError traceback with exit 1."""
    from longctx.init.presets import write_tiny_qwen3

    require_vllm()
    ckpt = write_tiny_qwen3(tmp_path / "tiny2k", reference_tokenizer_dir, max_position_embeddings=2048)
    out = tmp_path / "run"
    env = {**user_environment(), "VLLM_CPU_KVCACHE_SPACE": "1", "TQDM_DISABLE": "1"}  # no progress bars on stderr
    # one sequence at a time: the predictions arrive one by one, so many are still to come when the engine dies
    proc = subprocess.Popen([sys.executable, "-m", "longctx", "ruler", "run", str(ckpt), "--backend", "vllm",
                             "--dtype", "float32", "--enforce-eager", "--engine-arg", "max_num_seqs=1",
                             "--lengths", "1k", "--tasks", "vt", "--samples", "40", "-o", str(out), "--no-plot"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    pred = out / "pred" / "1024" / "vt.jsonl"
    try:
        deadline = time.time() + 600
        while not (pred.is_file() and pred.read_text().count("\n") >= 1):
            assert proc.poll() is None and time.time() < deadline, "the run ended before it made a prediction"
            time.sleep(0.1)
        engines = _engine_processes(proc.pid)
        assert len(engines) == 1, engines
        engines[0].kill()
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = out / "vllm-engine.log"
    assert proc.returncode == 2, stderr[-3000:]
    assert "Traceback" not in stdout + stderr
    assert stderr.count("\n") == 1 and stderr.startswith("Error: "), stderr[-3000:]
    assert f"the vLLM engine for {ckpt} stopped while generating (" in stderr
    assert "SIGKILL" in stderr, stderr
    assert stderr.endswith(f"full output in {log}\n"), stderr
    made = [json.loads(line) for line in pred.read_text().splitlines()]
    assert 1 <= len(made) < 40 and all(set(m) >= {"index", "pred", "prompt_sha256"} for m in made)
    assert (out / "run.json").is_file() and not (out / "scores.json").exists()


# --- a repo root whose checkpoints sit in subfolders, and checkpoints without weight files -------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"
GATED = "QwQZh/gated_attention"
MODELS = ("1B_baseline", "1B_gate_headwise")


def _weightless(src: Path, dst: Path) -> Path:
    """A copy of checkpoint `src` without its weight files (config.json, tokenizer and side files only: what a
    tokenizer-only download holds), with room for RULER's shortest tasks (1k)."""
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", ".longctx-output"))
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 2048}))
    return dst


@pytest.fixture
def hub(tmp_path, tiny_checkpoint, monkeypatch):
    """HF_HOME (offline) with QwQZh/gated_attention (two checkpoints in subfolders, nothing at the top), org/tok
    (config.json and tokenizer only) and org/tok-listed (the same, with the repo's file list that huggingface_hub
    >= 2.4 keeps beside a snapshot naming model.safetensors too)."""
    from test_hub import _repo

    home = tmp_path / "hf"
    _repo(home / "hub", GATED, [COMMIT], MODELS, checkpoint=tiny_checkpoint)
    weightless = _weightless(tiny_checkpoint, tmp_path / "weightless")
    _repo(home / "hub", "org/tok", [COMMIT], checkpoint=weightless)
    listed = _repo(home / "hub", "org/tok-listed", [COMMIT], checkpoint=weightless)
    # huggingface_hub/_tree_cache.py: trees/<commit>.json, {"format_version": 1, "files": {path: {size, blob_id}}}
    files = {f.name: {"size": f.stat().st_size, "blob_id": "0" * 40} for f in weightless.iterdir()}
    files["model.safetensors"] = {"size": 1024, "blob_id": "1" * 40}
    (listed / "trees").mkdir()
    (listed / "trees" / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": files}))
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return home / "hub"


def _verbs_on(checkpoint, out: Path) -> dict[str, list]:
    """A command of each verb that takes a checkpoint, writing (if it gets so far) to `out`."""
    return {
        "info": ["info", checkpoint],
        "yarn": ["yarn", checkpoint, "--factor", "2", "-o", out],
        "sinks": ["sinks", checkpoint, "--tokens", "256", "-o", out],
        "extend": ["extend", checkpoint, "--rope-base", "1e5", "--seq-len", "512", "--data", "synthetic:mixed",
                   "--steps", "1", "--tokens-per-step", "512", "-o", out],
        "ruler run --backend hf": ["ruler", checkpoint, "--lengths", "1k", "--tasks", "vt", "--samples", "1",
                                   "--backend", "hf", "--no-plot", "-o", out],
        "ruler run --backend vllm": ["ruler", checkpoint, "--lengths", "1k", "--tasks", "vt", "--samples", "1",
                                     "--backend", "vllm", "--no-plot", "-o", out],
        "convert": ["convert", checkpoint, out, "--from", "official"],
    }


@pytest.mark.parametrize("where", ["folder", "hub", "hub@revision"])
def test_a_root_of_checkpoints_in_subfolders_names_them(where, hub, tmp_path, tiny_checkpoint):
    """Before: "'QwQZh/gated_attention' has no config.json: not a transformers checkpoint directory", whatever
    its subfolders hold. The line names the subfolders that are checkpoints and how to name one, and the name it
    gives works."""
    import shutil

    if where == "folder":
        root = tmp_path / "gated"
        for model in MODELS:
            shutil.copytree(tiny_checkpoint, root / model)
        (root / ".cache" / "x").mkdir(parents=True)  # hidden folders are not looked into
        (root / ".cache" / "x" / "config.json").write_text("{}")
        spec, example = str(root), f"name one by its folder, e.g. {root / MODELS[0]}"
    else:
        suffix = f"@{COMMIT}" if where == "hub@revision" else ""
        spec = GATED + suffix
        example = f"name one as {GATED}/<subfolder>{suffix}, e.g. {GATED}/{MODELS[0]}{suffix}"
    for verb, argv in _verbs_on(spec, tmp_path / "out").items():
        line = one_line_exit_2(run(*argv), f"'{spec}' has no config.json, but its subfolders 1B_baseline, "
                                           f"1B_gate_headwise each hold a checkpoint: {example}")
        assert not (tmp_path / "out").exists(), verb
    named = line.rstrip("\n").rsplit("e.g. ", 1)[1]
    r = run("info", named, "--json")
    assert r.exit_code == 0, r.output
    assert Path(json.loads(r.output)["checkpoint"]).name == MODELS[0]


def test_a_hub_root_without_config_fetches_only_the_configs(hub, monkeypatch):
    """What is asked of the Hub for a repo root without config.json: its config.json files, never the weights of
    every checkpoint in it (the real snapshot_download, offline here, sees the patterns it would download)."""
    import huggingface_hub

    from longctx.checkpoint import hub as hub_module

    asked = []
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **kw: asked.append(kw) or real(*a, **kw))
    hub_module._snapshot.cache_clear()
    one_line_exit_2(run("info", GATED), "its subfolders 1B_baseline, 1B_gate_headwise each hold a checkpoint")
    assert [kw["allow_patterns"] for kw in asked] == [["config.json", "*/config.json"]]
    asked.clear()
    assert run("info", f"{GATED}/{MODELS[1]}").exit_code == 0
    assert [kw["allow_patterns"] for kw in asked] == [[f"{MODELS[1]}/config.json", f"{MODELS[1]}/*/config.json"],
                                                      [f"{MODELS[1]}/*"]]


def registered_verbs() -> set[str]:
    from test_integrity_paths import registered_verbs as verbs

    return verbs()


# Verbs that load a checkpoint's weights (the rows of the table below), and why the others need none.
NEEDS_WEIGHTS = ("sinks", "extend", "ruler run --backend hf", "ruler run --backend vllm", "convert")
NO_WEIGHTS = {
    "info": "describes the checkpoint, and says 'parameters: no weight files'",
    "yarn": "rewrites config.json and links the weight files there are; a verb that loads the output says so",
    "init": "writes new weights; of a checkpoint it reads the tokenizer only",
    "ruler prepare": "reads the tokenizer only",
    "ruler run --backend openai": "the server holds the weights",
    "compare": "reads run directories",
    "export": "reads a run directory",
    "ruler merge": "reads the shards of a run",
    "run": "runs a recipe's stages, which are the verbs above",
}


def test_every_verb_is_in_the_weights_table():
    verbs = {v.split(" --")[0] for v in (*NEEDS_WEIGHTS, *NO_WEIGHTS)}
    assert verbs == registered_verbs()


@pytest.mark.parametrize("verb", NEEDS_WEIGHTS)
@pytest.mark.parametrize("where", ["folder", "hub", "hub with its file list"])
def test_a_checkpoint_without_weights_is_one_line_before_any_work(verb, where, hub, tmp_path, tiny_checkpoint):
    """Before: transformers' "Error no file named model.safetensors, or pytorch_model.bin" from the model load
    (after `ruler` had prepared its tasks and made its run directory), and no way to get the weights. Now one line
    before anything is written: no weight files, and for a Hub snapshot the `hf download` that fetches them."""
    if where == "folder":
        spec = str(_weightless(tiny_checkpoint, tmp_path / "tok"))
        message = f"checkpoint '{spec}' has no weight files (*.safetensors, *.bin): copy the model's weights into it"
    elif where == "hub":
        spec = "org/tok"
        message = ("checkpoint 'org/tok' has no weight files (*.safetensors, *.bin): only some of its files are in "
                   f"the Hugging Face cache ({hub / 'models--org--tok' / 'snapshots' / COMMIT}); fetch the weights: "
                   "hf download org/tok")
    else:
        spec = "org/tok-listed"
        message = ("'org/tok-listed' is only partly in the local Hugging Face cache (files of the repo are missing) "
                   "and HF_HUB_OFFLINE=1; run once online, or: hf download org/tok-listed")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    one_line_exit_2(run(*_verbs_on(spec, tmp_path / "out")[verb]), message)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def _weights_edited(src: Path, dst: Path, edit) -> Path:
    """A copy of checkpoint `src` (with room for RULER's 1k tasks) whose state dict `edit` changed."""
    from safetensors.torch import load_file, save_file

    _weightless(src, dst)
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _one_missing(tensors):
    del tensors["model.layers.0.self_attn.q_proj.weight"]


def _a_gate_left_over(tensors):
    """Gate weights a baseline config has no place for (the gate a gated checkpoint's weights hold)."""
    import torch

    hidden = tensors["model.embed_tokens.weight"].shape[1]
    for layer in range(2):
        tensors[f"model.layers.{layer}.self_attn.g_proj.weight"] = torch.zeros(4, hidden)


def _gated_config_without_gates(dst: Path) -> None:
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "model_type": "gated_qwen3", "architectures":
                                                 ["GatedQwen3ForCausalLM"], "headwise_attn_output_gate": True}))


DISAGREE = {
    "missing": "the weight files lack 1 tensor the model config.json describes needs "
               "(model.layers.0.self_attn.q_proj.weight)",
    "left over": "the weight files hold 2 tensors the model config.json describes has no place for "
                 "(model.layers.0.self_attn.g_proj.weight, model.layers.1.self_attn.g_proj.weight)",
    "gated config, plain weights": "the weight files lack 2 tensors the model config.json describes needs "
                                   "(model.layers.0.self_attn.g_proj.weight, model.layers.1.self_attn.g_proj.weight)",
}


# every verb that computes (one check, `check_weight_shapes`, reached from the loader and from every backend),
# and every case on one of them
@pytest.mark.parametrize("verb,case", [(v, c) for v in ("sinks", "extend", "ruler run --backend hf",
                                                        "ruler run --backend vllm") for c in DISAGREE
                                       if v == "ruler run --backend hf" or c == "missing"])
def test_weights_and_config_that_disagree_are_one_line_before_any_work(verb, case, tmp_path, tiny_checkpoint):
    """Before: a tensor the config needs was initialised at random (a gate, in `sinks` and `ruler`), and one it has
    no place for ignored. Now every verb that computes refuses first, with what differs."""
    ckpt = tmp_path / "ckpt"
    if case == "missing":
        _weights_edited(tiny_checkpoint, ckpt, _one_missing)
    elif case == "left over":
        _weights_edited(tiny_checkpoint, ckpt, _a_gate_left_over)
    else:
        _weights_edited(tiny_checkpoint, ckpt, lambda tensors: None)
        _gated_config_without_gates(ckpt)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    one_line_exit_2(run(*_verbs_on(ckpt, tmp_path / "out")[verb]), f"checkpoint '{ckpt}': {DISAGREE[case]}")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_a_hub_snapshot_without_weights_names_the_revision_and_subfolder(hub, tmp_path, tiny_checkpoint):
    from test_hub import _repo

    _repo(hub, "org/multi", [COMMIT], ("1B_baseline",), checkpoint=_weightless(tiny_checkpoint, tmp_path / "w"))
    one_line_exit_2(run("sinks", f"org/multi/1B_baseline@{COMMIT}", "-o", tmp_path / "out"),
                    f"fetch the weights: hf download org/multi --revision {COMMIT} --include '1B_baseline/*'")
    # the snapshot folder named as a path: the commit it is
    snapshot = hub / "models--org--multi" / "snapshots" / COMMIT / "1B_baseline"
    one_line_exit_2(run("sinks", snapshot, "-o", tmp_path / "out"),
                    f"fetch the weights: hf download org/multi --revision {COMMIT} --include '1B_baseline/*'")
    assert not (tmp_path / "out").exists()
