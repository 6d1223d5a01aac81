"""Claim families (SPEC §10): groups of related records that a bootstrap resamples as one unit.

Intervals that resample claims independently are too narrow when claims are
not independent: SciFact writes a claim and its negation from one citation
sentence, FEVER mutates one source claim into several, datasets repeat a claim
with different whitespace. The score-accounting paper therefore resamples
*families*: records joined (transitively, by union-find) by any of these links,
applied in this order:

``same_claim``
    Always on. The units of one claim (SciFact: one claim × each of its
    retrieved abstracts) must stay together, so records of the same *claim
    key* are one family. The claim key is the record's ``claim_id`` field when
    it has one (a string), else the part of its id before the last
    ``unit_separator`` (default ``":"``: ``scifact-12:4983`` belongs to claim
    ``scifact-12``), else the whole id. Converted records (``scifact-12``,
    ``fever-75397``) hold no ``:`` and are their own claim.
``exact``
    Normalized exact match: NFKC, casefold, every run of characters that are
    not letters or digits collapsed to one space. A claim with no letter or
    digit has no key and matches nothing.
``numeric``
    Different normalized texts that are equal once every number (a digit run,
    with its decimal/thousands separators) is masked: "… 20% of patients" and
    "… 35% of patients".
``negation``
    Different normalized texts that are equal once the negation words
    (:data:`NEGATIONS`, ``n't`` split off first) are removed: "X causes Y" and
    "X does not cause Y" are *not* linked (the verb changed), "X is not
    associated with Y" and "X is associated with Y" are. Deliberately narrow,
    as in the paper: a broader rule would merge unrelated claims.
``shared_doc``
    Records that cite a common document. ``cited`` (default): the record's
    ``cited_docs`` field (a list of strings) when it has one; for a record of
    `real-data retrieve` (it has a ``retrieval`` field) the documents of its
    gold, retrieved or missed (``retrieval.gold_missed``), since retrieved
    pages are not citations; else the ``doc`` of every pool sentence. For
    converted SciFact and Check-COVID records the pool is exactly the cited
    abstracts, so this is the citation link (SciFact writes a claim and its
    mutations from one citation sentence, so they cite the same abstracts).
    ``gold``: the ``doc`` of its gold evidence sentences only. ``off``: no
    rule.
``near_duplicate``
    For each distinct normalized text, its ``neighbours`` (default 50) nearest
    other texts by BM25 (SQLite FTS5, the one lexical query of
    :mod:`data_prep.retrieval.lexical`; ties by the texts' sorted order) are
    flagged as near duplicates when the Jaccard similarity of their token sets
    is at least ``jaccard`` (default 0.7: on SciFact dev it catches antonym
    swaps such as "increases"/"reduces survival of granule cell neurons",
    0.5 already joins unrelated claims about one disease).

Everything is a function of the *set* of records: texts are indexed in sorted
order and a family is named by its smallest record id, so permuting the input
lines changes nothing in the output.
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import unicodedata
from collections import Counter, defaultdict
from typing import Iterable, Mapping, Sequence

from data_prep.records import ClaimRecord
from data_prep.retrieval.lexical import fts5_or_query, query_tokens, stoppable

EDGE_KINDS = ("same_claim", "exact", "numeric", "negation", "shared_doc", "near_duplicate")
SHARED_DOCS = ("cited", "gold", "off")
NEGATIONS = frozenset({"not", "no", "never", "without", "nor", "neither"})
NUMBER_MASK = "0"
# The most BM25 neighbours a claim is compared with (SQLite's LIMIT takes a 64-bit integer; far fewer than
# this already compare every claim of the largest dataset with every other).
MAX_NEIGHBOURS = 1_000_000
# Distinct words of a claim per BM25 query of the near-duplicate search (:func:`best_rows`).
QUERY_CHUNK = 1000

_NON_WORD = re.compile(r"[\W_]+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
# contractions first, so that "doesn't" and "does not" normalize alike
_CONTRACTIONS = ((re.compile(r"\bcan[’']t\b"), "can not"), (re.compile(r"\bwon[’']t\b"), "will not"),
                 (re.compile(r"\bshan[’']t\b"), "shall not"), (re.compile(r"\bcannot\b"), "can not"),
                 (re.compile(r"n[’']t\b"), " not"))


@dataclasses.dataclass(frozen=True)
class FamilyOptions:
    """Which links join records into families (see the module docstring for each)."""

    exact: bool = True
    numeric: bool = True
    negation: bool = True
    shared_docs: str = "cited"  # a name in SHARED_DOCS
    near_duplicates: bool = True
    neighbours: int = 50
    jaccard: float = 0.7
    unit_separator: str = ":"


@dataclasses.dataclass(frozen=True, order=True)
class Edge:
    """One link: records ``a`` < ``b`` joined by a rule of ``kind``."""

    kind: str
    a: str
    b: str


@dataclasses.dataclass
class FamilyResult:
    """The family of every record, the links that made them, and how much each kind of link contributed."""

    families: dict[str, str]
    edges: list[Edge]
    pairs: dict[str, int]  # per kind: record pairs of different claims the rule links on its own
    merges: dict[str, int]  # per kind: unions that joined two families, the kinds applied in EDGE_KINDS order
    near_duplicates: list[tuple[str, str, float]]  # flagged pairs (smallest record id of each text, Jaccard)


# ---------------------------------------------------------------- keys


def claim_key(record: ClaimRecord, separator: str) -> str:
    """The claim a record is a unit of: its ``claim_id`` field, else its id before the last separator."""
    given = record.extra.get("claim_id")
    if isinstance(given, str) and given:
        return given
    if separator and separator in record.id:
        head = record.id.rsplit(separator, 1)[0]
        if head:
            return head
    return record.id


def normalized_words(text: str) -> list[str]:
    """The claim's words: NFKC, casefold, contractions spelled out, split at everything not a letter or digit."""
    text = unicodedata.normalize("NFKC", text).casefold()
    for pattern, spelled in _CONTRACTIONS:
        text = pattern.sub(spelled, text)
    return [w for w in _NON_WORD.split(text) if w]


def exact_key(text: str) -> str | None:
    """The claim's normalized words joined by spaces: claims equal up to case, punctuation and contractions
    share it; None for a claim without words (it links to nothing)."""
    words = normalized_words(text)
    return " ".join(words) or None


def numeric_key(text: str) -> str | None:
    """The normalized text with every number masked (a claim without numbers keeps its exact key)."""
    return exact_key(_NUMBER.sub(NUMBER_MASK, unicodedata.normalize("NFKC", text)))


def negation_key(text: str) -> str | None:
    """The normalized words without the negation words (None when nothing else is left)."""
    return " ".join(w for w in normalized_words(text) if w not in NEGATIONS) or None


def documents(record: ClaimRecord, which: str) -> set[str]:
    """The documents a record cites (``cited``: its ``cited_docs``, else its pool's) or its gold sentences are
    from (``gold``)."""
    if which == "off":
        return set()
    if which == "cited":
        given = record.extra.get("cited_docs")
        if isinstance(given, list):
            return {str(d) for d in given}
        if isinstance(record.extra.get("retrieval"), dict):  # retrieved pages are not citations; its gold is
            return gold_docs(record) | missed_docs(record)
        return {s.doc for s in record.sentences if s.doc}
    return gold_docs(record)


def gold_docs(record: ClaimRecord) -> set[str]:
    """The documents the record's gold sentences come from (sentences without a doc are left out)."""
    gold = set(record.gold_ids)
    return {s.doc for s in record.sentences if s.doc and s.id in gold}


def missed_docs(record: ClaimRecord) -> set[str]:
    """The documents of gold groups `real-data retrieve` did not retrieve (``retrieval.gold_missed``:
    groups of ``[doc, sentence index]``)."""
    missed = record.extra.get("retrieval", {}).get("gold_missed") or []
    return {str(item[0]) for group in missed for item in group}


# ---------------------------------------------------------------- links


def within_pairs(members: Sequence[str], finer: Mapping[str, object]) -> int:
    """Pairs of ``members`` that differ in ``finer`` (the pairs a coarser key adds)."""
    n = len(members)
    same = Counter(finer[m] for m in members)
    return n * (n - 1) // 2 - sum(c * (c - 1) // 2 for c in same.values())


def grouped(keys: Mapping[str, object]) -> list[list[str]]:
    """Record ids with the same (non-None) key, each group sorted, groups in order of their first id."""
    groups: dict[object, list[str]] = defaultdict(list)
    for rid in sorted(keys):
        if keys[rid] is not None:
            groups[keys[rid]].append(rid)
    return [g for g in groups.values() if len(g) > 1]


def star(kind: str, members: Sequence[str]) -> list[Edge]:
    """Enough links to join a group: its first (smallest) id to each other one."""
    return [Edge(kind, members[0], m) for m in members[1:]]


def keyed_links(kind: str, keys: Mapping[str, object], finer: Mapping[str, object]) -> tuple[list[Edge], int]:
    """Links among records of equal key that differ in ``finer`` (what a finer rule joins is left to it).

    Within a group of equal key, the smallest record of each ``finer`` value is linked to the group's
    first; the pair count is every pair of the group that differs in ``finer``.
    """
    edges: list[Edge] = []
    pairs = 0
    for members in grouped(keys):
        firsts: dict[object, str] = {}
        for m in members:  # sorted, so the first of each finer value is its smallest id
            firsts.setdefault(finer[m], m)
        edges += star(kind, list(firsts.values()))
        pairs += within_pairs(members, finer)
    return edges, pairs


def shared_doc_links(records: Sequence[ClaimRecord], which: str,
                     claims: Mapping[str, str]) -> tuple[list[Edge], int]:
    """Records citing a common document; pairs of different claims counted once however many they share."""
    by_doc: dict[str, list[str]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: r.id):
        for doc in documents(rec, which):
            by_doc[doc].append(rec.id)
    edges: list[Edge] = []
    pairs: set[tuple[str, str]] = set()
    for doc in sorted(by_doc):
        members = by_doc[doc]
        edges += star("shared_doc", members)
        pairs.update((a, b) for i, a in enumerate(members) for b in members[i + 1:] if claims[a] != claims[b])
    return edges, len(pairs)


def lexical_neighbours(texts: Sequence[str], k: int) -> list[list[int]]:
    """For each text (a normalized claim), the indices of its ``k`` best other texts by BM25 over all of them.

    SQLite FTS5 in memory, queried with the SPEC §10 OR query; ties are broken by index, so the order of
    ``texts`` (sorted by the caller) fixes the answer. Ctrl-C and SIGTERM stop it at once
    (:func:`~data_prep.retrieval.lexical.stoppable`).
    """
    db = sqlite3.connect(":memory:")
    try:
        with stoppable(db):
            db.execute("CREATE VIRTUAL TABLE claims USING fts5(text)")
            db.executemany("INSERT INTO claims(rowid, text) VALUES (?, ?)", enumerate(texts))
            out: list[list[int]] = []
            for i, text in enumerate(texts):
                tokens = query_tokens(text)
                out.append([r for r in best_rows(db, tokens, k + 1) if r != i][:k] if tokens else [])
            return out
    finally:
        db.close()


def best_rows(db: sqlite3.Connection, tokens: Sequence[str], limit: int) -> list[int]:
    """The ``limit`` best rows of the ``claims`` table for the OR query of ``tokens``: BM25, then rowid.

    FTS5 parses an OR of n terms in time growing with n squared (20k distinct words: a second; 700k: most
    of an hour), so a claim of more than :data:`QUERY_CHUNK` distinct words is queried a chunk of words at
    a time and each row's scores are added up: BM25 is a sum over the query's terms, each with its own
    IDF over the whole table, so the sum is the whole query's score (up to the order of the additions),
    and the time grows linearly with the claim's length.
    """
    if len(tokens) <= QUERY_CHUNK:
        rows = db.execute("SELECT rowid FROM claims WHERE claims MATCH ? ORDER BY bm25(claims), rowid LIMIT ?",
                          (fts5_or_query(list(tokens)), limit)).fetchall()
        return [r for (r,) in rows]
    totals: dict[int, float] = defaultdict(float)
    for start in range(0, len(tokens), QUERY_CHUNK):
        query = fts5_or_query(list(tokens[start:start + QUERY_CHUNK]))
        for rowid, score in db.execute("SELECT rowid, bm25(claims) FROM claims WHERE claims MATCH ?", (query,)):
            totals[rowid] += score
    return [r for r, _ in sorted(totals.items(), key=lambda rs: (rs[1], rs[0]))[:limit]]


def jaccard(a: set[str], b: set[str]) -> float:
    """|a ∩ b| / |a ∪ b|; two empty sets count as identical (1.0)."""
    return len(a & b) / len(a | b) if a or b else 1.0


def near_duplicate_pairs(texts: Sequence[str], k: int, threshold: float) -> list[tuple[int, int, float]]:
    """``(i, j, similarity)``, i < j, for every text pair where one is among the other's ``k`` BM25 neighbours
    and their token-set Jaccard similarity is at least ``threshold``."""
    if k == 0:
        return []
    token_sets = [set(query_tokens(t)) for t in texts]
    found: dict[tuple[int, int], float] = {}
    for i, neighbours in enumerate(lexical_neighbours(texts, k)):
        for j in neighbours:
            sim = jaccard(token_sets[i], token_sets[j])
            if sim >= threshold:
                found[(min(i, j), max(i, j))] = round(sim, 6)
    return [(i, j, s) for (i, j), s in sorted(found.items())]


def near_duplicate_links(exact: Mapping[str, str | None], options: FamilyOptions
                         ) -> tuple[list[Edge], int, list[tuple[str, str, float]]]:
    """Links between the records of flagged near-duplicate texts (compared once per distinct text)."""
    holders: dict[str, list[str]] = defaultdict(list)
    for rid in sorted(exact):
        if exact[rid] is not None:
            holders[exact[rid]].append(rid)
    texts = sorted(holders)
    edges: list[Edge] = []
    pairs = 0
    flagged: list[tuple[str, str, float]] = []
    for i, j, sim in near_duplicate_pairs(texts, options.neighbours, options.jaccard):
        a, b = holders[texts[i]], holders[texts[j]]
        edges.append(Edge("near_duplicate", *sorted((a[0], b[0]))))
        pairs += len(a) * len(b)
        flagged.append((*sorted((a[0], b[0])), sim))
    return edges, pairs, sorted(flagged)


# ---------------------------------------------------------------- families


class UnionFind:
    """Disjoint sets of record ids; a set's root is always its smallest id, so roots name families."""

    def __init__(self, ids: Iterable[str]):
        self.parent = {i: i for i in ids}

    def find(self, x: str) -> str:
        """The root of ``x``'s set (its family's name), compressing the path on the way."""
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:  # path compression
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: str, b: str) -> bool:
        """Join the sets of ``a`` and ``b``; False when they were one already."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        lo, hi = sorted((ra, rb))
        self.parent[hi] = lo
        return True


def find_links(records: Sequence[ClaimRecord], options: FamilyOptions
               ) -> tuple[list[Edge], dict[str, int], list[tuple[str, str, float]]]:
    """Every link of every enabled kind, in :data:`EDGE_KINDS` order, with each kind's pair count."""
    claims = {r.id: claim_key(r, options.unit_separator) for r in records}
    exact = {r.id: exact_key(r.claim) for r in records}
    edges, pairs = keyed_links("same_claim", claims, {rid: rid for rid in claims})
    counts = {"same_claim": pairs}
    keyed = {"exact": (options.exact, exact, claims),
             "numeric": (options.numeric, {r.id: numeric_key(r.claim) for r in records}, exact),
             "negation": (options.negation, {r.id: negation_key(r.claim) for r in records}, exact)}
    for kind, (enabled, keys, finer) in keyed.items():
        if enabled:
            more, counts[kind] = keyed_links(kind, keys, finer)
            edges += more
    if options.shared_docs != "off":
        more, counts["shared_doc"] = shared_doc_links(records, options.shared_docs, claims)
        edges += more
    flagged: list[tuple[str, str, float]] = []
    if options.near_duplicates:
        more, counts["near_duplicate"], flagged = near_duplicate_links(exact, options)
        edges += more
    return edges, counts, flagged


def build_families(records: Sequence[ClaimRecord], options: FamilyOptions) -> FamilyResult:
    """Join records by every enabled link; each family is named by its smallest record id."""
    if options.shared_docs not in SHARED_DOCS:
        raise ValueError(f"shared_docs must be one of {', '.join(SHARED_DOCS)}, got {options.shared_docs!r}")
    if not 0.0 <= options.jaccard <= 1.0:
        raise ValueError(f"jaccard must be in [0, 1], got {options.jaccard}")
    edges, pairs, flagged = find_links(records, options)
    sets = UnionFind(sorted(r.id for r in records))
    merges = dict.fromkeys(pairs, 0)
    for edge in edges:
        merges[edge.kind] += sets.union(edge.a, edge.b)
    families = {rid: sets.find(rid) for rid in sorted(sets.parent)}
    return FamilyResult(families=families, edges=edges, pairs=pairs, merges=merges, near_duplicates=flagged)


def size_distribution(families: Mapping[str, str]) -> dict[str, int]:
    """``{family size: number of families}``, sizes ascending (keys are strings, for JSON)."""
    sizes = Counter(Counter(families.values()).values())
    return {str(size): sizes[size] for size in sorted(sizes)}
