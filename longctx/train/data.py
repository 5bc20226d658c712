"""Training data for `longctx extend`: document sources, a tokenization cache, packing.

Sources (`--data SPEC`): a `.txt`/`.md` file (the whole file is one document), a `.jsonl`/`.json`
file (a string "text" field per record; `.json` may also be one JSON list of records), a `.parquet`
file (a "text" column), a directory of such files (all of them, recursively, sorted by path), a
`datasets.save_to_disk` directory, `hf:<dataset id or local path>[:split]` (`datasets.load_dataset`,
"text" column, split "train" by default) or `synthetic:<kind>` (`longctx.train.synthetic`).
Whitespace-only documents are skipped. Synthetic long documents are generated to fill one sequence
(`seq_len - 1` tokens plus the EOS), synthetic short ones at an eighth of it.

Tokenization: `tokenizer(texts, add_special_tokens=False)` in batches, then the tokenizer's EOS id
(when it has one) after every document, so the model learns where documents end; no BOS. Each pool
of sources (the long specs, the short specs) is read only until it holds its token budget (sources
may be endless); its sources are interleaved document by document so that each contributes an
equal share of tokens as far as it can. The result is cached under `cache_dir`:

  tokens-<sources+tokenizer>-<budget>/   tokens.bin (uint16 when the vocabulary fits, else uint32),
                                         doc_offsets.npy (int64, documents + 1), meta.json
  packed-<fingerprint>/                  the packing plan (segments of the token files per sequence)

Every cache directory is built in a `.tmp-*` directory beside it and renamed into place when
complete, so a concurrent or interrupted build is never read (a killed build leaves a `.tmp-*`
directory that can be deleted). A token cache is reused for any budget it covers: reading stops
at the first document that reaches the budget, so a smaller budget is a prefix of a larger one.

Packing (deterministic given the seed): documents longer than `seq_len` are cut into `seq_len`
pieces; all pieces of both pools are shuffled together and packed first-fit into sequences (a few
sequences stay open, so short pieces fill the gaps long ones leave); the unfilled tail is padding.
`position_ids` restart at 0 at every piece (document masking in transformers: position_ids with
attention_mask=None). The long/short mix is decided per token budget: `short_fraction` of
`num_tokens` is read from the short sources, the rest from the long ones, and both are packed
together, so the fraction holds over an epoch rather than in every sequence.

Epochs: one epoch holds every document token once; `get(index)` maps a global sequence number to
(epoch, position) and each epoch visits the sequences in its own seed-derived order. When the
sources hold fewer than `num_tokens` tokens the epochs repeat (logged, and in `stats["epochs"]`).
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longctx.errors import InputError

TEXT_SUFFIXES = (".txt", ".md")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
DATA_SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
FORMS = ("a .txt/.jsonl/.json/.parquet file, a directory of them, a datasets.save_to_disk directory, "
         "hf:<dataset id or path>[:split] or synthetic:<kind>")
IGNORE_INDEX = -100
# Bump when the cache layout or the packing rule changes: old caches are then never reused.
_CACHE_VERSION = 2
# Sequences kept open while packing: more fills gaps better, each costs a scan per piece.
_OPEN_SEQUENCES = 16
_BATCH_CHARS = 1 << 21
_BATCH_DOCS = 1024


# --- sources ------------------------------------------------------------------------------------


def _parse_spec(spec: str) -> tuple[str, Any]:
    """("synthetic", kind) | ("hf", (name, split)) | ("path", Path); InputError for anything else."""
    if spec.startswith("synthetic:"):
        return "synthetic", spec[len("synthetic:"):]
    if spec.startswith("hf:"):
        name, _, split = spec[len("hf:"):].partition(":")
        if not name:
            raise InputError(f"data spec '{spec}' names no dataset; write hf:<dataset id or path>[:split]")
        return "hf", (name, split or None)
    path = Path(spec).expanduser()
    if path.exists():
        return "path", path
    prefix = re.match(r"([A-Za-z][\w.+-]+):", spec)
    if prefix:
        raise InputError(f"unknown data spec form '{prefix.group(1)}:' in '{spec}'; give {FORMS}")
    raise InputError(f"data '{spec}' does not exist; give {FORMS}")


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def _data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*")
                  if p.is_file() and p.suffix.lower() in DATA_SUFFIXES
                  and not any(part.startswith(".") for part in p.relative_to(directory).parts))


def _record_text(record: Any, where: str) -> str:
    if isinstance(record, dict) and isinstance(record.get("text"), str):
        return record["text"]
    raise InputError(f"{where}: expected a JSON object with a string \"text\" field")


def _json_documents(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        first = f.read(4096).lstrip()[:1]
        f.seek(0)
        try:
            if path.suffix.lower() == ".json" and first == "[":
                for i, record in enumerate(json.load(f)):
                    yield _record_text(record, f"{path} record {i}")
                return
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield _record_text(json.loads(line), f"{path} line {n}")
        except json.JSONDecodeError as e:
            raise InputError(f"{path} is not valid JSON/JSONL ({e}); "
                             "write one JSON object per line with a \"text\" field") from None


def _parquet_documents(path: Path) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for an unreadable file
        raise InputError(f"{path} is not a readable parquet file ({e.__class__.__name__}: {e})") from None
    if "text" not in pf.schema_arrow.names:
        raise InputError(f"{path} has no \"text\" column (columns: {', '.join(pf.schema_arrow.names)})")
    for batch in pf.iter_batches(columns=["text"], batch_size=1024):
        yield from (t for t in batch.column(0).to_pylist() if t is not None)


def _file_documents(path: Path) -> Iterator[str]:
    suffix = path.suffix.lower()
    try:
        if suffix in TEXT_SUFFIXES:
            yield path.read_text(encoding="utf-8")
        elif suffix in JSON_SUFFIXES:
            yield from _json_documents(path)
        elif suffix in PARQUET_SUFFIXES:
            yield from _parquet_documents(path)
        else:
            raise InputError(f"data file '{path}' has an unknown type '{suffix}'; use {', '.join(DATA_SUFFIXES)}")
    except UnicodeDecodeError as e:
        raise InputError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _dataset_documents(ds: Any, where: str) -> Iterator[str]:
    if "text" not in ds.column_names:
        raise InputError(f"dataset {where} has no \"text\" column (columns: {', '.join(ds.column_names)})")
    for batch in ds.select_columns(["text"]).iter(batch_size=1024):
        yield from (t for t in batch["text"] if t is not None)


def _saved_dataset(path: Path, split: str | None) -> Any:
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds)
        pick = split or ("train" if "train" in ds else (names[0] if len(names) == 1 else None))
        if pick not in ds:
            raise InputError(f"{path} holds splits {', '.join(names)}; choose one with hf:{path}:<split>")
        ds = ds[pick]
    elif split:
        raise InputError(f"{path} is one dataset without splits; drop ':{split}' from hf:{path}:{split}")
    return ds


def _hf_documents(name: str, split: str | None) -> Iterator[str]:
    path = Path(name).expanduser()
    if _is_saved_dataset(path):
        ds = _saved_dataset(path, split)
    else:
        import datasets

        try:
            ds = datasets.load_dataset(name, split=split or "train")
        except Exception as e:  # noqa: BLE001 - any loader failure is a user-input problem here
            first = str(e).splitlines()[0] if str(e) else ""
            raise InputError(f"could not load dataset '{name}' ({e.__class__.__name__}: {first}); "
                             "offline only local paths and the datasets cache work") from None
    yield from _dataset_documents(ds, f"hf:{name}")


def _raw_documents(spec: str, seed: int, length_tokens: int | None) -> Iterator[str]:
    kind, arg = _parse_spec(spec)
    if kind == "synthetic":
        from longctx.train import synthetic

        yield from synthetic.documents(arg, seed, length_tokens=length_tokens)
    elif kind == "hf":
        yield from _hf_documents(*arg)
    elif _is_saved_dataset(arg):
        yield from _dataset_documents(_saved_dataset(arg, None), str(arg))
    elif arg.is_dir():
        for f in _data_files(arg):
            yield from _file_documents(f)
    else:
        yield from _file_documents(arg)


def iter_documents(spec: str, seed: int = 0, *, length_tokens: int | None = None) -> Iterator[str]:
    """The documents of one data spec, in a fixed order (see the module docstring for the forms).

    `seed` and `length_tokens` only matter for `synthetic:<kind>`; whitespace-only documents are skipped.
    """
    return (text for text in _raw_documents(spec, seed, length_tokens) if text and not text.isspace())


def check_data_specs(specs: Sequence[str]) -> None:
    """InputError (one line) for a spec of unknown form, a path that does not exist or holds no text."""
    for spec in specs:
        kind, arg = _parse_spec(spec)
        if kind == "synthetic":
            from longctx.train import synthetic

            if arg not in synthetic.KINDS:
                raise InputError(f"unknown synthetic data '{arg}' in '{spec}'; "
                                 f"choose one of {', '.join(synthetic.KINDS)}")
            continue
        if kind == "hf":
            name, _ = arg
            if not Path(name).expanduser().exists():
                if name.startswith((".", "/", "~")):
                    raise InputError(f"dataset path '{name}' in '{spec}' does not exist")
                continue  # a hub id: only loading it can tell (offline: from the datasets cache)
            if not _is_saved_dataset(Path(name).expanduser()):
                continue
        if next(iter_documents(spec), None) is None:
            folder = kind == "path" and arg.is_dir()
            what = "holds no .txt/.jsonl/.json/.parquet files with text" if folder else "holds no text"
            raise InputError(f"data '{spec}' {what}; give a file or dataset with at least one non-empty document")


def _source_identity(spec: str, seed: int, length_tokens: int | None) -> str:
    """What the documents of `spec` depend on: file paths + sizes + mtimes, a dataset id, or the
    synthetic kind, seed, length and generator source."""
    kind, arg = _parse_spec(spec)
    if kind == "synthetic":
        from longctx.train import synthetic

        code = hashlib.sha256(Path(synthetic.__file__).read_bytes()).hexdigest()[:16]
        return f"synthetic:{arg}:seed={seed}:length_tokens={length_tokens}:code={code}"
    if kind == "hf":
        name, split = arg
        path = Path(name).expanduser()
        return f"hf:{_tree_identity(path) if path.exists() else name}:{split or 'train'}"
    return _tree_identity(arg)


def _tree_identity(path: Path) -> str:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    parts = []
    for f in files:
        st = f.stat()
        parts.append(f"{f.relative_to(path) if f != path else ''}:{st.st_size}:{st.st_mtime_ns}")
    return f"{path.resolve()}|" + ";".join(parts)


def _tokenizer_identity(tokenizer: Any) -> str:
    """sha256 of the fast tokenizer's full definition (vocab, merges, normalizer), else of its vocab."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(f"|eos={tokenizer.eos_token_id}".encode())
    return h.hexdigest()


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# --- tokenization cache -------------------------------------------------------------------------


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


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished temp dir into place; if another process got there first, keep theirs."""
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / "meta.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _building(final: Path) -> Iterator[Path]:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        yield tmp
        _publish(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class _Pool:
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
            if meta["version"] == _CACHE_VERSION and (meta["exhausted"] or meta["tokens"] >= budget):
                return d
    return None


def _token_pool(specs: Sequence[str], tokenizer: Any, budget: int, *, seed: int, length_tokens: int | None,
                cache_dir: Path, log: Callable[[str], None]) -> _Pool:
    identity = {"version": _CACHE_VERSION, "tokenizer": _tokenizer_identity(tokenizer),
                "sources": [_source_identity(s, seed, length_tokens) for s in specs]}
    source_key = _hash(identity)[:20]
    found = _find_token_cache(cache_dir, source_key, budget)
    if found is not None:
        log(f"reusing tokenized data {found} for {', '.join(specs)}")
        return _Pool(found, source_key, budget)
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

    with _building(final) as tmp, open(tmp / "tokens.bin", "wb") as out, \
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
        (tmp / "meta.json").write_text(json.dumps({
            "version": _CACHE_VERSION, "specs": list(specs), "identity": identity, "budget": budget,
            "tokens": total, "documents": len(lengths), "exhausted": exhausted, "dtype": dtype.name,
            "eos_token_id": tokenizer.eos_token_id, "tokens_per_source": taken}, indent=1))
    return _Pool(final, source_key, budget)


# --- packing ------------------------------------------------------------------------------------


def _pieces(pools: list[_Pool], seq_len: int) -> dict[str, np.ndarray]:
    """Every document of every pool cut into pieces of at most seq_len tokens."""
    cols: dict[str, list[np.ndarray]] = {"pool": [], "start": [], "length": [], "doc_end": []}
    for p, pool in enumerate(pools):
        doc_start, doc_stop = pool.doc_offsets[:-1], pool.doc_offsets[1:]
        n = (doc_stop - doc_start + seq_len - 1) // seq_len
        first = np.repeat(np.cumsum(n) - n, n)
        k = np.arange(int(n.sum())) - first  # piece number within its document
        start = np.repeat(doc_start, n) + k * seq_len
        stop = np.repeat(doc_stop, n)
        length = np.minimum(seq_len, stop - start)
        cols["pool"].append(np.full(len(start), p, dtype=np.uint8))
        cols["start"].append(start)
        cols["length"].append(length.astype(np.int32))
        cols["doc_end"].append(start + length == stop)
    return {k: np.concatenate(v) for k, v in cols.items()}


def _pack(lengths: np.ndarray, order: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """First-fit packing of pieces (taken in `order`) into sequences with a few kept open.
    Returns (piece indices in sequence order, offsets into it per sequence)."""
    open_seqs: list[list] = []  # [free tokens, piece indices]
    flat, offsets = array.array("q"), array.array("q", [0])

    def close(pieces: list[int]) -> None:
        flat.extend(pieces)
        offsets.append(len(flat))

    chunk = 1 << 20  # Python ints for a million pieces at a time, not for all of them
    for at in range(0, len(order), chunk):
        block = order[at:at + chunk]
        for idx, n in zip(block.tolist(), lengths[block].tolist()):
            for j, seq in enumerate(open_seqs):
                if seq[0] >= n:
                    seq[0] -= n
                    seq[1].append(idx)
                    if seq[0] == 0:
                        close(open_seqs.pop(j)[1])
                    break
            else:
                if n == seq_len:
                    close([idx])
                    continue
                open_seqs.append([seq_len - n, [idx]])
                if len(open_seqs) > _OPEN_SEQUENCES:
                    close(open_seqs.pop(0)[1])
    for seq in open_seqs:
        close(seq[1])
    return np.frombuffer(flat, dtype=np.int64), np.frombuffer(offsets, dtype=np.int64)


class PackedDataset:
    """Packed `seq_len` sequences over memory-mapped token pools; see the module docstring."""

    def __init__(self, plan_dir: Path, pools: list[_Pool], *, seq_len: int, pad_id: int, seed: int,
                 fingerprint: str, stats: dict[str, Any]):
        self.seq_len, self.fingerprint, self.stats = seq_len, fingerprint, stats
        self.pad_id, self.seed = pad_id, seed
        self.plan_dir = plan_dir
        self._token_files = [(str(p.tokens.filename), p.tokens.dtype.str) for p in pools]
        self._open()

    _STATE = ("seq_len", "fingerprint", "stats", "pad_id", "seed", "plan_dir", "_token_files")

    def _open(self) -> None:
        self._tokens = [np.memmap(f, dtype=np.dtype(dtype), mode="r") for f, dtype in self._token_files]
        plan = {k: np.load(self.plan_dir / f"{k}.npy", mmap_mode="r")
                for k in ("pool", "start", "length", "doc_end", "seq_offsets")}
        self._pool, self._start, self._length = plan["pool"], plan["start"], plan["length"]
        self._doc_end, self._seq_offsets = plan["doc_end"], plan["seq_offsets"]
        self._epoch_order: tuple[int, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Memory maps would pickle as full copies: a DataLoader worker process reopens the files instead.
        return {k: self.__dict__[k] for k in self._STATE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return len(self._seq_offsets) - 1

    def order(self, epoch: int) -> np.ndarray:
        """The sequence order of one epoch (a permutation derived from the seed and the epoch)."""
        if self._epoch_order is None or self._epoch_order[0] != epoch:
            self._epoch_order = (epoch, np.random.default_rng([self.seed, 1, epoch]).permutation(len(self)))
        return self._epoch_order[1]

    def get(self, index: int) -> dict[str, torch.Tensor]:
        """Sequence number `index` (global: epoch = index // len) as int64 tensors of shape [seq_len]."""
        if index < 0:
            raise IndexError(f"sequence index {index} < 0")
        epoch, i = divmod(int(index), len(self))
        seq = int(self.order(epoch)[i])
        input_ids = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        position_ids = np.empty(self.seq_len, dtype=np.int64)
        shift_labels = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        t = 0
        for k in range(int(self._seq_offsets[seq]), int(self._seq_offsets[seq + 1])):
            tokens, start, n = self._tokens[self._pool[k]], int(self._start[k]), int(self._length[k])
            # A piece that does not end its document also predicts the first token of the next piece.
            stop = start + n + (0 if self._doc_end[k] else 1)
            ids = tokens[start:stop]
            input_ids[t:t + n] = ids[:n]
            position_ids[t:t + n] = np.arange(n)
            shift_labels[t:t + len(ids) - 1] = ids[1:]
            t += n
        # Padding is one block of its own positions, so it forms one (ignored) pseudo-document.
        position_ids[t:] = np.arange(self.seq_len - t)
        return {"input_ids": torch.from_numpy(input_ids), "position_ids": torch.from_numpy(position_ids),
                "shift_labels": torch.from_numpy(shift_labels)}


def build_packed_dataset(specs: Sequence[str], tokenizer: Any, seq_len: int, *, num_tokens: int,
                         short_specs: Sequence[str] = (), short_fraction: float = 0.0, seed: int = 0,
                         cache_dir: str | os.PathLike, log: Callable[[str], None] = print) -> PackedDataset:
    """Tokenize (once, cached) and pack `specs` (+ `short_specs` for `short_fraction` of the tokens)
    into `seq_len` sequences; see the module docstring. Call it on the main process first: the other
    ranks then open the finished cache."""
    if seq_len < 2:
        raise InputError(f"seq_len {seq_len} is too short; give at least 2 tokens")
    if num_tokens < 1:
        raise InputError(f"num_tokens {num_tokens} must be positive")
    if not specs:
        raise InputError("no training data given; pass at least one data spec")
    if not 0.0 <= short_fraction < 1.0:
        raise InputError(f"short fraction {short_fraction} must be in [0, 1)")
    if short_fraction > 0 and not short_specs:
        raise InputError(f"short fraction {short_fraction} needs short data; pass short data specs or a fraction of 0")
    if short_specs and short_fraction == 0:
        log(f"short data {', '.join(short_specs)} unused: the short fraction is 0")
        short_specs = ()
    check_data_specs([*specs, *short_specs])
    cache = Path(cache_dir)
    short_budget = round(num_tokens * short_fraction)
    long_budget = num_tokens - short_budget
    pools = [_token_pool(specs, tokenizer, long_budget, seed=seed, cache_dir=cache, log=log,
                         length_tokens=_synthetic_document_tokens(seq_len, short=False))]
    if short_specs:
        pools.append(_token_pool(short_specs, tokenizer, short_budget, seed=seed, cache_dir=cache, log=log,
                                 length_tokens=_synthetic_document_tokens(seq_len, short=True)))
    fingerprint = _hash({"version": _CACHE_VERSION, "pools": [p.source_key for p in pools],
                         "pool_tokens": [p.num_tokens for p in pools], "seq_len": seq_len,
                         "short_fraction": short_fraction, "seed": seed, "num_tokens": num_tokens})
    plan_dir = cache / f"packed-{fingerprint[:20]}"
    if (plan_dir / "meta.json").is_file():
        log(f"reusing packed sequences {plan_dir}")
        stats = json.loads((plan_dir / "meta.json").read_text())["stats"]
    else:
        with _building(plan_dir) as tmp:
            stats = _write_plan(tmp, pools, seq_len, seed, num_tokens, short_fraction, log)
            (tmp / "meta.json").write_text(json.dumps({"version": _CACHE_VERSION, "fingerprint": fingerprint,
                                                       "stats": stats}, indent=1))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ds = PackedDataset(plan_dir, pools, seq_len=seq_len, pad_id=pad_id, seed=seed, fingerprint=fingerprint, stats=stats)
    log(f"packed {stats['documents']:,} documents ({stats['tokens']:,} tokens, "
        f"{stats['short_token_fraction']:.1%} short) "
        f"into {len(ds):,} sequences of {seq_len:,} tokens ({stats['padding_fraction']:.1%} padding)")
    if stats["epochs"] > 1:
        log(f"the data holds {stats['tokens']:,} tokens, fewer than the {num_tokens:,} requested: "
            f"it repeats for {stats['epochs']:.2f} epochs, each in a new order")
    if short_specs and abs(stats["short_token_fraction"] - short_fraction) > 0.01:
        log(f"short data is {stats['short_token_fraction']:.1%} of the tokens, not the {short_fraction:.1%} asked for: "
            "one of the sources ran out")
    return ds


def _synthetic_document_tokens(seq_len: int, short: bool) -> int:
    """Target length of synthetic documents: a long one fills one sequence with room for the EOS;
    a short one is an eighth of it, so short documents fill the gaps long ones leave."""
    from longctx.train import synthetic

    return max(synthetic.MIN_LENGTH, seq_len // 8 if short else seq_len - 1)


def _write_plan(out: Path, pools: list[_Pool], seq_len: int, seed: int, num_tokens: int,
                short_fraction: float, log: Callable[[str], None]) -> dict[str, Any]:
    pieces = _pieces(pools, seq_len)
    log(f"packing {len(pieces['length']):,} document pieces into {seq_len:,}-token sequences")
    order = np.random.default_rng([seed, 0]).permutation(len(pieces["length"]))
    flat, seq_offsets = _pack(pieces["length"], order, seq_len)
    for k, v in pieces.items():
        np.save(out / f"{k}.npy", v[flat])
    np.save(out / "seq_offsets.npy", seq_offsets)
    sequences = len(seq_offsets) - 1
    tokens = sum(p.num_tokens for p in pools)
    short_tokens = pools[1].num_tokens if len(pools) > 1 else 0
    return {
        "documents": sum(len(p.doc_offsets) - 1 for p in pools),
        "documents_short": len(pools[1].doc_offsets) - 1 if len(pools) > 1 else 0,
        "documents_split": sum(int((np.diff(p.doc_offsets) > seq_len).sum()) for p in pools),
        "tokens": tokens,
        "short_token_fraction": round(short_tokens / tokens, 6),
        "requested_short_fraction": short_fraction,
        "sequences": sequences,
        "padding_fraction": round(1 - tokens / (sequences * seq_len), 6),
        "epochs": round(num_tokens / (sequences * seq_len), 6),
        "sources_exhausted": [p.exhausted for p in pools],
        "source_tokens": [p.source_tokens for p in pools],
    }
