"""Corpus readers for retrieval (SPEC §10): one document = an id, a title and its units (sentences).

Three formats, each read line by line so a 5.4M-page FEVER dump never sits in memory:

* ``scifact``: ``{"doc_id", "title"?, "abstract": [sentences]}`` (the official corpus has titles, the
  shipped ``corpus_cited.jsonl`` has none);
* ``check-covid``: ``{"cord_id", "title", "abstract": [sentences]}``;
* ``fever``: the ``wiki-pages`` shards, ``{"id", "text", "lines"}`` with ``lines`` as ``N<TAB>sentence``
  rows; the title is the page id with ``_`` read as a space, PTB escapes undone as the converter does,
  and the id is kept in Unicode NFC, the form the claim files are matched in.

A line without its id or its text is fatal (file, line, field), because an index silently missing a
page would move every score. The one exception is FEVER's dump, whose first shard opens with a
page of empty id and text: such a line is skipped and counted. Duplicate ids are found by the index
(a unique key), which scales where a Python set of 5.4M ids would not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from data_prep.converters.base import InputError, get_field, read_jsonl
from data_prep.converters.fever import norm_title, parse_lines, unescape, wiki_shards

FORMATS = ("scifact", "check-covid", "fever")
# The id field of each format, named in errors and in the index's metadata.
ID_FIELDS = {"scifact": "doc_id", "check-covid": "cord_id", "fever": "id"}
TEXT_FIELDS = {"scifact": "abstract", "check-covid": "abstract", "fever": "lines"}


@dataclass(frozen=True)
class Document:
    """A page of the corpus and where it was read, so a duplicate can name both lines."""

    id: str
    title: str
    units: tuple[str, ...]  # sentence text by sentence index; '' where the source line is empty
    path: str
    line: int


def corpus_files(path: str | Path, fmt: str) -> list[Path]:
    """The files of a corpus: FEVER's ``wiki-pages/`` directory is its shards, sorted; else the file itself."""
    path = Path(path)
    if fmt == "fever":
        return wiki_shards(path)
    return [path]


def iter_documents(path: str | Path, fmt: str, skipped: list[int] | None = None) -> Iterator[Document]:
    """Every document of the corpus at ``path`` in file order; ``skipped`` (if given) counts FEVER's
    empty pages."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown corpus format {fmt!r}")
    for file in corpus_files(path, fmt):
        for lineno, obj in read_jsonl(file):
            doc = read_document(obj, fmt, file, lineno)
            if doc is None:
                if skipped is not None:
                    skipped.append(lineno)
                continue
            yield doc


def read_document(obj: dict, fmt: str, path, lineno: int) -> Document | None:
    """One corpus line as a :class:`Document` (None: FEVER's empty page), else an InputError naming the field."""
    if fmt == "fever":
        return _fever_page(obj, path, lineno)
    id_field = ID_FIELDS[fmt]
    doc_id = str(get_field(obj, id_field, (str, int), path, lineno, nonempty=True))
    abstract = get_field(obj, "abstract", list, path, lineno)
    for k, s in enumerate(abstract):
        if not isinstance(s, str):
            raise InputError(path, lineno, f"abstract[{k}]", f"must be a string, got {type(s).__name__}")
    if not any(s.strip() for s in abstract):
        raise InputError(path, lineno, "abstract", "has no text (every sentence is empty)")
    title = get_field(obj, "title", str, path, lineno, optional=True) or ""
    return Document(doc_id, title.strip(), tuple(s.strip() for s in abstract), str(path), lineno)


def _fever_page(obj: dict, path, lineno: int) -> Document | None:
    page = get_field(obj, "id", str, path, lineno)
    text = get_field(obj, "text", str, path, lineno)
    lines = get_field(obj, "lines", str, path, lineno)
    if not page.strip() and not text.strip() and not lines.strip():
        return None  # the dump's own empty page
    if not page.strip():
        raise InputError(path, lineno, "id", "must be a non-empty string")
    units = tuple(parse_lines(lines, path, lineno))
    if not any(units):
        if not text.strip():
            raise InputError(path, lineno, "text", "page has no text")
        units = (unescape(text).strip(),)
    return Document(norm_title(page), unescape(page.replace("_", " ")), units, str(path), lineno)
