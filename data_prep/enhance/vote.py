"""Pure vote and agreement functions: no I/O, so ``--revote`` reuses them unchanged.

``annotations`` maps annotator name -> sorted valid ids it picked, or None
when it abstained (malformed answer after the bounded re-asks). An
abstaining annotator counts as *not picking*: the majority is a strict
majority of the configured annotators, not of those that answered, so an
abstention can never lower the bar (3 annotators -> 2 votes, always).
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

Annotations = Mapping[str, "Sequence[int] | None"]


def votes_needed(n_annotators: int) -> int:
    """Strict majority of ``n_annotators``: more than half."""
    if n_annotators < 1:
        raise ValueError("need at least one annotator")
    return n_annotators // 2 + 1


def vote_counts(annotations: Annotations) -> Counter:
    """How many annotators picked each id (abstentions pick nothing)."""
    counts: Counter = Counter()
    for ids in annotations.values():
        if ids:
            counts.update(set(ids))
    return counts


def majority_picks(annotations: Annotations, min_votes: int | None = None) -> list[int]:
    """Ids picked by at least ``min_votes`` annotators (default: strict majority of all configured)."""
    need = votes_needed(len(annotations)) if min_votes is None else min_votes
    if need < 1:
        raise ValueError(f"min_votes must be >= 1, got {need}")
    return sorted(i for i, c in vote_counts(annotations).items() if c >= need)


def enhanced_evidence(gold_ids: Iterable[int], annotations: Annotations, min_votes: int | None = None) -> list[int]:
    """Gold evidence (always kept) ∪ majority picks, sorted."""
    return sorted(set(gold_ids) | set(majority_picks(annotations, min_votes)))


def annotator_agreement(pairs: Iterable[tuple[Sequence[int], "Sequence[int] | None"]]) -> dict:
    """Micro precision/recall of one annotator's picks against gold.

    ``pairs`` = (gold ids, picks or None) per claim; claims where the
    annotator abstained are left out of both numbers and counted apart.
    """
    tp = n_pick = n_gold = answered = abstained = 0
    for gold, picks in pairs:
        if picks is None:
            abstained += 1
            continue
        answered += 1
        g, p = set(gold), set(picks)
        tp += len(g & p)
        n_pick += len(p)
        n_gold += len(g)
    return {
        "claims_answered": answered,
        "abstentions": abstained,
        "picked": n_pick,
        "precision": tp / n_pick if n_pick else None,
        "recall": tp / n_gold if n_gold else None,
    }


def vote_summary(
    claims: Sequence[tuple[Sequence[int], Sequence[int], Annotations]], annotator_names: Sequence[str]
) -> dict:
    """Agreement and effect of the vote over claims of (gold ids, enhanced ids, annotations)."""
    added = [len(set(enh) - set(gold)) for gold, enh, _ in claims]
    hist = Counter(added)
    return {
        "claims": len(claims),
        "claims_enhanced_differs_from_gold": sum(1 for a in added if a > 0),
        "sentences_added": {
            "total": sum(added),
            "mean_per_claim": sum(added) / len(added) if added else 0.0,
            "per_claim_histogram": {str(k): hist[k] for k in sorted(hist)},
        },
        "annotators": {
            name: annotator_agreement((gold, ann.get(name)) for gold, _, ann in claims)
            for name in annotator_names
        },
    }
