"""Commands as functions: each subcommand is a typed config plus ``run(config) -> CommandResult``.

A command module declares its options once, as a dataclass ``XConfig`` that subclasses
:class:`CommandConfig` (a subcommand's registry entry names it, ``"package.module:XConfig"``; a console
script's module names it ``CONFIG``), and exposes ``run(config)``. The
command line and a Python caller then take the same path::

    fae report RUN_A RUN_B --output out          # argparse -> ReportConfig -> run
    run(ReportConfig(runs=["RUN_A", "RUN_B"], output="out"))   # the same checks

The checks are the core's one strict loader (:mod:`real_fae_core.config`): a
value of the wrong type or outside its field's range is one
:class:`~real_fae_core.errors.UserError` naming the field, whether it came from
a flag, a YAML file (:meth:`CommandConfig.from_yaml`) or a constructor. The
command's own cross-field checks live in ``run`` and so hold for both.

The command line is generated from the config (:func:`add_config_arguments`): each field is one
option, its flag, help, positional-ness, choices and old spellings in the field's metadata, so an
option is written once. ``tests/test_commands.py`` walks every subcommand: every field is an option of
its parser, and a command line parses to the config the same values make in Python.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import types
import typing
from typing import Any, ClassVar, Iterable, Literal, Mapping, TypeVar
from urllib.parse import urlsplit

from real_fae_core.config import (
    check_mapping,
    init_fields,
    load_config,
    range_problem,
    spelled_like_a_flag,
    value_problem,
)
from real_fae_core.errors import EXIT_OK, UserError
from real_fae_core.flags import ListFlag, Refused, SpacedList, deprecated_alias, reparsing
from real_fae_core.secrets import MASK, scrub

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
        """True when the command succeeded (exit code 0)."""
        return self.exit_code == EXIT_OK


class CommandConfig:
    """Base of a command's config dataclass: checked field by field on construction.

    A ``str`` field takes a path (``pathlib.Path``) too, a ``list`` field a tuple;
    both are stored as the field's type.
    """

    # What the dispatcher (real_fae_core.cli) reads to build and parse the command line, declared here once:
    #: the fields that are options, in order (None: every field, in field order); a field holding a nested
    #: config (fae checkpoints' run options) stands for that config's fields (:func:`add_command_arguments`)
    COMMAND_FIELDS: ClassVar[tuple[str, ...] | None] = None
    #: ``--config YAML`` (defaults < the file < the command line, :func:`parse_with_config_file`): False, True
    #: (the file's keys are this config's fields), or the configs whose fields they are (a nested config's)
    CONFIG_FILE: ClassVar[bool | tuple[type, ...]] = False
    #: more keywords of the command's parser (``description``, ``epilog``, ``formatter_class``)
    PARSER: ClassVar[Mapping[str, Any]] = {}

    def __post_init__(self) -> None:
        check_fields(self)

    @classmethod
    def config_file_types(cls) -> list[type]:
        """The configs whose fields a ``--config`` YAML file's keys are ([]: the command takes no file)."""
        if cls.CONFIG_FILE is True:
            return [cls]
        return list(cls.CONFIG_FILE or ())

    @classmethod
    def from_parsed(cls: type[C], values: dict[str, Any], parser: argparse.ArgumentParser,
                    from_file: Mapping[str, Any] | None = None) -> C:
        """The config of what the command's ``parser`` gave (``values`` by dest; ``from_file``: what its
        ``--config`` file set): :meth:`from_namespace`, a nested config's fields built into it
        (:func:`nested_fields`: its fields that are no option take the file's value, else their default)."""
        nested = nested_fields(cls)
        if not nested:
            return cls.from_namespace(argparse.Namespace(**values))
        own = {name: values[name] for name in init_fields([cls]) if name not in nested and name in values}
        for name, (inner, exclude) in nested.items():
            inner_values = {k: values[k] for k in field_names(inner) if k not in exclude and k in values}
            defaults = {f.name: f.default for f in dataclasses.fields(inner) if f.name in exclude}
            inner_values.update({k: (from_file or {}).get(k, defaults[k]) for k in exclude})
            own[name] = inner.from_parsed(inner_values, parser)
        return cls(**own)

    def check_command_line(self, argv: list[str], config_file: str | None) -> None:
        """Checks that need the command line itself (``argv``: the command's words; ``config_file``: its
        ``--config`` file or None), run by the dispatcher after parsing: an option set that would be ignored."""

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


# ---------------------------------------------------------------------------
# The command line of a config: one option per field
# ---------------------------------------------------------------------------

# What a field's metadata may say about its option (beside the loader's ranges: min, max, above, below).
ARGUMENT_KEYS = ("help", "metavar", "choices", "positional", "flag", "aliases", "action", "deprecated", "exclusive",
                 "repeat", "group", "exclude", "refuse")


def option(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
           **metadata: Any) -> Any:
    """A config field and its option: ``option(4, help="rounds", min=0)`` is
    ``dataclasses.field(default=4, metadata={"help": "rounds", "min": 0})`` (keys: :data:`ARGUMENT_KEYS` and the
    loader's ranges); no default: a required option."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def add_config_arguments(parser, config: type, names: Iterable[str] | None = None) -> None:
    """Declare one argparse argument per field of the dataclass ``config`` (or of the fields ``names``, in
    that order) on ``parser`` (a parser or an argument group), from the field itself.

    The one generator of every command line but ``real-train``'s (TRL's ``TrlParser``); it never imports
    transformers, so building a parser stays cheap (every subcommand's parser is built on each call of
    ``fae``/``real-data``):

    - the flag is ``--field-name``; metadata ``flag`` another spelling (``--no-progress``), ``aliases`` more
      spellings of the same option (``-o``), ``positional`` True a positional argument (its ``metavar`` the
      name shown);
    - a field without a default is required; the default is the field's (``default_factory`` called);
    - ``int``/``float`` (``| None`` too) are the argparse type; ``list[T]`` takes ``nargs="+"`` of T
      (metadata ``action="append"``: one T per flag), and a list flag given again APPENDS its values, on
      every command (:class:`~real_fae_core.flags.ListFlag`: ``--budgets 100 200 --budgets 300`` is
      [100, 200, 300]); its first use replaces the default, never adds to it. Metadata ``repeat=False``
      refuses a second use (one usage error, exit 2) where appending would be wrong for the field;
      a ``Literal`` gives its values as choices, metadata ``choices`` names others;
    - a bool is ``store_true`` (default False) or ``store_false`` (default True, flag ``--no-field-name``),
      unless its metadata names an ``action`` (``argparse.BooleanOptionalAction``: ``--x`` / ``--no-x``), or
      the config class does for all its bools (its attribute ``BOOL_ACTION``: a config whose values a YAML
      file may set, such as `fae run`'s, needs both spellings so that the command line can undo the file);
    - metadata ``help``, ``metavar``, ``action`` (an Action class; a list's a subclass of ``ListFlag``) go
      to argparse as they are;
      ``deprecated`` lists old spellings, accepted with a warning (:func:`real_fae_core.flags.deprecated_alias`);
      fields with the same ``exclusive`` name are a required mutually exclusive group (exactly one is given);
    - fields with the same metadata ``group`` (``"hf backend"``) go into one ``parser.add_argument_group(group)``
      of this call, shown under that title in ``--help`` (where ``parser`` is itself an argument group, the
      caller has placed the fields: ``group`` is not nested).
    """
    fields = {f.name: f for f in dataclasses.fields(config) if f.init}
    hints = typing.get_type_hints(config)
    bool_action = getattr(config, "BOOL_ACTION", None)
    exclusive: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for name in (fields if names is None else names):
        f = fields[name]
        args, kwargs = argument_of(f, hints[name], bool_action)
        container = parser
        title = f.metadata.get("group")
        if title is not None and isinstance(parser, argparse.ArgumentParser):
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            container = groups[title]
        one_of = f.metadata.get("exclusive")
        if one_of is not None and one_of not in exclusive:
            exclusive[one_of] = container.add_mutually_exclusive_group(required=True)
        (container if one_of is None else exclusive[one_of]).add_argument(*args, **kwargs)
        for old in f.metadata.get("deprecated", ()):
            deprecated_alias(parser, old, f.metadata.get("metavar", name) if f.metadata.get("positional")
                             else args[0])


def nested_fields(config: type) -> dict[str, tuple[type, tuple[str, ...]]]:
    """{field: (its config class, the names of that config's fields that are no option of this command)} of the
    fields of ``config`` that hold a whole config (a dataclass; metadata ``exclude``: those names)."""
    hints = typing.get_type_hints(config)
    return {f.name: (hints[f.name], tuple(f.metadata.get("exclude", ()))) for f in dataclasses.fields(config)
            if f.init and isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])}


def add_command_arguments(parser: argparse.ArgumentParser, config: type) -> None:
    """The options of a command whose config is ``config``: :func:`add_config_arguments` of its
    ``COMMAND_FIELDS`` (a nested config's fields in its place but the field's metadata ``exclude``; those
    that metadata ``refuse`` names are refused, with its reason: :class:`~real_fae_core.flags.Refused`), then
    ``--config YAML`` where the config takes one (``CONFIG_FILE``)."""
    names = getattr(config, "COMMAND_FIELDS", None) or field_names(config)
    nested = nested_fields(config)
    run: list[str] = []
    for name in [*names, None]:
        if name is not None and name not in nested:
            run.append(name)
            continue
        if run:  # consecutive fields in one call: one heading per group
            add_config_arguments(parser, config, run)
            run = []
        if name is not None:
            inner, exclude = nested[name]
            add_config_arguments(parser, inner, [n for n in field_names(inner) if n not in exclude])
    if getattr(config, "config_file_types", lambda: [])():
        parser.add_argument("--config", metavar="YAML", help=CONFIG_FILE_HELP)
    for f in dataclasses.fields(config):
        for refused, reason in f.metadata.get("refuse", {}).items():
            parser.add_argument("--" + refused.replace("_", "-"), action=Refused, reason=reason)


def field_names(*parts: type) -> tuple[str, ...]:
    """The constructor field names of some dataclasses, in order: ``names`` for :func:`add_config_arguments`
    of a config made of parts (a command's own fields, then the backend options it embeds)."""
    return tuple(f.name for part in parts for f in dataclasses.fields(part) if f.init)


def argument_of(f: dataclasses.Field, tp: Any, bool_action: Any = None) -> tuple[list[str], dict[str, Any]]:
    """(the option strings, the ``add_argument`` keywords) of one field (:func:`add_config_arguments`);
    ``bool_action``: the config's ``BOOL_ACTION``, the action of a bool whose metadata names none."""
    meta = f.metadata
    has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    base = tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        base = next(a for a in typing.get_args(tp) if a is not type(None))
    kwargs: dict[str, Any] = {k: meta[k] for k in ("help", "metavar", "choices", "action") if k in meta}
    if base is bool and "action" not in kwargs and bool_action is not None:
        kwargs["action"] = bool_action
    flag = "--" + f.name.replace("_", "-")
    if base is bool and "action" not in kwargs:
        kwargs["action"] = "store_false" if default else "store_true"
        flag = "--no-" + f.name.replace("_", "-") if default else flag
    elif base is bool:  # its own action (argparse.BooleanOptionalAction: --x / --no-x)
        kwargs["default"] = default
    else:
        if typing.get_origin(base) is list:
            base = typing.get_args(base)[0]
            if not meta.get("positional"):  # a flag: repeated, it appends (or, repeat=False, is refused)
                list_flag(kwargs, once=meta.get("repeat", True) is False)
            else:
                kwargs["nargs"] = "+"
        if typing.get_origin(base) is Literal and "choices" not in kwargs:
            kwargs["choices"] = list(typing.get_args(base))
        if base in (int, float):
            kwargs["type"] = base
        if has_default:
            kwargs["default"] = default
    if meta.get("positional"):
        if has_default:
            kwargs.setdefault("nargs", "?")
        return [f.name], kwargs
    if not has_default:
        kwargs["required"] = True
    flag = meta.get("flag", flag)
    if flag[2:].replace("-", "_") != f.name:
        kwargs["dest"] = f.name
    return [flag, *meta.get("aliases", ())], kwargs


def list_flag(kwargs: dict[str, Any], once: bool = False) -> None:
    """The ``add_argument`` keywords of a list flag made a :class:`~real_fae_core.flags.ListFlag`: ``nargs="+"``,
    or one value per flag for metadata ``action="append"``; an Action class of its own must be a ListFlag (its
    repetitions append as every list flag's do)."""
    action = kwargs.get("action")
    if action == "append":
        kwargs["nargs"] = None
        action = None
    if action is None:
        action = ListFlag
    elif not (isinstance(action, type) and issubclass(action, ListFlag)):
        raise TypeError(f"a list option's action must be a ListFlag (repeated, it appends), not {action!r}")
    kwargs["action"] = action
    kwargs.setdefault("nargs", "+")
    if once:
        kwargs["once"] = True


CONFIG_FILE_HELP = "options from a YAML file (keys named like the flags); flags given on the command line win"


def parse_words(parser: argparse.ArgumentParser, argv: list[str],
                command_parser: argparse.ArgumentParser | None = None) -> dict[str, Any]:
    """The values ``parser`` gives ``argv``, by dest; a word it does not know is the usage error of the command's
    own parser (``command_parser``, the subparser where ``parser`` is the dispatcher's): ``fae run: error:
    unrecognized arguments: --roundz 2``, its usage above it."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        (command_parser or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return vars(args)


def parse_with_config_file(parser: argparse.ArgumentParser, argv: list[str], config_types: Iterable[type],
                           command_parser: argparse.ArgumentParser | None = None
                           ) -> tuple[dict[str, Any], str | None, dict[str, Any]]:
    """(the values ``parser`` gives ``argv``, by dest; its ``--config`` YAML file or None; that file's values),
    in the precedence of ``real-train`` (TRL's ``set_defaults_with_config``): field defaults < the YAML file <
    the command line. ``parser`` has a ``--config`` option (dest ``config``, :data:`CONFIG_FILE_HELP`).

    Usage errors and ``--help`` come first, with the true defaults; then the file is read by the one strict
    loader against the fields of ``config_types`` (a typo'd or doubled key, a value of the wrong type or out
    of its range is one :class:`~real_fae_core.errors.UserError` ``file:line: key: reason``), and its values
    become the parser's defaults, so a flag given on the command line wins, even one equal to its default.
    ``command_parser``: the subparser of the command where ``parser`` is its dispatcher's (the file's values
    become that one's defaults)."""
    values = parse_words(parser, argv, command_parser)
    config = values.pop("config", None)
    if not config:
        return values, None, {}
    from_file = load_config(config, list(config_types), spell=spelled_like_a_flag)[0]
    target = parser if command_parser is None else command_parser
    target.set_defaults(**from_file)
    with reparsing(target):  # the command line again, over the file's values (its warnings said once)
        values = parse_words(parser, argv, command_parser)
    values.pop("config", None)
    return values, config, from_file


# ---------------------------------------------------------------------------
# The command line of a config: the generator's inverse
# ---------------------------------------------------------------------------


def given_command_line(prog: str, argv: list[str]) -> str:
    """The command line as the user typed it (``prog`` and its words, shell-quoted), every secret masked: what a
    run records beside its config and what an interrupted command says to rerun, where the words themselves
    (a ``--config`` file, not its values) are what reproduces it. :func:`command_line` writes a config's."""
    return scrub(shlex.join([*prog.split(), *argv]))


def command_line(prog: str, config: Any) -> str:
    """The command that reproduces ``config``: ``prog`` (``"fae study"``) and, for every field whose value is
    not its default, the option :func:`argument_of` declares for it, spelled so that the same parser gives back
    an equal config. What a run records to be resumed with, and what a Python caller's run prints.

    - a bool is its flag (``--gold-only``, ``--no-progress``; ``--x`` / ``--no-x`` for a
      ``BooleanOptionalAction``);
    - a list is its flag and its items (``--budgets 100 200``), one flag per item for metadata
      ``action="append"`` and where an item starts with ``-`` (every list flag appends when repeated);
    - a mapping (``--backend-args``) is ``KEY=VALUE,KEY=VALUE``; any other value is its ``str``, written
      ``--flag=VALUE`` where it starts with ``-``;
    - positional arguments come first (after ``--`` at the end where one starts with ``-``).

    Secrets never reach the line: a password in a URL is masked and every registered secret is scrubbed
    (:mod:`real_fae_core.secrets`; configs name a key's environment variable, never the key). A value the
    parser cannot give back (an empty list, None for a field whose default is not None) is a ValueError naming
    the field.
    """
    hints = typing.get_type_hints(type(config))
    bool_action = getattr(type(config), "BOOL_ACTION", None)
    positional: list[str] = []
    words: list[str] = []
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        value = plain_value(getattr(config, f.name))
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if has_default and value == plain_value(default):
            continue
        args, kwargs = argument_of(f, hints[f.name], bool_action)
        if f.metadata.get("positional"):
            if value is None or value == []:
                raise ValueError(f"{type(config).__name__}: {f.name}: {value!r} has no command line spelling")
            positional += [_shown(v) for v in (value if isinstance(value, list) else [value])]
            if "--" in positional:
                raise ValueError(f"{type(config).__name__}: {f.name}: '--' has no command line spelling")
            continue
        words += _option_words(type(config).__name__, f.name, args[0], kwargs, value)
    if any(p.startswith("-") for p in positional):
        words += ["--", *positional]
        positional = []
    return scrub(shlex.join([*prog.split(), *positional, *words]))


def _option_words(owner: str, name: str, flag: str, kwargs: dict[str, Any], value: Any) -> list[str]:
    """The words of one option whose value is not its default (:func:`command_line`)."""
    action = kwargs.get("action")
    if isinstance(value, bool):
        if action == "store_true" and value:
            return [flag]
        if action == "store_false" and not value:
            return [flag]
        if action not in ("store_true", "store_false"):  # --x / --no-x (argparse.BooleanOptionalAction)
            return [flag if value else "--no-" + flag[2:]]
        raise ValueError(f"{owner}: {name}: {value!r} has no command line spelling ({flag} gives the other value)")
    if value is None or value == []:
        raise ValueError(f"{owner}: {name}: {value!r} has no command line spelling")
    if isinstance(value, dict):
        return [flag, ",".join(f"{k}={_shown(v)}" for k, v in value.items())]
    if isinstance(value, list):
        items = [_shown(v) for v in value]
        if isinstance(action, type) and issubclass(action, SpacedList) and any("," in v for v in items):
            raise ValueError(f"{owner}: {name}: {value!r} has no command line spelling ({flag} splits at commas)")
        if kwargs.get("nargs") is None or any(v.startswith("-") for v in items):
            if kwargs.get("once") and len(items) > 1:
                raise ValueError(f"{owner}: {name}: {value!r} has no command line spelling ({flag} is given once)")
            return [w for v in items for w in _flag_and(flag, v)]  # one item per flag: a repeated list flag appends
        return [flag, *items]
    return _flag_and(flag, _shown(value))


def _flag_and(flag: str, text: str) -> list[str]:
    """``[flag, text]``, or ``[flag=text]`` where the value would read as an option (``-3``, ``-x``)."""
    if text == "--":  # argparse drops it from every option's values
        raise ValueError(f"{flag}: '--' has no command line spelling")
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def _shown(value: Any) -> str:
    """A value as a command line word, a URL's password masked."""
    text = str(value)
    if "@" in text and "://" in text:
        try:
            password = urlsplit(text).password
        except ValueError:
            password = None
        if password:
            text = text.replace(f":{password}@", f":{MASK}@", 1)
    return text
