"""scripts/gpu_check.py in its CPU smoke mode (docs/gpu.md): every part runs its real code path and passes, a part
that fails or runs out of time is reported while the rest still run, and bad input is one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.models.gates import NAMED

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
PARTS = ["correctness", "extend-sdpa", "gate-cost", "sinks", "ruler-hf", "gpu-tests"]  # on a machine without CUDA

pytestmark = pytest.mark.slow


def _check(tmp_path, *args):
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(report), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    return r, json.loads(report.read_text()) if report.exists() else None


def test_every_part_passes_in_smoke_mode(tmp_path):
    r, report = _check(tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert [p["name"] for p in report["parts"]] == PARTS
    assert [p["status"] for p in report["parts"]] == ["ok"] * len(PARTS), report["parts"]
    assert report["mode"] == "smoke" and report["format"] == "longctx-gpu-check/1" and report["attention"] == ["sdpa"]
    got = {p["name"]: p["metrics"] for p in report["parts"]}
    assert got["correctness"]["variants"] == len(NAMED)
    assert {"tiny-baseline", "tiny-gated"} <= got["correctness"].keys()
    assert got["extend-sdpa"]["tokens_per_s"] > 0 and got["extend-sdpa"]["padding"] == "0.0%"
    assert got["gate-cost"]["elementwise_ratio"] > 0 and got["gate-cost"]["headwise_ratio"] > 0
    assert got["sinks"]["window"] == 2048 and got["sinks"]["tokens_per_s"] > 0
    assert got["ruler-hf"]["predictions_equal"] is True and got["ruler-hf"]["samples"] == 2
    # on CPU the gpu-marked tests run and skip
    assert got["gpu-tests"]["tests"] == got["gpu-tests"]["skipped"] > 0 and got["gpu-tests"]["failures"] == 0
    table = [line for line in r.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| part | status | seconds | budget | result |" and len(table) == 2 + len(PARTS)
    work = Path(r.stdout.split("work folder ", 1)[1].split()[0])
    assert not work.exists()  # the temporary work folder is removed


def test_a_failed_and_a_timed_out_part_are_reported_and_the_rest_run(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data-cache").write_text("")  # extend's token cache: a file is refused; sinks does not read it, so it
    # makes its checkpoint, its YaRN copy and its window, far past its budget
    r, report = _check(tmp_path, "--work-dir", str(work), "--parts", "extend-sdpa,gate-cost,sinks,ruler-hf",
                       "--budget", "sinks=0.05")
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-4000:]
    parts = {p["name"]: p for p in report["parts"]}
    assert [p["name"] for p in report["parts"]] == ["extend-sdpa", "gate-cost", "sinks", "ruler-hf"]
    assert parts["extend-sdpa"]["status"] == "failed"
    assert "data-cache" in parts["extend-sdpa"]["problems"][0]
    assert parts["sinks"]["status"] == "timeout" and parts["sinks"]["budget_s"] == 0.05
    assert parts["gate-cost"]["status"] == parts["ruler-hf"]["status"] == "ok"
    assert "| extend-sdpa | failed |" in r.stdout and "| sinks | timeout |" in r.stdout
    assert "1 failed" in r.stdout and "1 timeout" in r.stdout
    assert (work / "tiny-baseline").is_dir()  # a work folder the user gave is kept


@pytest.mark.parametrize("args, message", [
    ([], "the full check needs a CUDA device (torch sees none here); run with --smoke for the CPU smoke mode"),
    (["--smoke", "--parts", "extend-flash"], "--parts: no part extend-flash; the parts are correctness, "
                                             "extend-sdpa, extend-flex_attention, extend-flash_attention_2, gate-cost"),
    (["--smoke", "--budget", "sinks"], "--budget sinks: give PART=SECONDS, e.g. gpu-tests=300"),
    (["--smoke", "--budget", "colour=3"], "--budget: no part colour; the parts are correctness, "),
    (["--smoke", "--budget-scale", "0"], "--budget-scale 0 must be above 0"),
    (["--smoke", "--budget-scale", "fast"], "argument --budget-scale: invalid float value: 'fast' (--help lists "),
    (["--smoke", "--json", "/nonexistent-folder/r.json"], "--json /nonexistent-folder/r.json: its folder does not exist"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    r = subprocess.run([sys.executable, str(SCRIPT), "--json", str(tmp_path / "r.json"), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"gpu_check: {message}") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "r.json").exists()
