"""Tiny subcommand dispatcher shared by the `real-data` and `fae` CLIs."""

from __future__ import annotations

import argparse
import importlib
import sys


class UserError(Exception):
    """A mistake in the user's input: printed as one clear sentence, no traceback."""


def dispatch(prog: str, doc: str | None, subcommands: dict, argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in subcommands.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                module = None  # not implemented yet
            else:
                raise
        p = sub.add_parser(name, help=help_text + ("" if module else " (not implemented yet)"),
                           description=help_text)
        if module is not None:
            module.add_arguments(p)
        modules[name] = module
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = modules[args.command]
    if module is None:
        print(f"{prog} {args.command}: not implemented yet", file=sys.stderr)
        return 2
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"{prog} {args.command}: error: {exc}", file=sys.stderr)
        return 1
