"""The tokenization cache of `extend`: each pool of data specs tokenized once into memory-mapped files.

Tokenization: `tokenizer(texts, add_special_tokens=False)` in batches, then the tokenizer's EOS id
(when it has one) after every document, so the model learns where documents end; no BOS. A pool (the
long specs, or the short specs) is read only until it holds its token budget (sources may be endless);
its sources are interleaved document by document so that each contributes an equal share of tokens as
far as it can. The result is cached under `cache_dir`:

  tokens-<sources+tokenizer>-<budget>/   tokens.bin (uint16 when the vocabulary fits, else uint32),
                                         doc_offsets.npy (int64, documents + 1), doc_source.npy, meta.json

Every cache directory is built in a hidden `.<name>.tmp-*` directory beside it and renamed into place
when complete, so a concurrent or interrupted build is never read (a killed build leaves such a
directory behind, which can be deleted). A token cache is reused for any budget it covers: reading
stops at the first document that reaches the budget, so a smaller budget is a prefix of a larger one.
"""

from __future__ import annotations

import array
import contextlib
import json
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from longctx.core.errors import InputError
from longctx.core.files import atomic_dir, write_json
from longctx.core.hashing import hash_json, tokenizer_fingerprint
from longctx.data.sources import iter_documents, source_identity

# Bump when the cache layout or the packing rule changes: old caches are then never reused.
CACHE_VERSION = 2
_BATCH_CHARS = 1 << 21
_BATCH_DOCS = 1024


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """One batched call of the fast tokenizer (tests count calls of this function)."""
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


class _TokenStream:
    """Documents of one spec, tokenized in batches on demand."""

    def __init__(self, docs: Iterator[str], tokenizer: Any, eos: int | None, dtype: np.dtype):
        self.docs, self.tokenizer, self.eos, self.dtype = docs, tokenizer, eos, dtype
        self.buffer: deque[np.ndarray] = deque()
        self.done = False
        self.chars_per_token = 3.0

    def next(self, want_tokens: int) -> np.ndarray | None:
        """The next document's token ids (EOS appended), or None when the source is exhausted.
        `want_tokens` bounds how much is read ahead from an endless source."""
        if not self.buffer and not self.done:
            self._refill(want_tokens)
        return self.buffer.popleft() if self.buffer else None

    def _refill(self, want_tokens: int) -> None:
        texts, chars = [], 0
        while len(texts) < _BATCH_DOCS and chars < _BATCH_CHARS and chars < want_tokens * self.chars_per_token:
            text = next(self.docs, None)
            if text is None:
                self.done = True
                break
            texts.append(text)
            chars += len(text)
        if not texts:
            return
        ids = _encode(self.tokenizer, texts)
        tail = [] if self.eos is None else [self.eos]
        self.buffer.extend(np.array(x + tail, dtype=self.dtype) for x in ids)
        self.chars_per_token = max(1.0, chars / max(1, sum(len(x) for x in ids)))


class Pool:
    """Tokenized documents of one pool: a memory-mapped token array and document offsets."""

    def __init__(self, directory: Path, source_key: str, budget: int):
        meta = json.loads((directory / "meta.json").read_text())
        self.directory, self.source_key = directory, source_key
        offsets = np.load(directory / "doc_offsets.npy")
        # A cache built for a larger budget: its documents up to the one that reaches `budget`.
        n_docs = min(len(offsets) - 1, int(np.searchsorted(offsets[1:], budget, side="left")) + 1)
        self.doc_offsets = offsets[: n_docs + 1]
        self.tokens = np.memmap(directory / "tokens.bin", dtype=np.dtype(meta["dtype"]), mode="r",
                                shape=(int(offsets[-1]),))
        self.exhausted = meta["exhausted"] and n_docs == len(offsets) - 1
        per_source = np.bincount(np.load(directory / "doc_source.npy")[:n_docs], weights=np.diff(self.doc_offsets),
                                 minlength=len(meta["specs"]))
        self.source_tokens: dict[str, int] = {}
        for spec, n in zip(meta["specs"], per_source):  # a spec given twice counts once, with both shares
            self.source_tokens[spec] = self.source_tokens.get(spec, 0) + int(n)

    @property
    def num_tokens(self) -> int:
        return int(self.doc_offsets[-1])


def _find_token_cache(cache_dir: Path, source_key: str, budget: int) -> Path | None:
    for d in sorted(cache_dir.glob(f"tokens-{source_key}-*")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            meta = json.loads((d / "meta.json").read_text())
            if meta["version"] == CACHE_VERSION and (meta["exhausted"] or meta["tokens"] >= budget):
                return d
    return None


def token_pool(specs: Sequence[str], tokenizer: Any, budget: int, *, seed: int, length_tokens: int | None,
                cache_dir: Path, log: Callable[[str], None]) -> Pool:
    identity = {"version": CACHE_VERSION, "tokenizer": tokenizer_fingerprint(tokenizer),
                "eos": tokenizer.eos_token_id, "sources": [source_identity(s, seed, length_tokens) for s in specs]}
    source_key = hash_json(identity)[:20]
    found = _find_token_cache(cache_dir, source_key, budget)
    if found is not None:
        log(f"reusing tokenized data {found} for {', '.join(specs)}")
        return Pool(found, source_key, budget)
    final = cache_dir / f"tokens-{source_key}-{budget}"
    log(f"tokenizing {', '.join(specs)} (up to {budget:,} tokens) into {final}")
    dtype = np.dtype(np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32)
    streams = [_TokenStream(iter_documents(s, seed, length_tokens=length_tokens), tokenizer,
                            tokenizer.eos_token_id, dtype) for s in specs]
    taken = [0] * len(streams)
    lengths = array.array("q")  # 8 bytes a document: tens of millions of documents at paper scale
    sources = array.array("H")  # which spec each document came from
    total = 0
    from tqdm.auto import tqdm

    with atomic_dir(final, keep_existing="meta.json") as tmp, open(tmp / "tokens.bin", "wb") as out, \
            tqdm(total=budget, unit="tok", unit_scale=True, desc="tokenizing", disable=budget < 1 << 22) as bar:
        pending: list[np.ndarray] = []
        while total < budget:
            live = [i for i, s in enumerate(streams) if not (s.done and not s.buffer)]
            if not live:
                break
            i = min(live, key=lambda j: (taken[j], j))  # the source furthest behind its equal share
            ids = streams[i].next(budget - total)
            if ids is None:
                continue
            pending.append(ids)
            lengths.append(len(ids))
            sources.append(i)
            taken[i] += len(ids)
            total += len(ids)
            bar.update(len(ids))
            if len(pending) >= 4096:
                out.write(np.concatenate(pending).tobytes())
                pending.clear()
        if pending:
            out.write(np.concatenate(pending).tobytes())
        out.close()
        if total == 0:
            raise InputError(f"data {', '.join(specs)} holds no text")
        exhausted = total < budget
        np.save(tmp / "doc_source.npy", np.frombuffer(sources, dtype=np.uint16))
        np.save(tmp / "doc_offsets.npy", np.concatenate([[0], np.cumsum(np.frombuffer(lengths, dtype=np.int64))]))
        write_json(tmp / "meta.json", {
            "version": CACHE_VERSION, "specs": list(specs), "identity": identity, "budget": budget,
            "tokens": total, "documents": len(lengths), "exhausted": exhausted, "dtype": dtype.name,
            "eos_token_id": tokenizer.eos_token_id, "tokens_per_source": taken}, indent=1)
    return Pool(final, source_key, budget)
