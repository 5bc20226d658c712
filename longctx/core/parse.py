"""Bounded parsing of untrusted text: every JSON and YAML document longctx reads goes through here.

Files (configs, safetensors headers, indexes, run files, results of other tools, recipes) and server replies
are untrusted input. Python's `json` recurses once per nesting level and raises `RecursionError` (not a
`ValueError`) on a deeply nested document, and a YAML alias bomb (anchors that name anchors) expands to
billions of nodes for whoever walks it. Here each document is bounded in nesting depth, in size where the
caller says so, and (YAML) in the number of nodes it expands to; a document over a limit raises a
`ValueError` subclass naming the limit, so every reader's existing "is not valid JSON (...)" handling
reports it in one line.
"""

from __future__ import annotations

import json
from typing import Any

# Deeper than any file longctx reads needs (a config.json nests ~4 levels, an lm-eval results file ~5), far
# below the ~1,000 levels at which Python's parser runs out of stack.
MAX_DEPTH = 100
# A recipe is a few hundred nodes; a YAML alias bomb is billions.
MAX_YAML_NODES = 100_000
# The longest integer a document may hold: no count, length or seed has a tenth of this many digits, and Python
# refuses to convert more than 4,300 (with a ValueError about its own limit).
MAX_INT_DIGITS = 100


class LimitError(ValueError):
    """A document over one of the limits above (or a size limit the caller gave)."""


def check_size(size: int, max_bytes: int | None, what: str = "the document") -> None:
    """LimitError when `size` bytes is over `max_bytes` (None: no limit)."""
    if max_bytes is not None and size > max_bytes:
        raise LimitError(f"{what} is {size:,} bytes, over the limit of {max_bytes:,} bytes")


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar: 0), level by level, without recursion (a tokenizer's
    hundreds of thousands of vocabulary entries and merges are gathered by C loops, and looked at once each)."""
    depth, level = 0, [value]
    while True:
        level = [x for x in level if isinstance(x, (dict, list))]
        if not level:
            return depth
        depth += 1
        children: list = []
        for item in level:
            children.extend(item.values() if isinstance(item, dict) else item)
        level = children


def loads(data: str | bytes, *, max_depth: int = MAX_DEPTH, max_bytes: int | None = None) -> Any:
    """`json.loads(data)`, refusing (LimitError) a document nested deeper than `max_depth` or longer than
    `max_bytes`; a syntax error is `json.JSONDecodeError`, also a ValueError."""
    check_size(len(data), max_bytes)
    try:
        value = json.loads(data)
    except RecursionError:
        raise LimitError(f"JSON nested deeper than {max_depth} levels") from None
    if _depth(value) > max_depth:
        raise LimitError(f"JSON nested deeper than {max_depth} levels")
    return value


def load_yaml(text: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_YAML_NODES,
              max_bytes: int | None = None) -> Any:
    """`yaml.safe_load(text)` (merge keys `<<: *anchor` included), refusing a mapping with a key twice (YAML 1.2
    requires unique keys; PyYAML keeps the last one silently), nesting deeper than `max_depth`, a document whose
    aliases expand to more than `max_nodes` nodes, and text longer than `max_bytes` characters. Errors are
    `yaml.YAMLError` (syntax, duplicate keys) or LimitError."""
    import yaml

    check_size(len(text), max_bytes)

    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            # PyYAML's composer recurses once per nesting level (yaml/composer.py, `compose_node`): count the
            # levels, so that deep nesting is a LimitError and not a RecursionError
            self.depth += 1
            try:
                if self.depth > max_depth + 1:
                    raise LimitError(f"YAML nested deeper than {max_depth} levels")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    def mapping(loader: Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` (YAML's merge key): its keys are defaults the mapping's own keys override
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: construct_mapping says so
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found the key {key!r} twice",
                    key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    def integer(loader: Loader, node: yaml.ScalarNode) -> int:
        # Python refuses to convert more than 4,300 digits with a ValueError about its own limit (no YAMLError)
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise LimitError(f"a YAML integer of {digits:,} digits, over the limit of {MAX_INT_DIGITS}")
        return loader.construct_yaml_int(node)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    Loader.add_constructor("tag:yaml.org,2002:int", integer)
    loader = Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_nodes(root, max_depth, max_nodes)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _check_nodes(root: Any, max_depth: int, max_nodes: int) -> None:
    """LimitError when the node graph under `root` (aliases are shared nodes) expands to more than `max_nodes`
    nodes or nests deeper than `max_depth`. Sizes are memoised per node, so a bomb costs its size in YAML, not
    its expansion."""
    import yaml

    size: dict[int, int] = {}
    height: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in size:
            continue
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if not expanded:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in size)
            if len(stack) > max_nodes:
                raise LimitError(f"YAML expands to more than {max_nodes:,} nodes (aliases of aliases?)")
            continue
        size[id(node)] = 1 + sum(size.get(id(c), 0) for c in children)
        height[id(node)] = 1 + max((height.get(id(c), 0) for c in children), default=0)
        if size[id(node)] > max_nodes:
            raise LimitError(f"YAML expands to more than {max_nodes:,} nodes (aliases of aliases?)")
        if height[id(node)] > max_depth + 1:
            raise LimitError(f"YAML nested deeper than {max_depth} levels")
