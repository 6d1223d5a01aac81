"""Deterministic pool trimming under a token budget (``--max-pool-tokens``).

The cost of a sentence is the token count of its rendered ``lineN: text`` row
(the evidence block of the prompt, as :func:`data_prep.prompts.format_pool`
writes it) plus one for the newline. Every gold sentence is kept (and, for NEI
records, the ``related_evidence`` ids); then the non-gold sentences are added
nearest-first (distance in reading order to the closest anchor, ties by lower
id), growing a contiguous window around each anchor; a sentence that would
exceed the budget closes the window on its side. Reading order and ids
are unchanged. Pools within the budget are left whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from data_prep.prompts import format_pool
from data_prep.records import ClaimRecord

CountTokens = Callable[[Sequence[str]], list[int]]


def hf_token_counter(tokenizer_path: str) -> CountTokens:
    """Token counts from a local HF tokenizer (batched, no special tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)

    def count(rows: Sequence[str]) -> list[int]:
        if not rows:
            return []
        return [len(ids) for ids in tok(list(rows), add_special_tokens=False)["input_ids"]]

    return count


@dataclass
class TrimStats:
    max_pool_tokens: int
    trimmed: int = 0
    kept_whole: int = 0
    gold_over_budget: int = 0

    def to_dict(self) -> dict:
        """The trimming figures for the conversion summary."""
        return {"max_pool_tokens": self.max_pool_tokens, "trimmed": self.trimmed,
                "kept_whole": self.kept_whole, "dropped_gold_over_budget": self.gold_over_budget}


def anchors(rec: ClaimRecord) -> set[int]:
    """The sentence ids a trimmed pool must keep: the gold ones and any ``related_evidence`` ids."""
    keep = set(rec.gold_ids)
    related = rec.extra.get("related_evidence")
    if isinstance(related, list):
        keep |= {i for i in related if isinstance(i, int)}
    return keep


def select_pool(ids: Sequence[int], costs: Sequence[int], keep: set[int], budget: int) -> list[int] | None:
    """Pure selection: the ids to keep, in reading order, or None if ``keep`` alone exceeds the budget.

    ``ids``/``costs`` are in reading order. Windows grow outwards from the
    anchors, nearest sentence first (ties: lower id); a sentence that does not
    fit closes its window on that side, so no far-away sentence is pulled in
    past a gap. With no anchors (an NEI record without related ids) the pool
    is filled from the start.
    """
    total = sum(c for i, c in zip(ids, costs) if i in keep)
    if total > budget:
        return None
    chosen_pos = {p for p, i in enumerate(ids) if i in keep} or {-1}
    anchor_pos = sorted(chosen_pos)
    candidates = []
    for p, i in enumerate(ids):
        if i in keep:
            continue
        dist = min(abs(p - a) for a in anchor_pos)
        candidates.append((dist, i, p, costs[p]))
    candidates.sort()
    for _, _, p, cost in candidates:
        if (p - 1 in chosen_pos or p + 1 in chosen_pos) and total + cost <= budget:
            chosen_pos.add(p)
            total += cost
    return [i for p, i in enumerate(ids) if p in chosen_pos]


class PoolTrimmer:
    """Applies :func:`select_pool` to records; returns None for a dropped record."""

    def __init__(self, max_pool_tokens: int, count_tokens: CountTokens):
        if max_pool_tokens <= 0:
            raise ValueError("max_pool_tokens must be positive")
        self.budget = max_pool_tokens
        self.count = count_tokens
        self.stats = TrimStats(max_pool_tokens)

    def costs(self, rec: ClaimRecord) -> list[int]:
        """Tokens each sentence takes in the prompt, in pool order (its formatted row plus one for the newline)."""
        rows = format_pool(rec).split("\n")  # one row per sentence: texts are single-lined
        return [n + 1 for n in self.count(rows)]

    def __call__(self, rec: ClaimRecord) -> ClaimRecord | None:
        costs = self.costs(rec)
        if sum(costs) <= self.budget:
            self.stats.kept_whole += 1
            return rec
        keep = select_pool(rec.pool_ids, costs, anchors(rec), self.budget)
        if keep is None:
            self.stats.gold_over_budget += 1
            return None
        self.stats.trimmed += 1
        kept = set(keep)
        rec.extra["pool_trimmed_from"] = len(rec.sentences)
        rec.sentences = [s for s in rec.sentences if s.id in kept]
        return rec
