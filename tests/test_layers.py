"""The package's import order (written in `longctx/__init__.py`): every import, at module level or inside a
function, goes to a lower layer or within its own folder; stages never import each other; nothing imports
the CLI; there are no import circles. Read from the source with `ast`, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The layers, lowest first. A module may import a lower layer, or its own package (folder); packages that
# share a layer are siblings and may not import each other.
LAYERS = [
    ["longctx.core"],
    ["longctx.models", "ruler_tasks"],
    ["longctx"],  # the package root: registers the gated family with transformers
    ["longctx.checkpoint"],
    ["longctx.rope"],
    ["longctx.data", "longctx.info"],
    ["longctx.init", "longctx.convert", "longctx.yarn", "longctx.extend", "longctx.eval", "longctx.sinks"],
    ["longctx.report"],
    ["longctx.recipe"],
    ["longctx.cli"],
    ["longctx.__main__"],  # `python -m longctx`: what torchrun and accelerate launch run
]
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def _modules() -> dict[str, Path]:
    out = {}
    for top in ("longctx", "ruler_tasks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package(module: str) -> str:
    """The layer package a module belongs to: the longest entry of RANK that is a prefix of it."""
    best = max((p for p in RANK if module == p or module.startswith(p + ".")), key=len)
    return best


def _imports(path: Path) -> set[str]:
    """The longctx / ruler_tasks modules `path` imports (a `from package import name` of a submodule counts as
    that submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        for name in names:
            if name.split(".")[0] in ("longctx", "ruler_tasks"):
                while name not in MODULES and "." in name:
                    name = name.rsplit(".", 1)[0]
                found.add(name)
    return found


GRAPH = {m: _imports(p) - {m} for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    assert all(_package(m) for m in MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    here = _package(module)
    for target in sorted(GRAPH[module]):
        there = _package(target)
        if there == here:
            continue
        assert RANK[there] < RANK[here], (f"{module} imports {target}: layer {there} is not below {here} "
                                          f"(order: {LAYERS})")


def test_nothing_imports_the_cli():
    for module, targets in GRAPH.items():
        if _package(module) not in ("longctx.cli", "longctx.__main__"):
            assert not [t for t in targets if t.startswith("longctx.cli")], module


def test_no_import_circles():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(target):], target]))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [module])


def test_the_check_sees_a_violation(tmp_path):
    """The walker finds a lazy import inside a function, so a stage reaching into the CLI would be caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from longctx.cli.main import cli\n    import longctx.report.compare\n")
    assert _imports(bad) == {"longctx.cli.main", "longctx.report.compare"}
