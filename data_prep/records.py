"""Claim records (SPEC §2): typed classes, validation, streaming JSONL I/O.

Every part of the framework (pairs, training, FAE, probes, enhancement) reads
these records, so validation lives here once. Errors always name the file, the
line, the record id when known, the field and the reason.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from real_fae_core.atomicio import atomic_open
from real_fae_core.errors import UserError
from real_fae_core.jsonl import (
    SURROGATE_REASON,
    RecordError,
    escaped,
    iter_jsonl_lines,
    short_repr,
    surrogate_field,
)
from real_fae_core.labels import LABELS, NOT_ENOUGH_INFO, REFUTE, SUPPORT  # noqa: F401 - records' public names

# Fields the schema knows; anything else is kept verbatim in ``ClaimRecord.extra``
# so a load/save round trip never loses data added by other tools.
_KNOWN_FIELDS = (
    "id",
    "dataset",
    "claim",
    "label",
    "sentences",
    "evidence",
    "enhanced_evidence",
)


# Sentence ids must fit a signed 64-bit integer: datasets (Arrow) and every
# downstream tool store them as int64.
MAX_SENTENCE_ID = 2**63 - 1
_SENTENCE_FIELDS = ("id", "text", "doc")
@dataclass
class Sentence:
    """One line of the pool. ``extra`` keeps any other key of the sentence object verbatim (a retrieved
    pool's provenance: document, sentence index, BM25 rank; docs/retrieval.md), so a load/save round trip
    never drops what another tool wrote."""

    id: int
    text: str
    doc: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The sentence as a record line holds it: id, text, doc when known, then any extra keys."""
        out: dict[str, Any] = {"id": self.id, "text": self.text}
        if self.doc is not None:
            out["doc"] = self.doc
        out.update((k, v) for k, v in self.extra.items() if k not in _SENTENCE_FIELDS)
        return out


@dataclass
class ClaimRecord:
    """A claim, its sentence pool ``S`` and gold evidence groups.

    ``evidence`` holds groups: any one complete group suffices (FEVER
    semantics). Sentence ids are never renumbered, so ablated pools keep ids.
    """

    id: str
    claim: str
    label: str
    sentences: list[Sentence]
    evidence: list[list[int]]
    dataset: str = ""
    enhanced_evidence: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    # -- derived views -------------------------------------------------
    @property
    def pool_ids(self) -> list[int]:
        """The ids of the pool's sentences, in reading order."""
        return [s.id for s in self.sentences]

    @property
    def gold_ids(self) -> list[int]:
        """E*: the union of all gold groups, sorted."""
        return sorted({i for group in self.evidence for i in group})

    def sentence_map(self) -> dict[int, Sentence]:
        """The pool's sentences by id."""
        return {s.id: s for s in self.sentences}

    # -- (de)serialisation ---------------------------------------------
    def to_dict(self) -> dict:
        """The record as one line of a records file: the schema's fields, ``enhanced_evidence`` when set,
        then the extra keys (kept as read)."""
        out: dict[str, Any] = {
            "id": self.id,
            "dataset": self.dataset,
            "claim": self.claim,
            "label": self.label,
            "sentences": [s.to_dict() for s in self.sentences],
            "evidence": [list(g) for g in self.evidence],
        }
        if self.enhanced_evidence is not None:
            out["enhanced_evidence"] = list(self.enhanced_evidence)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, obj: Any, *, check_surrogates: bool = True) -> "ClaimRecord":
        """Build and validate; raises RecordError (without location).

        ``check_surrogates=False`` skips the scan for lone surrogates: the file
        reader (:func:`real_fae_core.jsonl.iter_jsonl_lines`) has made it.
        """
        if not isinstance(obj, dict):
            hint = " (records files are JSON lines: one object per line, not one JSON array)" \
                if isinstance(obj, list) else ""
            raise RecordError(f"expected a JSON object, got {type(obj).__name__}{hint}")
        rid = obj.get("id")
        record_id = str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
        if record_id is not None:
            record_id = escaped(record_id)  # so the error itself can be printed and saved

        def fail(fld: str, reason: str):
            raise RecordError(reason, field=fld, record_id=record_id)

        bad_text = surrogate_field(obj) if check_surrogates else None
        if bad_text is not None:
            fail(bad_text, SURROGATE_REASON)

        for name in ("id", "claim", "label", "sentences", "evidence"):
            if name not in obj:
                fail(name, "missing required field")
        if record_id is None or record_id == "":
            fail("id", "must be a non-empty string or integer")
        claim = obj["claim"]
        if not isinstance(claim, str) or not claim.strip():
            fail("claim", "must be a non-empty string")
        label = obj["label"]
        if label not in LABELS:
            fail("label", f"unknown label {short_repr(label)} (expected one of {', '.join(LABELS)})")
        dataset = obj.get("dataset", "")
        if not isinstance(dataset, str):
            fail("dataset", "must be a string")

        sentences = _parse_sentences(obj["sentences"], fail)
        seen = {s.id for s in sentences}
        evidence = _parse_evidence(obj["evidence"], seen, fail)
        if label != NOT_ENOUGH_INFO and not evidence:
            fail("evidence", f"a {label} record needs at least one gold evidence group")
        enhanced = _parse_enhanced(obj.get("enhanced_evidence"), seen, evidence, fail)

        extra = {k: v for k, v in obj.items() if k not in _KNOWN_FIELDS}
        return cls(
            id=record_id,
            dataset=dataset,
            claim=claim,
            label=label,
            sentences=sentences,
            evidence=evidence,
            enhanced_evidence=enhanced,
            extra=extra,
        )

    def validate(self) -> "ClaimRecord":
        """Re-validate an in-memory record (e.g. one a converter built)."""
        return ClaimRecord.from_dict(self.to_dict())



def _parse_sentences(raw_sents: Any, fail) -> list[Sentence]:
    """The pool: a non-empty list of ``{"id", "text", "doc"?}`` with unique ids in [0, 2**63-1].

    Any other key of a sentence (provenance) is kept in ``Sentence.extra``."""
    if not isinstance(raw_sents, list):
        fail("sentences", "must be a list")
    if not raw_sents:
        fail("sentences", "empty pool: a record needs at least one sentence")
    sentences: list[Sentence] = []
    seen: set[int] = set()
    for k, s in enumerate(raw_sents):
        fld = f"sentences[{k}]"
        if not isinstance(s, dict):
            fail(fld, "must be an object with 'id' and 'text'")
        sid = s.get("id")
        if not _is_int(sid):
            fail(f"{fld}.id", f"must be an integer, got {short_repr(sid)}")
        if not 0 <= sid <= MAX_SENTENCE_ID:
            fail(f"{fld}.id", f"must be between 0 and 2**63-1, got {short_repr(sid)}")
        if sid in seen:
            fail(f"{fld}.id", f"duplicate sentence id {sid}")
        seen.add(sid)
        text = s.get("text")
        if not isinstance(text, str):
            fail(f"{fld}.text", "missing or not a string")
        doc = s.get("doc")
        if doc is not None and not isinstance(doc, (str, int)):
            fail(f"{fld}.doc", "must be a string")
        extra = {k: v for k, v in s.items() if k not in _SENTENCE_FIELDS}
        sentences.append(Sentence(id=sid, text=text, doc=None if doc is None else str(doc), extra=extra))
    return sentences


def _parse_evidence(raw_ev: Any, seen: set[int], fail) -> list[list[int]]:
    """Gold groups: non-empty lists of pool ids, each id once per group (first occurrence kept)."""
    if not isinstance(raw_ev, list):
        fail("evidence", "must be a list of groups (lists of sentence ids)")
    evidence: list[list[int]] = []
    for g, group in enumerate(raw_ev):
        if not isinstance(group, list) or not group:
            fail(f"evidence[{g}]", "each group must be a non-empty list of sentence ids")
        ids = []
        for i in group:
            if not _is_int(i):
                fail(f"evidence[{g}]", f"evidence id {short_repr(i)} is not an integer")
            if i not in seen:
                fail(f"evidence[{g}]", f"evidence id {short_repr(i)} is not in the pool")
            if i not in ids:
                ids.append(i)
        evidence.append(ids)
    return evidence


def _parse_enhanced(enhanced: Any, seen: set[int], evidence: list[list[int]], fail) -> list[int] | None:
    """Optional enlarged evidence: pool ids holding every gold id, returned sorted and unique."""
    if enhanced is None:
        return None
    if not isinstance(enhanced, list):
        fail("enhanced_evidence", "must be a list of sentence ids")
    for i in enhanced:
        if not _is_int(i):
            fail("enhanced_evidence", f"id {short_repr(i)} is not an integer")
        if i not in seen:
            fail("enhanced_evidence", f"id {short_repr(i)} is not in the pool")
    missing = {i for grp in evidence for i in grp} - set(enhanced)
    if missing:
        fail("enhanced_evidence", f"must contain all gold evidence; missing {sorted(missing)}")
    return sorted(set(enhanced))

def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class ValidationReport:
    """Bad lines collected by ``--keep-going`` instead of stopping at the first."""

    path: str
    n_lines: int = 0
    n_valid: int = 0
    errors: list[RecordError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every record was valid."""
        return not self.errors

    def to_dict(self) -> dict:
        """The report as JSON (``real-data validate --json``): counts and every error, located."""
        return {
            "path": self.path,
            "lines": self.n_lines,
            "valid": self.n_valid,
            "invalid": len(self.errors),
            "errors": [e.to_dict() for e in self.errors],
        }

    def summary(self) -> str:
        """The report as printed: one head line of counts, then one indented line per bad record."""
        head = f"{self.path}: {self.n_valid} valid, {len(self.errors)} invalid of {self.n_lines} records"
        return "\n".join([head] + [f"  {e}" for e in self.errors])


def iter_records(
    path: str | os.PathLike,
    *,
    on_error: Callable[[RecordError], None] | None = None,
) -> Iterator[ClaimRecord]:
    """Stream validated records from a JSONL file.

    Without ``on_error`` the first bad line raises RecordError; with it, bad
    lines are handed to the callback and skipped. Blank lines are ignored.
    """
    for _, rec in iter_with_lines(path, on_error):
        yield rec


def load_records(
    path: str | os.PathLike,
    *,
    keep_going: bool = False,
    report: ValidationReport | None = None,
) -> list[ClaimRecord]:
    """Load and validate every record of a JSONL file.

    ``keep_going=True`` skips bad lines, collecting them into ``report`` (pass
    one in to read it) instead of raising at the first. Duplicate record ids
    are errors: every downstream tool keys on them.
    """
    if report is None:
        report = ValidationReport(path=str(path))
    records: list[ClaimRecord] = []
    seen_ids: dict[str, int] = {}

    def collect(err: RecordError) -> None:
        report.n_lines += 1
        report.errors.append(err)

    for lineno_rec in iter_with_lines(path, collect if keep_going else None):
        lineno, rec = lineno_rec
        report.n_lines += 1
        if rec.id in seen_ids:
            err = RecordError(
                f"duplicate record id (first seen on line {seen_ids[rec.id]})",
                field="id",
                path=path,
                line=lineno,
                record_id=rec.id,
            )
            if not keep_going:
                raise err
            report.errors.append(err)
            continue
        seen_ids[rec.id] = lineno
        report.n_valid += 1
        records.append(rec)
    return records


def load_records_or_fail(path: str | os.PathLike, **kwargs) -> list[ClaimRecord]:
    """:func:`load_records` for a command: a missing file is bad input too (one line, exit 2).

    Every other problem already is a :class:`RecordError`, itself a ``UserError``.
    """
    try:
        return load_records(path, **kwargs)
    except FileNotFoundError:
        raise UserError(f"{path}: records file not found") from None


def iter_with_lines(path, on_error) -> Iterator[tuple[int, ClaimRecord]]:
    """(line number, record) for each valid record of ``path``; a bad one goes to ``on_error`` (located),
    or is raised when ``on_error`` is None."""
    for lineno, obj in iter_jsonl_lines(path):
        try:
            if isinstance(obj, RecordError):
                raise obj
            rec = ClaimRecord.from_dict(obj, check_surrogates=False)  # the reader has checked
        except RecordError as err:
            located = err.located(path, lineno)
            if on_error is None:
                raise located from None
            on_error(located)
            continue
        yield lineno, rec


def validate_file(path: str | os.PathLike) -> ValidationReport:
    """Check every line of a records file and report all problems."""
    report = ValidationReport(path=str(path))
    load_records(path, keep_going=True, report=report)
    return report


def save_records(records: Iterable[ClaimRecord | dict], path: str | os.PathLike) -> int:
    """Write records as UTF-8 JSONL, streaming; returns the count written.

    Writes to a temporary file beside ``path`` and renames it, so a crash or a
    full disk never leaves a half-written records file under the final name
    (the temporary is removed).
    """
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_open(path, "w") as fh:
        for rec in records:
            obj = rec.to_dict() if isinstance(rec, ClaimRecord) else rec
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
            n += 1
    return n
