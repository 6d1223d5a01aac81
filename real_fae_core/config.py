"""The one strict config loader: a YAML mapping checked against the fields of dataclasses.

Training recipes, `fae run` YAML, backend options and annotator files are all
read here. A dataclass declares each option once: its name, type, default and
(in the field's metadata) its range, ``{"min": 1}``, ``{"above": 0.0}``,
``{"below": 1}``, ``{"max": 10}``. Every way a file can be wrong is ONE
:class:`~real_fae_core.errors.UserError` line ``file:line: key: reason``:

- a key given twice (:mod:`real_fae_core.yamlio`), an unknown key (with the
  closest known one), a missing required field;
- a value of the wrong type (``rounds: 1.5``, ``progress: 'off'``; ``2.0``
  means 2 and ``1e-4`` a number, as argparse would read them);
- a value out of its declared range.

Precedence is the one of ``TrlParser`` / alignment-handbook: field defaults <
YAML < command line. The checked mapping becomes the parser's defaults
(argparse never type-checks non-string defaults, so the check happens here),
and :func:`check_ranges` checks the parsed values again, flags included.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import os
import types
import typing
from typing import Any, Callable, Iterable, Mapping

from real_fae_core.errors import UserError
from real_fae_core.yamlio import load_yaml_located

# field metadata keys of a range: inclusive (min, max) and exclusive (above, below) bounds
RANGE_KEYS = ("min", "max", "above", "below")
_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               list: "a list", dict: "a mapping"}
_SCALARS = (bool, int, float, None)


class RangeError(UserError, ValueError):
    """A value outside its field's declared range; ``key`` names the field (a usage error: exit 2)."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


# ---------------------------------------------------------------------------
# Fields
# ---------------------------------------------------------------------------

def init_fields(dataclass_types: Iterable[type]) -> dict[str, dataclasses.Field]:
    """Every constructor field of the dataclasses, by name, each with its resolved type in ``.type``."""
    out: dict[str, dataclasses.Field] = {}
    for dc in dataclass_types:
        hints = typing.get_type_hints(dc)
        for f in dataclasses.fields(dc):
            if f.init:
                f.type = hints.get(f.name, f.type)
                out[f.name] = f
    return out


def is_required(f: dataclasses.Field) -> bool:
    """True for a field with neither a default nor a default factory: a config without it is refused."""
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def suggestion(key: str, known: Iterable[str]) -> str:
    """`` (did you mean 'batch_size'?)`` for a mistyped ``key``, the closest of ``known``; "" when none is close."""
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _allowed(tp) -> list:
    """The plain types a field annotation admits (Union / Optional flattened)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(tp) for t in _allowed(arg)]
    if tp is type(None):
        return [None]
    if origin is typing.Literal:
        return [("literal", typing.get_args(tp))]
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return [(list, args[0] if args else typing.Any)]
    if origin is dict or tp is dict:
        return [dict]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [str]
    return [tp]


def describe(tp) -> str:
    """A field type in words: ``an integer or a number``."""
    words = []
    for a in _allowed(tp):
        if a is None:
            continue
        if isinstance(a, tuple):
            words.append("one of " + ", ".join(map(str, a[1])) if a[0] == "literal" else "a list")
        else:
            words.append(_TYPE_WORDS.get(a, getattr(a, "__name__", str(a))))
    return " or ".join(dict.fromkeys(words)) or "a value"


def _describe_value(value) -> str:
    kind = ("true/false" if isinstance(value, bool) else "a list" if isinstance(value, (list, tuple))
            else "a mapping" if isinstance(value, dict) else type(value).__name__)
    return f"{kind} ({value!r})" if not isinstance(value, (list, dict)) else f"{kind} {value!r}"


def value_problem(value: Any, tp) -> tuple[str | None, Any]:
    """(why ``value`` does not fit the type ``tp``, or None; the value as the field's type)."""
    allowed = _allowed(tp)
    if typing.Any in allowed or object in allowed:
        return None, value
    if value is None:
        return (None, value) if None in allowed else ("must not be empty (null)", value)
    literals = [a[1] for a in allowed if isinstance(a, tuple) and a[0] == "literal"]
    if literals and value in literals[0]:
        return None, value
    if isinstance(value, bool):
        if bool in allowed:
            return None, value
    elif isinstance(value, int):
        if int in allowed:
            return None, value
        if float in allowed:
            return None, float(value)
    elif isinstance(value, float):
        if float in allowed:
            return None, value
        if int in allowed and math.isfinite(value) and value.is_integer():
            return None, int(value)  # `2.0` means 2
        if int in allowed:
            return f"must be a whole number, got {value!r}", value
    elif isinstance(value, str):
        if literals:
            return f"must be one of {', '.join(map(str, literals[0]))}, got {value!r}", value
        if not all(a in _SCALARS for a in allowed):  # a string field, or a list one (argparse reads a string)
            return None, value
        if int in allowed or float in allowed:  # YAML 1.1 reads `1e-4` as a string; argparse converts it
            try:
                number = float(value)
            except ValueError:
                return f"must be {describe(tp)}, got {value!r}", value
            return value_problem(number, tp)
    elif isinstance(value, (list, tuple)):
        lists = [a[1] for a in allowed if isinstance(a, tuple) and a[0] is list]
        if lists:
            for item in value:
                problem, _ = value_problem(item, lists[0])
                if problem or isinstance(item, (list, dict)):
                    return f"list items must be {describe(lists[0])}, got {item!r}", value
            return None, list(value)
    elif isinstance(value, dict):
        if dict in allowed:
            return None, value
    return f"must be {describe(tp)}, got {_describe_value(value)}", value


def range_problem(f: dataclasses.Field, value: Any) -> str | None:
    """Why ``value`` is outside the range in ``f``'s metadata, or None (None values are not ranged)."""
    meta = f.metadata
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if "min" in meta and value < meta["min"]:
        return f"must be >= {meta['min']}, got {value}"
    if "max" in meta and value > meta["max"]:
        return f"must be <= {meta['max']}, got {value}"
    if "above" in meta and not value > meta["above"]:
        return f"must be > {meta['above']}, got {value}"
    if "below" in meta and not value < meta["below"]:
        return f"must be < {meta['below']}, got {value}"
    return None


def check_ranges(obj: Any) -> None:
    """Raise :class:`RangeError` for the first field of the dataclass ``obj`` outside its range.

    Call it from ``__post_init__``: YAML values, flags and direct construction are checked alike.
    """
    for f in dataclasses.fields(obj):
        problem = range_problem(f, getattr(obj, f.name))
        if problem:
            raise RangeError(f.name, problem)


# ---------------------------------------------------------------------------
# Mappings and files
# ---------------------------------------------------------------------------

def check_mapping(data: Mapping, dataclass_types: Iterable[type], where: Callable[[Any], str], *,
                  extra: Iterable[str] = (), spell: Callable[[str], str] = str) -> dict[str, Any]:
    """``data`` checked key by key against the fields; the values converted to their fields' types.

    ``where(key)`` names the place of a key (``file:line``; ``where(None)``: the
    mapping itself), ``extra`` are keys passed through unchecked (a recipe's
    ``env``), ``spell`` turns a key into its field name (``batch-size`` ->
    ``batch_size``). Required fields (no default) must be present.
    """
    fields = init_fields(dataclass_types)
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = spell(str(raw_key))
        if key in extra:
            out[key] = value
            continue
        if key not in fields:
            raise UserError(f"{where(raw_key)}: {raw_key}: unknown key{suggestion(key, fields)}")
        problem, value = value_problem(value, fields[key].type)
        problem = problem or range_problem(fields[key], value)
        if problem:
            raise UserError(f"{where(raw_key)}: {raw_key}: {problem}")
        out[key] = value
    for name, f in fields.items():
        if is_required(f) and name not in out:
            raise UserError(f"{where(None)}: {name}: missing required field")
    return out


def locator(path: str | os.PathLike, lines: Mapping[tuple, int], prefix: tuple = ()) -> Callable[[Any], str]:
    """``where`` for :func:`check_mapping`: ``file:line`` of a key under ``prefix`` (the file alone if unknown)."""
    def where(key) -> str:
        line = lines.get((*prefix, key) if key is not None else prefix)
        return f"{path}:{line}" if line else str(path)

    return where


def load_config(path: str | os.PathLike, dataclass_types: Iterable[type], *, extra: Iterable[str] = (),
                spell: Callable[[str], str] = str) -> tuple[dict[str, Any], dict[tuple, int]]:
    """(the checked options of a YAML file, the line of every key).

    An empty file is no options. Errors: :func:`check_mapping` and
    :func:`real_fae_core.yamlio.load_yaml` (missing file, not UTF-8, bad YAML,
    a key given twice).
    """
    data, lines = load_yaml_located(path)
    if data is None:
        return {}, lines
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of option: value")
    return check_mapping(data, dataclass_types, locator(path, lines), extra=extra, spell=spell), lines


def options_from(dataclass_type: type, values: Mapping[str, Any], source: str = "options"):
    """An instance of ``dataclass_type`` from the keys of ``values`` that are its fields (others ignored).

    Programmatic callers hand a backend a plain dict; its values are checked
    like a file's (``source`` names them in the error).
    """
    names = init_fields([dataclass_type])
    kept = {k: v for k, v in values.items() if k in names}
    return dataclass_type(**check_mapping(kept, [dataclass_type], lambda _key: source))


def spelled_like_a_flag(key: str) -> str:
    """``batch-size`` -> ``batch_size``: YAML keys may be spelled like the flags."""
    return key.replace("-", "_")
