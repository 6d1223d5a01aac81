"""One spelling per idea across the command-line tools, old spellings kept for one release.

A renamed flag stays accepted until :data:`UNTIL` through :func:`deprecated_alias`:
it is hidden from ``--help`` and prints one line on stderr when used::

    real-data convert: warning: --keep-nei is deprecated; use --include-nei (accepted until 0.2)

List flags take space-separated values (``nargs="+"``), and a list flag given again appends its values
(:class:`ListFlag`: ``--budgets 100 200 --budgets 300`` is [100, 200, 300]) on every command; the first
use replaces the default (a field's, or a YAML file's). ``KEY=VALUE,...`` flags join their pairs
(:class:`KeyValueFlag`), and an option whose one string stands for several values is refused when given
twice (:class:`OnceFlag`): no list option silently keeps only its last value. :class:`SpacedList` also
splits a comma list, with the same kind of warning, for the same release. An option a command refuses
is one line (:class:`Refused`). Light: the standard library and :mod:`real_fae_core.errors` only, so
importing it never slows ``--help``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import types
import typing

from real_fae_core.errors import UserError

UNTIL = "0.2"


def warn_deprecated(prog: str, old: str, new: str) -> None:
    """The one stderr line a deprecated spelling prints."""
    print(f"{prog}: warning: {old} is deprecated; use {new} (accepted until {UNTIL})", file=sys.stderr)


class _DeprecatedAlias(argparse.Action):
    """A hidden option that warns, then acts exactly as the flag it was renamed to."""

    def __init__(self, option_strings, dest, target: argparse.Action, **kwargs):
        super().__init__(option_strings, target.dest, nargs=target.nargs, const=target.const,
                         type=target.type, choices=target.choices, metavar=target.metavar,
                         default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.target = target

    def __call__(self, parser, namespace, values, option_string=None):
        new = max(self.target.option_strings, key=len)
        if not getattr(parser, "_reparsing", False):
            warn_deprecated(parser.prog, option_string, new)
        self.target(parser, namespace, values, new)


@contextlib.contextmanager
def reparsing(parser: argparse.ArgumentParser):
    """``parser`` parsing a command line a second time (a YAML file's values now its defaults:
    :func:`real_fae_core.command.parse_with_config_file`): a deprecated spelling's warning was said once."""
    parser._reparsing = True
    try:
        yield parser
    finally:
        parser._reparsing = False


def is_deprecated(action: argparse.Action) -> bool:
    """True for an old spelling registered by :func:`deprecated_alias` (not one of the command's own flags)."""
    return isinstance(action, _DeprecatedAlias)


def deprecated_positionals(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{old option: positional metavar} of the positional arguments that were once options of ``parser``."""
    return dict(getattr(parser, "_deprecated_positionals", {}))


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Accept ``old`` as a deprecated spelling of ``new`` on ``parser`` until :data:`UNTIL`.

    ``new`` is an option string already on ``parser`` (``--include-nei``) or the
    metavar of one of its positionals (``RUN_DIR``): then ``old VALUE`` (or
    ``old=VALUE``) is read as that positional.
    """
    if new.startswith("-"):
        target = parser._option_string_actions[new]
        parser.add_argument(old, action=_DeprecatedAlias, target=target)
        return
    if not any(not a.option_strings and (a.metavar or a.dest) == new for a in parser._actions):
        raise ValueError(f"{parser.prog}: no positional {new}")
    if not hasattr(parser, "_deprecated_positionals"):
        parser._deprecated_positionals = {}
        parse_known_args = parser.parse_known_args

        def with_positionals(args=None, namespace=None):  # dispatch's subparsers call this too
            args = list(sys.argv[1:] if args is None else args)
            return parse_known_args(_as_positionals(parser, args), namespace)

        parser.parse_known_args = with_positionals
    parser._deprecated_positionals[old] = new


def _as_positionals(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """``args`` with each ``OLD VALUE`` of a deprecated positional alias moved to the front as ``VALUE``."""
    moved, kept, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            kept += args[i:]
            break
        old, eq, value = arg.partition("=")
        new = parser._deprecated_positionals.get(old)
        if new is not None and (eq or i + 1 < len(args)):
            if not getattr(parser, "_reparsing", False):
                warn_deprecated(parser.prog, old, f"the positional {new} ({parser.prog} {new} ...)")
            if not eq:
                i += 1
                value = args[i]
            moved.append(value)
        else:
            kept.append(arg)
        i += 1
    return moved + kept


def _first_use(action: argparse.Action, namespace: argparse.Namespace) -> bool:
    """True while ``action`` has not been used on this command line: the namespace still holds its default
    (the very object: a field's default, or a YAML value the parser took as its default)."""
    current = getattr(namespace, action.dest, None)
    return current is None or current is action.default


def _given_twice(parser: argparse.ArgumentParser, action: argparse.Action, how: str) -> None:
    flag = max(action.option_strings, key=lambda s: (len(s), s.count("-")))
    parser.error(f"argument {flag}: given twice; {how}")


class Refused(argparse.Action):
    """An option a command refuses, with one line saying why (``fae checkpoints --adapter``, ``reason``: "is
    set per checkpoint; give --training-output"): a :class:`~real_fae_core.errors.UserError`, exit 2, as the
    command's other refusals. Hidden from ``--help``; its value, if any, is never read. A guard looking for the
    flag by name in argv would have to know ``--adapter=x`` too; this one is argparse's own match."""

    def __init__(self, option_strings, dest, reason: str, **kwargs):
        kwargs.update(nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None):
        raise UserError(f"{option_string} {self.reason}")


class ListFlag(argparse._StoreAction):
    """A list option whose repetitions append: ``--budgets 100 200 --budgets 300`` is [100, 200, 300].

    The first use on a command line replaces the default, whether the field's or one a YAML file set as
    the parser's default (defaults < YAML < command line: a list on the command line is never added to
    the YAML's). ``nargs="+"`` (the default) takes several values per flag, ``nargs=None`` one (a flag
    repeated per value, ``--tokenizer A --tokenizer B``). ``once=True`` refuses a second use with one
    usage error (exit 2), for a list that must be given in one piece.
    """

    def __init__(self, option_strings, dest, nargs="+", once: bool = False, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)
        self.once = once

    def __call__(self, parser, namespace, values, option_string=None):
        values = [values] if self.nargs is None else list(values)
        if _first_use(self, namespace):
            setattr(namespace, self.dest, values)
        elif self.once:
            _given_twice(parser, self, "give its values once (" + max(self.option_strings, key=len) + " A B ...)")
        else:
            setattr(namespace, self.dest, [*getattr(namespace, self.dest), *values])


class OnceFlag(argparse._StoreAction):
    """An option of one value that stands for several (a JSON mapping, a comma list: transformers'
    ``--deepspeed``, ``--report-to``): a second use would silently replace the first, so it is refused
    with one usage error (exit 2)."""

    once = True

    def __call__(self, parser, namespace, values, option_string=None):
        if not _first_use(self, namespace):
            _given_twice(parser, self, "give it once")
        setattr(namespace, self.dest, values)


def key_value_pairs(text: str) -> list[tuple[str, str]]:
    """(KEY, VALUE) of each item of ``KEY=VALUE,KEY=VALUE`` (an item without ``=``: (item, ""))."""
    return [(k.strip(), v.strip()) for k, _eq, v in (item.partition("=") for item in text.split(",") if item.strip())]


class KeyValueFlag(argparse.Action):
    """``--flag KEY=VALUE,...`` (``fae run --backend-args``, ``real-train --fae-eval``): given again, its
    pairs are added to the earlier ones (``--x a=1 --x b=2`` is ``a=1,b=2``); a KEY given twice with two
    VALUEs is one usage error (exit 2). The first use replaces the default (a YAML file's mapping)."""

    def __call__(self, parser, namespace, values, option_string=None):
        text = values if _first_use(self, namespace) else f"{getattr(namespace, self.dest)},{values}"
        seen: dict[str, str] = {}
        for key, value in key_value_pairs(text):
            if seen.setdefault(key, value) != value:
                flag = max(self.option_strings, key=lambda s: (len(s), s.count("-")))
                parser.error(f"argument {flag}: {key} given twice ({key}={seen[key]}, {key}={value})")
        setattr(namespace, self.dest, text)


def appending_lists(parser: argparse.ArgumentParser, dataclass_types=()) -> argparse.ArgumentParser:
    """``parser`` (built by another generator: transformers' ``HfArgumentParser``, TRL's ``TrlParser``) with
    each plain list option (``nargs="+"`` or ``"*"``) a :class:`ListFlag` (given twice, it appends), and each
    option of ``dataclass_types`` typed a list or a mapping that takes one string (``dict | str``, ``str |
    list[str]``) an :class:`OnceFlag` (given twice, it is refused): none keeps only its last value."""
    several = set()
    for cls in dataclass_types:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            parts = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
            if any(p in (list, dict) or typing.get_origin(p) in (list, dict) for p in parts):
                several.add(f.name)
    for action in parser._actions:
        if type(action) is not argparse._StoreAction:
            continue
        if action.nargs in ("+", "*"):
            action.__class__ = ListFlag  # a subclass with the same attributes: only __call__ differs
            action.once = False
        elif action.dest in several:
            action.__class__ = OnceFlag
    return parser


class SpacedList(ListFlag):
    """``--flag a b`` (``nargs="+"``), appending when repeated (:class:`ListFlag`); a comma list
    ``--flag a,b`` is split, with a deprecation warning."""

    def __call__(self, parser, namespace, values, option_string=None):
        values = list(values)
        if any("," in v for v in values):
            flag = option_string or self.dest
            spaced = " ".join(s for v in values for s in v.split(",") if s.strip())
            warn_deprecated(parser.prog, f"a comma list after {flag}", f"spaces ({flag} {spaced})")
            values = [s.strip() for v in values for s in v.split(",") if s.strip()]
        super().__call__(parser, namespace, values, option_string)
