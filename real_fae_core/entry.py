"""What every entry point shares: the one top-level error handler and the interrupt note.

Exit codes: :mod:`real_fae_core.errors` (docs/errors.md).

:func:`run_guarded` wraps a console command: every failure prints one line
``PROG: error: ...`` with secrets scrubbed. Set ``REAL_FAE_DEBUG=1`` (or pass
``--debug`` anywhere on the command line) to see the traceback instead. A
running command leaves what it has kept and how to resume with
:func:`set_interrupt_note`; an interrupt prints it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from typing import Callable

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
from real_fae_core.progress import quiet_library_bars
from real_fae_core.secrets import scrub

_interrupt_notes: list = []


def set_interrupt_note(text) -> None:
    """What the running command has kept and how to resume, printed if it is interrupted: a line, or a
    function that says it at that moment (when what is on disk can change between two callbacks)."""
    _interrupt_notes.clear()
    if text:
        _interrupt_notes.append(text)


def interrupt_note() -> str | None:
    """The note set by :func:`set_interrupt_note`, if any."""
    if not _interrupt_notes:
        return None
    note = _interrupt_notes[0]
    return note() if callable(note) else note


def say_line(text: str) -> None:
    """One line to stderr in a single write: the ranks of a launch share one stderr, and ``print``
    writes the text and its newline apart, so two ranks' lines could run into one."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


# A path the user named that cannot be used as asked (a file where a directory is needed, a folder we may
# not write, a read-only file system, a name too long): bad input, exit 2. Other OSErrors (a full disk,
# an I/O error, a lost mount) are runtime failures, exit 1.
_BAD_PATH_ERRNOS = frozenset({errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                              errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP})


def os_error_exit_code(exc: OSError) -> int:
    """2 for an OSError that names an unusable path of the user's (:data:`_BAD_PATH_ERRNOS`), else 1."""
    return EXIT_USAGE if exc.errno in _BAD_PATH_ERRNOS and exc.filename else EXIT_FAILURE


def _file_in_the_way(path: str) -> str | None:
    """The first existing non-directory among ``path`` and its parents, if any: what blocks a directory."""
    p = os.path.abspath(path)
    while True:
        if os.path.lexists(p) and not os.path.isdir(p):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def _describe_os_error(exc: OSError) -> str:
    reason = exc.strerror or type(exc).__name__
    names = [n for n in (exc.filename, getattr(exc, "filename2", None)) if n]
    where = " -> ".join(str(n) for n in names)
    if exc.errno in (errno.EEXIST, errno.ENOTDIR) and exc.filename:
        blocker = _file_in_the_way(os.fsdecode(exc.filename))
        if blocker is not None:
            shown = os.fsdecode(exc.filename)
            if os.path.abspath(shown) != blocker:
                shown = os.path.relpath(blocker) if not os.path.isabs(shown) else blocker
            reason = "is a file, not a directory; give a path whose folders are directories"
            where = shown
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and exc.filename:
        reason += " (choose a folder you can write, or change its permissions)"
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


def quiet_third_party_warnings() -> None:
    """Filters for third-party warnings about the libraries' own code, which we cannot fix by using them
    differently (each named, with the reason and the version it was seen with). Installed by every entry
    point; a warning of ours, or one about how we call a library, is fixed where it is raised instead."""
    import warnings

    # peft 0.21 (PeftModel.__init__: getattr(model, "is_gradient_checkpointing", True)) and TRL 1.16
    # (unwrap_model_for_generation, disable_gradient_checkpointing) read transformers 5's deprecated
    # alias `is_gradient_checkpointing`, which warns on every read (FutureWarning, transformers 5.25);
    # nothing of ours reads it (we use `is_activation_checkpointing` / `activation_checkpointing`).
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def run_guarded(prog: str, fn: Callable[[list[str]], int | None], argv: list[str] | None = None) -> int:
    """Call ``fn(argv)`` and turn every way it can fail into one line and an exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_enabled()
    if "--debug" in argv:
        argv = [a for a in argv if a != "--debug"]
        debug = True
    set_interrupt_note(None)
    quiet_library_bars()  # progress bars only on a terminal (a log keeps every \r redraw)
    quiet_third_party_warnings()
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
        note = interrupt_note()
        say_line(f"{prog}: {what}{'; ' + note if note else ''}")
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
        return os_error_exit_code(exc)
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
