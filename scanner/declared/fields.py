"""Checked reads of what a model folder declares in YAML (card front matter, mergekit configs).

Such files come from anywhere: a malformed field is dropped with a note saying why, never raised, so one bad field
costs its own value and nothing else. YAML itself is read within a budget of what it builds (`load_yaml`): aliases
let a few hundred bytes name ten million nodes, and whatever walks or prints the result (a note quoting a field)
pays for every one of them.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_YAML_NODES = 100_000
"""Nodes a declaration may build once its aliases are expanded; a real card or merge config has a few hundred."""

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlTooLarge(yaml.YAMLError):
    """A YAML document whose aliases expand past the node budget, or refer to themselves."""


def load_yaml(text: str, max_nodes: int = MAX_YAML_NODES) -> Any:
    """``yaml.safe_load`` of one document, refused (`YamlTooLarge`) when its aliases would expand it past
    ``max_nodes`` nodes or make it recursive: the node graph is composed (each alias a reference, cheap), sized as
    if expanded, and only then built into Python values."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node, max_nodes)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expanded_size(root: yaml.Node, max_nodes: int) -> None:
    """Raise YamlTooLarge if the node tree, every alias expanded, holds more than ``max_nodes`` nodes or a cycle.

    Each node is sized once (memo by identity) in a depth-first walk without recursion: a node met again while it is
    still being sized is its own descendant, a recursive alias."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            in_progress.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > max_nodes:
                raise YamlTooLarge(f"its aliases expand it to more than {max_nodes:,} nodes")
            continue
        if key in sizes:
            continue
        if key in in_progress:
            raise YamlTooLarge("an alias refers to a node that contains it (a recursive document)")
        in_progress.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def optional_string(value: Any, field: str, notes: list[str]) -> str | None:
    """``value`` if it is a string or absent; anything else is None, with a note."""
    if value is None or isinstance(value, str):
        return value
    notes.append(f"{field} is a {type(value).__name__}, not a string; ignored")
    return None


def first_line(error: Exception) -> str:
    """An error's first line, at most 200 characters (a YAML error quotes the offending text at length)."""
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
