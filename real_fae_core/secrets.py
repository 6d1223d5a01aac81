"""API keys come from the environment and never reach a log, a file or stderr.

Every path that reads a key calls :func:`read_key` (or :func:`register_secret`),
and every path that formats an error coming from a server, a client library or
an exception passes it through :func:`scrub` before printing or storing it.
Servers do echo the ``Authorization`` header in 400/401/5xx bodies, and the
openai client puts those bodies in its exception messages.
"""

from __future__ import annotations

import os
import re
import threading

MASK = "***"
_lock = threading.Lock()
_secrets: set[str] = set()
# "Bearer <token>" and "api-key: <token>" / "api_key=<token>" shapes, whatever the token.
_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[^\s\"',;}\]]+"),
    re.compile(r"(?i)((?:x-)?api[-_]?key[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}\]]+"),
)
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary words


def register_secret(value: str | None) -> None:
    """Remember ``value`` so that :func:`scrub` masks it wherever it appears."""
    if value and len(value) >= _MIN_SECRET_LEN:
        with _lock:
            _secrets.add(value)


def read_key(env_var: str | None) -> str | None:
    """The value of ``env_var`` (registered as a secret), or None when unset or not named."""
    if not env_var:
        return None
    value = os.environ.get(env_var) or None
    register_secret(value)
    return value


def scrub(text: object) -> str:
    """``str(text)`` with every registered secret and bearer-like token masked."""
    out = str(text)
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for value in secrets:
        out = out.replace(value, MASK)
    for pattern in _PATTERNS:
        out = pattern.sub(lambda m: m.group(1) + MASK, out)
    return out
