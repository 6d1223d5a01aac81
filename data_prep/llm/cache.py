"""One-file SQLite answer cache: re-runs and resumed runs never repeat a request.

Keyed by sha256 over (model, messages, decoding settings); the endpoint URL
is left out so moving a vLLM server to another host keeps the cache. WAL
mode and one commit per answer mean a SIGKILL loses only the requests that
were in flight. Stored: the raw answer text, token usage and a status:
``ok`` (parseable answer) or ``abstain`` (still malformed after the bounded
re-asks, cached so a re-run makes zero requests). Transport failures are
never stored, so a re-run retries exactly those.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from real_fae_core.hashing import sha256_json

OK = "ok"
ABSTAIN = "abstain"


def request_key(model: str, messages: list[dict[str, str]], decoding: dict[str, Any]) -> str:
    """The cache key of one request: a hash of the model, the messages and the decoding settings (key order
    ignored), so any change to them is a new request."""
    payload = {"model": model, "messages": messages, "decoding": decoding}
    return sha256_json(payload)


@dataclass
class CachedAnswer:
    status: str  # OK or ABSTAIN
    content: str | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


class AnswerCache:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process kills
        self._db.execute(
            """CREATE TABLE IF NOT EXISTS answers (
                key TEXT PRIMARY KEY,
                model TEXT NOT NULL,
                status TEXT NOT NULL,
                content TEXT,
                prompt_tokens INTEGER NOT NULL DEFAULT 0,
                completion_tokens INTEGER NOT NULL DEFAULT 0,
                error TEXT,
                created REAL NOT NULL
            )"""
        )
        self._db.commit()

    def get(self, key: str) -> CachedAnswer | None:
        """The stored answer (an abstention too) to the request ``key``, or None when it was never answered."""
        row = self._db.execute(
            "SELECT status, content, prompt_tokens, completion_tokens, error FROM answers WHERE key = ?",
            (key,),
        ).fetchone()
        return CachedAnswer(*row) if row else None

    def put(self, key: str, model: str, answer: CachedAnswer) -> None:
        """Store ``answer`` under ``key``, replacing an older one, committed at once (a kill keeps it)."""
        self._db.execute(
            "INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key, model, answer.status, answer.content, answer.prompt_tokens,
             answer.completion_tokens, answer.error, time.time()),
        )
        self._db.commit()

    def keys(self) -> set[str]:
        """Every request key the cache holds (for a dry run's count of requests still to send)."""
        return {r[0] for r in self._db.execute("SELECT key FROM answers")}

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]

    def close(self) -> None:
        """Close the database; every put is already committed."""
        self._db.close()
