"""Benchmark `extend`'s tokenization: tokens/s with 1 and with 2 worker processes, in one run.

It writes a corpus of English-like documents (200-1,500 words, as a parquet file, the form Hub datasets ship
in, or JSONL), tokenizes all of it with the reference 32k SentencePiece tokenizer into a fresh token cache
per worker count (`longctx.extend.tokens.token_pool`, what `longctx extend --tokenize-workers N` runs),
alternating the counts `--repeats` times and keeping each count's fastest run (this VM is noisy), checks the
caches are byte-identical, and projects the hours 80B tokens take on one node. The projection
takes the slower of the workers (tokens/s per worker x cores) and the one reading process (its CPU seconds per
token, measured in the 2-worker run). Target: 2 workers >= 1.8x 1 worker on 2 cores.

    .venv/bin/python scripts/bench_tokenize.py [--documents 20000] [--format parquet|jsonl] [--repeats 2]

The last line is `ratio=<2-worker tokens/s / 1-worker tokens/s>`.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

TARGET = 1.8
PAPER_TOKENS = 80e9
NODE_CORES = (32, 64, 128)

_WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
          "they you were her she there one all we their has been had when more if so no would who what about out up "
          "into them other some then its time only could new these two may first any like now my over such our man "
          "even most made after also did many before must through back years where much your way well down should "
          "because each just those people how too little state good very make world still own see men work long "
          "here get both between life being under never day same another know while last might great old year off "
          "come since against go came right used take three river mountain library question answer history").split()


def write_corpus(folder: Path, documents: int, form: str) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    words = np.array(_WORDS)
    texts = []
    for i in range(documents):
        body = " ".join(words[rng.integers(0, len(words), int(rng.integers(200, 1500)))])
        texts.append(f"{body.capitalize()}. Chapter {i}, page {rng.integers(1, 999)}: café, naïve, 3.14159.\n")
    if form == "jsonl":
        path = folder / "docs.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "docs.parquet"
        pq.write_table(pa.table({"text": texts}), path, row_group_size=1024)
    return path


def tokenize(corpus: Path, tokenizer, cache: Path, workers: int) -> dict:
    from longctx.extend.tokens import token_pool

    cpu = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    pool = token_pool([str(corpus)], tokenizer, 10**12, seed=0, length_tokens=None, cache_dir=cache,
                      log=lambda m: None, workers=workers)
    seconds = time.perf_counter() - start
    used = resource.getrusage(resource.RUSAGE_SELF)
    main_cpu = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    return {"workers": workers, "tokens": pool.num_tokens, "seconds": seconds,
            "tokens_per_s": pool.num_tokens / seconds, "main_cpu_s_per_token": main_cpu / pool.num_tokens,
            "bytes": (pool.directory / "tokens.bin").read_bytes()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, default=20000, help="documents in the corpus (~850 tokens each)")
    ap.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    ap.add_argument("--repeats", type=int, default=2, help="runs per worker count; the fastest counts")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from longctx.checkpoint.tokenizer import write_reference_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_reference_tokenizer(root / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
        corpus = write_corpus(root, args.documents, args.format)
        runs = [tokenize(corpus, tokenizer, root / f"cache-{w}-{i}", w) for i in range(args.repeats) for w in (1, 2)]
    same = len({r.pop("bytes") for r in runs}) == 1
    one, two = (max((r for r in runs if r["workers"] == w), key=lambda r: r["tokens_per_s"]) for w in (1, 2))
    for r in (one, two):
        print(f"workers={r['workers']}  tokens={r['tokens']:,}  seconds={r['seconds']:.2f}  "
              f"tokens/s={r['tokens_per_s']:,.0f}  (best of {args.repeats})")
    print(f"caches byte-identical: {same}")
    per_worker = two["tokens_per_s"] / 2
    reader = 1 / max(two["main_cpu_s_per_token"], 1e-12)
    print(f"per worker {per_worker:,.0f} tokens/s; the reading process alone could feed {reader:,.0f} tokens/s "
          f"({args.format})")
    for cores in NODE_CORES:
        rate = min(per_worker * cores, reader)
        print(f"projection: 80B tokens on a {cores}-core node ~ {PAPER_TOKENS / rate / 3600:.2f} h "
              f"({'reader-bound' if rate == reader else 'worker-bound'})")
    if not same:
        raise SystemExit("the 1- and 2-worker caches differ")
    print(f"target: 2 workers >= {TARGET}x 1 worker")
    print(f"ratio={two['tokens_per_s'] / one['tokens_per_s']:.3f}")


if __name__ == "__main__":
    main()
