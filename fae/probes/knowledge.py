"""What the knowledge prompt's state stands for: the verifier's answers to the claim-only prompt.

DirK measures the drift of the hidden state toward ``h(K)``, the state on
the claim-only (knowledge) prompt. That state is a direction toward
parametric knowledge only if the model answers from knowledge there; a
verifier trained to abstain without evidence answers NOT_ENOUGH_INFO, and
then ``h(K)`` is an abstention state and DirK measures drift toward
abstaining. These pure functions summarise the answers and say so.
"""

from __future__ import annotations

from typing import Sequence

from real_fae_core.labels import LABELS, NOT_ENOUGH_INFO

INVALID = "invalid"
ABSTAIN_SHARE = 0.5  # more than half NOT_ENOUGH_INFO: the reference is an abstention state


def label_shares(labels: Sequence[str | None], gold: Sequence[str | None] | None = None) -> dict:
    """Counts and shares of each label (None or an unknown label = ``invalid``), and the share matching gold."""
    keys = (*LABELS, INVALID)
    counts = dict.fromkeys(keys, 0)
    for label in labels:
        counts[label if label in LABELS else INVALID] += 1
    n = len(labels)
    out = {"n": n, "counts": counts, "shares": {k: (counts[k] / n if n else None) for k in keys}}
    if gold is not None:
        pairs = [(a, g) for a, g in zip(labels, gold) if g is not None]
        out["correct"] = sum(a == g for a, g in pairs) / len(pairs) if pairs else None
    return out


def abstaining(summary: dict, threshold: float = ABSTAIN_SHARE) -> bool:
    """Whether more than ``threshold`` of the claim-only answers are NOT_ENOUGH_INFO (the reference is an
    abstention state); False when the summary has no such share."""
    share = summary["shares"].get(NOT_ENOUGH_INFO)
    return share is not None and share > threshold


def invalid_reference(summary: dict) -> bool:
    """Every claim-only answer is invalid (a base that writes prose): h(K) answers nothing at all."""
    return bool(summary.get("n")) and summary["shares"].get(INVALID) == 1.0


def reference_note(summary: dict, reference: str) -> str | None:
    """The sentence a report prints beside DirK when its reference abstains or answers nothing valid
    (None when it does neither)."""
    who = "the base model" if reference == "base" else "the verifier"
    if invalid_reference(summary):
        return (f"invalid reference: none of {who}'s answers to the {summary['n']} claim-only prompts is a valid "
                "answer (prose, not the answer format), so h(K) is the state of a model that does not answer the "
                "task; DirK here measures drift toward that state, whose verdict is unknown.")
    if not abstaining(summary):
        return None
    share = summary["shares"][NOT_ENOUGH_INFO]
    advice = ("" if reference == "base" else
              " `fae probe --knowledge-reference base` takes h(K) from the base model without the adapter instead.")
    return (f"abstaining reference: {who} answers NOT_ENOUGH_INFO to {100 * share:.0f}% of the claim-only prompts, "
            "so h(K) is an abstention state and DirK here measures drift toward abstaining, not toward "
            f"parametric knowledge.{advice}")


def shares_text(summary: dict | None) -> str:
    """"SUPPORT 10% / REFUTE 5% / NOT_ENOUGH_INFO 85% (n=20)" for reports."""
    if not summary or not summary.get("n"):
        return "n/a"
    names = {"SUPPORT": "SUPPORT", "REFUTE": "REFUTE", "NOT_ENOUGH_INFO": "NEI", INVALID: "invalid"}
    parts = [f"{names[k]} {100 * v:.0f}%" for k, v in summary["shares"].items() if v]
    return " / ".join(parts) + f" (n={summary['n']})"
