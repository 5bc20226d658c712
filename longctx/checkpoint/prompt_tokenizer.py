"""A checkpoint's tokenizer as prompts need it, without transformers (or torch) once its folder has been loaded.

Writing RULER task files needs of a tokenizer its Rust pipeline (`tokenizers.Tokenizer`: the exact token counts),
its chat template rendered around one message, its BOS and special ids, and its fingerprint. transformers builds
all of that from the folder, but importing it takes over a second (it imports torch), and a gated checkpoint's
config registration imports modeling code on top. So the first load of a folder goes through transformers
(`load`: every verb's checks) and keeps what prompts need under longctx's cache, keyed by the content of every
file transformers may read there and by the versions that build it; a later load of the same content reads that
back (`PromptTokenizer`) in a few tens of milliseconds.

What is kept is checked against the tokenizer transformers built before it is kept (the built object is the
oracle): the Rust pipeline's ids must equal the tokenizer's own for a set of probe texts, with and without
special tokens, and the fingerprints must match; otherwise transformers' tokenizer is used as it is, every time.
A chat template is rendered by transformers the first time each conversation is asked for; the rendering is kept
only when the template cannot render differently later (no `strftime_now`, no `random`). Tokenizers that run
their own code (`auto_map`) are never kept. What the cache holds is read back only when sealed by this user for
its entry (`longctx.core.cache`) and within bounds; else it is built again from the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from longctx import __version__
from longctx.core import cache
from longctx.core.files import json_object
from longctx.core.hashing import content_sha256s, hash_json, tokenizer_fingerprint

CACHE_FORMAT = "longctx-prompt-tokenizer/2"
# Bounds of what a cache entry may hold: the largest tokenizer.json on the Hub is tens of MB (Gemma 3: 33 MB).
TOKENIZER_BYTES = 256 << 20
FACTS_BYTES = 64 << 20
RENDERS_BYTES = 64 << 20
# Files transformers never reads to build a tokenizer: weights, by suffix (hashing them would cost seconds).
_WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx",
                              ".npz", ".npy", ".distcp"})
# Texts whose ids the kept pipeline must give exactly as the transformers tokenizer does.
PROBES = ("a", "The quick brown fox jumps over the lazy dog.", "  two  spaces,\ttabs\nand lines\n\n end. ",
          "One of the special magic numbers for long-context is: 1234567.", "naïve café — 東京 ☃ 🙂",
          "What are all the special magic uuids for 4f1b-9c2e mentioned in the provided text?")
# Jinja names whose output can change between two renders of the same conversation.
_UNSTABLE_TEMPLATE = ("strftime_now", "random")


class _Encoded:
    __slots__ = ("input_ids",)

    def __init__(self, ids: list[int]):
        self.input_ids = ids


@dataclass(eq=False)
class PromptTokenizer:
    """What prompt writing reads of a transformers fast tokenizer, under the same names (`backend_tokenizer`,
    `chat_template`, `bos_token`, `apply_chat_template`, `tokenizer(text).input_ids`, `len(tokenizer)`), read
    back from the cache; `transformers_tokenizer()` loads the tokenizer itself when something needs more."""

    backend_tokenizer: Any  # tokenizers.Tokenizer
    name_or_path: str
    chat_template: str | dict | None
    bos_token: str | None
    bos_token_id: int | None
    all_special_ids: list[int]
    vocabulary: int
    load: Callable[[], Any] = field(repr=False)  # transformers' tokenizer of the folder, with every check
    entry: Path | None = field(default=None, repr=False)  # the cache entry, where new renderings are kept
    renders: dict[str, str] = field(default_factory=dict, repr=False)
    loaded: Any = field(default=None, repr=False)
    is_fast: ClassVar[bool] = True

    def __len__(self) -> int:
        return self.vocabulary

    def __call__(self, text: str, add_special_tokens: bool = True) -> _Encoded:
        return _Encoded(self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def transformers_tokenizer(self) -> Any:
        if self.loaded is None:
            self.loaded = self.load()
        return self.loaded

    def apply_chat_template(self, conversation: list[dict], *, tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> Any:
        """transformers' rendering of `conversation` (`tokenize=False`), kept per conversation when the template
        renders the same text every time."""
        key = hash_json({"template": self.chat_template, "conversation": conversation,
                         "add_generation_prompt": add_generation_prompt, "kwargs": kwargs})
        if not tokenize and key in self.renders:
            return self.renders[key]
        real = self.transformers_tokenizer()
        real.chat_template = self.chat_template  # which may have been set after loading, as on the tokenizer itself
        out = real.apply_chat_template(conversation, tokenize=tokenize, add_generation_prompt=add_generation_prompt,
                                       **kwargs)
        if not tokenize and isinstance(out, str) and _stable(self.chat_template):
            self.renders[key] = out
            self._keep_renders()
        return out

    def _keep_renders(self) -> None:
        if self.entry is None:
            return
        path = self.entry / "renders.json"
        renders = {**_renders(cache.read_json(path, RENDERS_BYTES)), **self.renders}
        if sum(len(k) + len(v) for k, v in renders.items()) < RENDERS_BYTES // 2:  # JSON escapes at most double it
            cache.write_json(path, renders)


def transformers_tokenizer(tokenizer: Any) -> Any:
    """The transformers tokenizer behind `tokenizer` (itself when it is one)."""
    return tokenizer.transformers_tokenizer() if isinstance(tokenizer, PromptTokenizer) else tokenizer


def _stable(template: Any) -> bool:
    source = json.dumps(template) if not isinstance(template, str) else template
    return not any(name in source for name in _UNSTABLE_TEMPLATE)


def _runs_own_code(folder: Path) -> bool:
    """Whether transformers would build the tokenizer with code the folder ships (an `AutoTokenizer` entry in
    tokenizer_config.json's or config.json's `auto_map`)."""
    for name in ("tokenizer_config.json", "config.json"):
        with contextlib.suppress(Exception):
            auto_map = json_object(folder / name).get("auto_map")
            if isinstance(auto_map, (list, tuple)) or (isinstance(auto_map, dict) and "AutoTokenizer" in auto_map):
                return True
    return False


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def source_key(folder: str | os.PathLike, trust_remote_code: bool) -> str | None:
    """The cache key of the tokenizer transformers builds from `folder`: every file there it may read (all but
    weights, plus additional_chat_templates/), by content, and the versions of what builds it. None for a
    tokenizer that runs its own code, or a folder that cannot be read."""
    folder = Path(folder)
    try:
        if _runs_own_code(folder):
            return None
        paths = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix not in _WEIGHT_SUFFIXES)
        extra = folder / "additional_chat_templates"
        if extra.is_dir():
            paths += sorted(p for p in extra.iterdir() if p.is_file())
        files = [(p.relative_to(folder).as_posix(), digest) for p, digest in zip(paths, content_sha256s(paths))]
    except OSError:
        return None
    return hash_json({"format": CACHE_FORMAT, "longctx": __version__, "transformers": _version("transformers"),
                      "tokenizers": _version("tokenizers"), "trust_remote_code": bool(trust_remote_code),
                      "files": files})


def _facts(tok: PromptTokenizer) -> dict[str, Any]:
    return {"format": CACHE_FORMAT, "chat_template": tok.chat_template, "bos_token": tok.bos_token,
            "bos_token_id": tok.bos_token_id, "all_special_ids": tok.all_special_ids, "vocabulary": tok.vocabulary,
            "fingerprint": tokenizer_fingerprint(tok)}


def _renders(doc: Any) -> dict[str, str]:
    return {k: v for k, v in doc.items() if isinstance(v, str)} if isinstance(doc, dict) else {}


def _read(entry: Path, name: str, load: Callable[[], Any]) -> PromptTokenizer | None:
    """The tokenizer kept in `entry`, or None when there is none, or it is not whole, not sealed by this user for
    this entry (`longctx.core.cache`), or not the tokenizer its facts describe (then it is built again)."""
    from tokenizers import Tokenizer

    facts = cache.read_json(entry / "facts.json", FACTS_BYTES)
    definition = cache.read(entry / "tokenizer.json", TOKENIZER_BYTES)
    if not isinstance(facts, dict) or facts.get("format") != CACHE_FORMAT or definition is None:
        return None
    try:
        tok = PromptTokenizer(Tokenizer.from_str(definition.decode("utf-8")), name, facts["chat_template"],
                              facts["bos_token"], facts["bos_token_id"], [int(i) for i in facts["all_special_ids"]],
                              int(facts["vocabulary"]), load, entry)
    except Exception:  # noqa: BLE001 - sealed by an older longctx in another shape: built again
        return None
    if tokenizer_fingerprint(tok) != facts["fingerprint"]:
        return None
    tok.renders = _renders(cache.read_json(entry / "renders.json", RENDERS_BYTES))
    return tok


def _twin(real: Any, name: str, load: Callable[[], Any]) -> PromptTokenizer | None:
    """A `PromptTokenizer` of the transformers tokenizer `real`, or None when it is not fast or its Rust pipeline
    alone does not give the tokenizer's ids for every probe text (then `real` is used as it is)."""
    from tokenizers import Tokenizer

    backend = getattr(real, "backend_tokenizer", None)
    if not getattr(real, "is_fast", False) or backend is None:
        return None
    special = getattr(real, "all_special_ids", None) or []
    tok = PromptTokenizer(Tokenizer.from_str(backend.to_str()), name, getattr(real, "chat_template", None),
                          getattr(real, "bos_token", None), getattr(real, "bos_token_id", None), list(special),
                          len(real), load, loaded=real)
    for text in PROBES:
        for add in (True, False):
            if list(real(text, add_special_tokens=add).input_ids) != tok(text, add_special_tokens=add).input_ids:
                return None
    return tok if tokenizer_fingerprint(tok) == tokenizer_fingerprint(real) else None


def _keep(key: str, tok: PromptTokenizer) -> None:
    """Keep `tok` as the cache entry of `key`, its facts last (what a reader looks for first); a full or read-only
    cache keeps nothing, which only costs time."""
    entry = cache.folder("tokenizers", key)
    if entry is not None and (cache.write(entry / "tokenizer.json", tok.backend_tokenizer.to_str().encode())
            and cache.write_json(entry / "facts.json", _facts(tok))):
        tok.entry = entry


def cached_tokenizer(folder: str | os.PathLike, trust_remote_code: bool, load: Callable[[], Any]) -> Any:
    """The tokenizer of `folder` for writing prompts: a `PromptTokenizer` read from the cache when this content
    was loaded before; else `load()` (transformers, with its checks and refusals), kept as a `PromptTokenizer`
    when its pipeline alone gives its ids, or returned as it is when not."""
    key = source_key(folder, trust_remote_code)
    if key is None:
        return load()
    entry = cache.folder("tokenizers", key, make=False)
    tok = _read(entry, str(folder), load) if entry is not None else None
    if tok is not None:
        return tok
    real = load()
    tok = _twin(real, str(folder), load)
    if tok is None:
        return real
    _keep(key, tok)
    return tok
