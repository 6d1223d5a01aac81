"""Subcommand dispatcher of the ``fae`` and ``real-data`` console commands.

A registry (``SUBCOMMANDS`` of :mod:`fae.cli`, :mod:`data_prep.cli`) maps each COMMAND to an entry and its
help line. The entry of a command is ``"package.module:XConfig"``: the library module that holds the
command's config dataclass ``XConfig`` (a :class:`~real_fae_core.command.CommandConfig`) and
``run(config) -> CommandResult``. ``dispatch`` builds that subcommand's parser from the config
(:func:`~real_fae_core.command.add_command_arguments`), makes the config of what was parsed
(:func:`parse_command`), runs it under the top-level error handler :func:`real_fae_core.entry.run_guarded`,
and exits with the result's code. A Python caller calls the same ``run(XConfig(...))``.

What a command needs beyond its fields is declared on its config class, never here: ``COMMAND_FIELDS`` (the
fields that are options, in order; a nested config's fields in its place), ``CONFIG_FILE`` (``--config YAML``:
defaults < the file < the command line), ``PARSER`` (its parser's description, epilog, help format) and
``check_command_line`` (checks run after parsing, on the command line itself). A ``run`` that takes
``command`` or ``config_file`` gets them: the command line (secrets scrubbed), what a run directory records to
be resumed with, and the ``--config`` file or None.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import sys
from types import ModuleType
from typing import Any, NamedTuple

from real_fae_core.command import (add_command_arguments, exit_code_of, given_command_line, parse_with_config_file,
                                   parse_words)
from real_fae_core.entry import run_guarded
from real_fae_core.errors import DEBUG_ENV, EXIT_USAGE


class Command(NamedTuple):
    """A subcommand as its registry entry names it: the module that runs it and its config class, and, once
    :func:`build_parser` made it, its parser (the dispatcher parses the command's words with it)."""

    module: ModuleType
    config: type
    parser: argparse.ArgumentParser | None = None


def load_command(entry: str) -> Command:
    """The :class:`Command` of a registry entry ``"package.module:XConfig"``: a config dataclass and ``run`` in
    that module."""
    module_name, _, config_name = entry.partition(":")
    module = importlib.import_module(module_name)
    config = getattr(module, config_name, None) if config_name else None
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise TypeError(f"{entry}: {module_name} has no config dataclass {config_name or '(none named)'}")
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"{entry}: {module_name} has no run(config)")
    return Command(module, config)


def command_parser(prog: str, config: type, help_text: str | None = None,
                   parent: argparse._SubParsersAction | None = None) -> argparse.ArgumentParser:
    """The parser of a command whose config is ``config``: a subparser of ``parent`` named ``prog``'s last word,
    or a parser of its own (a caller parsing one command line: :func:`parse_command_line`). Its description is
    ``help_text`` unless the config's ``PARSER`` says otherwise; no abbreviated flag (``allow_abbrev=False``,
    every parser of the repository: tests/test_no_abbreviations.py): a guard that looks for a flag by name
    would miss ``--adapt``."""
    keywords = {"description": help_text, **getattr(config, "PARSER", {})}
    if parent is None:
        parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False, **keywords)
    else:
        parser = parent.add_parser(prog.split()[-1], help=help_text, allow_abbrev=False, **keywords)
    add_command_arguments(parser, config)
    return parser


def build_parser(prog: str, doc: str | None, subcommands: dict) -> tuple[argparse.ArgumentParser, dict]:
    """The top-level parser of ``prog`` with one subparser per COMMAND, generated from its config
    (:func:`command_parser`), and {COMMAND: its :class:`Command`}."""
    parser = argparse.ArgumentParser(allow_abbrev=False, prog=prog, description=(doc or "").splitlines()[0])
    parser.add_argument("--debug", action="store_true", help=f"show tracebacks (also {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = {}
    for name, (entry, help_text) in subcommands.items():
        command = load_command(entry)
        commands[name] = command._replace(
            parser=command_parser(f"{prog} {name}", command.config, help_text, parent=sub))
    return parser, commands


# the dests of the dispatcher's own parser: not the command's
_DISPATCHER_DESTS = ("command", "debug")


def parse_command(parser: argparse.ArgumentParser, argv: list[str], config: type, prog: str,
                  command_argv: list[str], command: argparse.ArgumentParser | None = None
                  ) -> tuple[Any, dict[str, Any]]:
    """(the config of a command line, its context): ``parser`` parses ``argv`` (usage errors and ``--help``
    first); a config that takes ``--config YAML`` has the file's values as the defaults of its ``command``
    parser (the subparser; None: ``parser`` is the command's own) and the command line over them
    (:func:`~real_fae_core.command.parse_with_config_file`); the config is ``config.from_parsed`` of the values
    and passes its ``check_command_line``. The context: ``{"command": prog and command_argv (the command's own
    words), secrets scrubbed; "config_file": the --config file or None}``."""
    command = parser if command is None else command
    types = config.config_file_types()
    if types:
        values, config_file, from_file = parse_with_config_file(parser, argv, types, command)
    else:
        values, config_file, from_file = parse_words(parser, argv, command), None, {}
    if parser is not command:
        values = {k: v for k, v in values.items() if k not in _DISPATCHER_DESTS}
    parsed = config.from_parsed(values, command, from_file)
    parsed.check_command_line(command_argv, config_file)
    return parsed, {"command": given_command_line(prog, command_argv), "config_file": config_file}


def parse_command_line(config: type, argv: list[str], prog: str) -> tuple[Any, dict[str, Any]]:
    """(the config, the context) of one command's own words ``argv``, parsed as ``prog COMMAND`` parses them:
    for a Python caller or a test that has a command line and no dispatcher."""
    parser = command_parser(prog, config)
    return parse_command(parser, argv, config, prog, list(argv))


def run_command(command: Command, config, context: dict[str, Any]) -> int:
    """Run a command on its config, as an exit code; its ``run`` gets the keys of ``context`` it takes
    (``command``, ``config_file``)."""
    params = inspect.signature(command.module.run).parameters
    return exit_code_of(command.module.run(config, **{k: v for k, v in context.items() if k in params}))


def dispatch(prog: str, doc: str | None, subcommands: dict, argv: list[str] | None) -> int:
    """Run ``prog COMMAND ...``: ``subcommands`` maps COMMAND to (its entry ``"package.module:XConfig"``, its
    help line)."""
    # The command's name in messages: "fae run", "real-data enhance". The dispatcher's own options take no
    # value, so the first word that is no option is the command.
    argv_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv_list if not a.startswith("-")), None)
    name = f"{prog} {first}" if first in subcommands else prog

    def body(argv: list[str]) -> int:
        parser, commands = build_parser(prog, doc, subcommands)
        if first not in commands:
            args = parser.parse_args(argv)  # --help, an unknown command: argparse's answer
            if args.command is None:
                parser.print_help()
                return EXIT_USAGE
        command = commands[first]
        config, context = parse_command(parser, argv, command.config, f"{prog} {first}",
                                        argv[argv.index(first) + 1:], command.parser)
        return run_command(command, config, context)

    return run_guarded(name, body, argv_list)
