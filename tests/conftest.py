"""Shared fixtures: a real 32k SentencePiece tokenizer and tiny checkpoints, all built locally."""

from __future__ import annotations

import contextlib
import json
import os
import sysconfig
import tempfile
from pathlib import Path

import pytest

# transformers copies a checkpoint's own code (--trust-remote-code tests) into HF_MODULES_CACHE, read once
# when it is imported: a temporary one, never the user's ~/.cache/huggingface/modules.
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="longctx-test-modules-"))


def _share_the_cores() -> None:
    """Under `-n N`, each test process and what it starts (torch, a vLLM engine core, `longctx` subprocesses) gets
    its share of the cores as OpenMP threads, unless OMP_NUM_THREADS is set: N processes each running as many
    threads as there are cores spin on each other's cores (on 2 cores with 2 processes the full lane took 989 s with
    2 threads a process, 769 s with 1). Runs at import, before anything here imports torch."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set by xdist in each test process
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


_share_the_cores()


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


@pytest.fixture(scope="session")
def ruler_checkpoint(tmp_path_factory, reference_tokenizer_dir):
    """A tiny random Qwen3 (fp32) with a 4096-token context: long enough for RULER's 2k tasks."""
    from longctx.init.presets import write_tiny_qwen3

    return write_tiny_qwen3(tmp_path_factory.mktemp("rck") / "tiny4k", reference_tokenizer_dir,
                            max_position_embeddings=4096)


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

            from longctx.eval.backends.vllm import cpu_engine_args

            own = cpu_engine_args({"dtype": "float32"}, kwargs)  # as `longctx ruler` starts its engine
            self.llm = LLM(model=str(model), dtype="float32", enforce_eager=True, seed=0, **kwargs, **own)
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

    from longctx.eval.backends.vllm import cpu_engine_environment

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default sizing fails on these machines
    for key, value in cpu_engine_environment({}).items():  # as `longctx ruler` starts its engine
        os.environ.setdefault(key, value)
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


# --- the lanes: `-m "not slow"` (the fast lane) never starts a process, a vLLM engine or a recipe -------------
#
# Every test that starts a process (subprocess, multiprocessing / ProcessPoolExecutor workers, torchrun ranks,
# `longctx` or `vllm serve` as a command), a vLLM engine (`vllm.LLM`, an engine core, the `vllm_engines`
# fixture) or runs a recipe's stages (`longctx run`, `run_recipe`) is marked `slow`. The guard below makes that
# mechanical: while a test that is not marked slow is set up, runs or is torn down, those entry points raise
# `SlowTestNotMarked`, and the test fails even where the code under test catches the error. A session (or
# module) fixture that started one of them, for whichever test first asked for it, is remembered: a later
# unmarked test that uses it fails at set-up too, although it starts nothing itself (it shares what is slow).
# Threads are not processes and stay allowed.

ENGINE_FIXTURES = {"vllm_engines"}  # fixtures that stand for a live vLLM engine whether or not one is running
# The standard library's own probes of the machine (ctypes.util.find_library's `ldconfig -p`, platform's
# `uname -p`, uuid's): no test starting a process, whoever imports them.
_PROBES = {os.path.join(sysconfig.get_paths()["stdlib"], f) for f in ("ctypes/util.py", "platform.py", "uuid.py")}


class SlowTestNotMarked(RuntimeError):
    pass


class _LaneGuard:
    def __init__(self):
        self.item = None  # the unmarked test being set up, run or torn down; None while a slow one is
        self.fixtures: list = []  # the FixtureDefs whose set-up is running now (innermost last)
        self.started: dict[tuple[str, str], str] = {}  # (fixture's baseid, name) -> what its set-up started
        self.violations: list[str] = []

    def check(self, what: str) -> None:
        """Called by every guarded entry point before it starts `what`."""
        if self.fixtures:
            self.started.setdefault(_key(self.fixtures[-1]), what)
        if self.item is None:
            return
        import traceback

        if any(f.filename in _PROBES for f in traceback.extract_stack()[-8:]):
            return
        where = f" (in the set-up of fixture '{self.fixtures[-1].argname}')" if self.fixtures else ""
        msg = (f"{self.item.nodeid}: this test {what}{where}: mark it @pytest.mark.slow (the fast lane, "
               f"-m 'not slow', starts no process, vLLM engine or recipe)")
        self.violations.append(msg)
        raise SlowTestNotMarked(msg)


_guard = _LaneGuard()


def _key(fixturedef) -> tuple[str, str]:
    """A fixture by where it is defined and its name: two modules' fixtures of one name are two fixtures."""
    return fixturedef.baseid, fixturedef.argname


def _shared_slow_fixtures(item) -> list[str]:
    """What the fixtures `item` uses (its own definitions of them, overrides included) started, or stand for."""
    info = getattr(item, "_fixtureinfo", None)
    defs = {name: fds[-1] for name, fds in info.name2fixturedefs.items() if fds} if info is not None else {}
    out = []
    for name in item.fixturenames:
        what = _guard.started.get(_key(defs[name])) if name in defs else None
        if what is not None:
            out.append(f"uses fixture '{name}', whose set-up {what.removeprefix('this test ')}")
        elif name in ENGINE_FIXTURES:
            out.append(f"uses fixture '{name}', which stands for a live vLLM engine")
    return out


def _wrap(owner, name: str, what):
    """Replace `owner.name` by a function that first asks the guard; `what(*args, **kwargs)` describes it."""
    import functools

    original = getattr(owner, name)

    @functools.wraps(original)
    def guarded(*args, **kwargs):
        _guard.check(what(*args, **kwargs))
        return original(*args, **kwargs)

    setattr(owner, name, guarded)


def _command(args) -> str:
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)


def _guard_vllm_llm(module) -> None:
    _wrap(module.LLM, "__init__",
          lambda self, *a, **k: f"starts a vLLM engine (vllm.LLM({k.get('model', a[0] if a else '')!s}))")


def _guard_vllm_core(module) -> None:
    _wrap(module.EngineCore, "__init__", lambda self, *a, **k: "starts a vLLM engine core (vllm EngineCore)")


def _guard_recipes(module) -> None:
    # every stage a recipe runs goes through `_execute` (longctx/recipe/run.py); if it is renamed, rename it here
    assert hasattr(module, "_execute"), "tests/conftest.py guards longctx.recipe.run._execute: update the guard"
    _wrap(module, "_execute", lambda *a, **k: f"runs a recipe stage "
                                              f"({getattr(a[1] if len(a) > 1 else k.get('step'), 'label', '?')})")


# modules guarded when (and if) they are imported: vLLM's import takes seconds, so never for the guard's sake
_GUARDED_MODULES = {"vllm.entrypoints.llm": _guard_vllm_llm, "vllm.v1.engine.core": _guard_vllm_core,
                    "longctx.recipe.run": _guard_recipes}


class _GuardOnImport:
    """A meta-path finder that finds nothing itself: it guards the modules of `_GUARDED_MODULES` once the other
    finders' loaders executed them."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _GUARDED_MODULES:
            return None
        import sys

        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _GUARDED_MODULES[fullname](module)

        spec.loader.exec_module = exec_module  # this spec's loader instance only
        return spec


def _install_guard() -> None:
    import multiprocessing.process
    import multiprocessing.util
    import posix
    import subprocess
    import sys

    _wrap(subprocess.Popen, "_execute_child", lambda self, args, *a, **k: f"starts a process ({_command(args)})")
    _wrap(multiprocessing.process.BaseProcess, "start",
          lambda self: f"starts a process (multiprocessing: {self.name}, target {getattr(self, '_target', None)})")
    # how multiprocessing starts its resource tracker and forkserver (not through subprocess)
    _wrap(multiprocessing.util, "spawnv_passfds", lambda path, args, *a: f"starts a process ({_command(args)})")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(posix, name) and getattr(os, name) is getattr(posix, name):
            # in posix, which os re-exports, as well: pickle finds `posix.system` by name (a test plants a pickle
            # of it), and the wrapper, named as the function it wraps, must be what that name holds
            _wrap(posix, name, lambda *a, _name=name, **k: f"starts a process (os.{_name} {_command(a[:2])})")
            setattr(os, name, getattr(posix, name))
    for module, guard in _GUARDED_MODULES.items():
        if module in sys.modules:
            guard(sys.modules[module])
    sys.meta_path.insert(0, _GuardOnImport())


def _is_slow(item) -> bool:
    return item.get_closest_marker("slow") is not None


@contextlib.contextmanager
def _guarding(item):
    """Guard an unmarked test while the block runs; fail it on any attempt, even one the code under test caught."""
    _guard.item = None if _is_slow(item) else item
    _guard.violations = []
    try:
        yield
    finally:
        violations, _guard.violations, _guard.item = _guard.violations, [], None
        if violations:
            raise SlowTestNotMarked("\n".join(dict.fromkeys(violations)))


class _LanePlugin:
    """The guard's hooks, registered as a plugin: a conftest's own hooks do not see the set-up of session
    fixtures (pytest calls those on the session's hooks, which reach only the conftests at the root)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        _guard.fixtures.append(fixturedef)
        try:
            return (yield)
        finally:
            _guard.fixtures.pop()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        with _guarding(item):
            result = yield
        if not _is_slow(item):
            shared = _shared_slow_fixtures(item)
            if shared:
                raise SlowTestNotMarked(f"{item.nodeid}: this test {'; '.join(shared)}: mark it @pytest.mark.slow")
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        with _guarding(item):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        with _guarding(item):
            return (yield)


def _build_font_cache() -> None:
    """matplotlib builds its font cache on first import by running `fc-list`: do that once, before the guard, so a
    fresh machine's first plotting test is not failed for a process it did not ask for."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib.font_manager  # noqa: F401 (imported for its side effect)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a test process per core this process may use, at most 4, each with 6 GiB of memory (two live vLLM
    engines and a served one fit in 24 GiB)."""
    cores = len(os.sched_getaffinity(0))
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cores, 4, int(memory_gib // 6)))


FILE_SECONDS = Path(__file__).parent / "file_seconds.json"  # a test file's seconds in one process, last recorded


def _file_seconds() -> dict[str, float]:
    try:
        return json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(config, items):
    """The longest files first (their seconds as last recorded in tests/file_seconds.json; a file not recorded yet
    by its count of slow tests, 5 s each): the test processes take whole files in collection order (`--dist
    loadfile`), so the long ones start early and the short ones fill in at the end, instead of a long file
    starting last while the other process idles."""
    recorded = _file_seconds()
    estimate: dict[str, float] = {}
    for item in items:
        f = item.nodeid.split("::")[0]
        estimate[f] = estimate.get(f, 0.0) + 5.0 * _is_slow(item)
    estimate = {f: recorded.get(f, e) for f, e in estimate.items()}
    order = {f: i for i, f in enumerate(sorted(estimate, key=lambda f: -estimate[f]))}  # sorted() is stable
    items.sort(key=lambda item: order[item.nodeid.split("::")[0]])


class _FileSeconds:
    """`LONGCTX_RECORD_SECONDS=1 pytest`: each file's seconds (set-up, call and tear-down of its tests, summed over
    the reports the test processes send) into tests/file_seconds.json, merged over what is there."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report) -> None:
        f = report.nodeid.split("::")[0]
        self.seconds[f] = self.seconds.get(f, 0.0) + report.duration

    def pytest_sessionfinish(self, session) -> None:
        if self.seconds:
            merged = {**_file_seconds(), **{f: round(s, 1) for f, s in self.seconds.items()}}
            FILE_SECONDS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")


def pytest_configure(config):
    _build_font_cache()
    _install_guard()
    config.pluginmanager.register(_LanePlugin(), "longctx-lanes")
    if os.environ.get("LONGCTX_RECORD_SECONDS") == "1" and not hasattr(config, "workerinput"):  # the controller
        config.pluginmanager.register(_FileSeconds(), "longctx-file-seconds")
