"""`ruler prepare` on every core: the same bytes for any number of workers, every task, two lengths, two seeds; an
interrupted or killed multi-worker prepare leaves nothing half-written and reruns to the same files; the essay
sentences it shares across tasks and runs are exactly nltk's."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import user_environment
from ruler_helpers import FIXTURE_DATA

from ruler_tasks.data import DataSource, essay_haystack, load_source
from ruler_tasks.prepare import prepare
from ruler_tasks.punkt import sent_tokenize
from ruler_tasks.registry import TASK_NAMES
from ruler_tasks.sentences import EssaySentences, essay_sentences


def _tree(out: Path) -> dict[str, str]:
    """sha256 of every file under `out` (the task files and the manifest), by relative path."""
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def _temporaries(out: Path) -> list[Path]:
    return [p for p in out.rglob(".*") if ".tmp-" in p.name]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [42, 7])
def test_task_files_are_the_same_bytes_for_any_number_of_workers(reference_tokenizer_dir, tmp_path, monkeypatch,
                                                                  seed):
    """Every task at two lengths: one worker (essay sentences computed, in a fresh cache), then two and three
    worker processes (sentences read back from the cache) write the same files and the same manifest."""
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(tmp_path / "cache"))
    trees = {}
    for workers in (1, 2, 3):
        out = tmp_path / f"w{workers}"
        r = prepare(reference_tokenizer_dir, [2048, 3072], tasks=None, samples=2, seed=seed, data_dir=FIXTURE_DATA,
                    out_dir=out, progress=False, workers=workers)
        assert [(t.length, t.task) for t in r.timings] == [(L, n) for L in (2048, 3072) for n in TASK_NAMES]
        assert not _temporaries(out)
        trees[workers] = _tree(out)
    assert len(trees[1]) == 2 * 13 + 2  # the task files, manifest.json and the output marker
    assert trees[2] == trees[1] and trees[3] == trees[1]


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X")


# Samples per task of the stopped calls: after the first file is written, the other twelve must take long enough
# (about 9 s on 2 idle cores; 3 s with 40 samples, which a loaded CI machine finished before its signal landed)
# for the signal to land part way.
STOPPED_SAMPLES = 120


def _prepare_cli(tok: Path, out: Path, cache: Path) -> subprocess.Popen:
    env = {**user_environment(), "LONGCTX_CACHE_DIR": str(cache), "TQDM_DISABLE": "1"}
    return subprocess.Popen([sys.executable, "-m", "longctx", "ruler", "prepare", "--tokenizer", str(tok),
                             "--lengths", "32k", "--tasks", ",".join(TASK_NAMES), "--samples", str(STOPPED_SAMPLES),
                             "--workers", "2", "--data-dir", str(FIXTURE_DATA), "-o", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _complete(out: Path) -> None:
    """Every task file there is whole: the manifest lists it with its sha256, or (renamed just before the
    interruption, not yet listed) every line is a sample and there are all of them."""
    files = json.loads((out / "manifest.json").read_text()).get("files", {}) if (out / "manifest.json").is_file() \
        else {}
    for path in out.rglob("*.jsonl"):
        rel = path.relative_to(out).as_posix()
        if rel in files:
            assert hashlib.sha256(path.read_bytes()).hexdigest() == files[rel]["sha256"], rel
        else:
            assert len([json.loads(x)["input"] for x in path.read_text().splitlines()]) == STOPPED_SAMPLES, rel


@pytest.fixture(scope="module")
def whole_prepare(reference_tokenizer_dir, tmp_path_factory) -> tuple[Path, Path]:
    """The cache and the output of the call the stopped ones are compared with, made without a stop."""
    root = tmp_path_factory.mktemp("whole")
    done = _prepare_cli(reference_tokenizer_dir, root / "out", root / "cache")
    assert done.wait(timeout=600) == 0, done.stderr.read()[-3000:]
    return root / "cache", root / "out"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["interrupted", "killed"])
def test_a_stopped_multi_worker_prepare_leaves_nothing_half_written_and_reruns_the_same(reference_tokenizer_dir,
                                                                                        whole_prepare, tmp_path, sig):
    cache, whole = whole_prepare
    # On a loaded machine the call's main process can be starved while its workers finish every file, so that it
    # writes them all before the signal lands: such a try stopped nothing and is made again, in a fresh folder.
    for attempt in range(3):
        out = tmp_path / f"out{attempt}"
        proc = _prepare_cli(reference_tokenizer_dir, out, cache)
        workers: set[int] = set()
        deadline = time.time() + 300
        while True:
            ended = proc.poll() is not None  # read before the manifest: a call that ends in between wrote it all
            if (out / "manifest.json").is_file() and json.loads((out / "manifest.json").read_text())["files"]:
                break
            assert not ended and time.time() < deadline, "the call ended before it wrote its first file"
            workers.update(_children(proc.pid))
            time.sleep(0.02)
        workers.update(_children(proc.pid))
        proc.send_signal(sig)
        proc.wait(timeout=120)
        if not (proc.returncode == 0 and len(json.loads((out / "manifest.json").read_text())["files"]) == 13):
            break
    else:
        pytest.fail("three calls finished every file before the signal reached them")
    if sig == signal.SIGINT:
        assert proc.returncode == 1 and proc.stderr.read().strip().endswith("Aborted.")
    assert workers, "no worker processes were seen"
    deadline = time.time() + 30
    while any(_alive(p) for p in workers):  # killed: the kernel ends them (parent-death signal)
        assert time.time() < deadline, "worker processes outlived the call"
        time.sleep(0.05)
    _complete(out)
    if sig == signal.SIGINT:  # each worker removed the file it was writing
        assert not _temporaries(out)
    files = set(json.loads((out / "manifest.json").read_text())["files"])
    assert 0 < len(files) < 13  # stopped part way

    again = _prepare_cli(reference_tokenizer_dir, out, cache)
    assert again.wait(timeout=600) == 0, again.stderr.read()[-3000:]
    assert not _temporaries(out)  # what the killed call left, removed by the next
    assert _tree(out) == _tree(whole)


# --- essay sentences ---------------------------------------------------------------------------------------------

TRICKY = ("He said \"Stop.\" Then he left. (It was late.) Dr. Smith arrived at 5 p.m. in the U.S. capital... "
          "Was it real?! 'Yes,' she said. \"No.\" The end.) Mr. Jones, Jr. paid $3.50 -- e.g. for coffee. "
          "It works, i.e. mostly! Numbers: 1. one 2. two. Quotes: \"(nested.)\" done. Ellipsis... and then. ") * 40


def _source(text: str) -> DataSource:
    return DataSource("essay", "test", hashlib.sha256(text.encode()).hexdigest(), None, {"text": text})


@pytest.mark.parametrize("essay", ["fixture", "tricky"])
def test_essay_sentences_are_nltks_at_every_size(essay, tmp_path, monkeypatch):
    """`sent_tokenize(" ".join(words[:n]).strip())` for sizes within the text, beyond it (repeated), and around
    each sentence end; then again from the cache, in a new object."""
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(tmp_path / "cache"))
    src = load_source("essay", str(FIXTURE_DATA / "essay.json")) if essay == "fixture" else _source(TRICKY)
    words = essay_haystack(src)
    rng = random.Random(0)
    sizes = sorted({*(rng.randrange(1, 2 * len(words)) for _ in range(6)), *range(1, 30), len(words) - 1,
                    len(words), len(words) + 1, 2 * len(words) + 7})
    shared = essay_sentences(src)
    for n in sizes:
        want = sent_tokenize(" ".join((words * (n // len(words) + 1))[:n]).strip())
        assert shared.get(n) == want, n
    shared.keep()
    again = EssaySentences(words, shared.file.name.removeprefix("essay-sentences-").removesuffix(".json"))
    assert again.splits and all(again.get(n) == shared.get(n) for n in sizes)


def test_a_restart_that_does_not_split_as_the_longer_text_is_not_used(tmp_path, monkeypatch):
    """The rest of a prefix is tokenized from a sentence start of the longer text; when its first sentence comes
    out otherwise, the whole prefix is tokenized instead (here: spans made up, so no restart can match)."""
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(tmp_path / "cache"))
    words = essay_haystack(_source(TRICKY))
    es = EssaySentences(words)
    es.get(len(words))  # covers the text
    es._set_spans([(a, b - 1) for a, b in es.spans], 0)  # every sentence one character short
    es.splits.clear()
    es.memo.clear()
    n = len(words) - 3
    assert es.get(n) == sent_tokenize(" ".join(words[:n]).strip())
    assert es.splits[n][0] == 0  # tokenized whole


@pytest.mark.slow
def test_prepare_reads_the_sentences_the_last_run_kept(reference_tokenizer_dir, tmp_path, monkeypatch):
    """A second run of an essay task finds every sentence split it needs in the cache, without nltk."""
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(tmp_path / "cache"))
    args = dict(tasks=["niah_single_2", "niah_multikey_1"], samples=3, data_dir=FIXTURE_DATA, progress=False,
                workers=1)
    prepare(reference_tokenizer_dir, [4096], out_dir=tmp_path / "a", **args)
    code = ("import sys, warnings; warnings.simplefilter('ignore')\n"
            "from ruler_tasks.prepare import prepare\n"
            f"prepare({str(reference_tokenizer_dir)!r}, [4096], out_dir={str(tmp_path / 'b')!r}, "
            f"tasks={args['tasks']!r}, samples=3, data_dir={str(FIXTURE_DATA)!r}, progress=False, workers=1)\n"
            "print(sorted(m for m in ('nltk',) if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "LONGCTX_CACHE_DIR": str(tmp_path / "cache")}, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]"
    assert _tree(tmp_path / "b") == _tree(tmp_path / "a")
