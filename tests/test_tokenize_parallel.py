"""Tokenization at scale (longctx/extend/tokens.py, longctx/data/sources.py): worker processes give the same
token cache as one process, the fast path gives the ids transformers gives, and hf: datasets are streamed
so that reading stops at the token budget."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longctx.core.errors import InputError
from longctx.data.sources import iter_documents
from longctx.extend import tokens
from longctx.extend.packing import build_packed_dataset

WORDS = "the river stone of a lamp and garden window silver copper in violet morning winter harbor".split()
# Text a tokenizer treats specially: its own special tokens written out, runs of spaces, tabs and newlines,
# digits, accents, symbols and characters outside the vocabulary.
EDGE_TEXTS = ["<s> a </s> b <unk>", "  two  spaces\tand\ttabs\n\nnewlines ", "12345 67.890 1e-9", "naïve café Ωμέγα",
              "emoji 🙂 and ∑ and 中文字", " leading space", "trailing space ", "x", "[INST] not special [/INST]"]


@pytest.fixture(scope="module")
def tokenizer(reference_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(reference_tokenizer_dir)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A JSONL file of 1,500 documents of 20-400 words, some with the edge texts in them."""
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    with open(path, "w") as f:
        for i in range(1500):
            text = " ".join(rng.choice(WORDS, int(rng.integers(20, 400))))
            f.write(json.dumps({"text": f"{EDGE_TEXTS[i % len(EDGE_TEXTS)]} {text}" if i % 3 == 0 else text}) + "\n")
    return path


def _cache_files(ds) -> dict[str, bytes]:
    out = {}
    for pool in ds._token_files:
        folder = tokens.Path(pool[0]).parent
        for name in ("tokens.bin", "doc_offsets.npy", "doc_source.npy", "meta.json"):
            data = (folder / name).read_bytes()
            # meta.json's seal line names the folder it was built for (each build here has its own)
            out[f"{folder.name}/{name}"] = data.partition(b"\n")[2] if name == "meta.json" else data
    return out


@pytest.mark.slow
def test_two_workers_write_the_same_cache_as_one(tokenizer, corpus, tmp_path, monkeypatch):
    """Same data + tokenizer + seed -> the same bytes, whatever the worker count: two sources interleaved by
    their shares and a short pool, in small batches so that many are in flight at once."""
    monkeypatch.setattr(tokens, "_BATCH_DOCS", 16)  # read by this process, which cuts the batches
    logs: dict[int, list[str]] = {1: [], 2: []}
    built = {}
    for workers in (1, 2):
        cache = tmp_path / f"w{workers}"
        built[workers] = build_packed_dataset([str(corpus), "synthetic:niah"], tokenizer, 512, num_tokens=150_000,
                                              short_specs=["synthetic:vt"], short_fraction=0.3, seed=3,
                                              cache_dir=cache, workers=workers, log=logs[workers].append)
    one, two = built[1], built[2]
    assert _cache_files(one) == _cache_files(two)
    assert one.fingerprint == two.fingerprint and one.stats == two.stats
    assert [one.get(i)["input_ids"].tolist() for i in range(len(one))] == \
           [two.get(i)["input_ids"].tolist() for i in range(len(two))]
    assert any("(up to 105,011 tokens, 2 workers)" in m for m in logs[2]), logs[2]
    assert any("(up to 105,011 tokens, 1 worker)" in m for m in logs[1]), logs[1]
    assert sum("tokens/s" in m for m in logs[2]) == 2  # each pool says how fast it went


@pytest.mark.slow
def test_the_cache_holds_what_transformers_gives_each_document(tokenizer, corpus, tmp_path):
    ds = build_packed_dataset([str(corpus)], tokenizer, 512, num_tokens=10**8, cache_dir=tmp_path, workers=2,
                              log=lambda m: None)
    folder = tokens.Path(ds._token_files[0][0]).parent
    flat = np.fromfile(folder / "tokens.bin", dtype=np.uint16)
    offsets = np.load(folder / "doc_offsets.npy")
    texts = list(iter_documents(str(corpus)))
    expected = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert len(offsets) - 1 == len(texts) == 1500  # exhausted: every document, in order
    for i, ids in enumerate(expected):
        assert flat[offsets[i]:offsets[i + 1]].tolist() == ids + [tokenizer.eos_token_id], i


@pytest.mark.parametrize("split_special_tokens", [False, True])
def test_the_fast_path_encodes_as_the_transformers_call(reference_tokenizer_dir, split_special_tokens):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(reference_tokenizer_dir, split_special_tokens=split_special_tokens)
    encoder = tokens._encoder(tok)
    assert encoder is not tok  # the Rust tokenizer, not the transformers object
    assert tokens._encode(encoder, EDGE_TEXTS) == tok(EDGE_TEXTS, add_special_tokens=False)["input_ids"]
    # the special tokens are kept whole unless split_special_tokens says otherwise
    first = tokens._encode(encoder, ["<s>"])[0]
    assert (first == [tok.bos_token_id]) is not split_special_tokens


@pytest.mark.slow
def test_a_tokenizer_that_changes_how_it_encodes_is_used_as_it_is(reference_tokenizer_dir):
    from transformers import AutoTokenizer

    base = type(AutoTokenizer.from_pretrained(reference_tokenizer_dir))

    class Shouting(base):
        def __call__(self, text, *args, **kwargs):
            return super().__call__([t.upper() for t in text], *args, **kwargs)

    tok = Shouting.from_pretrained(reference_tokenizer_dir)
    assert tokens._encoder(tok) is tok
    assert tokens._encode(tok, ["abc"]) == tok(["ABC"], add_special_tokens=False)["input_ids"]


# --- hf: streaming -----------------------------------------------------------------------------------------------


@pytest.fixture
def hub_dataset(monkeypatch, tmp_path):
    """Offline, a dataset `hf download` put in the Hub cache: two parquet files, the second unreadable. Returns
    (the spec, the datasets cache folder, the documents of the first file)."""
    import datasets.config

    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home / "datasets")
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    repo = home / "hub" / "datasets--org--books"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    data = repo / "snapshots" / commit / "data"
    data.mkdir(parents=True)
    rng = np.random.default_rng(2)
    texts = [" ".join(rng.choice(WORDS, 300)) for _ in range(100)]
    pq.write_table(pa.table({"text": texts}), data / "train-00000-of-00002.parquet", row_group_size=8)
    (data / "train-00001-of-00002.parquet").write_bytes(b"not parquet at all" * 100)
    return "hf:org/books", home / "datasets", texts


@pytest.mark.slow
def test_an_hf_dataset_is_read_only_up_to_the_token_budget(hub_dataset, tokenizer, tmp_path):
    spec, datasets_cache, texts = hub_dataset
    ds = build_packed_dataset([spec], tokenizer, 512, num_tokens=3000, cache_dir=tmp_path / "c", log=lambda m: None)
    assert ds.stats["tokens"] >= 3000 and not ds.stats["sources_exhausted"][0]
    assert not datasets_cache.exists() or not any(datasets_cache.rglob("*.arrow"))  # nothing prepared
    assert next(iter_documents(spec)) == texts[0]


def test_an_unreadable_file_the_stream_reaches_is_one_line(hub_dataset, tokenizer, tmp_path):
    spec, _, _ = hub_dataset
    with pytest.raises(InputError, match=r"^could not read dataset 'org/books' \(\w+: [^\n]*\)$"):
        build_packed_dataset([spec], tokenizer, 512, num_tokens=10**7, cache_dir=tmp_path / "c", log=lambda m: None)
    assert not any((tmp_path / "c").glob("tokens-*"))


def _die(texts):
    import os

    os._exit(1)


@pytest.mark.slow
def test_a_worker_that_dies_is_one_line_and_nothing_is_cached(tokenizer, corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "_worker_tokenize", _die)  # what the spawned workers are sent by name
    with pytest.raises(InputError, match=r"^a tokenize worker process died .*; nothing was cached: rerun"):
        build_packed_dataset([str(corpus)], tokenizer, 512, num_tokens=10**5, cache_dir=tmp_path, workers=2,
                             log=lambda m: None)
    assert list(tmp_path.iterdir()) == []
