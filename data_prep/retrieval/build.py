"""From claims to the files of `real-data retrieve`: records, misses, and the summary's figures.

Each claim's pools (:mod:`data_prep.retrieval.retrieve`) get their second ordering (a reranker,
when one is given) and, per budget, the units each ordering keeps (:mod:`data_prep.retrieval.pack`).
The summary holds what judges a retrieval: gold documents found within the top k pages, gold
sentences inside the pool and inside each packed budget per ordering, the share of the pool each
budget keeps, the reranker (name and kind) and its truncated pairs (bi-encoder: units cut). Nothing
in it depends on time or machine, so two runs on the same inputs write byte-identical files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from real_fae_core.errors import UserError
from real_fae_core.modelref import portable_name
from data_prep.records import NOT_ENOUGH_INFO
from data_prep.retrieval.claims import ClaimGold
from data_prep.retrieval.index import Index
from data_prep.retrieval.pack import BudgetTooSmall, pack, token_lengths
from data_prep.retrieval.retrieve import SOURCES, claim_pools, miss_entry, pool_record


@dataclass
class Options:
    """What shapes the pools: pages per claim, units per pool, budgets, and the two optional models."""

    pages: int
    max_units: int
    budgets: list[int] = field(default_factory=list)
    tokenizers: dict = field(default_factory=dict)  # name -> tokenizer
    reranker: Any = None  # a rerank.Reranker or rerank.BiEncoder, or None for BM25 alone


@dataclass
class Tally:
    """Per-claim counts the summary is computed from."""

    gold_doc_ranks: list[tuple[int, list[int]]] = field(default_factory=list)  # (n gold docs, ranks found)
    gold_sentences: int = 0
    in_pool: int = 0
    in_budget: dict[tuple[int, int], int] = field(default_factory=dict)  # (budget, source) -> gold kept
    shares: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    pairs: int = 0
    truncated: int = 0
    retrieved: dict[str, int] = field(default_factory=lambda: {"all": 0, "some": 0, "none": 0})
    no_page: int = 0


def retrieve_all(index: Index, claims: list[ClaimGold], opts: Options) -> tuple[list[dict], list[dict], Tally]:
    """Records (valid §2), misses (one per claim with gold lost) and the tally, in claim order."""
    records: list[dict] = []
    misses: list[dict] = []
    tally = Tally()
    for claim in claims:
        top, pools = claim_pools(index, claim, opts.pages, opts.max_units)
        if not top:
            tally.no_page += 1
        kept, invalid = [], []
        for pool in pools:
            rec, valid = pool_record(claim, pool)
            _order_and_pack(claim, rec, opts, tally)
            (kept if valid else invalid).append(rec)
        records += kept
        missed = _count_claim(claim, top, kept + invalid, tally)
        if missed or invalid:
            misses.append(miss_entry(claim, top, missed, invalid))
    return records, misses, tally


def _order_and_pack(claim: ClaimGold, rec: dict, opts: Options, tally: Tally) -> None:
    """Add source 1 (reranker) and, per budget, each ordering's packed unit ids to the record."""
    texts = [s["text"] for s in rec["sentences"]]
    retrieval = rec["retrieval"]
    if opts.reranker is not None:
        order, truncated = opts.reranker.order(claim.claim, texts)
        retrieval["orderings"].append(order)
        retrieval["truncated_pairs"] = truncated
        tally.pairs += len(texts)
        tally.truncated += len(truncated)
    if not opts.budgets:
        return
    lengths = token_lengths(opts.tokenizers, texts)
    packed: dict[str, list[list[int]]] = {}
    for budget in opts.budgets:
        packed[str(budget)] = []
        for source, order in enumerate(retrieval["orderings"]):
            try:
                ids = pack(order, lengths, budget)
            except BudgetTooSmall as exc:
                raise UserError(f"{claim.path}:{claim.line}: field 'budgets': {exc} of {SOURCES[source]} ordering "
                                f"of record {rec['id']}") from None
            packed[str(budget)].append(ids)
            tally.shares.setdefault((budget, source), []).append(len(ids) / len(texts))
    retrieval["packed"] = packed


def _count_claim(claim: ClaimGold, top, pools: list[dict], tally: Tally) -> list:
    """Tally the claim's gold: documents by page rank, sentences in pool and per budget. Returns the gold
    groups no pool holds whole (none for a claim without gold)."""
    if not claim.groups:
        return []
    ranks = {p.doc: p.rank for p in top}
    tally.gold_doc_ranks.append((len(claim.gold_docs), [ranks[d] for d in claim.gold_docs if d in ranks]))
    gold = {item for g in claim.groups for item in g}
    tally.gold_sentences += len(gold)
    pooled: set = set()
    for rec in pools:
        units = [(s["doc"], s["sentence_index"]) for s in rec["sentences"]]
        pooled |= set(units) & gold
        for budget, per_source in rec["retrieval"].get("packed", {}).items():
            for source, ids in enumerate(per_source):
                key = (int(budget), source)
                tally.in_budget[key] = tally.in_budget.get(key, 0) + len({units[i] for i in ids} & gold)
    tally.in_pool += len(pooled)
    complete = [g for g in claim.groups if set(g) <= pooled]
    tally.retrieved["all" if len(complete) == len(claim.groups) else "some" if complete else "none"] += 1
    return [g for g in claim.groups if not set(g) <= pooled]


def summary(tally: Tally, records: list[dict], misses: list[dict], opts: Options) -> dict:
    """The figures of docs/retrieval.md's summary.json (rates as fractions, 4 decimals)."""
    def rate(num: float, den: float) -> float | None:
        return round(num / den, 4) if den else None

    sources = SOURCES[:2 if opts.reranker is not None else 1]
    doc_recall = {str(k): rate(sum(sum(r < k for r in found) / n for n, found in tally.gold_doc_ranks),
                               len(tally.gold_doc_ranks)) for k in range(1, opts.pages + 1)}
    labels: dict[str, int] = {}
    for r in records:
        labels[r["label"]] = labels.get(r["label"], 0) + 1
    return {
        "records": len(records), "records_by_label": dict(sorted(labels.items())),
        "units_per_record": {"mean": round(mean(len(r["sentences"]) for r in records), 2) if records else None,
                             "max": max((len(r["sentences"]) for r in records), default=0)},
        "nei_records": labels.get(NOT_ENOUGH_INFO, 0),
        "claims_with_gold": len(tally.gold_doc_ranks), "claims_no_page_matched": tally.no_page,
        "gold_groups_retrieved": tally.retrieved, "misses": len(misses),
        "gold_doc_recall_at_k": doc_recall,
        "gold_sentence_recall": {
            "pool": rate(tally.in_pool, tally.gold_sentences),
            "budgets": {str(b): {s: rate(tally.in_budget.get((b, i), 0), tally.gold_sentences)
                                 for i, s in enumerate(sources)} for b in opts.budgets}},
        "retained_share": {str(b): {s: round(mean(tally.shares[b, i]), 4) if tally.shares.get((b, i)) else None
                                    for i, s in enumerate(sources)} for b in opts.budgets},
        "reranker": None if opts.reranker is None else {
            "model": portable_name(opts.reranker.name), "kind": opts.reranker.kind, "pairs": tally.pairs,
            "truncated_pairs": tally.truncated, "max_pair_tokens": opts.reranker.max_tokens},
    }
