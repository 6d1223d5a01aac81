"""The on-disk BM25 index of SPEC §10: one SQLite file with an FTS5 table over title + body.

SQLite's FTS5 is what the paper used, ships with Python (no dependency), keeps the whole index in
one file and builds it in a stream, so FEVER's 5.4M pages never sit in memory (docs/retrieval.md
compares it with bm25s). The file holds:

* ``pages``: a contentless FTS5 table (``title``, ``body``), rowid = the document's row in ``docs``;
* ``docs``: document id (unique: a duplicate id is found here, naming both lines), title, source line;
* ``units``: every non-empty sentence by (document, sentence index), the text a pool is built from;
* ``meta``: the corpus format, its files and their SHA-256, so a retrieval can refuse an index built
  from another corpus than the one it names.

Page order is BM25 (FTS5's ``bm25()``, k1 = 1.2, b = 0.75), ties broken by document id, so the same
corpus and query give the same pages on every machine.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from real_fae_core.atomicio import atomic_file
from real_fae_core.errors import RunFailure, UserError
from data_prep.converters.base import InputError
from data_prep.retrieval.corpus import ID_FIELDS, corpus_files, iter_documents
from data_prep.retrieval.lexical import fts5_or_query

SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE docs(rowid INTEGER PRIMARY KEY, doc TEXT NOT NULL UNIQUE, title TEXT NOT NULL,
                  path TEXT NOT NULL, line INTEGER NOT NULL);
CREATE TABLE units(doc INTEGER NOT NULL, idx INTEGER NOT NULL, text TEXT NOT NULL,
                   PRIMARY KEY(doc, idx)) WITHOUT ROWID;
CREATE VIRTUAL TABLE pages USING fts5(title, body, content='', tokenize='unicode61');
"""


@dataclass(frozen=True)
class Page:
    """A retrieved document: its id, rank (0 = best) and BM25 score (FTS5's sign: lower is better)."""

    doc: str
    rank: int
    score: float
    rowid: int


def corpus_fingerprint(path: str | Path, fmt: str) -> str:
    """SHA-256 over the corpus files' names and bytes, in reading order: what an index was built from."""
    digest = hashlib.sha256()
    for file in corpus_files(path, fmt):
        digest.update(file.name.encode() + b"\0")
        try:
            with open(file, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            raise UserError(f"cannot read {file}: {exc.strerror}") from None
    return digest.hexdigest()


def is_index(path: str | Path) -> bool:
    """Whether ``path`` is an index `real-data index` wrote (an SQLite file with its ``meta`` table)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(16) != b"SQLite format 3\x00":
                return False
        con = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        try:
            keys = {k for (k,) in con.execute("SELECT key FROM meta")}
        finally:
            con.close()
    except (OSError, sqlite3.Error):
        return False
    return {"schema", "format", "corpus_sha256"} <= keys


def build_index(corpus: str | Path, fmt: str, output: str | Path) -> dict:
    """Index the corpus into ``output`` (written beside it and renamed when complete); returns the counts."""
    start = time.perf_counter()
    fingerprint = corpus_fingerprint(corpus, fmt)
    with atomic_file(output) as tmp:
        con = sqlite3.connect(tmp)
        try:
            con.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + _SCHEMA)
        except sqlite3.OperationalError as exc:
            con.close()
            raise RunFailure(f"this Python's SQLite has no FTS5 ({exc}); install a Python built with it") from None
        try:
            counts = _fill(con, corpus, fmt)
            meta = {"schema": SCHEMA_VERSION, "format": fmt, "corpus": str(Path(corpus).resolve()),
                    "corpus_sha256": fingerprint, "documents": str(counts["documents"]),
                    "units": str(counts["units"])}
            con.executemany("INSERT INTO meta VALUES (?, ?)", sorted(meta.items()))
            con.execute("INSERT INTO pages(pages) VALUES ('optimize')")
            con.commit()
        finally:
            con.close()
    counts["seconds"] = round(time.perf_counter() - start, 3)
    counts["corpus_sha256"] = fingerprint
    return counts


def _fill(con: sqlite3.Connection, corpus, fmt: str) -> dict:
    """Stream the documents into the tables; a duplicate id or an empty corpus is an InputError."""
    id_field = ID_FIELDS[fmt]
    skipped: list[int] = []
    n_docs = n_units = 0
    for doc in iter_documents(corpus, fmt, skipped):
        try:
            cur = con.execute("INSERT INTO docs(doc, title, path, line) VALUES (?, ?, ?, ?)",
                              (doc.id, doc.title, doc.path, doc.line))
        except sqlite3.IntegrityError:
            first_path, first_line = con.execute("SELECT path, line FROM docs WHERE doc = ?", (doc.id,)).fetchone()
            first = f"line {first_line}" + ("" if first_path == doc.path else f" of {first_path}")
            raise InputError(doc.path, doc.line, id_field, f"duplicate {id_field} {doc.id!r} (first on {first})") \
                from None
        rowid = cur.lastrowid
        units = [(rowid, i, text) for i, text in enumerate(doc.units) if text]
        con.executemany("INSERT INTO units VALUES (?, ?, ?)", units)
        con.execute("INSERT INTO pages(rowid, title, body) VALUES (?, ?, ?)",
                    (rowid, doc.title, " ".join(t for _, _, t in units)))
        n_docs += 1
        n_units += len(units)
    if n_docs == 0:
        raise UserError(f"{corpus}: empty corpus: no document to index")
    return {"documents": n_docs, "units": n_units, "skipped_empty_pages": len(skipped)}


class Index:
    """A built index, opened read-only; :meth:`check_corpus` refuses one built from another corpus."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        if not Path(path).is_file():
            raise UserError(f"{path}: index not found (build it with `real-data index`)")
        self.con = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        try:
            self.meta = dict(self.con.execute("SELECT key, value FROM meta"))
        except sqlite3.DatabaseError:
            raise UserError(f"{path}: not an index built by `real-data index`") from None
        if self.meta.get("schema") != SCHEMA_VERSION:
            raise UserError(f"{path}: field 'schema': index schema {self.meta.get('schema')!r}, expected "
                            f"{SCHEMA_VERSION!r}; rebuild it with `real-data index`")

    def check_corpus(self, corpus: str | Path, fmt: str) -> None:
        """The index must come from ``corpus`` in format ``fmt``: same bytes, not merely the same name."""
        if self.meta["format"] != fmt:
            raise UserError(f"{self.path}: field 'format': the index is of a {self.meta['format']} corpus, "
                            f"not {fmt}")
        if corpus_fingerprint(corpus, fmt) != self.meta["corpus_sha256"]:
            raise UserError(f"{self.path}: field 'corpus_sha256': the index was built from {self.meta['corpus']}, "
                            f"not from --corpus {corpus} (its bytes differ); rebuild the index from it")

    def top_pages(self, tokens: list[str], k: int) -> list[Page]:
        """The ``k`` best pages for the OR query of ``tokens``, ties broken by document id."""
        rows = self.con.execute(
            "SELECT d.doc, bm25(pages) AS s, d.rowid FROM pages JOIN docs d ON d.rowid = pages.rowid "
            "WHERE pages MATCH ? ORDER BY s, d.doc LIMIT ?", (fts5_or_query(tokens), k)).fetchall()
        return [Page(doc, rank, score, rowid) for rank, (doc, score, rowid) in enumerate(rows)]

    def units(self, page: Page) -> list[tuple[int, str]]:
        """``(sentence index, text)`` of the page's non-empty sentences, in page order."""
        return self.con.execute("SELECT idx, text FROM units WHERE doc = ? ORDER BY idx", (page.rowid,)).fetchall()

    def close(self) -> None:
        """Close the SQLite connection; the index cannot be searched afterwards."""
        self.con.close()
