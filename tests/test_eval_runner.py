"""`longctx ruler CKPT ...`: the runner with real tiny models (hf, vllm, a real `vllm serve`), resume,
run-directory binding, bad inputs, and `longctx compare` over real runs."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require_vllm, user_environment
from http_helpers import FlakyProxy

from longctx.cli.main import cli
from longctx.core.errors import InputError
from longctx.eval.request import Request
from longctx.eval.runner import run_ruler as run_settings
from longctx.eval.settings import RulerRunSettings
from longctx.report.results import load_results
from longctx.report.run import write_report

TASKS = "niah_single_1,vt"


def run_ruler(checkpoint, lengths, out, engine=None, progress=True, on_prediction=None, **settings):
    s = RulerRunSettings(checkpoint=str(checkpoint), lengths=lengths, output=str(out), **settings)
    return run_settings(s, engine=engine, progress=progress, on_prediction=on_prediction)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="session")
def gated_yarn_checkpoint(tmp_path_factory, reference_tokenizer_dir):
    """A tiny gated-attention (headwise) model trained-length 2048, YaRN x2 -> 4096: the plugin + YaRN path."""
    from longctx.init.checkpoint import init_checkpoint
    from longctx.init.settings import InitSettings
    from longctx.yarn.scaling import yarn_checkpoint
    from longctx.yarn.settings import YarnSettings

    root = tmp_path_factory.mktemp("gck")
    init_checkpoint(InitSettings(output=str(root / "gated"), preset="tiny", attention="headwise",
                                 tokenizer=str(reference_tokenizer_dir), config={"max_position_embeddings": 2048}))
    yarn_checkpoint(YarnSettings(checkpoint=str(root / "gated"), factor=2.0, output=str(root / "gated-yarn2x")))
    return root / "gated-yarn2x"


class Stop(Exception):
    pass


@pytest.mark.slow
def test_samples_sharing_upstreams_niah_index_all_get_predictions(ruler_checkpoint, tmp_path):
    """Upstream NIAH writes the answer's character offset as `index`; with seed 2 at 1k, samples 0 and 5
    share 1536. Keyed by that, one prediction would be lost; keyed by sample number, none is."""
    out = tmp_path / "run"
    r = run_ruler(ruler_checkpoint, [1024], out, tasks="niah_single_1", samples=6, seed=2, backend="hf",
                  progress=False)
    upstream_index = [x["index"] for x in lines(out / "tasks" / "1024" / "niah_single_1.jsonl")]
    assert upstream_index[0] == upstream_index[5]  # the collision this test is about
    preds = lines(out / "pred" / "1024" / "niah_single_1.jsonl")
    assert sorted(x["index"] for x in preds) == list(range(6)) and r.new_predictions == 6
    assert [x["outputs"] for x in sorted(preds, key=lambda x: x["index"])] == \
        [x["outputs"] for x in lines(out / "tasks" / "1024" / "niah_single_1.jsonl")]


@pytest.mark.slow
def test_starting_the_backend_while_the_task_files_are_written_changes_no_prediction(ruler_checkpoint, tmp_path):
    """The same run with the model loaded while worker processes write the task files, and with the model loaded
    when the first prediction is asked for: the same task files and predictions, byte for byte."""
    def run_dir(overlap: bool) -> Path:
        out = tmp_path / f"overlap-{overlap}"
        s = RulerRunSettings(checkpoint=str(ruler_checkpoint), lengths=[1024], output=str(out), tasks=TASKS,
                             samples=2, backend="hf", workers=2)
        r = run_settings(s, progress=False, overlap=overlap)
        assert ("backend_start_s" in r.timings) is overlap and r.new_predictions == 4
        return out

    def digests(out: Path, folder: str) -> dict[str, str]:
        return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted((out / folder).rglob("*.jsonl"))}

    a, b = run_dir(True), run_dir(False)
    for folder in ("tasks", "pred"):
        assert digests(a, folder) == digests(b, folder) and len(digests(a, folder)) == 2


@pytest.mark.slow
def test_hf_run_resumes_without_loss_or_duplicates(ruler_checkpoint, tmp_path):
    out = tmp_path / "run"
    seen = []

    def stop_after_two(rec):
        seen.append((rec["max_length"], rec["task"], rec["index"]))
        if len(seen) == 2:
            raise Stop

    with pytest.raises(Stop):
        run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=3, backend="hf", progress=False,
                  on_prediction=stop_after_two)
    first = lines(out / "pred" / "2048" / "niah_single_1.jsonl")
    task_index = {t: list(range(3)) for t in ("niah_single_1", "vt")}  # predictions are keyed by sample number
    assert [r["index"] for r in first] == [0, 1]
    assert set(first[0]) == {"index", "pred", "outputs", "length", "task", "max_length", "prompt_tokens",
                             "prompt_sha256"}
    row = lines(out / "tasks" / "2048" / "niah_single_1.jsonl")[0]
    assert first[0]["prompt_sha256"] == hashlib.sha256((row["input"] + row["answer_prefix"]).encode()).hexdigest()
    # a kill in the middle of a write leaves a torn line: it is cut, its sample predicted again
    with open(out / "pred" / "2048" / "niah_single_1.jsonl", "a") as f:
        f.write(f'{{"index": {task_index["niah_single_1"][2]}, "pred": "torn')
    r = run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=3, backend="hf", progress=False)
    assert (r.reused_predictions, r.new_predictions) == (2, 4)
    for task in ("niah_single_1", "vt"):
        recs = lines(out / "pred" / "2048" / f"{task}.jsonl")
        assert sorted(x["index"] for x in recs) == sorted(task_index[task])
    assert [x["pred"] for x in lines(out / "pred" / "2048" / "niah_single_1.jsonl")][:2] == [x["pred"] for x in first]
    scores = json.loads((out / "scores.json").read_text())
    assert {(s["task"], s["samples"]) for s in scores["scores"]} == {("niah_single_1", 3), ("vt", 3)}
    # a third run has nothing left to predict
    scores = json.loads((out / "scores.json").read_text())
    # auto is the checkpoint's dtype, resolved before the model loads, and that is what ran; per-length throughput
    assert scores["backend"]["dtype"] == "float32" and scores["backend"]["ran"]["dtype"] == "float32"
    assert scores["backend"]["ran"]["device"]["type"] == "cpu"
    stats = scores["timings"]["per_length"]["2048"]
    assert stats["predictions"] == 4 and stats["prompt_tokens"] > 4 * 1500 and stats["prompt_tokens_per_s"] > 0
    again = run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=3, backend="hf", progress=False)
    assert (again.reused_predictions, again.new_predictions) == (6, 0)
    # nothing ran this time: what ran before is kept
    assert json.loads((out / "scores.json").read_text())["backend"]["ran"] == scores["backend"]["ran"]
    # bound to the checkpoint, task settings and backend
    with pytest.raises(InputError, match="other settings: --seed 42 -> 1; use the same settings"):
        run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=3, seed=1, backend="hf", progress=False)
    with pytest.raises(InputError, match="other settings: --samples 3 -> 2;"):
        run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=2, backend="hf", progress=False)
    # vLLM's auto is the checkpoint's float32 too (its own auto would be bfloat16 here): only the backend differs
    with pytest.raises(InputError, match='--backend "hf" -> "vllm"; --device "cpu" -> null; --tensor-parallel-'):
        run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=3, backend="vllm", progress=False)
    # every option that can change a prediction, named with both values; the dtype as it resolves ("auto" is
    # this fp32 checkpoint's float32, so naming it continues the run)
    with pytest.raises(InputError, match='other settings: --dtype "float32" -> "bfloat16"; use the same settings'):
        run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=3, backend="hf", dtype="bfloat16",
                  progress=False)
    with pytest.raises(InputError, match='other settings: --seed 42 -> 1; --dtype "float32" -> "float16"; use'):
        run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=3, seed=1, backend="hf", dtype="float16",
                  progress=False)
    same = run_ruler(ruler_checkpoint, [2048], out, tasks=TASKS, samples=3, backend="hf", dtype="float32",
                     progress=False)
    assert (same.reused_predictions, same.new_predictions) == (6, 0)
    # a new length in the same directory is fine (same task settings): it is added
    rep = write_report(out)
    assert load_results(out)["lengths"] == [2048] and rep.results["samples"]["vt"][2048] == 3


@pytest.mark.slow
def test_scores_and_results_cover_every_length_and_task_the_run_directory_holds(ruler_checkpoint, tmp_path):
    out = tmp_path / "run"
    notes: list[str] = []

    def call(lengths, tasks):
        s = RulerRunSettings(checkpoint=str(ruler_checkpoint), lengths=lengths, output=str(out), tasks=tasks,
                             samples=2, backend="hf")
        r = run_settings(s, progress=False, log=notes.append)
        return r, json.loads((out / "scores.json").read_text()), write_report(out).results

    first, scores, _ = call([1024], "niah_single_1")
    assert "backend_start_s" in scores["timings"]  # the model loaded while the task files were written
    again, scores, _ = call([1024], "niah_single_1")  # nothing left to predict: no model is loaded
    assert (again.new_predictions, again.reused_predictions) == (0, 2) and "backend_start_s" not in scores["timings"]
    r, scores, results = call([2048], "niah_single_1")  # a later call with other lengths keeps the earlier ones
    assert (r.new_predictions, r.reused_predictions) == (2, 0)
    assert scores["lengths"] == results["lengths"] == [1024, 2048]
    assert {(x["task"], x["length"]) for x in scores["scores"]} == {("niah_single_1", 1024), ("niah_single_1", 2048)}
    assert set(scores["timings"]["per_length"]) == {"2048"}  # what this call predicted
    r, scores, results = call([2048], "vt")  # and other tasks
    assert scores["tasks"] == ["vt", "niah_single_1"] and scores["lengths"] == [1024, 2048]  # this call's first
    assert {(x["task"], x["length"]) for x in scores["scores"]} == {("niah_single_1", 1024), ("niah_single_1", 2048),
                                                                    ("vt", 2048)}
    assert results["samples"]["vt"][2048] == 2
    # an earlier call's part-predicted (length, task) is named and left out, never scored on what it has
    pred = out / "pred" / "1024" / "niah_single_1.jsonl"
    pred.write_text(pred.read_text().splitlines(keepends=True)[0])
    notes.clear()
    _, scores, _ = call([2048], "vt")
    assert scores["lengths"] == [2048] and ("niah_single_1", 1024) not in {(x["task"], x["length"])
                                                                            for x in scores["scores"]}
    assert any(n.startswith("note: not scored, predicted in part by an earlier call: niah_single_1 at 1024 (1 of 2)")
               for n in notes), notes


def wait_for_a_prediction(proc: subprocess.Popen, pred: Path) -> None:
    deadline = time.time() + 300
    while not (pred.is_file() and pred.read_text().count("\n") >= 1) and time.time() < deadline:
        assert proc.poll() is None, "the run ended before it made a prediction"
        time.sleep(0.2)


@pytest.mark.slow
def test_one_writer_per_run_directory_and_a_killed_one_never_blocks(ruler_checkpoint, tmp_path):
    """A second `longctx ruler` into a run directory another one is writing is refused, naming the holder's
    pid; once that process is killed (kill -9: no cleanup), the same command continues its predictions."""
    import signal

    out = tmp_path / "run"
    argv = [sys.executable, "-m", "longctx", "ruler", str(ruler_checkpoint), "--lengths", "2k", "--tasks", "vt",
            "--samples", "40", "--backend", "hf", "-o", str(out), "--no-plot"]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=user_environment())
    try:
        pred = out / "pred" / "2048" / "vt.jsonl"
        wait_for_a_prediction(first, pred)
        with pytest.raises(InputError, match=rf"run directory '{out}' is being written by process {first.pid} on "):
            run_ruler(ruler_checkpoint, [2048], out, tasks="vt", samples=40, backend="hf", progress=False)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    made = pred.read_text().count("\n")
    assert 1 <= made < 40
    r = run_ruler(ruler_checkpoint, [2048], out, tasks="vt", samples=40, backend="hf", progress=False)
    assert (r.reused_predictions, r.new_predictions) == (made, 40 - made)
    # the lock lives beside the run directory while it is held, and is gone once the run ends
    assert len(lines(pred)) == 40 and not (tmp_path / ".run.longctx-lock").exists()

    # refused while the holder goes on: the holder finishes intact, each sample predicted once
    other = tmp_path / "other"
    holder = subprocess.Popen([*argv[:argv.index("--samples")], "--samples", "8", "--backend", "hf", "-o",
                               str(other), "--no-plot"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=user_environment())
    pred = other / "pred" / "2048" / "vt.jsonl"
    wait_for_a_prediction(holder, pred)
    with pytest.raises(InputError, match=rf"run directory '{other}' is being written by process {holder.pid} on "):
        run_ruler(ruler_checkpoint, [2048], other, tasks="vt", samples=8, backend="hf", progress=False)
    assert holder.wait(timeout=300) == 0, holder.stderr.read().decode()[-2000:]
    assert sorted(x["index"] for x in lines(pred)) == list(range(8))
    assert json.loads((other / "scores.json").read_text())["scores"][0]["samples"] == 8


@pytest.mark.slow
def test_cli_run_default_command_and_bad_inputs(ruler_checkpoint, tmp_path, reference_tokenizer_dir):
    from longctx.init.presets import write_tiny_qwen3

    out = tmp_path / "run"
    base = ["ruler", ruler_checkpoint, "--lengths", "1k", "--tasks", "vt", "--samples", "2", "--backend", "hf",
            "-o", out]
    r = run(*base)
    assert r.exit_code == 0, r.output
    assert "lengths: 1024" in r.output and "| Models | Claimed Length | Effective Length | 1K |" in r.output
    assert "results.json, results.md, results.csv, results.png" in r.output
    assert json.loads((out / "results.json").read_text())["model"]["context_length"] == 4096
    other = write_tiny_qwen3(tmp_path / "other", reference_tokenizer_dir, seed=1, max_position_embeddings=4096)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    cases = [
        (["ruler", other, *base[2:]], "was made for another checkpoint"),
        (["ruler", ruler_checkpoint, "--lengths", "8k", "-o", tmp_path / "x"], "longctx yarn"),
        ([*base[:-4], "--backend", "tgi", "-o", tmp_path / "y"], "unknown backend 'tgi'"),
        ([*base[:-4], "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "-o", tmp_path / "z"],
         "unreachable after 3 attempts"),
        (["ruler", ruler_checkpoint, "--lengths", "1k", "--tasks", "vt", "-o", ruler_checkpoint / "run"],
         "lies inside the checkpoint"),
        (["ruler", ruler_checkpoint, "--lengths", "1k", "--tasks", "vt", "-o", reference_tokenizer_dir],
         "not a longctx ruler run directory"),
        (["compare", out, tmp_path], "has no results.json"),
    ]
    for args, message in cases:
        t0 = time.perf_counter()
        r = run(*args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.stderr and r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
        assert time.perf_counter() - t0 < 15
    assert not (tmp_path / "z").exists() and not (tmp_path / "y").exists()
    r = run("ruler", "--help")
    assert r.exit_code == 0 and "prepare" in r.output and "run" in r.output and "longctx ruler CKPT" in r.output


@pytest.mark.slow
def test_cli_engine_options_reach_vllm(ruler_checkpoint, tmp_path, monkeypatch):
    """`--tensor-parallel-size/--data-parallel-size/--dtype/--kv-cache-memory/--gpu-memory-utilization/
    --enforce-eager` arrive in `vllm.LLM(...)` under vLLM's own names, each replica's for `--data-parallel-size`
    (the engine is stopped at construction: a multi-GPU engine cannot start here)."""
    vllm = require_vllm()
    seen = {}

    def llm(**kwargs):
        seen.update(kwargs)
        raise InputError("engine construction reached")

    def replicas(self):  # each replica's process would call vllm.LLM(**self.engine)
        seen.update(self.engine, replicas=self.count)
        raise InputError("engine construction reached")

    from longctx.eval.vllm_replicas import Replicas

    monkeypatch.setattr(vllm, "LLM", llm)
    monkeypatch.setattr(Replicas, "start", replicas)
    base = ["ruler", ruler_checkpoint, "--lengths", "1k", "--tasks", "vt", "--samples", "1"]
    r = run(*base, "-o", tmp_path / "a", "--tensor-parallel-size", "2", "--data-parallel-size", "4", "--dtype",
            "bfloat16", "--kv-cache-memory", "8e9", "--enforce-eager")
    assert r.exit_code == 2 and "engine construction reached" in r.stderr, r.output
    assert seen == {"model": str(ruler_checkpoint), "max_model_len": 1024, "tensor_parallel_size": 2,
                    "replicas": 4, "dtype": "bfloat16", "kv_cache_memory_bytes": 8_000_000_000,
                    "enforce_eager": True, "seed": 0}
    seen.clear()
    r = run(*base, "-o", tmp_path / "b", "--gpu-memory-utilization", "0.5")
    assert seen["gpu_memory_utilization"] == 0.5 and "data_parallel_size" not in seen
    assert seen["tensor_parallel_size"] == 1
    # any other engine argument, by vLLM's name, typed as `vllm serve` types it
    seen.clear()
    r = run(*base, "-o", tmp_path / "c", "--engine-arg", "max_num_seqs=4", "--engine-arg", "kv_cache_dtype=auto",
            "--engine-arg", "enable_prefix_caching=false", "--engine-arg", 'hf_overrides={"rope_theta": 10000}',
            "--engine-arg", "max_num_batched_tokens=2k")
    assert r.exit_code == 2 and "engine construction reached" in r.stderr, r.output
    assert {k: seen[k] for k in ("max_num_seqs", "kv_cache_dtype", "enable_prefix_caching", "hf_overrides",
                                 "max_num_batched_tokens")} == {
        "max_num_seqs": 4, "kv_cache_dtype": "auto", "enable_prefix_caching": False,
        "hf_overrides": {"rope_theta": 10000}, "max_num_batched_tokens": 2000}
    for args, message in [
            (["--engine-arg", "max_num_seq=4"], "--engine-arg max_num_seq: vLLM's EngineArgs has no such field; did "
                                                "you mean 'max_num_seqs'?"),
            (["--engine-arg", "max_num_seqs=many"], "--engine-arg max_num_seqs: vLLM's --max-num-seqs refuses 'many'"),
            (["--engine-arg", "kv_cache_dtype=fp9"], "did you mean 'fp8'?"),
            (["--engine-arg", "dtype=float32"], "--engine-arg dtype: longctx sets this one (--dtype)"),
            (["--engine-arg", "max_num_seqs"], "'max_num_seqs' is not KEY=VALUE"),
            (["--engine-arg", "max_num_seqs=4", "--backend", "hf"], "--engine-arg is an option of vllm")]:
        seen.clear()
        r = run(*base, "-o", tmp_path / "d", *args)
        assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, (args, r.output)
        assert not seen and not (tmp_path / "d").exists()


@pytest.mark.slow
def test_vllm_gated_yarn_matches_bare_generate_and_hf_token_counts(gated_yarn_checkpoint, tmp_path, vllm_engines):
    """The vllm backend on a gated (plugin) YaRN checkpoint: same texts as a bare `LLM.generate` of the same
    prompts, and the same prompt token counts as the hf backend; max_model_len is derived and checked."""
    vllm = require_vllm()
    llm = vllm_engines.get(gated_yarn_checkpoint, max_model_len=4096)
    out = tmp_path / "vllm"
    r = run_ruler(gated_yarn_checkpoint, [2048, 4096], out, tasks=TASKS, samples=2, backend="vllm", engine=llm,
                  progress=False)
    assert r.max_model_len == 4096 and r.new_predictions == 8
    prompts, params, preds = [], [], []
    for L in (2048, 4096):
        for task, budget in (("niah_single_1", 128), ("vt", 30)):
            rows = lines(out / "tasks" / str(L) / f"{task}.jsonl")
            got = {x["index"]: x for x in lines(out / "pred" / str(L) / f"{task}.jsonl")}
            for sample, row in enumerate(rows):
                prompts.append(row["input"] + row["answer_prefix"])
                params.append(vllm.SamplingParams(temperature=0.0, top_p=1.0, max_tokens=budget))
                preds.append(got[sample])
    bare = llm.generate(prompts, params, use_tqdm=False)
    assert [b.outputs[0].text for b in bare] == [p["pred"] for p in preds]
    assert [len(b.prompt_token_ids) for b in bare] == [p["prompt_tokens"] for p in preds]
    assert all(p["prompt_tokens"] + sp.max_tokens <= 4096 for p, sp in zip(preds, params))
    assert max(p["prompt_tokens"] for p in preds) > 3800  # the 4k samples really are long
    rep = write_report(out)
    assert rep.results["model"]["yarn_factor"] == 2.0 and rep.results["model"]["parent_fingerprint"]
    assert rep.results["backend"]["ran"]["dtype"] == "float32"  # the engine's, as it ran
    assert set(rep.results["timings"]["per_length"]) == {"2048", "4096"}
    # the hf backend counts the same prompt tokens (BOS included) on the same task files
    hf_out = tmp_path / "hf"
    run_ruler(gated_yarn_checkpoint, [2048], hf_out, tasks="vt", samples=2, backend="hf", progress=False)
    assert [x["prompt_tokens"] for x in lines(hf_out / "pred" / "2048" / "vt.jsonl")] == \
        [x["prompt_tokens"] for x in lines(out / "pred" / "2048" / "vt.jsonl")]


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def readme_cpu_serve_command() -> tuple[dict[str, str], list[str]]:
    """The README's CPU `vllm serve` line: its environment variables and its argv."""
    import re
    import shlex

    text = (Path(__file__).parents[1] / "docs" / "ruler.md").read_text(encoding="utf-8")
    found = re.search(r"`(VLLM_CPU_KVCACHE_SPACE=[^`]*api_server[^`]*)`", text)
    assert found, "the README has no CPU serving line"
    words = shlex.split(found.group(1))
    env = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
    return env, [w for w in words if not re.match(r"^[A-Z_]+=", w)]


@pytest.mark.slow
def test_openai_backend_against_a_real_vllm_serve(gated_yarn_checkpoint, tmp_path):
    """The README's CPU serving line, as written (checkpoint and port replaced), serves a run."""
    require_vllm()
    port = _free_port()
    readme_env, argv = readme_cpu_serve_command()
    assert argv[:3] == [".venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"] and "--host" in argv
    argv = [sys.executable, *argv[1:]]
    argv[argv.index("--model") + 1] = str(gated_yarn_checkpoint)
    argv[argv.index("--port") + 1] = str(port)
    env = {**user_environment(), **readme_env, "OPENAI_API_KEY": "sk-test-not-stored"}
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([*argv, "--enforce-eager", "--seed", "0"], stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("vllm serve did not come up:\n" + (tmp_path / "serve.log").read_text()[-3000:])
                time.sleep(1)
        out = tmp_path / "run"
        r = run("ruler", gated_yarn_checkpoint, "--lengths", "2k", "--tasks", TASKS, "--samples", "3", "--backend",
                "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--concurrency", "4", "-o", out)
        assert r.exit_code == 0, r.output
        res = load_results(out)
        assert res["backend"]["model"] == str(gated_yarn_checkpoint) and res["samples"]["vt"][2048] == 3
        assert res["backend"]["ran"]["server"] == {"id": str(gated_yarn_checkpoint),
                                                   "root": str(gated_yarn_checkpoint), "max_model_len": 4096}
        assert "sk-test" not in "".join(p.read_text() for p in out.rglob("*.json*"))
        recs = lines(out / "pred" / "2048" / "niah_single_1.jsonl")
        assert len({x["index"] for x in recs}) == 3 and all(x["prompt_tokens"] for x in recs)
        # the same task files through hf: identical prompt token counts (raw prompt, BOS added by the server)
        hf = tmp_path / "hf"
        run_ruler(gated_yarn_checkpoint, [2048], hf, tasks="niah_single_1", samples=3, backend="hf", progress=False)
        assert sorted((x["index"], x["prompt_tokens"]) for x in lines(hf / "pred" / "2048" / "niah_single_1.jsonl")) \
            == sorted((x["index"], x["prompt_tokens"]) for x in recs)
        # two endpoints: the server, and a proxy in front of it that fails every other completion with 503: the
        # same predictions, byte for byte, each endpoint checked first, the load spread
        proxy = FlakyProxy(f"http://127.0.0.1:{port}")
        try:
            two = tmp_path / "two"
            r = run("ruler", gated_yarn_checkpoint, "--lengths", "2k", "--tasks", TASKS, "--samples", "3",
                    "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1", "--base-url", proxy.url,
                    "--concurrency", "2", "-o", two)
        finally:
            proxy.stop()
        assert r.exit_code == 0, r.output
        assert proxy.failed and proxy.forwarded
        for task in TASKS.split(","):
            assert (two / "pred" / "2048" / f"{task}.jsonl").read_bytes() == \
                (out / "pred" / "2048" / f"{task}.jsonl").read_bytes()
        answered = load_results(two)["backend"]["ran"]["answered"]
        assert sum(answered.values()) == 6 and answered[proxy.url] == proxy.forwarded
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_vllm_backend_shuts_down_only_the_engine_it_started():
    """An engine `longctx ruler` started is shut down when the run ends (its worker processes would otherwise
    hold their memory while `longctx run` trains the next model); an engine the caller gave is left running.
    Stand-in engines: what is checked is who owns the engine, not vLLM's shutdown itself."""
    from types import SimpleNamespace

    from longctx.eval.backends.vllm import VllmBackend

    shut = []

    def engine():
        return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: shut.append(1))))

    given = VllmBackend("ckpt", 256, llm=engine())
    given.close()
    assert shut == [] and given.llm is not None
    started = VllmBackend("ckpt", 256)
    started.llm = engine()  # what _engine() does on first use
    started.close()
    started.close()
    assert shut == [1] and started.llm is None


@pytest.mark.slow
def test_engine_args_reach_a_real_engine_and_bind_the_run(ruler_checkpoint, tmp_path, vllm_engines):
    """`--engine-arg`s arrive in the engine vLLM builds, and a run directory is bound to those that change what
    the model computes (kv_cache_dtype), not to those that only schedule the work (max_num_seqs)."""
    from longctx.eval.backends.vllm import VllmBackend
    from longctx.eval.engine_args import typed_engine_args

    vllm_engines.close()  # one engine at a time on 2 cores
    args = typed_engine_args({"max_num_seqs": "2", "enable_prefix_caching": "false", "max_num_batched_tokens": "2k"})
    bk = VllmBackend(str(ruler_checkpoint), 1024, dtype="float32", enforce_eager=True, engine_args=args,
                     log_dir=tmp_path)
    got = []
    try:
        bk.generate([Request(i, "The grass is", 4) for i in range(3)], lambda r, text, n: got.append(r.key))
        config = bk.llm.llm_engine.vllm_config
        assert config.scheduler_config.max_num_seqs == 2 and config.cache_config.enable_prefix_caching is False
        assert config.scheduler_config.max_num_batched_tokens == 2000
    finally:
        bk.close()
    assert sorted(got) == [0, 1, 2]

    llm = vllm_engines.get(ruler_checkpoint, max_model_len=1024)
    out = tmp_path / "run"
    first = run_ruler(ruler_checkpoint, [1024], out, engine=llm, tasks="vt", samples=2, progress=False,
                      engine_args=["kv_cache_dtype=auto", "max_num_seqs=8"])
    assert first.new_predictions == 2
    assert json.loads((out / "scores.json").read_text())["backend"]["engine_args"] == {"kv_cache_dtype": "auto",
                                                                                      "max_num_seqs": 8}
    again = run_ruler(ruler_checkpoint, [1024], out, engine=llm, tasks="vt", samples=2, progress=False,
                      engine_args=["kv_cache_dtype=auto", "max_num_seqs=4"])
    assert (again.reused_predictions, again.new_predictions) == (2, 0)
    assert json.loads((out / "scores.json").read_text())["backend"]["engine_args"]["max_num_seqs"] == 4
    with pytest.raises(InputError, match='other settings: --engine-arg kv_cache_dtype "auto" -> "fp8"; use'):
        run_ruler(ruler_checkpoint, [1024], out, engine=llm, tasks="vt", samples=2, progress=False,
                  engine_args=["kv_cache_dtype=fp8"])
