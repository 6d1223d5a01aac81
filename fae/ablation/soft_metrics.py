"""Soft FAE, part 2: metrics on the label probabilities of each round (``metrics.json["soft"]``).

Population: the claims of the hard metrics (gold SUPPORT/REFUTE), restricted
per quantity to the claims whose rounds carry ``label_probs``. With
``P_r(l)`` the probability of label ``l`` at round ``r`` of a claim:

- ``p_gold[r]`` = mean over claims of ``P_r(gold)``; ``p_nei[r]`` = mean ``P_r(NEI)``.
- soft IS = ``1 − E[P_1(gold)] / E[P_0(gold)]``, both means over the same
  claims (those with probabilities at rounds 0 and 1), as IS = ``1 − a_1/a_0``.
- NEI area = ``(1/R) Σ_{r=1..R} p_nei[r]`` (the mean height of the P(NEI)
  curve after round 0, like IO; 1 for a verifier that abstains with certainty).
- round-0 calibration: confidence = ``max_l P_0(l)``, correct = ``argmax_l
  P_0(l) == gold`` (the argmax of the same distribution, not the generated
  label, so confidence and correctness describe one prediction); 10
  equal-width bins ``[0, .1), ..., [.9, 1]``; ECE = ``Σ_b (n_b/N) |acc_b − conf_b|``.

Undefined values are None with a ``*_reason`` (never NaN). Pure functions.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from real_fae_core.labels import NOT_ENOUGH_INFO as NEI
from fae.ablation.population import evidence_claims, is_nei, mean_or_none
from fae.ablation.scores import n_rounds

NO_PROBS = "no label probabilities in this run (backend gave no logprobs, or --no-label-probs)"
ECE_BINS = 10


def probs_at(claim: Mapping, r: int) -> Mapping[str, float] | None:
    """The round-``r`` label probabilities of a claim, or None (absent, old run, no such round)."""
    rounds = claim.get("rounds") or []
    if r >= len(rounds):
        return None
    p = rounds[r].get("label_probs")
    return p if isinstance(p, Mapping) else None


def label_token_answers(claims: Sequence[Mapping]) -> list[dict]:
    """The claims re-answered by label-token scoring: each round's label is ``argmax_l P_r(l)``.

    Scoring the three label continuations instead of reading the generated text (as lm-eval scores
    multiple choice) separates what a small verifier knows from whether it can write the answer
    format: a truncated or malformed answer still has label probabilities. A round without
    probabilities becomes invalid (no label); citations are kept as generated, so only label
    metrics (Acc, balanced accuracy, a_r) change meaning. Ties go to the first label in the
    probabilities' order.
    """
    out = []
    for claim in claims:
        rounds = []
        for r in claim.get("rounds") or []:
            p = r.get("label_probs")
            label = max(p, key=p.get) if isinstance(p, Mapping) and p else None
            rounds.append({**r, "label": label, "valid": label is not None, "label_source": "label_token"})
        out.append({**claim, "rounds": rounds})
    return out


def claim_curves(claim: Mapping, R: int) -> dict[str, list[float | None]]:
    """Per round ``P_r(gold)`` and ``P_r(NEI)`` of one claim (None where missing)."""
    gold = claim["gold_label"]
    ps = [probs_at(claim, r) for r in range(R + 1)]
    return {"p_gold": [None if p is None else float(p.get(gold, 0.0)) for p in ps],
            "p_nei": [None if p is None else float(p.get(NEI, 0.0)) for p in ps]}


def mean_curve(curves: Sequence[Sequence[float | None]]) -> list[float | None]:
    """Mean per round over the claims that have a value there."""
    R1 = max((len(c) for c in curves), default=0)
    return [mean_or_none([c[r] for c in curves if r < len(c) and c[r] is not None]) for r in range(R1)]


def soft_is(p_gold: Sequence[Sequence[float | None]]) -> tuple[float | None, str | None]:
    """``1 − E[P_1(gold)] / E[P_0(gold)]`` over claims with both rounds; (value, reason)."""
    pairs = [(c[0], c[1]) for c in p_gold if len(c) > 1 and c[0] is not None and c[1] is not None]
    if not pairs:
        return None, NO_PROBS if not any(x is not None for c in p_gold for x in c) else \
            "no claim has label probabilities at rounds 0 and 1"
    e0 = sum(a for a, _ in pairs) / len(pairs)
    if e0 <= 0:
        return None, "E[P_0(gold)] is 0: nothing to lose under ablation"
    return 1 - (sum(b for _, b in pairs) / len(pairs)) / e0, None


def nei_area(p_nei_mean: Sequence[float | None], R: int) -> tuple[float | None, str | None]:
    """``(1/R) Σ_{r=1..R} p_nei[r]``; (value, reason)."""
    if R < 1:
        return None, "no ablation rounds (R = 0)"
    vals = [p_nei_mean[r] if r < len(p_nei_mean) else None for r in range(1, R + 1)]
    if any(v is None for v in vals):
        return None, NO_PROBS if all(v is None for v in p_nei_mean) else \
            "some rounds 1..R have no label probabilities"
    return sum(vals) / R, None


def calibration(pairs: Sequence[tuple[Mapping[str, float], str]], bins: int = ECE_BINS):
    """(ECE, reliability bins) from (round-0 probabilities, gold label) pairs; (None, []) when empty.

    A bin: ``{"lo", "hi", "n", "confidence", "accuracy"}`` (means; None when empty).
    """
    if not pairs:
        return None, []
    table = [[0, 0.0, 0] for _ in range(bins)]  # n, sum confidence, correct
    for probs, gold in pairs:
        label = max(probs, key=lambda k: probs[k])
        conf = float(probs[label])
        b = min(int(conf * bins), bins - 1)
        table[b][0] += 1
        table[b][1] += conf
        table[b][2] += int(label == gold)
    n = len(pairs)
    ece = sum(cnt / n * abs(ok / cnt - s / cnt) for cnt, s, ok in table if cnt)
    diagram = [{"lo": k / bins, "hi": (k + 1) / bins, "n": cnt,
                "confidence": s / cnt if cnt else None, "accuracy": ok / cnt if cnt else None}
               for k, (cnt, s, ok) in enumerate(table)]
    return ece, diagram


def soft_metrics(claims: Sequence[Mapping]) -> dict[str, Any]:
    """``metrics.json["soft"]``: curves, soft IS, NEI area, round-0 ECE and reliability diagram."""
    pop = evidence_claims(claims)
    R = n_rounds(pop, strict=False) if pop else 0
    curves = [claim_curves(c, R) for c in pop]
    p_gold = [c["p_gold"] for c in curves]
    p_nei = [c["p_nei"] for c in curves]
    mean_gold, mean_nei = mean_curve(p_gold), mean_curve(p_nei)
    if len(mean_gold) < R + 1:
        mean_gold = mean_gold + [None] * (R + 1 - len(mean_gold))
        mean_nei = mean_nei + [None] * (R + 1 - len(mean_nei))
    s_is, s_is_reason = soft_is(p_gold) if pop else (None, "no SUPPORT/REFUTE claims")
    area, area_reason = nei_area(mean_nei, R) if pop else (None, "no SUPPORT/REFUTE claims")
    cal_pairs = [(probs_at(c, 0), c["gold_label"]) for c in pop if probs_at(c, 0) is not None]
    ece, diagram = calibration(cal_pairs)
    return {
        "n_with_probs": sum(1 for c in pop if probs_at(c, 0) is not None),
        "p_gold": mean_gold,
        "p_nei": mean_nei,
        "soft_IS": s_is,
        "soft_IS_reason": s_is_reason,
        "nei_area": area,
        "nei_area_reason": area_reason,
        "ece": ece,
        "ece_reason": None if ece is not None else NO_PROBS,
        "ece_bins": ECE_BINS,
        "reliability": diagram,
    }


# ---------------------------------------------------------------------------
# per-claim columns for the paired bootstrap of ``fae compare``
# ---------------------------------------------------------------------------

SOFT_COMPARE_NAMES = ("soft_IS", "nei_area", "p_gold_0", "ece")


def has_probs(claims: Sequence[Mapping]) -> bool:
    """Whether any round of any claim has label probabilities (a backend that returns them, a recent run)."""
    return any(probs_at(c, r) is not None for c in claims for r in range(len(c.get("rounds") or [])))


def soft_columns(claims: Sequence[Mapping], R: int):
    """Per-claim columns (n, 1 + 2(R+1) + ECE_BINS) whose sums give the soft scalars.

    A claim counts (h = 1) when it is SUPPORT/REFUTE-gold and has label
    probabilities at every round 0..R. Columns: h, h·P_r(gold) (R+1),
    h·P_r(NEI) (R+1), and per round-0 confidence bin h·(correct − confidence),
    so that ECE = Σ_b |column_b| / Σ h.
    """
    import numpy as np

    rows = []
    for c in claims:
        ps = [probs_at(c, r) for r in range(R + 1)]
        if is_nei(c["gold_label"]) or any(p is None for p in ps):
            rows.append([0.0] * (1 + 2 * (R + 1) + ECE_BINS))
            continue
        gold = c["gold_label"]
        label = max(ps[0], key=lambda k: ps[0][k])
        conf = float(ps[0][label])
        bins = [0.0] * ECE_BINS
        bins[min(int(conf * ECE_BINS), ECE_BINS - 1)] = float(label == gold) - conf
        rows.append([1.0, *(float(p.get(gold, 0.0)) for p in ps), *(float(p.get(NEI, 0.0)) for p in ps), *bins])
    return np.asarray(rows, float).reshape(len(rows), 1 + 2 * (R + 1) + ECE_BINS)


def soft_from_sums(sums, R: int):
    """(..., 4): soft IS, NEI area, P_0(gold), ECE from summed :func:`soft_columns`; NaN when undefined."""
    import numpy as np

    s = np.asarray(sums, float)
    n = s[..., 0]
    gold = s[..., 1:R + 2]
    nei = s[..., R + 2:2 * R + 3]
    diff = s[..., 2 * R + 3:]
    with np.errstate(divide="ignore", invalid="ignore"):
        p0 = np.where(n > 0, gold[..., 0] / n, np.nan)
        s_is = np.where((R >= 1) & (gold[..., 0] > 0), 1 - gold[..., min(R, 1)] / gold[..., 0], np.nan)
        area = np.where((n > 0) & (R >= 1), nei[..., 1:].sum(-1) / (n * max(R, 1)), np.nan)
        ece = np.where(n > 0, np.abs(diff).sum(-1) / n, np.nan)
    return np.stack([s_is, area, p0, ece], axis=-1)
