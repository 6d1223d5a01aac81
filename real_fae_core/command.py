"""Commands as functions: each subcommand is a typed config plus ``run(config) -> CommandResult``.

A command module declares its options once, as a dataclass that subclasses
:class:`CommandConfig`, names it ``CONFIG``, and exposes ``run(config)``. The
command line and a Python caller then take the same path::

    fae report RUN_A RUN_B --output out          # argparse -> ReportConfig -> run
    run(ReportConfig(runs=["RUN_A", "RUN_B"], output="out"))   # the same checks

The checks are the core's one strict loader (:mod:`real_fae_core.config`): a
value of the wrong type or outside its field's range is one
:class:`~real_fae_core.errors.UserError` naming the field, whether it came from
a flag, a YAML file (:meth:`CommandConfig.from_yaml`) or a constructor. The
command's own cross-field checks live in ``run`` and so hold for both.

``tests/test_commands.py`` walks every subcommand: its parser's options are the
config's fields, with the same defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, Mapping, TypeVar

from real_fae_core.config import (
    check_mapping,
    init_fields,
    load_config,
    range_problem,
    spelled_like_a_flag,
    value_problem,
)
from real_fae_core.errors import EXIT_OK, UserError

C = TypeVar("C", bound="CommandConfig")


@dataclasses.dataclass
class CommandResult:
    """What a command did: its exit code, the files it wrote, and the numbers a caller reads.

    ``outputs`` maps a name (``"report"``, ``"run_dir"``) to a path;
    ``summary`` holds the command's in-memory result (a run's metrics, a count).
    """

    exit_code: int = EXIT_OK
    outputs: dict[str, str] = dataclasses.field(default_factory=dict)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK


class CommandConfig:
    """Base of a command's config dataclass: checked field by field on construction.

    A ``str`` field takes a path (``pathlib.Path``) too, a ``list`` field a tuple;
    both are stored as the field's type.
    """

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def from_mapping(cls: type[C], values: Mapping[str, Any], source: str = "options") -> C:
        """An instance from a plain mapping (keys spelled like the fields or the flags); an unknown key,
        a missing required field or a bad value is one error naming ``source`` and the key."""
        plain = {k: plain_value(v) for k, v in values.items()}
        return cls(**check_mapping(plain, [cls], lambda _key: source, spell=spelled_like_a_flag))

    @classmethod
    def from_yaml(cls: type[C], path: str | os.PathLike) -> C:
        """An instance from a YAML file: every problem is ``file:line: key: reason``."""
        values, _lines = load_config(path, [cls], spell=spelled_like_a_flag)
        return cls(**values)

    @classmethod
    def from_namespace(cls: type[C], args: argparse.Namespace) -> C:
        """An instance from what argparse parsed (attributes that are not fields, such as the dispatcher's
        ``command``, are left out)."""
        names = init_fields([cls])
        # keys spelled as the flags, so that a bad value is named as the user typed it: `--min-votes`
        given = {"--" + k.replace("_", "-"): plain_value(v) for k, v in vars(args).items() if k in names}
        return cls(**check_mapping(given, [cls], lambda _key: "command line",
                                   spell=lambda flag: flag[2:].replace("-", "_")))

    def replace(self: C, **changes: Any) -> C:
        """A copy with some fields changed, checked again."""
        return dataclasses.replace(self, **changes)


def check_fields(obj: Any) -> None:
    """Raise :class:`UserError` ``Config: field: reason`` for the first field of ``obj`` of the wrong type
    or outside its range; values are converted in place to their field's type (``2.0`` -> 2, a path -> str)."""
    fields = init_fields([type(obj)])
    for name, f in fields.items():
        value = plain_value(getattr(obj, name))
        if isinstance(f.type, type) and isinstance(value, f.type) and dataclasses.is_dataclass(value):
            continue  # a nested config (fae checkpoints' run options) checks itself
        problem, value = value_problem(value, f.type)
        problem = problem or range_problem(f, value)
        if problem:
            raise UserError(f"{type(obj).__name__}: {name}: {problem}")
        object.__setattr__(obj, name, value)


def plain_value(value: Any) -> Any:
    """A path as its string, a tuple as a list (items too): what a flag would have given."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
    return value


def config_type(module: Any) -> type | None:
    """The ``CONFIG`` dataclass of a command module, or None for a module not (yet) a typed command."""
    cls = getattr(module, "CONFIG", None)
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


def exit_code_of(result: Any) -> int:
    """The exit code of what a command's ``run`` returned: a :class:`CommandResult`, an int or None."""
    if isinstance(result, CommandResult):
        return int(result.exit_code)
    return int(result or 0)
