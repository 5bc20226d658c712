"""Shared fixtures: a real 32k SentencePiece tokenizer and tiny checkpoints, all built locally."""

from __future__ import annotations

import os
import tempfile

import pytest

# transformers copies a checkpoint's own code (--trust-remote-code tests) into HF_MODULES_CACHE, read once
# when it is imported: a temporary one, never the user's ~/.cache/huggingface/modules.
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="longctx-test-modules-"))


@pytest.fixture(scope="session")
def reference_tokenizer_dir(tmp_path_factory):
    """Mistral-7B v1 SentencePiece tokenizer (from `mistral_common`) as a transformers fast tokenizer.

    The tokenizer NVIDIA/RULER's golden task files in tests/data/ruler were made with (tokenizer.json
    sha256 37dd4082...).
    """
    from longctx.checkpoint.tokenizer import write_reference_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    write_reference_tokenizer(out)
    return out


# Tiny checkpoints are trained-length 256 so that "a prompt longer than N" stays cheap on 2 cores.
TINY_TRAINED_LENGTH = 256


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, reference_tokenizer_dir):
    """A tiny random Qwen3 checkpoint (fp32, head_dim 64, RoPE base 1e4, max_position_embeddings 256)."""
    from longctx.init.presets import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("ckpt") / "tiny", reference_tokenizer_dir,
                            max_position_embeddings=TINY_TRAINED_LENGTH)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Fingerprint caches go to a per-session temp dir, never the user's ~/.cache."""
    monkeypatch.setenv("LONGCTX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def require_vllm():
    """Import vllm, or skip; in CI (CI=true) or with LONGCTX_REQUIRE_VLLM=1 a missing vllm fails."""
    import os

    try:
        import vllm
    except ImportError:
        if os.environ.get("LONGCTX_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true":
            raise
        pytest.skip("vllm is not installed (pip install 'longctx[cpu]')")
    return vllm


class VllmEngines:
    """One live vLLM engine at a time for the whole test session (start-up costs ~30 s on 2 cores):
    asking for a different checkpoint shuts the previous engine down first."""

    def __init__(self):
        self.key = None
        self.llm = None

    def get(self, model, **kwargs):
        key = (str(model), tuple(sorted(kwargs.items())))
        if key != self.key:
            self.close()
            require_vllm()
            from vllm import LLM

            self.llm = LLM(model=str(model), dtype="float32", enforce_eager=True, seed=0, **kwargs)
            self.key = key
        return self.llm

    def close(self):
        if self.llm is not None:
            import gc

            self.llm.llm_engine.engine_core.shutdown()
            self.llm = self.key = None
            gc.collect()


def user_environment() -> dict[str, str]:
    """This process's environment without the settings the tests' own engines use (for a subprocess that
    should run exactly as a user's command does)."""
    return {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}


@pytest.fixture(scope="session")
def vllm_engines():
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default sizing fails on these machines
    # The engine core in this process instead of a spawned one: the same model code and scheduler, started in
    # ~5 s instead of ~35 s on 2 cores (a spawned process imports torch and vLLM again). `longctx ruler` itself
    # keeps vLLM's default, which the tests that start `vllm serve` or `longctx run` as a user does get back
    # from `user_environment()`.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    engines = VllmEngines()
    yield engines
    engines.close()



@pytest.fixture(scope="session")
def architecture_checkpoint(tmp_path_factory, reference_tokenizer_dir):
    """`get(name, **overrides)`: the tiny checkpoint `name` of tests/architectures.py (config values
    `overrides` changed), built once per session."""
    from architectures import write_tiny_architecture

    root = tmp_path_factory.mktemp("architectures")
    built = {}

    def get(name, **overrides):
        key = (name, tuple(sorted(overrides.items())))
        if key not in built:
            built[key] = write_tiny_architecture(name, root / f"{name}-{len(built)}", reference_tokenizer_dir,
                                                 **overrides)
        return built[key]

    return get


def mark_unread(path) -> int:
    """Set the access time of `path` before its modification time, so that the next read moves it (relatime);
    returns it."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_mtime_ns - 10**12, st.st_mtime_ns))
    return os.stat(path).st_atime_ns


@pytest.fixture(scope="session")
def reads_show(tmp_path_factory):
    """Whether this file system moves the access time on a read (it does under relatime and strictatime): the
    tests that a file outside a folder is never read check it through its access time."""
    f = tmp_path_factory.mktemp("atime") / "probe"
    f.write_bytes(b"x")
    before = mark_unread(f)
    f.read_bytes()
    return os.stat(f).st_atime_ns != before
