"""Weight files of a checkpoint, checked before any verb works on them.

A checkpoint's weights come from wherever the user got them: a download cut short, a disk that filled
up, a pickle that runs code. Every check here reads headers only (a safetensors header, a PyTorch
archive's pickle with memory-mapped storages), so a verb refuses a bad file with one line before it
loads a model, starts an engine or writes anything.

safetensors (format: https://github.com/huggingface/safetensors#format): 8 bytes, a little-endian u64
`N`; `N` bytes of UTF-8 JSON, an object mapping tensor names to `{"dtype", "shape", "data_offsets"}`
plus an optional `"__metadata__"` map of strings; then the byte buffer. The reference parser
(safetensors/src/tensor.rs) refuses a header over 100 MB, offsets that do not match dtype x shape,
and a buffer the tensors do not cover exactly ("entirely indexed, and cannot contain holes").

`.bin` / `.pt` / `.pth` (PyTorch's zip archive of a pickle): loaded as transformers and vLLM load them
safely, `torch.load(weights_only=True)` (https://pytorch.org/docs/stable/generated/torch.load.html),
memory-mapped so that no tensor data is read.

Which files: those at the folder's top level (vLLM globs them) and every shard a `*.index.json` names in its
`weight_map` (transformers opens those, also in subfolders). A shard name that is absolute or leads out of
the folder is refused before anything is opened (`longctx.checkpoint.paths`); the fingerprint and `yarn`'s
copy cover exactly `weight_files`.
"""

from __future__ import annotations

import math
import os
import pickle
import pickletools
import zipfile
from pathlib import Path
from typing import Any

from longctx.checkpoint.paths import check_inside
from longctx.core.errors import InputError
from longctx.core.hashing import file_version
from longctx.core.parse import LimitError, loads

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# What transformers' Trainer saves beside the weights of a `checkpoint-N/` folder: pickles, not weights.
TRAINER_FILES = ("training_args.bin", "optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state")

# safetensors/src/tensor.rs: MAX_HEADER_SIZE = 100_000_000.
MAX_HEADER_BYTES = 100_000_000

# Bits per element of every dtype the safetensors parser accepts (its `Dtype` enum and `bitsize()`;
# F4 and F6 pack several elements into a byte).
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
    "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}

_RESTORE = "restore it from the original checkpoint"

# Files already found valid in this process, by `file_version`: `checkpoint_dir` runs at every verb's start and
# again inside read_config / fingerprint, and a .bin file's pickle is worth reading once.
_checked: set[tuple[int, ...]] = set()


def index_files(path: Path) -> list[Path]:
    """The `*.index.json` files at the top of the checkpoint directory `path` (where transformers and vLLM look)."""
    return sorted(f for f in path.iterdir() if f.name.endswith(".index.json") and f.is_file())


def index_shards(index: Path) -> list[str]:
    """The shard files the `weight_map` of a sharded checkpoint's index names, relative to its folder and
    normalised, each once; InputError when the index is not valid JSON, names a file outside its folder
    (`longctx.checkpoint.paths`) or one that is not there (transformers and vLLM open every shard)."""
    try:
        doc = loads(index.read_text(encoding="utf-8"))
    except LimitError as e:
        raise InputError(f"'{index}': {e}; {_RESTORE}") from None
    except (OSError, ValueError) as e:
        raise InputError(f"'{index}' is not valid JSON ({e}); {_RESTORE}") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(f"'{index}' has no weight_map of tensor names to shard files; {_RESTORE}")
    # every name is checked before any is opened: a name outside the folder is never read
    shards = sorted({check_inside(index, "shard", shard) for shard in weight_map.values()})
    for shard in shards:
        if not (index.parent / shard).is_file():
            raise InputError(f"'{index}' names the shard '{shard}', which is not in '{index.parent}'; copy the "
                             "missing shard from the original checkpoint")
    return shards


def weight_files(path: Path) -> list[Path]:
    """The weight files a loader of the checkpoint directory `path` may read: those at its top level (vLLM
    globs them; not the Trainer's side files) and every weight shard an index names (transformers follows
    `weight_map`, also into subfolders), each once, sorted by their name relative to `path`. InputError from
    `index_shards` for a broken index."""
    names = {p.name for p in path.iterdir()
             if p.is_file() and p.suffix in WEIGHT_SUFFIXES and not p.name.startswith(TRAINER_FILES)}
    for index in index_files(path):
        names.update(s for s in index_shards(index) if Path(s).suffix in WEIGHT_SUFFIXES)
    return [path / name for name in sorted(names)]


def weight_indexes(path: Path) -> list[Path]:
    """The index files of `path` whose shards are all weight files (`weight_files` holds them): what a copy of
    the weights carries with them (an index of another format, e.g. TensorFlow's, would name files it lacks)."""
    return [i for i in index_files(path) if all(Path(s).suffix in WEIGHT_SUFFIXES for s in index_shards(i))]


def check_weight_files(path: str | os.PathLike) -> None:
    """InputError (one line naming the file) unless every index of the checkpoint directory `path` names only
    shards inside it that are there, and every weight file (`weight_files`) is well formed. Reads headers only."""
    for f in weight_files(Path(path)):
        key = file_version(f)
        if key in _checked:
            continue
        if f.suffix == ".safetensors":
            check_safetensors(f)
        else:
            check_torch_file(f)
        _checked.add(key)


def _bad(file: Path, why: str) -> InputError:
    return InputError(f"'{file}' is not a valid safetensors file: {why}; {_RESTORE}")


def check_safetensors(file: str | os.PathLike) -> None:
    """InputError unless `file` is a well-formed safetensors file, judged from its header and size alone."""
    file = Path(file)
    size = file.stat().st_size
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _bad(file, f"it is {size} bytes, shorter than the 8-byte header length")
        n = int.from_bytes(prefix, "little")
        # Bounded before reading: a corrupt length would otherwise ask for up to 2^64 bytes (MemoryError).
        if n > MAX_HEADER_BYTES:
            raise _bad(file, f"its header length {n} is over the format's limit of {MAX_HEADER_BYTES} bytes")
        if 8 + n > size:
            raise _bad(file, f"its header length {n} runs past the end of the file ({size} bytes; truncated?)")
        raw = f.read(n)
    try:
        header = loads(raw.decode("utf-8"))
    except LimitError as e:
        raise _bad(file, f"its header is {e}") from None
    except ValueError:  # UnicodeDecodeError, json.JSONDecodeError
        raise _bad(file, "its header is not UTF-8 JSON") from None
    if not isinstance(header, dict):
        raise _bad(file, f"its header is a JSON {type(header).__name__}, not an object")
    data_size = size - 8 - n
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise _bad(file, "its __metadata__ is not a map of strings to strings")
            continue
        spans.append((*_tensor_span(file, name, info), name))
    # The reference parser sorts by offsets and requires each tensor to start where the previous ended,
    # the first at 0 and the last at the end of the file: no holes, no overlaps, nothing after.
    spans.sort()
    end = 0
    for begin, stop, name in spans:
        if stop > data_size:
            raise _bad(file, f"tensor '{name}' ends at byte {stop} of the data, past the end of the file "
                             f"({data_size} data bytes; truncated?)")
        if begin != end:
            raise _bad(file, f"tensor '{name}' starts at data byte {begin}, not at {end} where the previous one "
                             f"ends ({'overlap' if begin < end else 'a hole'})")
        end = stop
    if end != data_size:
        raise _bad(file, f"its tensors cover {end} of the {data_size} data bytes")


def _tensor_span(file: Path, name: str, info: object) -> tuple[int, int]:
    """(begin, end) of one header entry's data, after checking its dtype, shape and offsets agree."""
    if not isinstance(info, dict):
        raise _bad(file, f"tensor '{name}' is described by a JSON {type(info).__name__}, not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise _bad(file, f"tensor '{name}' has the unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise _bad(file, f"tensor '{name}' has the shape {shape!r}, not a list of whole numbers >= 0")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_whole(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise _bad(file, f"tensor '{name}' has the data_offsets {offsets!r}, not [begin, end] with begin <= end")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or offsets[1] - offsets[0] != bits // 8:
        need = bits // 8 if bits % 8 == 0 else bits / 8
        raise _bad(file, f"tensor '{name}' spans {offsets[1] - offsets[0]} bytes, but {dtype} x {shape} needs {need}")
    return offsets[0], offsets[1]


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_torch_file(file: str | os.PathLike) -> None:
    """InputError unless `file` loads with `torch.load(weights_only=True, mmap=True)` as a dict of tensors.

    weights_only refuses any pickled object that is not a tensor or a plain container: such an object is
    rebuilt by calling a function the file names, which is how a pickle runs code. The message never
    suggests loading it without weights_only.
    """

    import torch

    file = Path(file)
    if file.stat().st_size == 0:
        raise InputError(f"'{file}' is empty; {_RESTORE}")
    if not zipfile.is_zipfile(file):
        _refuse_plain_pickle(file)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        raise _holds_code(file) from None
    except RuntimeError as e:
        if "mmap can only be used" in str(e):
            raise InputError(f"'{file}' is in PyTorch's legacy (pre-1.6) format, which cannot be memory-mapped; "
                             "convert it to safetensors with a tool you trust") from None
        raise InputError(f"'{file}' is not a readable PyTorch weights file ({_first_line(e)}); {_RESTORE}") from None
    except (OSError, EOFError, ValueError, KeyError, IndexError, TypeError) as e:
        raise InputError(f"'{file}' is not a readable PyTorch weights file ({_first_line(e)}); {_RESTORE}") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise InputError(f"'{file}' holds a {type(state).__name__}, not a state dict of named tensors; {_RESTORE}")


def _holds_code(file: Path) -> InputError:
    return InputError(f"'{file}' holds code, not only tensors; longctx loads weights only; convert it to "
                      "safetensors with a tool you trust")


# Pickle opcodes that look up a global or call one: how a pickle runs code (Lib/pickletools.py names them).
_CODE_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"}


def _refuse_plain_pickle(file: Path) -> None:
    """Refuse a file that is not PyTorch's zip archive: a bare pickle, or PyTorch's pre-1.6 format (a few
    pickles followed by the tensor data), which cannot be memory-mapped. Its first pickle is only read
    (`pickletools.genops` parses opcodes, it never builds an object), to say which of the two it is."""

    try:
        with open(file, "rb") as f:
            names = {op.name for op, _, _ in pickletools.genops(f)}
    except Exception:  # noqa: BLE001 - anything pickletools cannot parse is not a pickle
        raise InputError(f"'{file}' is not a readable PyTorch weights file (truncated or corrupt: neither a zip "
                         f"archive nor a pickle); {_RESTORE}") from None
    if names & _CODE_OPCODES:
        raise _holds_code(file)
    raise InputError(f"'{file}' is in PyTorch's legacy (pre-1.6) format, which cannot be memory-mapped; convert "
                     "it to safetensors with a tool you trust")


def _first_line(e: BaseException) -> str:
    """The first line of an exception's text, cut to 120 characters (never advice to drop weights_only)."""
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else type(e).__name__
    if "weights_only" in text:
        return type(e).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def safetensors_header(file: Path) -> dict[str, Any]:
    """The header of the safetensors file `file`, tensors only (call `check_safetensors` first; this trusts it)."""
    with open(file, "rb") as handle:
        header = loads(handle.read(int.from_bytes(handle.read(8), "little")))
    return {name: info for name, info in header.items() if name != "__metadata__"}


def safetensors_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} over the safetensors files among the `weight_files` of the checkpoint directory
    `path`, from their headers (call `check_weight_files` first; this trusts them)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in weight_files(Path(path)):
        if f.suffix == ".safetensors":
            shapes.update((name, tuple(info["shape"])) for name, info in safetensors_header(f).items())
    return shapes
