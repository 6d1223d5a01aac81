"""The lexical query of SPEC §10, defined once: every BM25 lookup (pages, units, claim neighbours) uses it.

The paper's query is the OR of a claim's unique casefolded alphanumeric
tokens. "Alphanumeric" is Unicode letters and digits (``[^\\W_]+``), which is
also how SQLite FTS5's default ``unicode61`` tokenizer splits text, so a query
token can always match an indexed one. Tokens keep their first-occurrence
order, so the query string (and everything ranked by it) is deterministic.
"""

from __future__ import annotations

import re

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
