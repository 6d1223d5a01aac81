"""Strict YAML for recipes and configs: a key given twice is an error, not a silent override.

PyYAML keeps the last of two equal keys, so a recipe with ``learning_rate``
twice trains at whichever came last. :func:`load_yaml` refuses such a file
naming the key and both lines, and turns every other way a config file can be
unreadable (missing, a directory, not UTF-8, not YAML) into one
:class:`~real_fae_core.errors.UserError` line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from real_fae_core.errors import UserError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # unhashable key: let the base constructor complain
            continue
        line = key_node.start_mark.line + 1
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is given twice (lines {first} and {line})", key_node.start_mark
            )
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse ``text`` strictly; errors name ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = exc.problem or exc.context or "invalid YAML"
        raise UserError(f"{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source}: invalid YAML: {exc}") from None


def load_yaml(path: str | os.PathLike) -> Any:
    """Read and strictly parse a YAML file, with one clear error for every failure."""
    return load_yaml_located(path)[0]


def key_lines(text: str) -> dict[tuple, int]:
    """Line (1-based) of every mapping key and list item, by its path (``("annotators", 1, "model")``)."""
    lines: dict[tuple, int] = {}

    def walk(node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    lines[(*path, key_node.value)] = key_node.start_mark.line + 1
                    walk(value_node, (*path, key_node.value))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*path, i)] = item.start_mark.line + 1
                walk(item, (*path, i))

    walk(yaml.compose(text, Loader=yaml.SafeLoader), ())
    return lines


def load_yaml_located(path: str | os.PathLike) -> tuple[Any, dict[tuple, int]]:
    """:func:`load_yaml` and the line of every key (:func:`key_lines`), for file:line messages."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a directory, not a YAML file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"config file {path} not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    return parse_yaml(text, str(path)), key_lines(text)
