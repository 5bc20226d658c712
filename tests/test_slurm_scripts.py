"""The Slurm scripts in scripts/, run as a cluster would run them, with stand-ins for Slurm's commands on PATH
(`sbatch` runs each array task and then the dependent job here, `srun` starts the command once per node with the
node's variables, `scontrol` names this machine): their command lines are the CLI's, so they cannot drift from it."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import user_environment

from longctx.eval.runner import run_ruler
from longctx.eval.settings import RulerRunSettings

ROOT = Path(__file__).resolve().parents[1]

# sbatch: records its arguments; `--array=1-N --wrap=CMD` runs CMD N times, SLURM_ARRAY_TASK_ID=1..N (two at a
# time, as two GPUs would); a job with --dependency=afterok:ID runs when ID succeeded. Prints the job's id; what a
# job prints goes to slurm-JOB_TASK.out beside the log, as Slurm writes it to a file.
FAKE_SBATCH = r'''
import json, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
args = sys.argv[1:]
with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
state = os.environ["FAKE_SLURM_LOG"] + ".jobs"
jobs = json.load(open(state)) if os.path.exists(state) else {}
after = opts.get("dependency", "").removeprefix("afterok:")
if after and jobs.get(after) != 0:
    sys.exit(f"sbatch: job {after} did not succeed")
job = str(100 + len(jobs))
def one(index):
    env = {**os.environ, **({"SLURM_ARRAY_TASK_ID": str(index)} if index else {})}
    with open(f"{os.environ['FAKE_SLURM_LOG']}-{job}_{index or 0}.out", "w") as out:
        return subprocess.run(["bash", "-c", opts["wrap"]], env=env, stdout=out, stderr=subprocess.STDOUT).returncode
if "array" in opts:
    first, last = map(int, opts["array"].split("-"))
    with ThreadPoolExecutor(2) as pool:
        codes = list(pool.map(one, range(first, last + 1)))
else:
    codes = [one(None)]
jobs[job] = max(codes)
json.dump(jobs, open(state, "w"))
print(job)
'''


# srun: the command once per node (SLURM_NNODES of them, at once), each with SLURM_NODEID and SLURM_PROCID and in a
# session of its own (its pid in FAKE_SLURM_LOG.nodes, one per line, so a test can kill a "node"); with
# --kill-on-bad-exit=1, a node that fails ends the others (SIGTERM, SIGKILL 10 s later), as Slurm does. Exits with
# the worst exit code.
FAKE_SRUN = r'''
import os, signal, subprocess, sys, time
args = sys.argv[1:]
kill_on_bad_exit = "--kill-on-bad-exit=1" in args
args = [a for a in args if not a.startswith("--kill-on-bad-exit")]
nodes = int(os.environ["SLURM_NNODES"])
procs = [subprocess.Popen(args, env={**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i)},
                          start_new_session=True) for i in range(nodes)]
with open(os.environ["FAKE_SLURM_LOG"] + ".nodes", "w") as f:
    f.write("".join(f"{p.pid}\n" for p in procs))
while any(p.poll() is None for p in procs):
    if kill_on_bad_exit and any(p.poll() not in (None, 0) for p in procs):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, sig)
            end = time.monotonic() + 10
            while any(p.poll() is None for p in procs) and time.monotonic() < end:
                time.sleep(0.1)
    time.sleep(0.1)
sys.exit(max(abs(p.returncode) for p in procs))
'''
# scontrol: `scontrol show hostnames LIST` names this machine (every "node" is 127.0.0.1).
FAKE_SCONTROL = r'''
import sys
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
print("127.0.0.1")
'''


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH starts with the stand-ins, then longctx's own bin folder."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    for name, body in {"sbatch": FAKE_SBATCH, "srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL}.items():
        tool = bin_dir / name
        tool.write_text(f"#!{sys.executable}\n{body}")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**user_environment(), "PATH": path, "FAKE_SLURM_LOG": str(tmp_path / "slurm.log")}


def submitted(env: dict[str, str]) -> list[list[str]]:
    return [json.loads(line) for line in Path(env["FAKE_SLURM_LOG"]).read_text().splitlines()]


@pytest.mark.slow
def test_the_ruler_array_job_predicts_shards_and_merges_them_into_the_run(ruler_checkpoint, tmp_path):
    env = fake_slurm(tmp_path)
    run = tmp_path / "shared" / "run"
    options = ["--lengths", "1k", "--tasks", "vt,niah_single_1", "--samples", "3", "--backend", "hf"]
    argv = ["bash", str(ROOT / "scripts" / "ruler_slurm.sh"), str(ruler_checkpoint), str(run), "2", *options]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = submitted(env)
    assert [j for j in jobs[0] if j.startswith("--array")] == ["--array=1-2"]
    assert "--dependency=afterok:100" in jobs[1]
    assert sorted(p.name for p in (run / "shards").iterdir() if p.is_dir()) == ["1-of-2", "2-of-2"]
    # the same run in one go: the same predictions, byte for byte, and scores
    whole = tmp_path / "whole"
    run_ruler(RulerRunSettings(checkpoint=str(ruler_checkpoint), lengths=[1024], tasks="vt,niah_single_1", samples=3,
                               backend="hf", output=str(whole)), progress=False)
    for task in ("vt", "niah_single_1"):
        for sub in ("tasks", "pred"):
            got, want = (hashlib.sha256((d / sub / "1024" / f"{task}.jsonl").read_bytes()).hexdigest()
                         for d in (run, whole))
            assert got == want, (sub, task)
    assert json.loads((run / "scores.json").read_text())["scores"] == \
        json.loads((whole / "scores.json").read_text())["scores"]
    assert (run / "results.md").is_file()
    outputs = {p.name: p.read_text() for p in tmp_path.glob("slurm.log-*.out")}
    assert "merged 2 shards" in outputs["slurm.log-101_0.out"], outputs


@pytest.mark.slow
def test_the_ruler_array_job_says_how_it_is_used():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "ruler_slurm.sh")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage: bash scripts/ruler_slurm.sh CKPT RUN_DIR N")


EXTEND = ["--rope-base", "1e5", "--seq-len", "512", "--tokens", "8192", "--tokens-per-step", "2048", "--lr", "1e-3",
          "--save-every", "2"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_extend_on_two_nodes_through_the_slurm_job_matches_one_process_and_resumes_a_lost_node(tiny_checkpoint,
                                                                                                tmp_path):
    """scripts/extend_slurm.sbatch with two "nodes" on this machine (one torchrun each, a c10d rendezvous on
    127.0.0.1): the losses and weights of one process; one node killed after the step-2 save, the job submitted
    again resumes there and ends with the same weights."""
    import signal
    import time

    import torch
    from safetensors.torch import load_file

    from longctx.extend.loop import extend
    from longctx.extend.settings import ExtendSettings

    cache = tmp_path / "cache"
    single = tmp_path / "single"
    extend(ExtendSettings(checkpoint=str(tiny_checkpoint), output=str(single), seq_len=512, data=["synthetic:mixed"],
                          rope_base=1e5, tokens=8192, tokens_per_step=2048, lr=1e-3, save_every=2,
                          cache_dir=str(cache)), progress=False)

    env = {**fake_slurm(tmp_path), "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "4242",
           "GPUS_PER_NODE": "1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "LONGCTX_CACHE_DIR": str(cache)}
    out = tmp_path / "shared" / "extended"
    argv = ["bash", str(ROOT / "scripts" / "extend_slurm.sbatch"), str(tiny_checkpoint), str(out), "synthetic:mixed",
            *EXTEND]
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    saved = tmp_path / "shared" / "extended.train" / "step-000002"
    deadline = time.monotonic() + 300
    while not saved.is_dir() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    nodes = [int(p) for p in Path(env["FAKE_SLURM_LOG"] + ".nodes").read_text().split()]
    os.killpg(nodes[1], signal.SIGKILL)  # the second node is lost after the step-2 save
    output = job.communicate(timeout=300)[0]
    assert job.returncode != 0 and not (out / "model.safetensors").exists(), output[-3000:]

    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resum" in again.stdout + again.stderr, again.stdout[-2000:]
    assert "world size 2 (FSDP2)" in again.stdout, again.stdout[-2000:]
    logs = [{e["step"]: e for e in map(json.loads, (d / "train_log.jsonl").read_text().splitlines())}
            for d in (single, out)]
    assert sorted(logs[1]) == [1, 2, 3, 4]
    for step, entry in logs[0].items():
        assert logs[1][step]["loss"] == pytest.approx(entry["loss"], rel=1e-4), step
    wa, wb = load_file(single / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(wa) == set(wb)
    for name in wa:  # 4 Adam steps move a weight by ~3e-3; the sums' order between ranks, by ~1e-5
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=5e-5, msg=name)
