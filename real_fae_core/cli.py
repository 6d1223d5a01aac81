"""Subcommand dispatcher and the one top-level error handler of every entry point.

Exit codes: :mod:`real_fae_core.errors` (docs/errors.md).

Every failure prints one line ``PROG: error: ...`` with secrets scrubbed. Set
``REAL_FAE_DEBUG=1`` (or pass ``--debug`` anywhere on the command line) to see
the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
from typing import Callable

from real_fae_core.command import config_type, exit_code_of
from real_fae_core.errors import (
    DEBUG_ENV,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Terminated,
    UserError,
)
from real_fae_core.secrets import scrub

_interrupt_notes: list[str] = []


def set_interrupt_note(text: str | None) -> None:
    """What the running command has kept and how to resume, printed if it is interrupted."""
    _interrupt_notes.clear()
    if text:
        _interrupt_notes.append(text)


def interrupt_note() -> str | None:
    """The note set by :func:`set_interrupt_note`, if any."""
    return _interrupt_notes[0] if _interrupt_notes else None


def say_line(text: str) -> None:
    """One line to stderr in a single write: the ranks of a launch share one stderr, and ``print``
    writes the text and its newline apart, so two ranks' lines could run into one."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _describe_os_error(exc: OSError) -> str:
    reason = exc.strerror or type(exc).__name__
    names = [n for n in (exc.filename, getattr(exc, "filename2", None)) if n]
    where = " -> ".join(str(n) for n in names)
    return scrub(f"{where}: {reason}" if where else f"{reason}")


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """Within the block, SIGTERM raises :class:`Terminated` (main thread only).

    Not in a multi-process run (``WORLD_SIZE`` > 1): a rank blocked in a
    collective (a gloo/NCCL wait for a dead peer) never returns to Python, so a
    Python-level handler alone could leave it hanging; there
    :func:`real_fae_core.lifeline.answer_sigterm` (installed by the entry point)
    or SIGTERM's default action stays.
    """
    import threading

    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    if world > 1 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # pragma: no cover - exotic embedding
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_guarded(prog: str, fn: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Call ``fn(argv)`` and turn every way it can fail into one line and an exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_enabled()
    if "--debug" in argv:
        argv = [a for a in argv if a != "--debug"]
        debug = True
    set_interrupt_note(None)
    try:
        with _sigterm_as_interrupt():
            return int(fn(argv) or 0)
    except SystemExit as exc:  # argparse usage errors and --help
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    except BrokenPipeError:
        # Our reader went away (`| head`): not an error of ours. Silence the
        # interpreter's own flush of the dead stdout at exit.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt as exc:
        if debug:
            raise
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        note = f"; {_interrupt_notes[0]}" if _interrupt_notes else ""
        say_line(f"{prog}: {what}{note}")
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    except UserError as exc:
        if debug:
            raise
        say_line(f"{prog}: error: {scrub(exc)}")
        return exc.exit_code
    except OSError as exc:
        if debug:
            raise
        say_line(f"{prog}: error: {_describe_os_error(exc)}")
        return EXIT_FAILURE
    except MemoryError:
        if debug:
            raise
        say_line(f"{prog}: error: out of memory")
        return EXIT_FAILURE
    except Exception as exc:  # a bug of ours: still one line, the traceback on request
        if debug:
            raise
        say_line(f"{prog}: internal error: {type(exc).__name__}: {scrub(exc)} "
                 f"(rerun with --debug or {DEBUG_ENV}=1 for the traceback, and please report it)")
        return EXIT_FAILURE


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
