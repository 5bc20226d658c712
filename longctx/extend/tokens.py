"""The tokenization cache of `extend`: each pool of data specs tokenized once into memory-mapped files.

Tokenization: `tokenizer(texts, add_special_tokens=False)` in batches, then the tokenizer's EOS id
(when it has one) after every document, so the model learns where documents end; no BOS. This process reads
the documents and cuts the batches; `workers` > 1 processes tokenize them (results in submission order, so
the cache is the same bytes for any worker count) while it writes what comes back. A pool (the
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
import errno
import itertools
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from longctx.core import cache
from longctx.core.errors import InputError, SettingError, ref
from longctx.core.files import atomic_dir, write_json
from longctx.core.hashing import hash_json, sha256_file, tokenizer_fingerprint
from longctx.core.processes import can_spawn, worker_pool
from longctx.data.sources import iter_documents, source_identity

# Bump when the cache layout or the packing rule changes: old caches are then never reused.
CACHE_VERSION = 3
_BATCH_CHARS = 1 << 19  # ~0.2 s of one worker: small enough that the last batches keep every worker busy
_BATCH_DOCS = 1024


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """One batched call of the tokenizer: a `tokenizers.Tokenizer` (the fast path) or a transformers tokenizer
    (tests count calls of this function)."""
    import tokenizers

    if isinstance(tokenizer, tokenizers.Tokenizer):
        return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _encoder(tokenizer: Any) -> Any:
    """What the workers encode with: the Rust tokenizer behind a transformers fast tokenizer, set up as transformers
    calls it for `tokenizer(texts, add_special_tokens=False)` (transformers tokenization_utils_tokenizers
    `_encode_plus`: `encode_special_tokens` from `split_special_tokens`, no truncation or padding); it gives the same
    ids without building a BatchEncoding per document (~1.3x the tokens/s per core). Any other tokenizer (a slow
    one, or a subclass that changes how it encodes) is used as is."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    backend = getattr(tokenizer, "backend_tokenizer", None)
    own = type(tokenizer)
    if (backend is None or own.__call__ is not TokenizersBackend.__call__
            or own._encode_plus is not TokenizersBackend._encode_plus):
        return tokenizer
    import tokenizers

    fast = tokenizers.Tokenizer.from_str(backend.to_str())
    fast.no_truncation()
    fast.no_padding()
    fast.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
    return fast


def _tokenize(encoder: Any, texts: list[str], eos: int | None, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(the documents' ids laid end to end, EOS after each; their lengths): compact to send between processes."""
    ids = _encode(encoder, texts)
    if eos is not None:
        for x in ids:
            x.append(eos)
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    return np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum())), lengths


class _Workers:
    """Tokenizes batches of texts in this process (`workers` 1) or in a pool of `workers` processes, each
    single-threaded; results come back in submission order, so the token stream is the same for any count."""

    def __init__(self, encoder: Any, eos: int | None, dtype: np.dtype, workers: int):
        self.encoder, self.eos, self.dtype, self.workers = encoder, eos, dtype, workers
        self.pool: ProcessPoolExecutor | None = None
        self.bound = contextlib.ExitStack()
        if workers > 1 and can_spawn():
            # started as they are in `submit`, from this (the main) thread
            self.pool = self.bound.enter_context(worker_pool(workers, _set_worker, (encoder, eos, dtype)))

    @property
    def depth(self) -> int:
        """Batches kept in flight per source: enough to keep every worker busy."""
        return 2 * self.workers if self.pool else 1

    def submit(self, texts: list[str]) -> Future:
        if self.pool is not None:
            return self.pool.submit(_worker_tokenize, texts)
        done: Future = Future()
        with _one_thread():
            done.set_result(_tokenize(self.encoder, texts, self.eos, self.dtype))
        return done

    def close(self) -> None:
        self.bound.close()


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One core for one worker: the Rust tokenizer otherwise spreads a batch over every core (its
    TOKENIZERS_PARALLELISM variable is read at each call)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


_WORKER: tuple[Any, int | None, np.dtype] | None = None


def _set_worker(encoder: Any, eos: int | None, dtype: np.dtype) -> None:
    global _WORKER
    _WORKER = (encoder, eos, dtype)


def _worker_tokenize(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _WORKER is not None
    return _tokenize(_WORKER[0], texts, _WORKER[1], _WORKER[2])


class _TokenStream:
    """Documents of one spec, tokenized in batches ahead of need (at most `depth` batches in flight, and no
    more text than the tokens still wanted, estimated from the characters per token seen so far)."""

    def __init__(self, docs: Iterator[str], tokenizing: _Workers):
        self.docs, self.tokenizing = docs, tokenizing
        self.buffer: deque[np.ndarray] = deque()
        self.buffered = 0  # tokens in `buffer`
        self.pending: deque[tuple[Future, int]] = deque()  # (batch, its characters)
        self.ahead_chars = 0  # characters in `pending`
        self.done = False
        self.chars_per_token = 3.0

    @property
    def exhausted(self) -> bool:
        return self.done and not self.buffer and not self.pending

    def next(self, want_tokens: int) -> np.ndarray | None:
        """The next document's token ids (EOS appended), or None when the source is exhausted.
        `want_tokens` bounds how much is read ahead from an endless source."""
        while not self.buffer:
            self._submit(want_tokens)
            if not self.pending:
                return None
            future, chars = self.pending.popleft()
            self.ahead_chars -= chars
            flat, lengths = future.result()
            self.buffer.extend(np.split(flat, np.cumsum(lengths[:-1])))
            self.buffered += len(flat)
            self.chars_per_token = max(1.0, chars / max(1, len(flat)))
        ids = self.buffer.popleft()
        self.buffered -= len(ids)
        self._submit(want_tokens - len(ids) - self.buffered)
        return ids

    def _submit(self, want_tokens: int) -> None:
        ahead = self.ahead_chars / self.chars_per_token
        while not self.done and len(self.pending) < self.tokenizing.depth and ahead < want_tokens:
            texts, chars = [], 0
            limit = min(_BATCH_CHARS, (want_tokens - ahead) * self.chars_per_token)
            while len(texts) < _BATCH_DOCS and chars < limit:
                text = next(self.docs, None)
                if text is None:
                    self.done = True
                    break
                texts.append(text)
                chars += len(text)
            if not texts:
                return
            self.pending.append((self.tokenizing.submit(texts), chars))
            self.ahead_chars += chars
            ahead += chars / self.chars_per_token


def cache_refusal(e: OSError, cache: Path) -> SettingError | None:
    """The line for a write into the tokenized-data cache `cache` that its disk refused (full, over quota,
    read-only): the cache's disk and its setting, not the output's; None for any other error."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
        return None
    return SettingError(f"cannot write the tokenized-data cache in '{cache}': {e.strerror or os.strerror(e.errno)}; "
                        f"free space there, or give {ref('cache_dir')} on another disk")


def write_sealed_meta(tmp: Path, final: Path, meta: dict[str, Any], arrays: Sequence[str]) -> dict[str, Any]:
    """meta.json of a cache folder built in `tmp` and renamed to `final`: `meta` with the sha256 of each of its
    array files `arrays` ("files"), sealed for `final`; unsealed (so never reused, which costs time) when this
    user's cache cannot seal. Returns what it wrote."""
    meta = {**meta, "files": {name: sha256_file(tmp / name) for name in arrays}}
    if not cache.write_json(tmp / "meta.json", meta, at=final / "meta.json"):
        write_json(tmp / "meta.json", meta, indent=None)
    return meta


def arrays_intact(directory: Path, meta: dict[str, Any], arrays: Sequence[str],
                  most_bytes: Callable[[str], int]) -> bool:
    """Whether each array file of the cache folder `directory` holds what its sealed `meta` recorded
    (`write_sealed_meta`), within `most_bytes(name)`."""
    files = meta.get("files")
    return isinstance(files, dict) and all(cache.check_sha256(directory / name, files.get(name), most_bytes(name))
                                           for name in arrays)


def remove_unverified(final: Path) -> None:
    """Move aside and delete the cache folder `final` that failed verification, so a new one takes its place
    (`atomic_dir` keeps a finished folder it finds)."""
    if final.is_dir() and not final.is_symlink():
        aside = final.with_name(f".{final.name}.unverified-{os.getpid()}")
        with contextlib.suppress(OSError):
            final.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
    elif final.is_symlink() or final.exists():
        with contextlib.suppress(OSError):
            final.unlink()


class Pool:
    """Tokenized documents of one pool: a memory-mapped token array and document offsets."""

    def __init__(self, directory: Path, meta: dict[str, Any], source_key: str, budget: int):
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


# The arrays of a token cache, whose sha256 its sealed meta.json records; and that file's bound.
_ARRAYS = ("tokens.bin", "doc_offsets.npy", "doc_source.npy")
_META_BYTES = 1 << 20


def _array_bytes(meta: dict[str, Any], name: str) -> int:
    """The most bytes the array file `name` of a cache described by `meta` can take (.npy headers are < 4 kB)."""
    per = {"tokens.bin": np.dtype(meta["dtype"]).itemsize * meta["tokens"],
           "doc_offsets.npy": 8 * (meta["documents"] + 1), "doc_source.npy": 2 * meta["documents"]}
    return per[name] + (0 if name == "tokens.bin" else 4096)


def _sealed_meta(directory: Path) -> dict[str, Any] | None:
    """The meta.json of the token cache `directory` when it is sealed by this user for this folder
    (`longctx.core.cache`) and of this version and shape; else None."""
    meta = cache.read_json(directory / "meta.json", _META_BYTES)
    try:
        if (not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION
                or meta["dtype"] not in ("uint16", "uint32")
                or not all(isinstance(meta[k], int) and meta[k] >= 0 for k in ("tokens", "documents"))
                or not isinstance(meta["specs"], list) or not isinstance(meta["exhausted"], bool)):
            return None
    except (KeyError, TypeError):
        return None
    return meta


def _find_token_cache(cache_dir: Path, source_key: str, budget: int) -> tuple[Path, dict[str, Any]] | None:
    """A token cache of these sources that covers `budget` and holds what its meta recorded (the arrays are
    hashed only for a cache that would be used); None when there is none (it is built again)."""
    for d in sorted(cache_dir.glob(f"tokens-{source_key}-*")):
        meta = _sealed_meta(d)
        if (meta is not None and (meta["exhausted"] or meta["tokens"] >= budget)
                and arrays_intact(d, meta, _ARRAYS, lambda name, meta=meta: _array_bytes(meta, name))):
            return d, meta
    return None


def token_pool(specs: Sequence[str], tokenizer: Any, budget: int, *, seed: int, length_tokens: int | None,
                cache_dir: Path, log: Callable[[str], None], workers: int = 1) -> Pool:
    identity = {"version": CACHE_VERSION, "tokenizer": tokenizer_fingerprint(tokenizer),
                "eos": tokenizer.eos_token_id, "sources": [source_identity(s, seed, length_tokens) for s in specs]}
    source_key = hash_json(identity)[:20]
    found = _find_token_cache(cache_dir, source_key, budget)
    if found is not None:
        log(f"reusing tokenized data {found[0]} for {', '.join(specs)}")
        return Pool(*found, source_key, budget)
    final = cache_dir / f"tokens-{source_key}-{budget}"
    remove_unverified(final)
    log(f"tokenizing {', '.join(specs)} (up to {budget:,} tokens, {workers} worker{'s' * (workers > 1)}) "
        f"into {final}")
    dtype = np.dtype(np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32)
    started = time.perf_counter()
    tokenizing = _Workers(_encoder(tokenizer), tokenizer.eos_token_id, dtype, workers)
    try:
        meta = _write_tokens(final, specs, tokenizer=tokenizer, identity=identity, budget=budget, seed=seed,
                              length_tokens=length_tokens, tokenizing=tokenizing, dtype=dtype)
    except OSError as e:
        raise cache_refusal(e, cache_dir) or e from None
    except BrokenProcessPool:
        raise SettingError(f"a tokenize worker process died (killed, or out of memory) while tokenizing "
                           f"{', '.join(specs)}; nothing was cached: rerun, with fewer {ref('tokenize_workers')} if "
                           "memory is short") from None
    finally:
        tokenizing.close()
    seconds = time.perf_counter() - started
    log(f"tokenized {meta['tokens']:,} tokens in {seconds:.1f} s ({meta['tokens'] / max(seconds, 1e-9):,.0f} "
        "tokens/s)")
    return Pool(final, meta, source_key, budget)


def _write_tokens(final: Path, specs: Sequence[str], *, tokenizer: Any, identity: dict[str, Any], budget: int,
                  seed: int, length_tokens: int | None, tokenizing: _Workers, dtype: np.dtype) -> dict[str, Any]:
    """Read, tokenize and write one pool's cache directory; returns its meta.json."""
    streams = [_TokenStream(iter_documents(s, seed, length_tokens=length_tokens), tokenizing) for s in specs]
    taken = [0] * len(streams)
    lengths = array.array("q")  # 8 bytes a document: tens of millions of documents at paper scale
    sources = array.array("H")  # which spec each document came from
    total = 0
    from tqdm.auto import tqdm

    with atomic_dir(final, keep_existing="meta.json") as tmp, open(tmp / "tokens.bin", "wb") as out, \
            tqdm(total=budget, unit="tok", unit_scale=True, desc="tokenizing", disable=budget < 1 << 22) as bar:
        pending: list[np.ndarray] = []
        while total < budget:
            live = [i for i, s in enumerate(streams) if not s.exhausted]
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
        return write_sealed_meta(tmp, final, {
            "version": CACHE_VERSION, "specs": list(specs), "identity": identity, "budget": budget, "tokens": total,
            "documents": len(lengths), "exhausted": exhausted, "dtype": dtype.name,
            "eos_token_id": tokenizer.eos_token_id, "tokens_per_source": taken}, _ARRAYS)
