"""Text documents from data specs: what `--data` of `extend` and `sinks` reads.

A spec is a `.txt`/`.md` file (the whole file is one document), a `.jsonl`/`.json` file (a string
"text" field per record; `.json` may also be one JSON list of records), a `.parquet` file (a "text"
column), a directory of such files (all of them, recursively, sorted by path, hidden ones skipped), a
`datasets.save_to_disk` directory, `hf:<dataset id or local path>[:split]` (`datasets.load_dataset` with
`streaming=True`, so only what is read is fetched; "text" column, split "train" by default) or
`synthetic:<kind>` (`longctx.data.synthetic`).
Whitespace-only documents are skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from longctx.checkpoint.hub import hf_home, hub_cache, is_repo_snapshot, offline_variable
from longctx.core.errors import InputError
from longctx.core.hashing import content_sha256s
from longctx.core.parse import LimitError, loads
from longctx.data import synthetic

TEXT_SUFFIXES = (".txt", ".md")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
DATA_SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
FORMS = ("a .txt/.jsonl/.json/.parquet file, a directory of them, a datasets.save_to_disk directory, "
         "hf:<dataset id or path>[:split] or synthetic:<kind>")

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
                for i, record in enumerate(loads(f.read())):
                    yield _record_text(record, f"{path} record {i}")
                return
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield _record_text(loads(line), f"{path} line {n}")
        except (json.JSONDecodeError, LimitError) as e:
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
    """The "text" column of a Dataset or an IterableDataset (whose columns may be known only once read)."""
    names = ds.column_names
    if names is not None:
        if "text" not in names:
            raise InputError(f"dataset {where} has no \"text\" column (columns: {', '.join(names)})")
        ds = ds.select_columns(["text"])
    for batch in ds.iter(batch_size=64):  # a stream reads no further than the batch it is in
        if "text" not in batch:
            raise InputError(f"dataset {where} has no \"text\" column (columns: {', '.join(batch)})")
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


def _offline_variable() -> str | None:
    """The environment variable that makes `datasets` offline, read now: as `datasets.config` does,
    HF_DATASETS_OFFLINE when it is set, else HF_HUB_OFFLINE."""
    return offline_variable("HF_DATASETS_OFFLINE" if "HF_DATASETS_OFFLINE" in os.environ else "HF_HUB_OFFLINE")


def _hub_snapshot(name: str) -> Path | None:
    """The newest snapshot of dataset repo `name` in the hub cache (`hf download --repo-type dataset NAME`)."""
    repo = hub_cache() / f"datasets--{name.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file() and not ref.is_symlink():
        snap = repo / "snapshots" / ref.read_text(encoding="utf-8", errors="replace")[:100].strip()
        if is_repo_snapshot(snap):
            return snap
    snaps = sorted((p for p in (repo / "snapshots").glob("*") if is_repo_snapshot(p)), key=lambda p: p.stat().st_mtime)
    return snaps[-1] if snaps else None


def _in_datasets_cache(name: str) -> bool:
    """Whether `datasets.load_dataset(name)` has prepared `name` before (its cache folder `org___name`)."""
    root = Path(os.environ.get("HF_DATASETS_CACHE") or hf_home() / "datasets").expanduser()
    *org, last = name.split("/")
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", last).lower()  # datasets' camelcase_to_snakecase, roughly
    return any((root / "___".join([*org, n])).is_dir() for n in {last, snake})


def uncached_dataset(spec: str) -> str | None:
    """The `hf download` command that fetches the dataset of an hf:<dataset id> spec when neither the datasets
    cache nor the Hub cache holds it; None for any other spec and for a cached or local dataset."""
    kind, arg = _parse_spec(spec)
    if kind != "hf" or Path(arg[0]).expanduser().exists() or _in_datasets_cache(arg[0]) or _hub_snapshot(arg[0]):
        return None
    return _download_command(arg[0])


def _download_command(name: str) -> str:
    return shlex.join(["hf", "download", "--repo-type", "dataset", name])


def _offline_source(name: str) -> Path | None:
    """Offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): a hub snapshot to load `name` from, None for the
    datasets cache, or InputError at once (no network attempt, no retries) when neither holds it."""
    var = _offline_variable()
    if _in_datasets_cache(name):
        return None
    snapshot = _hub_snapshot(name)
    if snapshot is None:
        raise InputError(f"hf:{name} is not in the local Hugging Face cache and {var}={os.environ[var]}; run once "
                         f"online, or: {_download_command(name)}")
    return snapshot


def _hf_documents(name: str, split: str | None) -> Iterator[str]:
    path = Path(name).expanduser()
    if _is_saved_dataset(path):
        yield from _dataset_documents(_saved_dataset(path, split), f"hf:{name}")
        return
    import datasets

    offline = _offline_variable()
    snapshot = _offline_source(name) if offline and not path.exists() else None
    # Streamed, so reading stops at the token budget instead of downloading and preparing the whole dataset;
    # offline and only in the datasets cache it is already prepared (memory-mapped Arrow), so it is read as is.
    streaming = not (offline and not path.exists() and snapshot is None)
    try:
        ds = datasets.load_dataset(str(snapshot or name), split=split or "train", streaming=streaming)
    except Exception as e:  # noqa: BLE001 - any loader failure is a user-input problem here
        hint = (f"; with {offline}={os.environ[offline]} only local paths and the Hugging Face cache work"
                if offline else "")
        raise InputError(f"could not load dataset '{name}' ({_first_line(e)}){hint}") from None
    try:
        yield from _dataset_documents(ds, f"hf:{name}")
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - a streamed file that cannot be read is the input's problem
        raise InputError(f"could not read dataset '{name}' ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    return f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _raw_documents(spec: str, seed: int, length_tokens: int | None) -> Iterator[str]:
    kind, arg = _parse_spec(spec)
    if kind == "synthetic":
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


def check_data_specs(specs: Sequence[str], offline: bool = True) -> None:
    """InputError (one line) for a spec of unknown form, a path that does not exist or holds no text, and (with
    `offline`) an hf: dataset that is not cached while offline."""
    for spec in specs:
        kind, arg = _parse_spec(spec)
        if kind == "synthetic":
            if arg not in synthetic.KINDS:
                raise InputError(f"unknown synthetic data '{arg}' in '{spec}'; "
                                 f"choose one of {', '.join(synthetic.KINDS)}")
            continue
        if kind == "hf":
            name, _ = arg
            if not Path(name).expanduser().exists():
                if name.startswith((".", "/", "~")):
                    raise InputError(f"dataset path '{name}' in '{spec}' does not exist")
                if offline and _offline_variable():
                    _offline_source(name)  # offline and not cached: refused now, before anything runs
                continue  # a hub id: only loading it can tell
            if not _is_saved_dataset(Path(name).expanduser()):
                continue
        if next(iter_documents(spec), None) is None:
            folder = kind == "path" and arg.is_dir()
            what = "holds no .txt/.jsonl/.json/.parquet files with text" if folder else "holds no text"
            raise InputError(f"data '{spec}' {what}; give a file or dataset with at least one non-empty document")


def source_identity(spec: str, seed: int, length_tokens: int | None) -> str:
    """What the documents of `spec` depend on: its files' names and content, a dataset id (with the commit of its
    Hub snapshot when one is cached), or the synthetic kind, seed, length and generator source."""
    kind, arg = _parse_spec(spec)
    if kind == "synthetic":
        code = synthetic.code_hash()
        return f"synthetic:{arg}:seed={seed}:length_tokens={length_tokens}:code={code}"
    if kind == "hf":
        name, split = arg
        path = Path(name).expanduser()
        snapshot = None if path.exists() else _hub_snapshot(name)
        where = _tree_identity(path) if path.exists() else f"{name}@{snapshot.name}" if snapshot else name
        return f"hf:{where}:{split or 'train'}"
    return _tree_identity(arg)


def _tree_identity(path: Path) -> str:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return ";".join(f"{f.relative_to(path) if f != path else ''}:{digest}"
                    for f, digest in zip(files, content_sha256s(files)))
