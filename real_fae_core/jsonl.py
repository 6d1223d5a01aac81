"""JSON-lines reading shared by every file format of the project (records, claims, corpora, caches).

Bytes are decoded line by line as strict UTF-8, so a bad line is reported with
its file, line and byte offset instead of a bare UnicodeDecodeError; blank
lines are skipped; whole-file problems (a directory, a compressed or UTF-16
file) are refused at once. A string holding a lone UTF-16 surrogate (the JSON
escape ``"\\ud800"``: valid JSON, but no UTF-8 file, SQLite database or
tokenizer can hold it) is refused here too, naming the line and the field, so
no command meets it later as a UnicodeEncodeError. Errors are :class:`RecordError` (``path:line:
record 'id': field 'x': reason``), a :class:`~real_fae_core.errors.UserError`:
bad input, exit 2.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import reprlib
from pathlib import Path
from typing import Any, Iterator

from real_fae_core.errors import UserError

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
SURROGATE_REASON = ("contains a lone UTF-16 surrogate (e.g. \"\\ud800\"), which no UTF-8 file can hold; "
                    "fix the escape in the source")
_short_repr = reprlib.Repr()
_short_repr.maxstring = 60
_short_repr.maxother = 60
_short_repr.maxlevel = 3


def short_repr(value: Any) -> str:
    """A bounded ``repr`` for error messages: never huge, never raises."""
    try:
        return _short_repr.repr(value)
    except (ValueError, RecursionError):  # e.g. an int over Python's 4300-digit str limit
        return f"<{type(value).__name__}>"


class RecordError(ValueError, UserError):
    """One bad record: where it is and what is wrong with it (bad input: exit 2)."""

    def __init__(
        self,
        reason: str,
        *,
        field: str | None = None,
        path: str | os.PathLike | None = None,
        line: int | None = None,
        record_id: str | None = None,
    ):
        self.reason = reason
        self.field = field
        self.path = str(path) if path is not None else None
        self.line = line
        self.record_id = record_id
        super().__init__(self._message())

    def _message(self) -> str:
        where = self.path or "<records>"
        if self.line is not None:
            where += f":{self.line}"
        parts = [where]
        if self.record_id is not None:
            parts.append(f"record {self.record_id!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ": ".join(parts) + f": {self.reason}"

    def located(self, path, line, record_id=None) -> "RecordError":
        """The same error placed at ``path``:``line``; an id the error already names wins over ``record_id``."""
        return RecordError(
            self.reason,
            field=self.field,
            path=path,
            line=line,
            record_id=self.record_id if self.record_id is not None else record_id,
        )

    def to_dict(self) -> dict:
        """The error as a JSON-ready mapping (path, line, record_id, field, reason; None where unknown), for reports."""
        return {
            "path": self.path,
            "line": self.line,
            "record_id": self.record_id,
            "field": self.field,
            "reason": self.reason,
        }


class RecordFileError(RecordError):
    """The whole file is unreadable as records (a directory, compressed, UTF-16): always fatal."""


# Leading bytes of files that are not UTF-8 JSON lines, with what to do about them.
_FILE_KINDS: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip-compressed: decompress it first (gunzip -k FILE)"),
    (b"BZh", "bzip2-compressed: decompress it first (bunzip2 -k FILE)"),
    (b"\xfd7zXZ\x00", "xz-compressed: decompress it first (unxz -k FILE)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed: decompress it first (unzstd FILE)"),
    (b"PK\x03\x04", "a zip archive: extract the JSONL file from it first"),
    (b"\xff\xfe\x00\x00", "UTF-32 encoded: records files must be UTF-8 "
                             "(convert with iconv -f UTF-32 -t UTF-8)"),
    (b"\xff\xfe", "UTF-16 encoded (byte-order mark FF FE): records files must be UTF-8 "
                  "(convert with iconv -f UTF-16 -t UTF-8)"),
    (b"\xfe\xff", "UTF-16 encoded (byte-order mark FE FF): records files must be UTF-8 "
                  "(convert with iconv -f UTF-16 -t UTF-8)"),
)
_UTF8_BOM = b"\xef\xbb\xbf"


def iter_jsonl_lines(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line number, JSON value or RecordError)`` for each non-blank line: the one JSON-lines reader.

    Reads bytes and decodes each line as strict UTF-8 (a UTF-8 byte-order mark
    is skipped), so an encoding problem names its line and byte offset instead
    of surfacing as a bare UnicodeDecodeError. Whole-file problems (a directory,
    a compressed or UTF-16 file) raise :class:`RecordFileError` at once. A line
    whose value holds a lone surrogate comes back as a :class:`RecordError`
    naming the field (and the object's ``id``). A missing file raises FileNotFoundError.
    """
    path = Path(path)
    if path.is_dir():
        raise RecordFileError("is a directory, not a records file (give the .jsonl file inside it)",
                              path=path)
    with path.open("rb") as fh:
        offset = 0
        for lineno, raw in enumerate(_universal_lines(fh), start=1):
            start = offset
            offset += len(raw)
            if lineno == 1:
                for magic, what in _FILE_KINDS:
                    if raw.startswith(magic):
                        raise RecordFileError(f"the file is {what}", path=path, line=1)
                if raw.startswith(_UTF8_BOM):
                    raw = raw[len(_UTF8_BOM):]
                    start += len(_UTF8_BOM)
            if not raw.strip():
                continue
            yield lineno, _decode_line(raw, start)


# A lone CR (not part of CRLF) ends a line, as in Python's text mode and in
# editors: old-Mac files (CR only) were read line by line before byte reading.
_AFTER_LONE_CR = re.compile(rb"(?<=\r)(?!\n)")


def _universal_lines(fh) -> Iterator[bytes]:
    """Byte lines ending at LF, CRLF or a lone CR (universal newlines), ends kept."""
    for raw in fh:
        cr = raw.find(b"\r")
        if cr < 0 or (cr == len(raw) - 2 and raw.endswith(b"\r\n")):
            yield raw  # the common case: no CR, or only the CR of CRLF
            continue
        for piece in _AFTER_LONE_CR.split(raw):
            if piece:
                yield piece


def _decode_line(raw: bytes, start: int) -> Any:
    """One line's JSON value, or a RecordError (without location) saying what is wrong."""
    if b"\x00" in raw:
        col = raw.index(b"\x00") + 1
        return RecordError(f"NUL byte at byte offset {start + col - 1} (column {col}): the file looks "
                           "UTF-16 or binary; records files must be UTF-8 JSON lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RecordError(
            f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at byte offset {start + exc.start} "
            f"(column {exc.start + 1}); records files must be UTF-8 "
            "(re-encode it, e.g. iconv -f latin1 -t UTF-8)")
    try:
        value = json.loads(text.rstrip("\r\n"))  # without the line end: errors at its real column
    except json.JSONDecodeError as exc:
        hint = (" (pretty-printed JSON? records files are JSON lines: one object per line)"
                if text.strip() in ("{", "[") else "")
        return RecordError(f"invalid JSON ({exc.msg} at column {exc.colno}){hint}")
    except RecursionError:
        return RecordError("invalid JSON (nested too deeply)")
    except ValueError:  # Python's 4300-digit limit on integers
        return RecordError("invalid JSON (a number has more than 4300 digits)")
    return surrogate_error(raw, value) or value


def surrogate_error(raw: bytes | str, value: Any) -> RecordError | None:
    """The error (without location) for a decoded line ``raw`` whose ``value`` holds a lone surrogate, else None.

    An escape (``\\ud800``) is the only way one enters strict UTF-8 JSON, so lines without one are not scanned.
    """
    if isinstance(raw, str):
        if "\\u" not in raw:
            return None
        raw = raw.encode("utf-8", "surrogatepass")
    if not _SURROGATE_ESCAPE.search(raw):
        return None
    bad = surrogate_field(value)
    return None if bad is None else RecordError(SURROGATE_REASON, field=bad, record_id=_record_id(value))


def _record_id(value: Any) -> str | None:
    """The ``id`` of a JSON object, printable (surrogates escaped), for locating an error."""
    rid = value.get("id") if isinstance(value, dict) else None
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return None
    return escaped(str(rid))


def escaped(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX`` escapes (safe to print and save)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def surrogate_field(obj: Any) -> str | None:
    """The path (``sentences[2].text``) of the first string or key holding a lone surrogate, if any.

    Iterative, so deeply nested values cannot overflow the stack.
    """
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return escaped(where) or "<record>"
        elif isinstance(value, dict):
            items = []
            for k, v in value.items():
                sub = f"{where}.{k}" if where else str(k)
                if isinstance(k, str) and _SURROGATE.search(k):
                    return escaped(sub)
                items.append((sub, v))
            stack.extend(reversed(items))
        elif isinstance(value, list):
            stack.extend(reversed([(f"{where}[{k}]", v) for k, v in enumerate(value)]))
    return None


def read_appended(path: str | os.PathLike, *, repair: bool = False) -> list[tuple[int, Any]]:
    """``(line number, JSON value or RecordError)`` of each complete non-blank line of an append-only file.

    Append-only outputs (``claims.jsonl``, pave's ``samples.jsonl``) are written
    one whole line per ``write``: a process killed mid-write leaves at most one
    last line without its newline. That line is skipped, and cut from the file
    when ``repair`` (only the process that appends to the file may repair it).
    A missing file has no lines. Bad complete lines come back as located-less
    :class:`RecordError` values for the caller to word and raise. A finished file
    kept gzipped (``.gz``: a committed study's responses) is read as it is; it is
    never appended to, so never repaired.
    """
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise RecordFileError(f"not a readable gzip file ({exc})", path=path) from None
        repair = False
    end = data.rfind(b"\n") + 1
    if end < len(data) and repair:
        with path.open("r+b") as fh:
            fh.truncate(end)
            fh.flush()
            os.fsync(fh.fileno())
    out = []
    offset = 0
    for lineno, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
        start, offset = offset, offset + len(raw) + 1
        if raw.strip():
            out.append((lineno, _decode_line(raw, start)))
    return out


class DurableAppender:
    """Appends JSON lines durably, one write and one fsync per batch, after cutting a half-written last line.

    ``read(path, repair=True)`` is the file's own reader (it checks the kind of line the file holds and
    cuts the trace of a kill mid-write), so a resumed run appends to complete lines only.
    """

    def __init__(self, path: str | os.PathLike, read) -> None:
        self.path = Path(path)
        read(self.path, repair=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def __call__(self, items) -> None:
        if not items:
            return
        self._fh.write("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the file; every batch already written is on disk (each call fsyncs)."""
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
