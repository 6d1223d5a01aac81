"""One spelling per idea across the command-line tools, old spellings kept for one release.

A renamed flag stays accepted until :data:`UNTIL` through :func:`deprecated_alias`:
it is hidden from ``--help`` and prints one line on stderr when used::

    real-data convert: warning: --keep-nei is deprecated; use --include-nei (accepted until 0.2)

List flags take space-separated values (``nargs="+"``); :class:`SpacedList`
also splits a comma list, with the same kind of warning, for the same release.
Light: argparse only, so importing it never slows ``--help``.
"""

from __future__ import annotations

import argparse
import sys

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
        warn_deprecated(parser.prog, option_string, new)
        self.target(parser, namespace, values, new)


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
            warn_deprecated(parser.prog, old, f"the positional {new} ({parser.prog} {new} ...)")
            if not eq:
                i += 1
                value = args[i]
            moved.append(value)
        else:
            kept.append(arg)
        i += 1
    return moved + kept


class SpacedList(argparse.Action):
    """``--flag a b`` (``nargs="+"``); a comma list ``--flag a,b`` is split, with a deprecation warning."""

    def __init__(self, option_strings, dest, nargs="+", **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        values = list(values)
        if any("," in v for v in values):
            flag = option_string or self.dest
            spaced = " ".join(s for v in values for s in v.split(",") if s.strip())
            warn_deprecated(parser.prog, f"a comma list after {flag}", f"spaces ({flag} {spaced})")
            values = [s.strip() for v in values for s in v.split(",") if s.strip()]
        setattr(namespace, self.dest, values)
