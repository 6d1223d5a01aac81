"""Shared pieces of the converters: input errors, JSONL reading, drop accounting.

Two kinds of bad input, treated differently:

* a malformed source (bad JSON, a missing or mistyped field) is fatal and
  raises :class:`InputError` naming the file, line and field, because the
  output would silently lose data otherwise;
* a claim whose evidence cannot be resolved (an unknown cord_id / doc id /
  wiki page, a sentence index outside its abstract, an empty gold line) is
  dropped and counted by reason in the summary, with the first few locations.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from real_fae_core.errors import UserError
from real_fae_core.jsonl import RecordFileError, iter_jsonl_lines
from data_prep.records import ClaimRecord, RecordError

# How many locations per drop reason the summary keeps (the counts are exact).
MAX_EXAMPLES = 5


class InputError(UserError):
    """A malformed source file: always says file, line and field."""

    def __init__(self, path, line: int | None, field: str | None, reason: str):
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = reason
        super().__init__(where(path, line, field) + f": {reason}")


def where(path, line: int | None = None, field: str | None = None) -> str:
    """``path``, ``path:line`` or ``path:line: field 'x'``: the place a message names."""
    out = str(path)
    if line is not None:
        out += f":{line}"
    if field is not None:
        out += f": field {field!r}"
    return out


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, object)``; blank lines are skipped, bad JSON is fatal.

    Bytes are decoded line by line as strict UTF-8 (a BOM is skipped), so a
    Latin-1, UTF-16 or gzip file, or a directory, is one InputError naming
    the file, line and byte offset instead of a UnicodeDecodeError traceback.
    """
    path = Path(path)
    try:
        lines = iter_jsonl_lines(path)
        for lineno, obj in lines:
            if isinstance(obj, RecordError):
                reason = obj.reason
                if lineno == 1 and reason.startswith("invalid JSON") and _starts_with_bracket(path):
                    reason += " (this file must be JSON lines: one object per line)"
                raise InputError(path, lineno, obj.field, reason)
            if not isinstance(obj, dict):
                raise InputError(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj
    except RecordFileError as exc:
        raise InputError(path, exc.line, None, exc.reason) from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None


def _starts_with_bracket(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(64).lstrip().startswith(b"[")


_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object"}


def get_field(obj: dict, name: str, kind: type | tuple[type, ...], path, line: int,
              *, optional: bool = False, nonempty: bool = False) -> Any:
    """``obj[name]`` checked for presence and type, else an InputError at file:line:field."""
    if name not in obj or obj[name] is None:
        if optional:
            return None
        raise InputError(path, line, name, "missing required field")
    value = obj[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise InputError(path, line, name, f"must be {expected}, got {type(value).__name__}")
    if nonempty and isinstance(value, str) and not value.strip():
        raise InputError(path, line, name, "must be a non-empty string")
    return value


def get_label(obj: dict, name: str, table: dict[str, Any], path, line: int) -> Any:
    """``table[obj[name]]``: the dataset's label mapped to ours, else an InputError listing the choices."""
    raw = get_field(obj, name, str, path, line)
    if raw not in table:
        raise InputError(path, line, name,
                         f"unknown label {raw!r} (expected one of {', '.join(table)})")
    return table[raw]


def claim_lines(inputs: ConvertInputs, stats: ConvertStats, id_field: str,
                id_kind: type | tuple[type, ...]) -> Iterator[tuple[Path, int, dict, Any, str]]:
    """``(path, line, object, id, claim text)`` of every claim line of ``--claims``, counted as read.

    The id and the (non-empty) claim text are checked first, in that order, as every
    one-file-per-claim-line converter does before its own fields.
    """
    for path in inputs.claims:
        for lineno, obj in read_jsonl(path):
            stats.claims_read += 1
            cid = get_field(obj, id_field, id_kind, path, lineno)
            claim = get_field(obj, "claim", str, path, lineno, nonempty=True)
            stats.current_id = cid
            yield path, lineno, obj, cid, claim
        stats.current_id = None


def load_abstract_corpus(path, id_field: str, id_kind: type | tuple[type, ...],
                         *, nonempty: bool = False) -> dict[str, list[str]]:
    """``{doc id: abstract sentences}`` from a JSONL corpus (Check-COVID, SciFact); duplicate ids are fatal."""
    corpus: dict[str, list[str]] = {}
    first_line: dict[str, int] = {}
    for lineno, obj in read_jsonl(path):
        doc_id = str(get_field(obj, id_field, id_kind, path, lineno, nonempty=nonempty))
        abstract = get_field(obj, "abstract", list, path, lineno)
        for k, s in enumerate(abstract):
            if not isinstance(s, str):
                raise InputError(path, lineno, f"abstract[{k}]", f"must be a string, got {type(s).__name__}")
        if doc_id in corpus:
            raise InputError(path, lineno, id_field,
                             f"duplicate {id_field} {doc_id!r} (first on line {first_line[doc_id]})")
        corpus[doc_id] = abstract
        first_line[doc_id] = lineno
    return corpus


@dataclass
class ConvertStats:
    """Counts the converters report; the CLI turns them into the summary."""

    claims_read: int = 0
    dropped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)  # converter-specific figures for the summary
    current_id: Any = None  # the source id of the claim line being converted (set by claim_lines)
    # every dropped claim line: (reason, source id or None, "file:line: field: detail"), uncapped
    dropped_claims: list[tuple[str, Any, str]] = field(default_factory=list)

    def drop(self, reason: str, path, line: int | None = None, field_name: str | None = None,
             detail: str | None = None) -> None:
        """Count one claim line dropped for ``reason`` and note where (every drop; ``MAX_EXAMPLES`` examples per reason)."""
        self.dropped[reason] += 1
        loc = where(path, line, field_name) + (f": {detail}" if detail else "")
        self.dropped_claims.append((reason, self.current_id, loc))
        ex = self.examples.setdefault(reason, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(loc)


@dataclass
class ConvertInputs:
    """What the CLI hands a converter (paths already checked to exist)."""

    claims: list[Path]
    corpus: Path | None = None
    wiki_pages: Path | None = None
    include_nei: bool = False


# A converter yields each record with the source location it came from, so the
# driver can name file:line if the record fails validation.
Emitted = tuple[ClaimRecord, Path, int]


@dataclass(frozen=True)
class Converter:
    name: str
    help: str
    convert: Callable[[ConvertInputs, ConvertStats], Iterator[Emitted]]
    needs: tuple[str, ...] = ()  # input options besides --claims: "corpus", "wiki_pages"


NEI_REASON = "NOT_ENOUGH_INFO claim (use --include-nei to keep)"
