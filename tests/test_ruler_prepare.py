"""`ruler_tasks.prepare.prepare`: files, manifest, reuse, input errors, the `chat` template, the registry."""

from __future__ import annotations

import json
import shutil

import pytest
from ruler_helpers import FIXTURE_DATA

from ruler_tasks.errors import RulerInputError
from ruler_tasks.prepare import prepare
from ruler_tasks.registry import TASK_NAMES, TASKS, resolve_tasks


def _run(tok, out, **kw):
    args = dict(tasks=["niah_single_1", "qa_1"], samples=3, seed=7, template="base", data_dir=FIXTURE_DATA,
                out_dir=out, progress=False)
    args.update(kw)
    return prepare(tok, [2048], **args)


def test_registry_matches_upstream_yaml():
    # scripts/synthetic.yaml + constants.py @ c3f5e3b
    assert TASK_NAMES == ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                          "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")
    assert {n: TASKS[n].tokens_to_generate for n in ("niah_single_1", "vt", "cwe", "fwe", "qa_1")} == \
        {"niah_single_1": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa_1": 32}
    assert TASKS["qa_2"].metric == "string_match_part" and TASKS["vt"].metric == "string_match_all"
    assert TASKS["niah_multikey_3"].args["type_needle_k"] == "uuids"
    assert [s.name for s in resolve_tasks("vt, cwe")] == ["vt", "cwe"]


@pytest.mark.slow
def test_writes_and_reuses(reference_tokenizer_dir, tmp_path):
    out = tmp_path / "out"
    r1 = _run(reference_tokenizer_dir, out)
    f = out / "2048" / "niah_single_1.jsonl"
    assert [p.name for p in r1.files] == ["niah_single_1.jsonl", "qa_1.jsonl"]
    lines = f.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x)["length"] <= 2048 for x in lines)
    m = json.loads((out / "manifest.json").read_text())
    assert m["seed"] == 7 and m["files"]["2048/qa_1.jsonl"]["samples"] == 3
    mtime = f.stat().st_mtime_ns
    r2 = _run(reference_tokenizer_dir, out)
    assert all(t.reused for t in r2.timings) and f.stat().st_mtime_ns == mtime
    # a different seed never reuses, and the output changes
    r3 = _run(reference_tokenizer_dir, out, seed=8)
    assert not any(t.reused for t in r3.timings) and f.read_text().splitlines() != lines
    # a tampered file is regenerated
    f.write_text("garbage\n")
    r4 = _run(reference_tokenizer_dir, out, seed=8)
    assert not r4.timings[0].reused and f.read_text() != "garbage\n"
    assert not list(out.glob("2048/.*.tmp"))


@pytest.mark.slow
def test_lengths_below_4096_and_odd(reference_tokenizer_dir, tmp_path):
    # upstream switches to 5-line steps and smaller CWE examples below 4096; nothing special-cased
    r = prepare(reference_tokenizer_dir, [3000], tasks=["niah_single_1", "vt", "cwe", "fwe"], samples=2, seed=1,
                out_dir=tmp_path, progress=False)
    for p in r.files:
        for line in p.read_text().splitlines():
            assert json.loads(line)["length"] <= 3000


@pytest.mark.parametrize("kw, msg", [
    (dict(tasks=["nope"]), "unknown RULER task"),
    (dict(samples=0), "--samples"),
    (dict(workers=0), "--workers must be a positive integer"),
    (dict(lengths=[512]), "at least 1024"),
    (dict(lengths=[1500], tasks=["qa_1"]), "qa_1 needs a length of at least 2048"),
    (dict(template="fancy"), "unknown template"),
    (dict(template="chat"), "chat template"),
    (dict(data_dir=None), "need the squad data"),
])
def test_bad_inputs(reference_tokenizer_dir, tmp_path, kw, msg):
    lengths = kw.pop("lengths", [2048])
    args = dict(tasks=["niah_single_1", "qa_1"], samples=2, data_dir=FIXTURE_DATA, out_dir=tmp_path / "o",
                progress=False)
    args.update(kw)
    with pytest.raises(RulerInputError, match=msg) as e:
        prepare(reference_tokenizer_dir, lengths, **args)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "o" / "2048").exists()


def test_bad_tokenizer_path(tmp_path):
    with pytest.raises(RulerInputError, match="does not exist"):
        prepare(tmp_path / "missing", [4096], tasks=["vt"], out_dir=tmp_path / "o", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RulerInputError, match="could not load a tokenizer"):
        prepare(tmp_path / "empty", [4096], tasks=["vt"], out_dir=tmp_path / "o", progress=False)


@pytest.mark.parametrize("content, msg", [
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n", "Git LFS pointer"),
    (b"<!DOCTYPE html><html><body>404</body></html>", "HTML"),
    (b'{"data": 3}', "not in RULER's format"),
    (b"{not json", "not valid JSON"),
])
def test_bad_data_files(reference_tokenizer_dir, tmp_path, content, msg):
    d = tmp_path / "data"
    shutil.copytree(FIXTURE_DATA, d)
    (d / "squad.json").write_bytes(content)
    with pytest.raises(RulerInputError, match=msg):
        prepare(reference_tokenizer_dir, [2048], tasks=["qa_1"], samples=1, data_dir=d, out_dir=tmp_path / "o",
                progress=False)


@pytest.mark.slow
def test_unknown_checksum_warns_and_is_recorded(reference_tokenizer_dir, tmp_path):
    d = tmp_path / "data"
    shutil.copytree(FIXTURE_DATA, d)
    essay = json.loads((d / "essay.json").read_text())
    essay["text"] += " One more sentence."
    (d / "my_essay.json").write_text(json.dumps(essay))
    with pytest.warns(UserWarning, match="not a known checksum"):
        prepare(reference_tokenizer_dir, [2048], tasks=["niah_single_2"], samples=1, data_dir=d,
                essay=str(d / "my_essay.json"), out_dir=tmp_path / "o", progress=False)
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["data"]["essay"]["known"] is False and m["data"]["essay"]["origin"].endswith("my_essay.json")


@pytest.mark.slow
def test_chat_template(reference_tokenizer_dir, tmp_path):
    tok_dir = tmp_path / "chat_tok"
    shutil.copytree(reference_tokenizer_dir, tok_dir)
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    r = prepare(tok_dir, [2048], tasks=["niah_single_1", "vt", "cwe"], samples=2, template="chat", out_dir=tmp_path / "o",
                progress=False)
    rec = json.loads(r.files[0].read_text().splitlines()[0])
    # the reference tokenizer adds no BOS itself, so the one the template writes stays in the prompt
    assert rec["input"].startswith("<s><|user|>\nA special magic number is hidden")
    assert rec["input"].endswith("mentioned in the provided text?\n<|assistant|>\n")
    assert rec["answer_prefix"].startswith(" The special magic number for ")
    vt = json.loads(r.files[1].read_text().splitlines()[0])
    # upstream inserts the one-shot example (without wrapper) right after the wrapper head
    assert vt["input"].startswith("<s><|user|>\nMemorize and track") and vt["input"].count("<|user|>") == 1
    cwe = json.loads(r.files[2].read_text().splitlines()[0])
    assert cwe["input"].count("<|assistant|>") == 2  # the few-shot is a whole templated turn, as upstream
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["template"]["name"] == "chat" and m["template"]["head"] == "<s><|user|>\n"


@pytest.mark.slow
def test_datasets_sources_give_the_same_prompts(reference_tokenizer_dir, tmp_path):
    """`--essay/--squad/--hotpotqa hf:<id>`: local `datasets` folders in the Hub layouts (rajpurkar/squad_v2,
    hotpot_qa distractor, a text column) convert to RULER's JSON and give the same prompts as the files."""
    import warnings

    fixture = {n: json.loads((FIXTURE_DATA / f"{n}.json").read_text()) for n in ("essay", "squad", "hotpotqa")}
    squad_rows = [{"id": q["id"], "title": art["title"], "context": p["context"], "question": q["question"],
                   "answers": {"text": [a["text"] for a in q["answers"]],
                               "answer_start": [a["answer_start"] for a in q["answers"]]}}
                  for art in fixture["squad"]["data"] for p in art["paragraphs"] for q in p["qas"]]
    hotpot_rows = [{"id": d["_id"], "question": d["question"], "answer": d["answer"],
                    "context": {"title": [t for t, _ in d["context"]], "sentences": [s for _, s in d["context"]]}}
                   for d in fixture["hotpotqa"]]
    for name, split, rows in [("essay", "train", [{"text": fixture["essay"]["text"]}]),
                              ("squad", "validation", squad_rows), ("hotpotqa", "validation", hotpot_rows)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = ["niah_single_2", "qa_1", "qa_2"]
    args = dict(tasks=tasks, samples=3, seed=5, template="base", progress=False)
    prepare(reference_tokenizer_dir, [2048], data_dir=FIXTURE_DATA, out_dir=tmp_path / "files", **args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = prepare(reference_tokenizer_dir, [2048], out_dir=tmp_path / "hf", essay=f"hf:{tmp_path / 'essay'}",
                      squad=f"hf:{tmp_path / 'squad'}", hotpotqa=f"hf:{tmp_path / 'hotpotqa'}", **args)
    assert any("not a known checksum" in str(w.message) for w in caught)  # converted JSON: not the file's sum
    assert res.manifest["data"]["squad"]["origin"] == f"hf:{tmp_path / 'squad'}"
    for t in tasks:
        assert (tmp_path / "hf" / "2048" / f"{t}.jsonl").read_bytes() == (tmp_path / "files" / "2048" / f"{t}.jsonl").read_bytes()
