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


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH starts with the stand-ins, then longctx's own bin folder."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    for name, body in {"sbatch": FAKE_SBATCH}.items():
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
    # submitted again (a shard was preempted, say): every shard resumes with nothing to do, the merge runs again
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    outputs = {p.name: p.read_text() for p in tmp_path.glob("slurm.log-*.out")}
    assert all("0 new predictions" in outputs[f"slurm.log-102_{i}.out"] for i in (1, 2)), outputs
    assert "merged 2 shards" in outputs["slurm.log-103_0.out"], outputs


@pytest.mark.slow
def test_the_ruler_array_job_says_how_it_is_used():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "ruler_slurm.sh")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage: bash scripts/ruler_slurm.sh CKPT RUN_DIR N")
