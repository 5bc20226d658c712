"""Training data for `longctx extend`: sources (longctx/data/sources.py), the tokenization cache
(longctx/extend/tokens.py) and packing (longctx/extend/packing.py).

Packing follows transformers' document masking: `position_ids` restart at 0 at every document and
`masking_utils.find_packed_sequence_indices` turns each run of consecutive positions into its own
block of the attention mask, so the invariants below are stated on position_ids.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from longctx.core.errors import InputError
from longctx.data.sources import check_data_specs, iter_documents
from longctx.extend import packing, tokens
from longctx.extend.loss import IGNORE_INDEX
from longctx.extend.packing import build_packed_dataset

WORDS = ("river stone lamp garden window silver copper violet morning winter harbor meadow candle "
         "forest orange pepper marble tiger falcon velvet anchor").split()


def _text(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, words))


@pytest.fixture(scope="module")
def tokenizer(reference_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(reference_tokenizer_dir)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A long-document directory (two .txt files longer than the test seq_len, one JSONL of mixed
    lengths) and a short-document JSONL file."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("corpus")
    long_dir = root / "long"
    (long_dir / "sub").mkdir(parents=True)
    (long_dir / "a.txt").write_text(_text(rng, 700))
    (long_dir / "sub" / "b.txt").write_text(_text(rng, 300))
    with open(long_dir / "c.jsonl", "w") as f:
        for n in (40, 250, 5, 120):
            f.write(json.dumps({"text": _text(rng, n), "id": n}) + "\n")
    (long_dir / ".hidden.txt").write_text("never read")
    short = root / "short.jsonl"
    short.write_text("".join(json.dumps({"text": _text(rng, int(n))}) + "\n" for n in rng.integers(3, 40, 60)))
    return {"long": long_dir, "short": short}


def _expected_pieces(tokenizer, texts: list[str], seq_len: int) -> Counter:
    """Each document tokenized on its own, EOS appended, cut into seq_len pieces."""
    pieces: Counter = Counter()
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        pieces.update(tuple(ids[i:i + seq_len]) for i in range(0, len(ids), seq_len))
    return pieces


def _split(sample: dict, pad_id: int) -> list[tuple[int, int]]:
    """(start, stop) of each block of consecutive positions, padding block excluded."""
    pos = sample["position_ids"].numpy()
    starts = [int(t) for t in np.flatnonzero(pos == 0)]
    blocks = list(zip(starts, starts[1:] + [len(pos)]))
    ids = sample["input_ids"].numpy()
    return [(a, b) for a, b in blocks if not (ids[a:b] == pad_id).all()]


def _check_sample(sample: dict, seq_len: int, pad_id: int, eos: int) -> list[tuple]:
    """Assert the packing invariants of one sequence; return its document pieces."""
    ids, pos, labels = (sample[k].numpy() for k in ("input_ids", "position_ids", "shift_labels"))
    assert all(sample[k].dtype == torch.int64 and sample[k].shape == (seq_len,)
               for k in ("input_ids", "position_ids", "shift_labels"))
    pieces = []
    blocks = _split(sample, pad_id)
    covered = 0
    for a, b in blocks:
        assert (pos[a:b] == np.arange(b - a)).all()
        assert (labels[a:b - 1] == ids[a + 1:b]).all()  # next token of the same document
        pieces.append(tuple(ids[a:b].tolist()))
        covered = b
    # Padding: pad ids, ignored labels, after every document.
    assert (ids[covered:] == pad_id).all() and (labels[covered:] == IGNORE_INDEX).all()
    assert sample["tokens"].dtype == torch.int64 and int(sample["tokens"]) == covered  # what is not padding
    for a, b in blocks:
        last = labels[b - 1]
        if ids[b - 1] == eos:
            assert last == IGNORE_INDEX  # a document's last token predicts nothing
        else:
            assert last != IGNORE_INDEX and b - a == seq_len  # a cut piece predicts the next piece's first token
    return pieces


def test_packing_invariants_every_token_once_per_epoch(tokenizer, corpus, tmp_path):
    seq_len = 128
    long_texts = list(iter_documents(str(corpus["long"])))
    short_texts = list(iter_documents(str(corpus["short"])))
    ds = build_packed_dataset([str(corpus["long"])], tokenizer, seq_len, num_tokens=10**6,
                              short_specs=[str(corpus["short"])], short_fraction=0.3, packing="whole",
                              cache_dir=tmp_path, log=lambda m: None)
    assert ds.stats["documents"] == len(long_texts) + len(short_texts) == 6 + 60
    assert ds.stats["documents_split"] >= 2 and ds.stats["epochs"] > 1
    pad_id = 0  # the reference tokenizer has no pad token
    seen: Counter = Counter()
    for i in range(len(ds)):
        seen.update(_check_sample(ds.get(i), seq_len, pad_id, tokenizer.eos_token_id))
    assert seen == _expected_pieces(tokenizer, long_texts + short_texts, seq_len)
    # Several short documents share a sequence.
    assert max(len(_split(ds.get(i), pad_id)) for i in range(len(ds))) >= 3
    nonpad = sum(int((ds.get(i)["shift_labels"] != IGNORE_INDEX).sum()) for i in range(len(ds)))
    assert nonpad == ds.stats["tokens"] - ds.stats["documents"]  # every token but each document's last


def test_split_packing_fills_every_sequence_and_keeps_every_token_once(tokenizer, corpus, tmp_path):
    """The default packing: sequences are full but the last; a document cut where a sequence ends goes on at
    the start of the next (its last token there predicts the next piece's first); every token once per epoch."""
    seq_len = 128
    texts = list(iter_documents(str(corpus["long"]))) + list(iter_documents(str(corpus["short"])))
    ds = build_packed_dataset([str(corpus["long"])], tokenizer, seq_len, num_tokens=10**6,
                              short_specs=[str(corpus["short"])], short_fraction=0.3,
                              cache_dir=tmp_path, log=lambda m: None)
    assert ds.stats["packing"] == "split" and ds.stats["padding_fraction"] * len(ds) * seq_len < seq_len
    eos, tokens_seen, labelled = tokenizer.eos_token_id, Counter(), 0
    stream = []  # the plan's pieces in sequence order: they are the documents, cut
    for seq in range(len(ds)):
        sample = ds.get(int(np.argsort(ds.order(0))[seq]))  # the seq-th sequence of the plan
        ids, pos, labels = (sample[k].numpy() for k in ("input_ids", "position_ids", "shift_labels"))
        blocks = _split(sample, 0)
        assert blocks[-1][1] == seq_len or seq == len(ds) - 1  # full, but the last
        for a, b in blocks:
            assert (pos[a:b] == np.arange(b - a)).all() and (labels[a:b - 1] == ids[a + 1:b]).all()
            stream.append((ids[a:b].tolist(), int(labels[b - 1]), b == seq_len))
        tokens_seen.update(int(t) for a, b in blocks for t in ids[a:b])
        labelled += int((labels != IGNORE_INDEX).sum())
    expected = Counter(t for text in texts for t in tokenizer(text, add_special_tokens=False)["input_ids"] + [eos])
    assert tokens_seen == expected and labelled == ds.stats["tokens"] - ds.stats["documents"]
    cut = 0
    for (piece, last, ends_sequence), (following, _, _) in zip(stream, stream[1:] + [([None], None, None)]):
        if piece[-1] == eos:
            assert last == IGNORE_INDEX  # a document's last token predicts nothing
        elif ends_sequence and len(piece) < seq_len:  # cut where the sequence ends: it goes on in the next
            assert last == following[0]
            cut += 1
        else:  # a piece of a longer document predicts its next piece's first token, wherever that is
            assert last != IGNORE_INDEX
    assert cut >= len(ds) // 2


@pytest.fixture(scope="module")
def bpe_tokenizers(corpus, tmp_path_factory):
    """Two small BPEs trained on the corpus's words: {False: adds nothing to a text, True: puts its BOS first}."""
    from transformers import AutoTokenizer

    from longctx.init.bpe import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("bpe")
    return {bos: AutoTokenizer.from_pretrained(train_bpe_tokenizer(root / str(bos), 300, [" ".join(WORDS)] * 20, bos=bos))
            for bos in (False, True)}


def test_stream_packing_is_split_as_one_causal_stream(bpe_tokenizers, corpus, tmp_path, tiny_checkpoint):
    """`stream` with a tokenizer that adds nothing to a text: split's sequences, each with positions 0..seq_len-1
    and every token predicting the next, across documents; the model then attends across them as plain causal
    attention does (no document mask)."""
    from transformers import AutoModelForCausalLM

    seq_len = 128
    built = {mode: build_packed_dataset([str(corpus["long"])], bpe_tokenizers[False], seq_len, num_tokens=20_000,
                                        packing=mode, short_specs=[str(corpus["short"])], short_fraction=0.3,
                                        cache_dir=tmp_path, log=lambda m: None) for mode in ("split", "stream")}
    split, stream = built["split"], built["stream"]
    assert stream.fingerprint != split.fingerprint and len(stream) == len(split)
    for i in range(len(split)):
        a, b = split.get(i), stream.get(i)
        ids, labels, n = b["input_ids"], b["shift_labels"], int(b["tokens"])
        assert torch.equal(a["input_ids"], ids) and int(a["tokens"]) == n
        assert torch.equal(b["position_ids"], torch.arange(seq_len))
        assert torch.equal(labels[:n - 1], ids[1:n]) and labels[n - 1] == a["shift_labels"][n - 1]
    assert (split.get(0)["position_ids"] == 0).sum() > 1  # split restarts at its documents: the two differ
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint).eval()
    sample = stream.get(0)
    with torch.no_grad():
        hidden = model.model(sample["input_ids"][None], position_ids=sample["position_ids"][None]).last_hidden_state
        causal = model.model(sample["input_ids"][None]).last_hidden_state
    torch.testing.assert_close(hidden, causal)


def test_stream_sequences_begin_as_the_tokenizer_begins_a_text(bpe_tokenizers, corpus, tmp_path):
    """A tokenizer that puts a BOS before every text (a BPE made with `bos=True`, as `init --bpe-bos`) begins every
    `stream` sequence with it, as a `sinks` window and a prompt begin: the BOS at position 0 predicts the stream's
    first token, then seq_len - 1 stream tokens follow. The same documents without a BOS pack without one."""
    seq_len, docs = 64, [str(corpus["long"])]
    plain = build_packed_dataset(docs, bpe_tokenizers[False], seq_len, num_tokens=5_000, packing="stream",
                                 cache_dir=tmp_path, log=lambda m: None)
    tok = bpe_tokenizers[True]
    led = build_packed_dataset(docs, tok, seq_len, num_tokens=5_000, packing="stream", cache_dir=tmp_path,
                               log=lambda m: None)
    assert led.fingerprint != plain.fingerprint and tok.bos_token_id is not None
    body = []
    for i in range(len(led)):
        s = led.get(i)
        ids, labels, n = s["input_ids"], s["shift_labels"], int(s["tokens"])
        assert ids[0] == tok.bos_token_id and (ids[1:n] != tok.bos_token_id).all()
        assert torch.equal(labels[:n - 1], ids[1:n]) and torch.equal(s["position_ids"], torch.arange(seq_len))
        body.append(ids[1:n])
    assert sum(len(b) < seq_len - 1 for b in body) <= 1  # a BOS and seq_len - 1 tokens; only the last is short
    assert tok.eos_token_id in torch.cat(body).tolist()  # documents end with their EOS inside the stream
    assert all(plain.get(i)["input_ids"][0] != bpe_tokenizers[False].bos_token_id for i in range(len(plain)))


@pytest.mark.slow
def test_split_packing_wastes_under_one_percent_where_whole_wastes_four_in_ten(tokenizer, tmp_path):
    """Documents of ~1.16k tokens at seq_len 2k: whole-document packing leaves ~43% padding, split ≤ 1%."""
    rng = np.random.default_rng(1)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": _text(rng, 905)}) + "\n" for _ in range(200)))
    mean = np.mean([len(tokenizer(json.loads(x)["text"])["input_ids"]) for x in docs.read_text().splitlines()])
    assert 1100 < mean < 1250
    whole, split = (build_packed_dataset([str(docs)], tokenizer, 2048, num_tokens=230_000, packing=mode,
                                         cache_dir=tmp_path / mode, log=lambda m: None) for mode in ("whole", "split"))
    assert whole.stats["padding_fraction"] > 0.3 and split.stats["padding_fraction"] <= 0.01
    assert whole.fingerprint != split.fingerprint and split.stats["tokens"] == whole.stats["tokens"]


def test_epochs_repeat_in_a_new_order_and_seed_decides_the_order(tokenizer, corpus, tmp_path):
    def build(seed, cache):
        return build_packed_dataset([str(corpus["long"]), str(corpus["short"])], tokenizer, 64,
                                    num_tokens=10**6, seed=seed, cache_dir=cache, log=lambda m: None)

    ds, again, other = build(0, tmp_path / "a"), build(0, tmp_path / "b"), build(1, tmp_path / "a")
    n = len(ds)
    epoch0 = [tuple(ds.get(i)["input_ids"].tolist()) for i in range(n)]
    epoch1 = [tuple(ds.get(n + i)["input_ids"].tolist()) for i in range(n)]
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    assert [tuple(again.get(i)["input_ids"].tolist()) for i in range(2 * n)] == epoch0 + epoch1
    assert again.fingerprint == ds.fingerprint != other.fingerprint
    assert [tuple(other.get(i)["input_ids"].tolist()) for i in range(n)] != epoch0
    with pytest.raises(IndexError):
        ds.get(-1)


def test_budget_reads_only_what_is_needed_from_an_endless_source(tokenizer, tmp_path):
    calls = []
    seq_len, num_tokens = 256, 3000
    ds = build_packed_dataset(["synthetic:niah"], tokenizer, seq_len, num_tokens=num_tokens, packing="whole",
                              cache_dir=tmp_path, log=calls.append)
    assert num_tokens <= ds.stats["tokens"] < num_tokens + 2 * seq_len
    assert len(ds) * seq_len >= num_tokens and ds.stats["epochs"] <= 1
    assert ds.stats["sources_exhausted"] == [False]
    from longctx.data.synthetic import documents

    stream = documents("niah", 0, length_tokens=packing._synthetic_document_tokens(seq_len, short=False))
    first = [next(stream) for _ in range(ds.stats["documents"])]
    pieces: Counter = Counter()
    for i in range(len(ds)):
        sample = ds.get(i)
        pieces.update(tuple(sample["input_ids"][a:b].tolist()) for a, b in _split(sample, 0))
    assert pieces == _expected_pieces(tokenizer, first, seq_len)


def test_sources_of_a_pool_contribute_equal_shares(tokenizer, corpus, tmp_path):
    """Interleaved by tokens read: an endless source does not crowd out the others, and a finite
    one that runs out leaves its share to the rest."""
    specs = ["synthetic:niah", "synthetic:vt", str(corpus["short"])]
    ds = build_packed_dataset(specs, tokenizer, 256, num_tokens=12_000, cache_dir=tmp_path, log=lambda m: None)
    niah, vt, short = (ds.stats["source_tokens"][0][s] for s in specs)
    short_total = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1
                      for t in iter_documents(str(corpus["short"])))
    assert short == short_total < 12_000 / 3  # all of it
    assert abs(niah - vt) <= 256 and niah + vt + short == ds.stats["tokens"]


def test_short_long_mix_fraction(tokenizer, tmp_path):
    ds = build_packed_dataset(["synthetic:niah"], tokenizer, 512, num_tokens=40_000,
                              short_specs=["synthetic:vt"], short_fraction=0.4, cache_dir=tmp_path, log=lambda m: None)
    assert ds.stats["short_token_fraction"] == pytest.approx(0.4, abs=0.03)
    assert ds.stats["documents_short"] > 0


def test_cache_is_reused_and_prefix_of_larger_budget(tokenizer, corpus, tmp_path, monkeypatch):
    calls = []
    encode = tokens._encode
    monkeypatch.setattr(tokens, "_encode", lambda tok, texts: calls.append(len(texts)) or encode(tok, texts))
    spec = [str(corpus["long"])]
    log: list[str] = []
    first = build_packed_dataset(spec, tokenizer, 64, num_tokens=900, cache_dir=tmp_path, log=log.append)
    assert calls and not any("reusing" in m for m in log)
    calls.clear()
    log.clear()
    again = build_packed_dataset(spec, tokenizer, 64, num_tokens=900, cache_dir=tmp_path, log=log.append)
    assert calls == [] and sum("reusing" in m for m in log) == 2  # tokens and packing plan
    assert [again.get(i)["input_ids"].tolist() for i in range(len(again))] == \
           [first.get(i)["input_ids"].tolist() for i in range(len(first))]
    # A smaller budget is a prefix of the cached one; a new seq_len re-packs without re-tokenizing.
    smaller = build_packed_dataset(spec, tokenizer, 64, num_tokens=300, cache_dir=tmp_path / "x", log=log.append)
    reused = build_packed_dataset(spec, tokenizer, 64, num_tokens=300, cache_dir=tmp_path, log=log.append)
    assert reused.fingerprint == smaller.fingerprint and reused.stats == smaller.stats
    calls.clear()
    build_packed_dataset(spec, tokenizer, 96, num_tokens=900, cache_dir=tmp_path, log=log.append)
    assert calls == []


def test_interrupted_build_leaves_no_usable_cache(tokenizer, corpus, tmp_path, monkeypatch):
    encode = tokens._encode
    calls = []

    def failing(tok, texts):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return encode(tok, texts)

    monkeypatch.setattr(tokens, "_BATCH_DOCS", 2)
    monkeypatch.setattr(tokens, "_encode", failing)
    spec = [str(corpus["short"])]
    with pytest.raises(KeyboardInterrupt):
        build_packed_dataset(spec, tokenizer, 64, num_tokens=10**5, cache_dir=tmp_path, log=lambda m: None)
    assert list(tmp_path.iterdir()) == []
    # A build killed outright leaves its temp dir behind: it is never read.
    stale = tmp_path / ".tmp-tokens-stale"
    stale.mkdir()
    (stale / "tokens.bin").write_bytes(b"\0" * 8)
    monkeypatch.setattr(tokens, "_encode", encode)
    log: list[str] = []
    ds = build_packed_dataset(spec, tokenizer, 64, num_tokens=10**5, cache_dir=tmp_path, log=log.append)
    fresh = build_packed_dataset(spec, tokenizer, 64, num_tokens=10**5, cache_dir=tmp_path / "fresh",
                                 log=lambda m: None)
    assert not any("reusing" in m for m in log)
    assert ds.stats == fresh.stats and ds.get(0)["input_ids"].tolist() == fresh.get(0)["input_ids"].tolist()


def test_spec_forms(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["first document", "second one\nwith two lines", "third"]
    (tmp_path / "one.txt").write_text("a whole file\n\nis one document")
    (tmp_path / "recs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts) + "\n")
    (tmp_path / "recs.json").write_text(json.dumps([{"text": t} for t in texts]))
    (tmp_path / "blank.jsonl").write_text(json.dumps({"text": "  \n "}) + "\n" + json.dumps({"text": "kept"}) + "\n")
    pq.write_table(pa.table({"text": texts, "n": [1, 2, 3]}), tmp_path / "t.parquet")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts[:1]}),
                          "test": datasets.Dataset.from_dict({"text": texts[2:]})}).save_to_disk(str(tmp_path / "dd"))
    docs = lambda spec: list(iter_documents(spec))
    assert docs(str(tmp_path / "one.txt")) == ["a whole file\n\nis one document"]
    assert docs(str(tmp_path / "recs.jsonl")) == docs(str(tmp_path / "recs.json")) == texts
    assert docs(str(tmp_path / "blank.jsonl")) == ["kept"]
    assert docs(str(tmp_path / "t.parquet")) == texts
    assert docs(str(tmp_path / "saved")) == docs(f"hf:{tmp_path / 'saved'}") == texts
    assert docs(str(tmp_path / "dd")) == texts[:1] and docs(f"hf:{tmp_path / 'dd'}:test") == texts[2:]
    with pytest.raises(InputError, match="without splits"):
        docs(f"hf:{tmp_path / 'saved'}:test")
    with pytest.raises(InputError, match="holds splits a, b; choose one"):
        datasets.DatasetDict({"a": datasets.Dataset.from_dict({"text": ["x"]}),
                              "b": datasets.Dataset.from_dict({"text": ["y"]})}).save_to_disk(str(tmp_path / "ab"))
        docs(str(tmp_path / "ab"))
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("b.txt", "a.jsonl", "notes.bin"):
        (folder / name).write_text(json.dumps({"text": name}) if name.endswith("jsonl") else name)
    assert docs(str(folder)) == ["a.jsonl", "b.txt"]
    from longctx.data.synthetic import MIN_LENGTH, documents

    stream = documents("vt", 3, length_tokens=MIN_LENGTH)
    assert list(zip(range(2), iter_documents("synthetic:vt", 3, length_tokens=MIN_LENGTH))) == \
           [(0, next(stream)), (1, next(stream))]
    check_data_specs([str(tmp_path / p) for p in ("one.txt", "recs.json", "t.parquet", "saved", "dd", "folder")]
                     + ["synthetic:mixed", f"hf:{tmp_path / 'saved'}"])


@pytest.mark.parametrize("make, spec, message", [
    (None, "missing.txt", "does not exist"),
    (None, "s3://bucket/data", "unknown data spec form 's3:'"),
    (None, "synthetic:nope", "unknown synthetic data 'nope'"),
    (None, "hf:./missing-dir", "does not exist"),
    (("empty.txt", ""), "empty.txt", "holds no text"),
    (("blank.txt", " \n\t\n"), "blank.txt", "holds no text"),
    (("empty.jsonl", "\n"), "empty.jsonl", "holds no text"),
    (("d/notes.bin", "x"), "d", "holds no .txt/.jsonl/.json/.parquet files"),
    (("bad.jsonl", "{\"text\": 1}\n"), "bad.jsonl", "line 1: expected a JSON object with a string \"text\" field"),
    (("broken.jsonl", "{oops\n"), "broken.jsonl", "is not valid JSON"),
    (("data.csv", "text\nhello\n"), "data.csv", "unknown type '.csv'"),
    (("latin.txt", b"caf\xe9"), "latin.txt", "is not UTF-8"),
])
def test_bad_specs_are_one_line_input_errors(tmp_path, monkeypatch, make, spec, message):
    monkeypatch.chdir(tmp_path)
    if make is not None:
        path = tmp_path / make[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(make[1], bytes) else path.write_text)(make[1])
    with pytest.raises(InputError, match=message) as e:
        check_data_specs([spec])
    assert "\n" not in str(e.value)


def test_parquet_without_text_column_and_bad_settings(tokenizer, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match="no \"text\" column"):
        check_data_specs([str(tmp_path / "t.parquet")])
    (tmp_path / "ok.txt").write_text("some text")
    ok = [str(tmp_path / "ok.txt")]
    for kwargs, message in [({"short_fraction": 0.3}, "needs short data"),
                            ({"short_fraction": 1.0, "short_specs": ok}, r"must be in \[0, 1\)"),
                            ({"num_tokens": 0}, "must be positive")]:
        with pytest.raises(InputError, match=message):
            build_packed_dataset(ok, tokenizer, 64, **{"num_tokens": 100, **kwargs}, cache_dir=tmp_path / "c")


def test_attention_does_not_cross_documents_in_a_pack(tiny_checkpoint, tokenizer, corpus, tmp_path):
    """transformers' packed-sequence masking (masking_utils.find_packed_sequence_indices): with
    position_ids restarting per document, attention_mask=None and no cache, a token's logits do not
    depend on the documents packed before it."""
    from transformers import AutoModelForCausalLM

    ds = build_packed_dataset([str(corpus["short"])], tokenizer, 128, num_tokens=10**5,
                              cache_dir=tmp_path, log=lambda m: None)
    sample = next(s for s in map(ds.get, range(len(ds))) if len(_split(s, 0)) >= 3)
    (a, b), (c, d) = _split(sample, 0)[:2]
    changed = sample["input_ids"].clone()
    changed[a:b] = torch.randint(100, 30000, (b - a,), generator=torch.Generator().manual_seed(0))
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, attn_implementation="sdpa").eval()

    def logits(ids, position_ids):
        with torch.no_grad():
            return model(input_ids=ids[None], position_ids=position_ids, attention_mask=None, use_cache=False).logits[0]

    pos = sample["position_ids"][None]
    packed, packed_changed = logits(sample["input_ids"], pos), logits(changed, pos)
    torch.testing.assert_close(packed[c:], packed_changed[c:], rtol=0, atol=1e-5)
    assert not torch.allclose(packed[a:b], packed_changed[a:b], atol=1e-3)
    # Without the restarting positions the second document does see the first.
    plain = torch.arange(len(changed))[None]
    assert not torch.allclose(logits(sample["input_ids"], plain)[c:d], logits(changed, plain)[c:d], atol=1e-3)
    # The same sequence, pickled for a DataLoader worker, reopens its files instead of copying them.
    import pickle

    blob = pickle.dumps(ds)
    assert len(blob) < 4096 and pickle.loads(blob).get(1)["input_ids"].tolist() == ds.get(1)["input_ids"].tolist()
