"""Evidence pools from an index (SPEC §10): pages by BM25, their units ranked lexically, records of §2.

For each claim: the query is the OR of its unique casefolded alphanumeric tokens
(:mod:`data_prep.retrieval.lexical`); the top ``k`` pages come from the index; their non-empty
sentences (units) are ranked by FTS5's BM25 with the retrieved units as the collection, a unit
that matches no query token scoring 0 (after every match); at most ``max_units`` are kept. Ties are
broken by unit id = (page rank, sentence index), so the order never depends on anything but the
corpus and the claim. SciFact makes one record per claim x abstract (its abstracts are judged one
by one); the other datasets one record per claim over all its pages.

A record's sentences are its units in BM25 order (source 0), ids 0..n-1, each with its provenance
(``doc``, ``sentence_index``, ``page_rank``, ``bm25_rank``); ``cited_docs`` names the documents the
claim cites (SciFact, Check-COVID), which `real-data families` links claims by. Gold groups whose every sentence was
retrieved become ``evidence``; the others are misses, recorded and never added back. A SUPPORT or
REFUTE pool that holds no complete gold group cannot be a §2 record (it would have no gold): it is
written to the misses file instead, pool included, so a study can still run and score it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from real_fae_core.errors import UserError
from data_prep.records import NOT_ENOUGH_INFO, ClaimRecord, Sentence
from data_prep.retrieval.claims import ClaimGold
from data_prep.retrieval.index import Index, Page
from data_prep.retrieval.lexical import fts5_or_query, query_tokens

SCIFACT = "scifact"
DEFAULT_PAGES = {SCIFACT: 3}  # abstracts per claim; every other dataset: DEFAULT_PAGES_OTHER
DEFAULT_PAGES_OTHER = 5
MAX_UNITS = 100
SOURCES = ("bm25", "reranker")  # source 0, source 1 (SPEC §8, §10)


@dataclass(frozen=True)
class Unit:
    """A sentence of a retrieved page; ``key`` = (page rank, sentence index) is its id for tie breaks."""

    doc: str
    page_rank: int
    index: int
    text: str

    @property
    def key(self) -> tuple[int, int]:
        """(page rank, sentence index): the unit's id, and the order that breaks score ties."""
        return (self.page_rank, self.index)


@dataclass
class Pool:
    """The units of one record, in BM25 order, and the pages they come from."""

    record_id: str
    pages: list[Page]
    units: list[Unit]


def claim_query(claim: ClaimGold) -> list[str]:
    """The claim's query tokens; a claim with none cannot be retrieved for (bad input naming its line)."""
    tokens = query_tokens(claim.claim)
    if not tokens:
        raise UserError(f"{claim.path}:{claim.line}: field 'claim': has no alphanumeric token, so there is "
                        f"no query to retrieve with ({claim.claim!r})")
    return tokens


def rank_units(units: list[Unit], tokens: list[str]) -> list[Unit]:
    """``units`` by BM25 over the units themselves (best first), non-matching ones last, ties by unit id."""
    con = sqlite3.connect(":memory:")
    try:
        con.execute("CREATE VIRTUAL TABLE u USING fts5(text, tokenize='unicode61')")
        con.executemany("INSERT INTO u(rowid, text) VALUES (?, ?)", [(i + 1, u.text) for i, u in enumerate(units)])
        scores = dict(con.execute("SELECT rowid, bm25(u) FROM u WHERE u MATCH ?", (fts5_or_query(tokens),)))
    finally:
        con.close()
    order = sorted(range(len(units)), key=lambda i: (scores.get(i + 1, 0.0), units[i].key))
    return [units[i] for i in order]


def claim_pools(index: Index, claim: ClaimGold, pages: int, max_units: int) -> tuple[list[Page], list[Pool]]:
    """The claim's top pages and its pools: one per page for SciFact, one over all pages otherwise."""
    tokens = claim_query(claim)
    top = index.top_pages(tokens, pages)
    units = [Unit(p.doc, p.rank, idx, text) for p in top for idx, text in index.units(p)]
    ranked = rank_units(units, tokens) if units else []
    if claim.dataset == SCIFACT:
        return top, [Pool(f"{claim.id}:{p.doc}", [p], [u for u in ranked if u.page_rank == p.rank][:max_units])
                     for p in top]
    return top, ([Pool(claim.id, top, ranked[:max_units])] if ranked else [])


def pool_record(claim: ClaimGold, pool: Pool) -> tuple[dict, bool]:
    """(the pool as a record dict, whether it is a valid §2 record). Gold groups are mapped where every
    sentence was retrieved; SciFact judges each abstract alone, so an abstract without the claim's
    rationales is a NOT_ENOUGH_INFO unit and only the rationales of this abstract count as its gold."""
    sentences = [Sentence(id=k, text=u.text, doc=u.doc,
                          extra={"sentence_index": u.index, "page_rank": u.page_rank, "bm25_rank": k})
                 for k, u in enumerate(pool.units)]
    where = {(u.doc, u.index): k for k, u in enumerate(pool.units)}
    groups = claim.groups
    label = claim.label
    if claim.dataset == SCIFACT:
        doc = pool.pages[0].doc
        groups = [g for g in groups if all(d == doc for d, _ in g)]
        label = claim.label if groups else NOT_ENOUGH_INFO
    evidence, missed = [], []
    for group in groups:
        if all(item in where for item in group):
            ids = sorted({where[item] for item in group})
            if ids not in evidence:
                evidence.append(ids)
        else:
            missed.append([list(item) for item in group])
    retrieval = {"pages": [{"doc": p.doc, "rank": p.rank, "bm25": round(p.score, 6)} for p in pool.pages],
                 "orderings": [list(range(len(sentences)))], "gold_missed": missed}
    extra = {"claim_id": claim.id, "claim_label": claim.label}
    if claim.cited is not None:
        extra["cited_docs"] = list(claim.cited)
    extra["retrieval"] = retrieval
    record = ClaimRecord(id=pool.record_id, dataset=claim.dataset, claim=claim.claim, label=label,
                         sentences=sentences, evidence=evidence, extra=extra)
    return record.to_dict(), label == NOT_ENOUGH_INFO or bool(evidence)


def miss_entry(claim: ClaimGold, top: list[Page], missed: list[list[tuple[str, int]]], pools: list[dict]) -> dict:
    """One line of the misses file: the claim, the gold groups no pool holds whole, and any pool that could
    not be a record (a SUPPORT/REFUTE pool without a complete gold group)."""
    found_docs = {p.doc for p in top}
    return {"claim_id": claim.id, "dataset": claim.dataset, "claim": claim.claim, "label": claim.label,
            "claims_file": claim.path, "line": claim.line,
            "retrieved_docs": [p.doc for p in top],
            "missed_docs": [d for d in claim.gold_docs if d not in found_docs],
            "missed_groups": [[list(item) for item in g] for g in missed], "pools": pools}
