"""The claims every FAE metric is over (SPEC §1): gold SUPPORT/REFUTE, NEI-gold left out and counted.

Shared by the hard metrics (:mod:`fae.ablation.metrics`) and the soft ones
(:mod:`fae.ablation.soft_metrics`), which both build on it; one definition, so
two metrics can never count different claims.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from real_fae_core.errors import UserError
from real_fae_core.labels import NOT_ENOUGH_INFO as NEI

# The FEVER scorer's own spelling of NEI is the same label (exact strings, no case folding).
_NEI_SPELLINGS = {NEI, "NOT ENOUGH INFO", "NEI"}


def is_nei(label: str | None) -> bool:
    """Whether ``label`` is NOT_ENOUGH_INFO in any of its exact spellings (no case folding; None is not)."""
    return label in _NEI_SPELLINGS


def _gold_label_of(item: Any) -> str:
    if hasattr(item, "label") and not isinstance(item, Mapping):  # a ClaimRecord
        return item.label
    return item["gold_label"] if "gold_label" in item else item["label"]


def fae_claims(items: Iterable[Any], source: str | None = None) -> tuple[list, int]:
    """SPEC §1: the items FAE evaluates (gold SUPPORT/REFUTE) and how many NEI-gold ones were left out.

    ``items`` are ClaimRecords, record dicts or claims.jsonl lines. With
    ``source`` (the records file a command reads), a file whose every record
    is NEI-gold is a :class:`UserError`: there is nothing to evaluate.
    """
    kept, n_nei = [], 0
    for item in items:
        if is_nei(_gold_label_of(item)):
            n_nei += 1
        else:
            kept.append(item)
    if source is not None and n_nei and not kept:
        raise UserError(f"{source}: no SUPPORT/REFUTE record (all {n_nei} have gold label {NEI}); "
                        "FAE evaluates SUPPORT/REFUTE claims only (SPEC §1)")
    return kept, n_nei


def evidence_claims(claims: Iterable[Mapping]) -> list[Mapping]:
    """Claims whose gold label is SUPPORT/REFUTE (the population of every metric)."""
    return fae_claims(claims)[0]


def mean_or_none(xs: Sequence[float]) -> float | None:
    """The mean, None for no values (metrics are None where undefined, never NaN)."""
    return sum(xs) / len(xs) if xs else None
