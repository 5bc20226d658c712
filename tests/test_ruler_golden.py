"""Byte-exact reproduction of upstream RULER output.

Golden sha256 sums are those of the files NVIDIA/RULER @ c3f5e3b
(scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,freq_words_extraction,qa}.py)
wrote for seed 42, 10 samples, `base` template, max_seq_length 4096 and 8192
(tests/data/ruler/commands.json; tests/data/ruler/README.md says how they were made).
"""

from __future__ import annotations

import hashlib
import json

import pytest
from ruler_helpers import FIXTURE_DATA, golden_commands

from ruler_tasks.prepare import prepare
from ruler_tasks.registry import TASK_NAMES


@pytest.fixture(scope="module")
def golden_run(reference_tokenizer_dir, tmp_path_factory, monkeypatch_module):
    # every token count in this run is also checked against a full tokenization
    monkeypatch_module.setenv("RULER_TASKS_VERIFY_COUNTS", "1")
    out = tmp_path_factory.mktemp("ruler_golden")
    res = prepare(reference_tokenizer_dir, [4096, 8192], tasks=None, samples=10, seed=42, template="base",
                  data_dir=FIXTURE_DATA, out_dir=out, progress=False)
    return out, res


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_commands_cover_all_tasks():
    cmds = golden_commands()
    assert sorted({c["task"] for c in cmds}) == sorted(TASK_NAMES)
    assert sorted({c["max_seq_length"] for c in cmds}) == [4096, 8192]


@pytest.mark.slow
@pytest.mark.parametrize("entry", golden_commands(), ids=lambda e: e["file"])
def test_golden_file_byte_identical(golden_run, entry):
    out, _ = golden_run
    path = out / str(entry["max_seq_length"]) / f"{entry['task']}.jsonl"
    data = path.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    assert got == entry["sha256"], (
        f"{path} differs from upstream {entry['file']} (regenerate it with the argv in commands.json)")
    # and the format facts the digest implies (upstream's key order; every sample within the length)
    first = json.loads(data.splitlines()[0])
    keys = ["index", "input", "outputs", "length", "length_w_model_temp", "answer_prefix"]
    if entry["task"].startswith("niah"):
        keys.append("token_position_answer")
    assert list(first) == keys
    assert all(json.loads(x)["length"] <= entry["max_seq_length"] for x in data.splitlines())


@pytest.mark.slow
def test_manifest_records_inputs(golden_run, reference_tokenizer_dir):
    out, res = golden_run
    m = json.loads((out / "manifest.json").read_text())
    assert m["seed"] == 42 and m["samples"] == 10 and m["template"]["name"] == "base"
    assert m["tokenizer"]["counting"] == "metaspace"
    assert set(m["data"]) == {"essay", "squad", "hotpotqa"}
    assert all(d["known"] for d in m["data"].values())
    assert len(m["files"]) == 26
    # search sizes match the sizes upstream's binary search logged for these files
    assert m["files"]["4096/niah_single_2.jsonl"]["size"] == 2442
    assert m["files"]["8192/fwe.jsonl"]["size"] == 3643
    assert m["files"]["8192/qa_2.jsonl"]["size"] == 104
