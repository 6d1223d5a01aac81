"""Subcommand dispatcher of the ``fae`` and ``real-data`` console commands.

``dispatch`` builds one parser per subcommand from its module (``add_arguments`` or its own
``parse_args``), gives the typed command its config and runs it under the top-level error
handler :func:`real_fae_core.entry.run_guarded`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from real_fae_core.command import config_type, exit_code_of
from real_fae_core.entry import run_guarded
from real_fae_core.errors import DEBUG_ENV, EXIT_USAGE


def build_parser(prog: str, doc: str | None, subcommands: dict) -> tuple[argparse.ArgumentParser, dict]:
    """The top-level parser of ``prog`` with one subparser per COMMAND, and {COMMAND: its module}.

    A module with ``parse_args`` gets an empty subparser: its arguments, ``--help``
    included, pass through untouched to its own parser (``make_parser``). No parser takes an abbreviated
    flag (``allow_abbrev=False``, every parser of the repository: tests/test_no_abbreviations.py): a guard
    that looks for a flag by name (``--adapter`` in ``fae checkpoints``) would miss ``--adapt``.
    """
    parser = argparse.ArgumentParser(allow_abbrev=False, prog=prog, description=(doc or "").splitlines()[0])
    parser.add_argument("--debug", action="store_true", help=f"show tracebacks (also {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in subcommands.items():
        module = importlib.import_module(module_name)
        if hasattr(module, "parse_args"):
            sub.add_parser(name, help=help_text, add_help=False, allow_abbrev=False)
        else:
            module.add_arguments(sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False))
        modules[name] = module
    return parser, modules


def run_parsed(module, parsed) -> int:
    """Run a command module on what its parser gave, as an exit code.

    A typed command (:mod:`real_fae_core.command`: ``CONFIG`` and ``run(config, **context)``) gets its
    config: from the argparse namespace, or the ``(config, context)`` its own ``parse_args`` returns
    (``context``: what only a command line has, such as the line itself).
    """
    cls = config_type(module)
    if cls is None:
        return exit_code_of(module.run(parsed))
    if isinstance(parsed, tuple):
        config, context = parsed
    else:
        config, context = cls.from_namespace(parsed), {}
    return exit_code_of(module.run(config, **context))


def dispatch(prog: str, doc: str | None, subcommands: dict, argv: list[str] | None) -> int:
    """Run ``prog COMMAND ...``: ``subcommands`` maps COMMAND to (module name, help line).

    A module either fills its argparse subparser (``add_arguments(parser)``) or
    parses its own arguments (``parse_args(argv, prog)``, e.g. a dataclass
    parser); then ``run(args)`` gets what was parsed.
    """
    def body(argv: list[str]) -> int:
        parser, modules = build_parser(prog, doc, subcommands)
        args, rest = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        module = modules[args.command]
        if hasattr(module, "parse_args"):
            args = module.parse_args(rest, prog=f"{prog} {args.command}")
        elif rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")  # as parse_args would
        return run_parsed(module, args)

    # The command's name in messages: "fae run", "real-data enhance".
    argv_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv_list if not a.startswith("-")), None)
    name = f"{prog} {first}" if first in subcommands else prog
    return run_guarded(name, body, argv_list)
