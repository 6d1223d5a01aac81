"""Subcommand dispatcher of the ``fae`` and ``real-data`` console commands.

A registry (``SUBCOMMANDS`` of :mod:`fae.cli`, :mod:`data_prep.cli`) maps each COMMAND to an entry and its
help line. The entry of a command is ``"package.module:XConfig"``: the library module that holds the
command's config dataclass ``XConfig`` (a :class:`~real_fae_core.command.CommandConfig`) and
``run(config, **context) -> CommandResult``. ``dispatch`` builds that subcommand's parser from the config
(:func:`~real_fae_core.command.add_config_arguments`), makes the config of what was parsed
(``XConfig.from_namespace``), runs it under the top-level error handler
:func:`real_fae_core.entry.run_guarded`, and exits with the result's code. A Python caller calls the same
``run(XConfig(...))``.

An entry that is a module name alone is the older form, kept while `fae run`, `fae checkpoints`, `fae probe`,
`fae neurons`, `fae pave` and `fae study` move: the module fills its subparser (``add_arguments(parser)``) or
parses its own arguments (``parse_args(argv, prog)``), and names its config ``CONFIG``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from types import ModuleType
from typing import NamedTuple

from real_fae_core.command import add_config_arguments, config_type, exit_code_of
from real_fae_core.entry import run_guarded
from real_fae_core.errors import DEBUG_ENV, EXIT_USAGE


class Command(NamedTuple):
    """A subcommand as its registry entry names it: the module that runs it, its config class (None: a
    module that is no typed command) and whether its parser is generated from that config."""

    module: ModuleType
    config: type | None
    generated: bool


def load_command(entry: str) -> Command:
    """The :class:`Command` of a registry entry: ``"package.module:XConfig"`` (a config dataclass and
    ``run`` in that module; its parser generated) or, the older form, ``"package.module"`` (its
    ``add_arguments`` or ``parse_args``, its ``CONFIG``)."""
    module_name, _, config_name = entry.partition(":")
    module = importlib.import_module(module_name)
    if not config_name:
        return Command(module, config_type(module), generated=False)
    config = getattr(module, config_name, None)
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise TypeError(f"{entry}: {module_name} has no config dataclass {config_name}")
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"{entry}: {module_name} has no run(config)")
    return Command(module, config, generated=True)


def build_parser(prog: str, doc: str | None, subcommands: dict) -> tuple[argparse.ArgumentParser, dict]:
    """The top-level parser of ``prog`` with one subparser per COMMAND, and {COMMAND: its :class:`Command`}.

    A ``"module:XConfig"`` command's subparser is generated from ``XConfig``; an older-form module fills
    its own (``add_arguments``), or, with ``parse_args``, gets an empty subparser: its arguments,
    ``--help`` included, pass through untouched to its own parser (``make_parser``). No parser takes an
    abbreviated flag (``allow_abbrev=False``, every parser of the repository: tests/test_no_abbreviations.py):
    a guard that looks for a flag by name (``--adapter`` in ``fae checkpoints``) would miss ``--adapt``.
    """
    parser = argparse.ArgumentParser(allow_abbrev=False, prog=prog, description=(doc or "").splitlines()[0])
    parser.add_argument("--debug", action="store_true", help=f"show tracebacks (also {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = {}
    for name, (entry, help_text) in subcommands.items():
        command = load_command(entry)
        if command.generated:
            add_config_arguments(sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False),
                                 command.config)
        elif hasattr(command.module, "parse_args"):
            sub.add_parser(name, help=help_text, add_help=False, allow_abbrev=False)
        else:
            command.module.add_arguments(sub.add_parser(name, help=help_text, description=help_text,
                                                        allow_abbrev=False))
        commands[name] = command
    return parser, commands


def run_parsed(command: Command, parsed) -> int:
    """Run a command on what its parser gave, as an exit code.

    A typed command (:mod:`real_fae_core.command`: a config and ``run(config, **context)``) gets its
    config: from the argparse namespace, or the ``(config, context)`` an own ``parse_args`` returns
    (``context``: what only a command line has, such as the line itself).
    """
    if command.config is None:
        return exit_code_of(command.module.run(parsed))
    if isinstance(parsed, tuple):
        config, context = parsed
    else:
        config, context = command.config.from_namespace(parsed), {}
    return exit_code_of(command.module.run(config, **context))


def dispatch(prog: str, doc: str | None, subcommands: dict, argv: list[str] | None) -> int:
    """Run ``prog COMMAND ...``: ``subcommands`` maps COMMAND to (its entry, its help line); the entry is
    ``"package.module:XConfig"`` or an older-form module name (:func:`load_command`)."""
    def body(argv: list[str]) -> int:
        parser, commands = build_parser(prog, doc, subcommands)
        args, rest = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        command = commands[args.command]
        if not command.generated and hasattr(command.module, "parse_args"):
            args = command.module.parse_args(rest, prog=f"{prog} {args.command}")
        elif rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")  # as parse_args would
        return run_parsed(command, args)

    # The command's name in messages: "fae run", "real-data enhance".
    argv_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv_list if not a.startswith("-")), None)
    name = f"{prog} {first}" if first in subcommands else prog
    return run_guarded(name, body, argv_list)
