"""The lexical query of SPEC §10, defined once: every BM25 lookup (pages, units, claim neighbours) uses it.

The paper's query is the OR of a claim's unique casefolded alphanumeric
tokens. "Alphanumeric" is Unicode letters and digits (``[^\\W_]+``), which is
also how SQLite FTS5's default ``unicode61`` tokenizer splits text, so a query
token can always match an indexed one. Tokens keep their first-occurrence
order, so the query string (and everything ranked by it) is deterministic.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sqlite3
import threading

from real_fae_core.errors import Terminated

_TOKEN = re.compile(r"[^\W_]+")


def query_tokens(text: str) -> list[str]:
    """The unique casefolded alphanumeric tokens of ``text``, in first-occurrence order."""
    seen: dict[str, None] = {}
    for token in _TOKEN.findall(text.casefold()):
        seen.setdefault(token, None)
    return list(seen)


def fts5_or_query(tokens: list[str]) -> str:
    """An FTS5 MATCH expression: each token quoted (so words like OR/NEAR stay words), joined by OR."""
    if not tokens:
        raise ValueError("no alphanumeric token to query")
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in tokens)


# Every this many SQLite virtual-machine steps a stoppable connection lets Python look at its signals.
PROGRESS_STEPS = 10_000


@contextlib.contextmanager
def stoppable(con: sqlite3.Connection):
    """Within the block, Ctrl-C and SIGTERM stop a long SQLite statement on ``con`` at once.

    A statement runs in C, where Python's signal handlers wait until it returns (a query over a huge claim
    ran for minutes after SIGTERM). A progress handler hands control back to Python every
    :data:`PROGRESS_STEPS` steps, so a handler runs there; its exception (``KeyboardInterrupt``, or
    :class:`~real_fae_core.errors.Terminated` under :func:`~real_fae_core.entry.run_guarded`) cannot cross
    SQLite, which aborts the statement instead, and is raised again here in place of SQLite's
    "interrupted". Handlers are wrapped only in the main thread (the only one that gets signals).
    """
    caught: list[BaseException] = []
    previous: dict[int, object] = {}

    def handler(signum, frame):
        prev = previous.get(signum)
        try:
            if callable(prev):
                prev(signum, frame)
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        except BaseException as exc:
            caught.append(exc)
            raise

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, OSError):
                previous[sig] = signal.signal(sig, handler)
    con.set_progress_handler(lambda: 0, PROGRESS_STEPS)
    try:
        yield con
    except sqlite3.OperationalError:
        if caught:
            raise caught[0] from None
        raise
    finally:
        with contextlib.suppress(sqlite3.ProgrammingError):  # a closed connection has no handler left
            con.set_progress_handler(None, 0)
        for sig, prev in previous.items():
            signal.signal(sig, prev)
