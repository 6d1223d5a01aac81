"""Sufficiency (SPEC §6): does the verifier answer on the evidence alone?

FAE's ablation and its control measure *necessity*: the verdict should go when
the cited lines go, and only then. A verifier can pass that and still fail the
other half: one that answers NOT_ENOUGH_INFO whenever the pool is short
abstains on a pool that holds exactly the proof, behind a retriever with a
small top-k or on a claim whose pool is one sentence. Three arms ask it:

- **gold-only**: the gold sentences alone;
- **cited-only**: the lines the verifier itself cited at round 0, alone (its
  own rationale: ERASER's sufficiency);
- **size sweep**: the gold lines plus k other lines, k = 0 .. n − |gold| − 1,
  added in a seeded order (nested pools), so accuracy can be read against the
  pool's size: a verifier that reads its evidence is flat at its round-0
  accuracy; one that learned "short pool → NOT_ENOUGH_INFO" rises with k.

Each is reported beside round 0 on the same claims, with the NOT_ENOUGH_INFO
and invalid shares. The population is every SUPPORT/REFUTE claim
(:func:`fae.ablation.population.evidence_claims`); a claim whose arm was not
asked (no gold line in its pool, a round-0 answer that cited nothing, a pool of
gold lines only) is counted in ``n_skipped`` with its reason, never silently
dropped. Every function returns None for a run made without the arm.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from fae.ablation.population import evidence_claims, is_nei
from fae.ablation.scores import round_label, same_label


def asked(rnd: Mapping | None) -> bool:
    """Whether an arm's question was asked (an answer, not a ``skipped`` note)."""
    return bool(rnd) and "skipped" not in rnd


def right(rnd: Mapping, gold: str) -> bool:
    """Whether the round's answer is the gold label (an invalid answer is wrong), as every metric counts it."""
    return same_label(round_label(rnd), gold)


def _shares(pairs: Sequence[tuple[Mapping, Mapping]]) -> dict[str, float | None]:
    """Accuracy, NOT_ENOUGH_INFO share, invalid share of (claim, answer) pairs, and round 0's accuracy on
    the same claims."""
    n = len(pairs)

    def share(hit) -> float | None:
        return sum(bool(hit(c, rnd)) for c, rnd in pairs) / n if n else None

    return {
        "label_accuracy": share(lambda c, rnd: right(rnd, c["gold_label"])),
        "nei_answer_rate": share(lambda c, rnd: is_nei(round_label(rnd))),
        "invalid_rate": share(lambda c, rnd: round_label(rnd) is None),
        "round0_label_accuracy": share(lambda c, rnd: right(c["rounds"][0], c["gold_label"])),
    }


def _single_arm(claims: Sequence[Mapping], key: str) -> dict[str, Any] | None:
    pop = evidence_claims(claims)
    if not pop or not all(key in c for c in pop):
        return None
    done = [c for c in pop if asked(c[key])]
    skipped = Counter(str((c[key] or {}).get("skipped", "not answered")) for c in pop if not asked(c[key]))
    kept_on = [c for c in done if right(c["rounds"][0], c["gold_label"])]
    return {
        "n_claims": len(done),
        "n_skipped": len(pop) - len(done),
        "skipped_reasons": dict(sorted(skipped.items())),
        **_shares([(c, c[key]) for c in done]),
        # of the claims right at round 0, the share still right on this pool alone (sufficiency proper)
        "n_round0_right": len(kept_on),
        "kept_rate": (sum(right(c[key], c["gold_label"]) for c in kept_on) / len(kept_on)) if kept_on else None,
        "model_calls": sum(not c[key].get("reused") for c in done),
    }


def gold_only_metrics(claims: Sequence[Mapping]) -> dict[str, Any] | None:
    """The gold-only pools: accuracy, NOT_ENOUGH_INFO and invalid shares beside round 0's on the same claims;
    None for a run made without them (``--no-gold-only``)."""
    return _single_arm(claims, "gold_only")


def cited_only_metrics(claims: Sequence[Mapping]) -> dict[str, Any] | None:
    """The cited-only pools (round 0's own rationale alone), as :func:`gold_only_metrics`; None for a run
    made without them (``--no-cited-only``)."""
    return _single_arm(claims, "cited_only")


def sweep_rounds(claim: Mapping) -> list[Mapping]:
    """The size sweep's answered pools of one claim, k = 0, 1, ... (none when it was skipped)."""
    sweep = claim.get("size_sweep") or {}
    return [rd for rd in sweep.get("rounds") or [] if rd]


def size_sweep_metrics(claims: Sequence[Mapping]) -> dict[str, Any] | None:
    """The size sweep: per k (other lines beside the gold), the claims with such a pool, their accuracy,
    NOT_ENOUGH_INFO and invalid shares and round 0's accuracy on the same claims; the lowest accuracy over
    k; ``sweep_accuracy`` (``sweep_nei_share``), the mean over claims of each claim's accuracy
    (NOT_ENOUGH_INFO share) over its k: one number per claim, so it has a bootstrap interval and a paired
    difference in ``fae compare``. None for a run made
    without it (``--no-size-sweep``)."""
    pop = evidence_claims(claims)
    if not pop or not all("size_sweep" in c for c in pop):
        return None
    done = [c for c in pop if sweep_rounds(c)]
    skipped = Counter(str((c["size_sweep"] or {}).get("skipped", "not answered")) for c in pop
                      if not sweep_rounds(c))
    width = max((len(sweep_rounds(c)) for c in done), default=0)
    per_k = []
    for k in range(width):
        pairs = [(c, sweep_rounds(c)[k]) for c in done if k < len(sweep_rounds(c))]
        per_k.append({"k": k, "n_claims": len(pairs), **_shares(pairs)})
    per_claim = [sum(right(rd, c["gold_label"]) for rd in sweep_rounds(c)) / len(sweep_rounds(c)) for c in done]
    per_claim_nei = [sum(is_nei(round_label(rd)) for rd in sweep_rounds(c)) / len(sweep_rounds(c)) for c in done]
    accs = [row["label_accuracy"] for row in per_k if row["label_accuracy"] is not None]
    return {
        "n_claims": len(done),
        "n_skipped": len(pop) - len(done),
        "skipped_reasons": dict(sorted(skipped.items())),
        "per_k": per_k,
        "min_accuracy": min(accs) if accs else None,
        "sweep_accuracy": sum(per_claim) / len(per_claim) if per_claim else None,
        "sweep_nei_share": sum(per_claim_nei) / len(per_claim_nei) if per_claim_nei else None,
        "round0_label_accuracy": (sum(right(c["rounds"][0], c["gold_label"]) for c in done) / len(done)
                                  if done else None),
        "model_calls": sum(not rd.get("reused") for c in done for rd in sweep_rounds(c)),
    }


def claim_sweep_accuracy(claim: Mapping) -> float | None:
    """One claim's accuracy over its size-sweep pools (None when it has none)."""
    rounds = sweep_rounds(claim)
    return sum(right(rd, claim["gold_label"]) for rd in rounds) / len(rounds) if rounds else None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def sufficiency_summary_line(m: Mapping[str, Any]) -> str | None:
    """One line for a terminal: the cited-only pools and the size sweep's lowest and mean accuracy; None for
    a run made without them."""
    parts = []
    cited, sweep = m.get("cited_only"), m.get("size_sweep")
    if cited:
        parts.append(f"cited-only on {cited['n_claims']} claims: Acc {_pct(cited['label_accuracy'])} "
                     f"(round 0 {_pct(cited['round0_label_accuracy'])}), NOT_ENOUGH_INFO "
                     f"{_pct(cited['nei_answer_rate'])}%")
    if sweep:
        curve = " / ".join(_pct(row["label_accuracy"]) for row in sweep["per_k"])
        parts.append(f"size sweep on {sweep['n_claims']} claims: Acc by k {curve or 'n/a'} "
                     f"(lowest {_pct(sweep['min_accuracy'])})")
    return "; ".join(parts) or None
