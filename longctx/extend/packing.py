"""Packing for `extend`: tokenized documents into `seq_len` sequences with document masking.

Packing (deterministic given the seed): documents longer than `seq_len` are cut into `seq_len`
pieces and all pieces of both pools are shuffled together. `split` (the default) lays them end to end and
cuts every `seq_len` tokens, so a piece that does not fit the rest of a sequence continues at the start of
the next one; sources that hold the budget fill exactly the ceil(num_tokens / seq_len) sequences it makes
(none padded; the tokens read past it are not packed), smaller ones pad only their last sequence. `whole`
packs whole pieces first-fit into sequences (a few stay open, so short pieces fill the gaps long ones leave)
and the unfilled tails are padding.
`position_ids` restart at 0 at every piece: with attention_mask=None transformers masks each document separately
(`masking_utils.find_packed_sequence_indices`). `stream` lays sequences out as `split` does but keeps each one
causal stream: positions run 0..seq_len-1 across its documents, nothing masks one document from the next, and a
document's last token (its EOS) predicts the next one's first, as GPT-style pretraining packs (so the first token of
every training sequence is seen by all the others, as the first token of a window is). A `stream` sequence is one
text, so it begins as the tokenizer begins a text: with its BOS when it adds one (as Llama's does, and a
`longctx init --bpe-bos` BPE), then `seq_len - 1` stream tokens; `sinks` windows and prompts begin with the same
token. The long/short mix is decided per token budget (`num_tokens` rounded up to whole sequences):
`short_fraction` of it is read from the short sources, the rest from the long ones, and both are packed
together, so the fraction holds over an epoch rather than in every sequence.
The plan is cached as `packed-<fingerprint>/` beside the token caches.

Synthetic long documents are generated to fill one sequence (`seq_len - 1` tokens plus the EOS),
synthetic short ones at an eighth of it.

Epochs: one epoch holds every document token once; `get(index)` maps a global sequence number to
(epoch, position) and each epoch visits the sequences in its own seed-derived order. When the
sources hold fewer than `num_tokens` tokens the epochs repeat (logged, and in `stats["epochs"]`).
"""

from __future__ import annotations

import array
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longctx.core import cache
from longctx.core.errors import InputError
from longctx.core.files import atomic_dir
from longctx.core.hashing import hash_json
from longctx.core.special_tokens import leading_bos
from longctx.data import synthetic
from longctx.data.sources import check_data_specs
from longctx.extend.loss import IGNORE_INDEX
from longctx.extend.settings import PACKING_MODES
from longctx.extend.tokens import (
    CACHE_VERSION,
    Pool,
    arrays_intact,
    cache_refusal,
    remove_unverified,
    token_pool,
    write_sealed_meta,
)

# Sequences kept open while packing: more fills gaps better, each costs a scan per piece.
_OPEN_SEQUENCES = 16
# Version of the split packing rule, part of a packed plan's fingerprint: a plan packed by an older rule is
# never reused (2: a stream that holds the budget is cut at it, `_split_pack`).
_SPLIT_RULE = 2
# The arrays of a packed plan (pieces of documents, and where each sequence's pieces start).
PLAN_ARRAYS = ("pool", "start", "length", "doc_end", "seq_offsets")


def _pieces(pools: list[Pool], seq_len: int) -> dict[str, np.ndarray]:
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


def _split_pack(pieces: dict[str, np.ndarray], order: np.ndarray, seq_len: int, budget: int
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The pieces in `order` laid end to end and cut every `seq_len` tokens: a piece a sequence boundary falls
    in becomes two (the first does not end its document, so it predicts the second's first token; positions
    restart in each, as they do at every piece). A stream that holds the `budget` (whole sequences) is cut
    there (its tail is never trained; a cut piece still predicts its document's next token), so no sequence
    is padded; a shorter one keeps every token and only its last sequence is padded. Returns the new pieces
    in sequence order and the offsets of each sequence into them."""
    length = pieces["length"][order].astype(np.int64)
    ends = np.cumsum(length)
    starts = ends - length
    total = int(ends[-1]) if len(ends) else 0
    if total >= budget:
        total = budget
        starts = starts[starts < total]
    # every cut point of the stream: piece starts and sequence boundaries, each once
    cuts = np.union1d(starts, np.arange(0, total, seq_len))
    piece = np.searchsorted(ends, cuts, side="right")  # which (ordered) piece each new piece lies in
    new_len = np.diff(np.append(cuts, total))
    offset = cuts - starts[piece]  # where in its piece a new piece starts
    src = order[piece]
    out = {"pool": pieces["pool"][src], "start": pieces["start"][src] + offset,
           "length": new_len.astype(np.int32),
           "doc_end": pieces["doc_end"][src] & (offset + new_len == length[piece])}
    return out, np.append(np.searchsorted(cuts, np.arange(0, total, seq_len)), len(cuts))


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

    def __init__(self, plan_dir: Path, pools: list[Pool], *, seq_len: int, pad_id: int, seed: int,
                 fingerprint: str, stats: dict[str, Any], stream: bool = False, bos_id: int | None = None):
        self.seq_len, self.fingerprint, self.stats = seq_len, fingerprint, stats
        self.pad_id, self.seed, self.stream, self.bos_id = pad_id, seed, stream, bos_id
        self.plan_dir = plan_dir
        self._token_files = [(str(p.tokens.filename), p.tokens.dtype.str) for p in pools]
        self._open()

    _STATE = ("seq_len", "fingerprint", "stats", "pad_id", "seed", "stream", "bos_id", "plan_dir", "_token_files")

    def _open(self) -> None:
        self._tokens = [np.memmap(f, dtype=np.dtype(dtype), mode="r") for f, dtype in self._token_files]
        plan = {k: np.load(self.plan_dir / f"{k}.npy", mmap_mode="r") for k in PLAN_ARRAYS}
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
        """Sequence number `index` (global: epoch = index // len) as int64 tensors of shape [seq_len], and
        `tokens`: how many of them (a 0-d tensor) are document tokens, the rest padding."""
        if index < 0:
            raise IndexError(f"sequence index {index} < 0")
        epoch, i = divmod(int(index), len(self))
        seq = int(self.order(epoch)[i])
        input_ids = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        position_ids = np.empty(self.seq_len, dtype=np.int64)
        shift_labels = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        t = 0
        if self.bos_id is not None:  # a stream sequence led by the tokenizer's BOS (its plan was cut at seq_len - 1)
            input_ids[0], t = self.bos_id, 1
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
        if self.stream:  # one causal stream: positions run on, and each piece's last token predicts the next piece
            position_ids[:] = np.arange(self.seq_len)
            shift_labels[:t - 1] = input_ids[1:t]  # the BOS predicts the stream's first token
        return {"input_ids": torch.from_numpy(input_ids), "position_ids": torch.from_numpy(position_ids),
                "shift_labels": torch.from_numpy(shift_labels), "tokens": torch.tensor(t)}


def build_packed_dataset(specs: Sequence[str], tokenizer: Any, seq_len: int, *, num_tokens: int,
                         short_specs: Sequence[str] = (), short_fraction: float = 0.0, seed: int = 0,
                         packing: str = "split", cache_dir: str | os.PathLike, workers: int = 1,
                         log: Callable[[str], None] = print) -> PackedDataset:
    """Tokenize (once, cached, in `workers` processes) and pack `specs` (+ `short_specs` for `short_fraction` of
    the tokens) into `seq_len` sequences; see the module docstring. Call it on the main process first: the other
    ranks then open the finished cache."""
    short_specs = _checked_arguments(specs, seq_len=seq_len, num_tokens=num_tokens, short_specs=short_specs,
                                     short_fraction=short_fraction, packing=packing, workers=workers, log=log)
    cache_folder = Path(cache_dir)
    budget = -(-num_tokens // seq_len) * seq_len  # whole sequences
    bos_id = leading_bos(tokenizer) if packing == "stream" else None  # a stream sequence is one text
    short_budget = round(budget * short_fraction)
    long_budget = budget - short_budget
    pools = [token_pool(specs, tokenizer, long_budget, seed=seed, cache_dir=cache_folder, log=log, workers=workers,
                         length_tokens=_synthetic_document_tokens(seq_len, short=False))]
    if short_specs:
        pools.append(token_pool(short_specs, tokenizer, short_budget, seed=seed, cache_dir=cache_folder, log=log,
                                 workers=workers, length_tokens=_synthetic_document_tokens(seq_len, short=True)))
    fingerprint = hash_json({"version": CACHE_VERSION, "pools": [p.source_key for p in pools],
                             "pool_tokens": [p.num_tokens for p in pools], "seq_len": seq_len,
                             "short_fraction": short_fraction, "seed": seed, "num_tokens": num_tokens,
                             **({} if packing == "whole" else {"packing": packing, "rule": _SPLIT_RULE}),
                             **({} if bos_id is None else {"bos": bos_id})})
    plan_dir = cache_folder / f"packed-{fingerprint[:20]}"
    stats = _verified_stats(plan_dir, fingerprint)
    if stats is not None:
        log(f"reusing packed sequences {plan_dir}")
    else:
        remove_unverified(plan_dir)
        try:
            with atomic_dir(plan_dir, keep_existing="meta.json") as tmp:
                stats = _write_plan(tmp, pools, seq_len=seq_len, seed=seed, num_tokens=num_tokens,
                                    short_fraction=short_fraction, packing=packing, log=log,
                                    body_len=seq_len - (bos_id is not None))
                write_sealed_meta(tmp, plan_dir, {"version": CACHE_VERSION, "fingerprint": fingerprint,
                                                  "stats": stats}, [f"{k}.npy" for k in PLAN_ARRAYS])
        except OSError as e:
            raise cache_refusal(e, cache_folder) or e from None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ds = PackedDataset(plan_dir, pools, seq_len=seq_len, pad_id=pad_id, seed=seed, fingerprint=fingerprint, stats=stats,
                       stream=packing == "stream", bos_id=bos_id)
    _log_packed(len(ds), stats, seq_len, num_tokens, short_fraction if short_specs else None, log)
    return ds


def _checked_arguments(specs: Sequence[str], *, seq_len: int, num_tokens: int, short_specs: Sequence[str],
                       short_fraction: float, packing: str, workers: int,
                       log: Callable[[str], None]) -> Sequence[str]:
    """InputError for an argument `build_packed_dataset` cannot use; the short data specs it uses (none, said,
    when the short fraction is 0)."""
    if seq_len < 2:
        raise InputError(f"seq_len {seq_len} is too short; give at least 2 tokens")
    if num_tokens < 1:
        raise InputError(f"num_tokens {num_tokens} must be positive")
    if not specs:
        raise InputError("no training data given; pass at least one data spec")
    if packing not in PACKING_MODES:
        raise InputError(f"unknown packing '{packing}'; choose one of {', '.join(PACKING_MODES)}")
    if workers < 1:
        raise InputError(f"tokenize workers {workers} must be at least 1")
    if not 0.0 <= short_fraction < 1.0:
        raise InputError(f"short fraction {short_fraction} must be in [0, 1)")
    if short_fraction > 0 and not short_specs:
        raise InputError(f"short fraction {short_fraction} needs short data; pass short data specs or a fraction of 0")
    if short_specs and short_fraction == 0:
        log(f"short data {', '.join(short_specs)} unused: the short fraction is 0")
        short_specs = ()
    check_data_specs([*specs, *short_specs])
    return short_specs


def _log_packed(sequences: int, stats: dict[str, Any], seq_len: int, num_tokens: int, short_fraction: float | None,
                log: Callable[[str], None]) -> None:
    """What was packed, and where it differs from what was asked (`short_fraction`: None without short data)."""
    packed = stats.get("tokens_packed", stats["tokens"])
    log(f"packed {stats['documents']:,} documents ({stats['tokens']:,} tokens, "
        f"{stats['short_token_fraction']:.1%} short) "
        f"into {sequences:,} sequences of {seq_len:,} tokens ({stats['padding_fraction']:.1%} padding)"
        + (f"; {packed:,} of the tokens fill the budget, the rest is not trained" if packed < stats["tokens"]
           else ""))
    if stats["epochs"] > 1:
        log(f"the data holds {stats['tokens']:,} tokens, fewer than the {num_tokens:,} requested: "
            f"it repeats for {stats['epochs']:.2f} epochs, each in a new order")
    if short_fraction is not None and abs(stats["short_token_fraction"] - short_fraction) > 0.01:
        log(f"short data is {stats['short_token_fraction']:.1%} of the tokens, not the {short_fraction:.1%} asked for: "
            "one of the sources ran out")


def _verified_stats(plan_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    """The stats of the packed plan `plan_dir` when its meta.json is sealed by this user for it
    (`longctx.core.cache`), is this plan's, and every array it names holds the content it recorded; else None (the
    plan is built again: a damaged cache costs time, never a refusal)."""
    meta = cache.read_json(plan_dir / "meta.json", 1 << 20)
    try:
        stats = meta["stats"]
        if (meta["version"] != CACHE_VERSION or meta["fingerprint"] != fingerprint
                or not all(isinstance(stats[k], (int, float)) for k in ("documents", "tokens", "short_token_fraction",
                                                                          "padding_fraction", "epochs"))):
            return None
    except (KeyError, TypeError):
        return None
    return stats if arrays_intact(plan_dir, meta, [f"{k}.npy" for k in PLAN_ARRAYS], lambda name: 1 << 40) else None


def _synthetic_document_tokens(seq_len: int, short: bool) -> int:
    """Target length of synthetic documents: a long one fills one sequence with room for the EOS;
    a short one is an eighth of it, so short documents fill the gaps long ones leave."""
    return max(synthetic.MIN_LENGTH, seq_len // 8 if short else seq_len - 1)


def _write_plan(out: Path, pools: list[Pool], *, seq_len: int, seed: int, num_tokens: int,
                short_fraction: float, packing: str, log: Callable[[str], None], body_len: int) -> dict[str, Any]:
    """`body_len`: the document tokens a sequence holds (seq_len, or seq_len - 1 after a BOS)."""
    pieces = _pieces(pools, seq_len)
    log(f"packing {len(pieces['length']):,} document pieces into {seq_len:,}-token sequences ({packing})")
    order = np.random.default_rng([seed, 0]).permutation(len(pieces["length"]))
    if packing in ("split", "stream"):
        pieces, seq_offsets = _split_pack(pieces, order, body_len, -(-num_tokens // seq_len) * body_len)
    else:
        flat, seq_offsets = _pack(pieces["length"], order, seq_len)
        pieces = {k: v[flat] for k, v in pieces.items()}
    for k, v in pieces.items():
        np.save(out / f"{k}.npy", v)
    np.save(out / "seq_offsets.npy", seq_offsets)
    sequences = len(seq_offsets) - 1
    tokens = sum(p.num_tokens for p in pools)
    packed = int(pieces["length"].sum())  # fewer than `tokens` when split packing cut the stream at the budget
    short_tokens = pools[1].num_tokens if len(pools) > 1 else 0
    return {
        "documents": sum(len(p.doc_offsets) - 1 for p in pools),
        "documents_short": len(pools[1].doc_offsets) - 1 if len(pools) > 1 else 0,
        "documents_split": sum(int((np.diff(p.doc_offsets) > seq_len).sum()) for p in pools),
        "tokens": tokens,
        "tokens_packed": packed,
        "short_token_fraction": round(short_tokens / tokens, 6),
        "requested_short_fraction": short_fraction,
        "packing": packing,
        "sequences": sequences,
        "padding_fraction": round(1 - packed / (sequences * body_len), 6),
        "epochs": round(num_tokens / (sequences * seq_len), 6),
        "sources_exhausted": [p.exhausted for p in pools],
        "source_tokens": [p.source_tokens for p in pools],
    }
