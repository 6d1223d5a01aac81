"""The project's errors and exit codes (docs/errors.md): every command maps failures onto these.

====  ==========================================================================
0     success
1     runtime failure: a server, a disk, a model, or an internal error
2     bad input or usage: a wrong flag or value, a bad file, a refused run
130   interrupted (Ctrl-C); 143 terminated (SIGTERM). Finished work is kept.
====  ==========================================================================
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
DEBUG_ENV = "REAL_FAE_DEBUG"


class UserError(Exception):
    """A mistake in the user's input or settings: one clear sentence, no traceback (exit 2)."""

    exit_code = EXIT_USAGE


class RunFailure(UserError):
    """The command could not finish for a reason outside the input (server, disk, model): exit 1."""

    exit_code = EXIT_FAILURE


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that ``finally`` blocks flush finished work."""
