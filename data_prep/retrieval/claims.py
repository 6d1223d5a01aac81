"""The claims a retrieval runs on, with their gold evidence as (document id, sentence index) pairs.

Retrieval needs each claim's label and gold located in the corpus, not in a pool someone chose. The
dataset's own converter (data_prep/converters) already reads its claims, maps its labels and checks
its evidence, so SciFact and Check-COVID claims are read through it (NOT_ENOUGH_INFO kept) and each
gold pool id is traced back to its abstract sentence. The converter's pool is the claim's cited
abstracts in order (SciFact's ``cited_doc_ids``, Check-COVID's ``cord_id``), so its documents are the
claim's citations, which retrieved records carry as ``cited_docs`` (`real-data families` joins claims
citing one abstract by them, as it does on converted records). FEVER claims are read with the FEVER
converter's claim parser, whose groups already are (page, line) pairs, so the 5.4M-page dump is not
loaded to build pools that retrieval would throw away; FEVER claims cite no document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from data_prep.converters import check_covid, scifact
from data_prep.converters.base import ConvertInputs, ConvertStats, InputError, read_jsonl
from data_prep.converters.fever import NAME as FEVER, norm_title, parse_claim
from data_prep.records import ClaimRecord

DATASETS = (scifact.NAME, check_covid.NAME, FEVER)
_ABSTRACT_CONVERTERS = {scifact.NAME: scifact, check_covid.NAME: check_covid}


@dataclass
class ClaimGold:
    """A claim to retrieve for: its record id, text, label and gold groups of (doc id, sentence index)."""

    id: str
    dataset: str
    claim: str
    label: str
    groups: list[list[tuple[str, int]]]
    path: str
    line: int
    cited: list[str] | None = None  # the documents the claim cites; None where the dataset names none (FEVER)

    @property
    def gold_docs(self) -> list[str]:
        """The documents holding gold, in order of first mention."""
        return list(dict.fromkeys(doc for group in self.groups for doc, _ in group))


@dataclass
class ClaimsRead:
    """The claims and the converter's accounting (claims it dropped, by reason)."""

    claims: list[ClaimGold] = field(default_factory=list)
    read: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    # per reason, each dropped claim: its record id and where ("file:line: field: detail")
    dropped_claims: dict[str, list[dict]] = field(default_factory=dict)


def read_claims(dataset: str, claim_files: list[str], corpus: str) -> ClaimsRead:
    """Every claim of ``claim_files`` with its gold located; bad lines raise the converter's InputError."""
    if dataset == FEVER:
        return _fever_claims(claim_files)
    module = _ABSTRACT_CONVERTERS[dataset]
    abstracts = module.load_corpus(corpus)
    stats = ConvertStats()
    inputs = ConvertInputs(claims=[Path(p) for p in claim_files], corpus=Path(corpus), include_nei=True)
    out = ClaimsRead()
    for record, path, line in module.CONVERTER.convert(inputs, stats):
        out.claims.append(ClaimGold(record.id, dataset, record.claim, record.label,
                                    gold_in_corpus(record, abstracts), str(path), line, pool_docs(record)))
    out.read = stats.claims_read
    out.dropped = dict(sorted(stats.dropped.items()))
    for reason, cid, at in stats.dropped_claims:
        out.dropped_claims.setdefault(reason, []).append({"id": None if cid is None else f"{dataset}-{cid}",
                                                          "at": at})
    out.dropped_claims = dict(sorted(out.dropped_claims.items()))
    return out


def pool_docs(record: ClaimRecord) -> list[str]:
    """The documents of a converted record's pool in order: the abstracts the claim cites."""
    return list(dict.fromkeys(s.doc for s in record.sentences if s.doc))


def gold_in_corpus(record: ClaimRecord, abstracts: dict[str, list[str]]) -> list[list[tuple[str, int]]]:
    """The record's gold groups as (doc, sentence index): each doc's pool lines are its non-empty abstract
    sentences in order (how both converters build pools), matched by text so a skipped empty line
    cannot shift an index."""
    where: dict[int, tuple[str, int]] = {}
    cursor: dict[str, int] = {}
    for s in record.sentences:
        abstract = abstracts[s.doc]
        i = cursor.get(s.doc, 0)
        while abstract[i] != s.text:
            i += 1
        where[s.id] = (s.doc, i)
        cursor[s.doc] = i + 1
    return [[where[i] for i in group] for group in record.evidence]


def _fever_claims(claim_files: list[str]) -> ClaimsRead:
    out = ClaimsRead()
    for path in claim_files:
        for lineno, obj in read_jsonl(path):
            out.read += 1
            cid, claim, label, groups = parse_claim(obj, path, lineno)
            located = [list(dict.fromkeys((norm_title(page), line) for page, line in g)) for g in groups]
            out.claims.append(ClaimGold(f"{FEVER}-{cid}", FEVER, claim, label, located, str(path), lineno))
    return out


def check_unique_ids(claims: list[ClaimGold]) -> None:
    """Two claims with one id would write two records under it: the first line names the second."""
    seen: dict[str, ClaimGold] = {}
    for c in claims:
        if c.id in seen:
            raise InputError(c.path, c.line, "id", f"duplicate claim id {c.id!r} (first on line {seen[c.id].line})")
        seen[c.id] = c
