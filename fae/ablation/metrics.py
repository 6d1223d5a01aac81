"""FAE metrics (SPEC §6) as pure functions over per-claim rounds.

Every function takes the claims exactly as ``RUN_DIR/claims.jsonl`` stores
them (``{"id", "gold_label", "gold_groups", "rounds": [...]}``), so metrics
can be recomputed from a run directory at any time and checked by hand.

One population for every metric: the claims whose gold label is SUPPORT or
REFUTE (:func:`fae_claims`). SPEC §1 excludes NOT_ENOUGH_INFO-gold claims from
evaluation: they have no evidence to ablate, and an abstaining verifier would
score them correct at every round. ``fae run`` does not run them at all; runs
made before that still hold them in ``claims.jsonl``, so every metric here
drops them again and ``metrics.json`` counts them in ``n_excluded_nei``. With
one population, the report's Acc is exactly ``a_0``.

An invalid answer has ``label = None``: it is wrong at every round and cites
nothing. Labels are compared exactly (:func:`same_label`; the answer parser
already maps the allowed spellings to the canonical ones). All values are
fractions in [0, 1] (``IS``/``ER`` may leave that range when ``a_r > a_0``;
they are not clamped, as in the paper), or ``None`` where a value is
undefined — never NaN. IS/ER/IO and ``g_r`` are undefined whenever ``a_0`` is
0 or undefined (a verifier that gets nothing right at round 0 has nothing to
lose under ablation: an always-invalid one would otherwise score IO = 100);
``metrics.json`` then says why in ``IS_reason`` etc.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from real_fae_core.labels import NOT_ENOUGH_INFO as NEI
from real_fae_core.labels import REFUTE, SUPPORT
from fae.ablation.control import control_metrics
from fae.ablation.sufficiency import cited_only_metrics, gold_only_metrics, size_sweep_metrics
from fae.intervals import MIN_INTERVAL_UNITS, draw_units, percentile_interval  # noqa: F401 - re-exported
from fae.ablation.population import evidence_claims, fae_claims, is_nei, mean_or_none
from fae.ablation.scores import (  # noqa: F401 - re-exported: the metrics' building blocks
    end_state_retention, fae_scores, ideal_offset, immediate_sensitivity, is_valid, n_rounds, retention,
    retention_reason, round_label, same_label, undefined_reason)
from fae.ablation.soft_metrics import soft_metrics

# The official FEVER scorer counts only the first five predicted sentences.
FEVER_MAX_EVIDENCE = 5

METRIC_KEYS = (
    "n_claims",
    "n_excluded_nei",
    "rounds",
    "label_accuracy",
    "strict_accuracy",
    "fever_score",
    "evidence_precision",
    "evidence_recall",
    "evidence_f1",
    "evidence_precision_macro",
    "evidence_recall_macro",
    "evidence_f1_macro",
    "round_accuracy",
    "retention",
    "retention_reason",
    "IS",
    "ER",
    "IO",
    "IS_reason",
    "ER_reason",
    "IO_reason",
    "flip_rate",
    "any_flip_rate",
    "invalid_rate",
    "nei_answer_rate",
    "truncated_rate",
    "hallucinated_id_rate",
    "reused_calls",
    "model_calls",
    "soft",
    "control",
    "gold_only",
    "cited_only",
    "size_sweep",
)


# ---------------------------------------------------------------------------
# helpers: labels and the claim set
# ---------------------------------------------------------------------------


def cites_gold(cited: Iterable, gold_groups: Sequence[Sequence]) -> bool:
    """Strict's evidence requirement: at least one gold sentence (of any group) cited."""
    gold = {i for g in gold_groups for i in g}
    return any(i in gold for i in cited)


def has_complete_group(predicted: Sequence, gold_groups: Sequence[Sequence],
                       max_evidence: int | None = FEVER_MAX_EVIDENCE) -> bool:
    """The FEVER score's evidence requirement: one complete gold group among the first
    ``max_evidence`` predicted ids (the official scorer's rule)."""
    top = list(predicted) if max_evidence is None else list(predicted)[:max_evidence]
    return any(all(i in top for i in g) for g in gold_groups)


def nei_exclusion_note(n_excluded: int, source: str) -> str:
    """The warning ``fae run`` prints when it leaves NEI-gold records out."""
    return (f"warning: {source}: {n_excluded} record(s) with gold label {NEI} are not evaluated "
            "(SPEC §1: FAE needs gold evidence to ablate); metrics.json counts them in n_excluded_nei")


def _f1(p: float | None, r: float | None) -> float | None:
    if p is None or r is None:
        return None
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def gold_union(claim: Mapping) -> set:
    """``E*``: the union of the claim's gold groups."""
    return {i for g in claim["gold_groups"] for i in g}


def named_ids(rnd: Mapping) -> list:
    """Every id an answer named, in citation order (cited + hallucinated); none for an invalid answer.

    Runs store this as ``evidence``; older hand-built rounds may only have
    ``cited``/``hallucinated``, in which case citation order is cited first.
    """
    if not is_valid(rnd):
        return []
    if "evidence" in rnd and rnd["evidence"] is not None:
        return list(rnd["evidence"])
    return list(rnd.get("cited") or []) + list(rnd.get("hallucinated") or [])


# ---------------------------------------------------------------------------
# round-0 fact-checking metrics
# ---------------------------------------------------------------------------


def label_accuracy(claims: Sequence[Mapping], r: int = 0) -> float | None:
    """Share of SUPPORT/REFUTE claims whose round-``r`` label equals the gold label (``a_r``)."""
    pop = evidence_claims(claims)
    if not pop:
        return None
    return sum(same_label(round_label(c["rounds"][r]), c["gold_label"]) for c in pop) / len(pop)


def strict_accuracy(claims: Sequence[Mapping]) -> float | None:
    """Round 0: label correct AND at least one gold sentence cited (the paper's Strict).

    Only ids present in the pool count as cited.
    """
    pop = evidence_claims(claims)
    if not pop:
        return None
    ok = 0
    for c in pop:
        r0 = c["rounds"][0]
        if same_label(round_label(r0), c["gold_label"]) and cites_gold(r0.get("cited") or [], c["gold_groups"]):
            ok += 1
    return ok / len(pop)


def evidence_prf(claims: Sequence[Mapping]) -> dict[str, float | None]:
    """Round-0 evidence precision/recall/F1, micro and macro, over SUPPORT/REFUTE claims.

    Predicted = every id the answer named (hallucinated ids count as wrong
    predictions, so inventing ids lowers precision); gold = ``E*``. Micro pools
    all (claim, sentence) pairs; precision is 0 when nothing was predicted at
    all. Macro averages per-claim values; a claim that cites nothing (or
    answers invalidly) has precision 0, recall 0 and F1 0 — unlike the FEVER
    scorer, which gives an empty prediction precision 1 (see :func:`fever_score`).
    """
    pop = evidence_claims(claims)
    tp = n_pred = n_gold = 0
    ps, rs, fs = [], [], []
    for c in pop:
        pred = set(named_ids(c["rounds"][0]))
        gold = gold_union(c)
        hit = len(pred & gold)
        tp += hit
        n_pred += len(pred)
        n_gold += len(gold)
        p = hit / len(pred) if pred else 0.0
        r = hit / len(gold) if gold else 0.0
        ps.append(p)
        rs.append(r)
        fs.append(_f1(p, r))
    if not pop:
        return dict.fromkeys(
            ("precision", "recall", "f1", "precision_macro", "recall_macro", "f1_macro")
        )
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return {
        "precision": p,
        "recall": r,
        "f1": _f1(p, r),
        "precision_macro": mean_or_none(ps),
        "recall_macro": mean_or_none(rs),
        "f1_macro": mean_or_none(fs),
    }


def fever_score(
    predictions: Sequence[Mapping],
    records: Sequence[Any],
    max_evidence: int | None = FEVER_MAX_EVIDENCE,
) -> dict[str, float]:
    """The official FEVER scorer (``fever-scorer`` 2.0.39), over our ids.

    ``predictions``: ``{"id", "label", "evidence": [ids]}``; ``records``:
    ClaimRecords, record dicts (``label``/``evidence`` groups) or claims.jsonl
    lines (``gold_label``/``gold_groups``), matched by ``id``. Returns
    ``strict``, ``accuracy``, ``precision``, ``recall``, ``f1`` with the
    scorer's conventions: only the first ``max_evidence`` predicted ids count;
    strict needs the correct label and one complete gold group (an NEI-gold
    claim only needs the label); precision and recall skip NEI-gold claims, a
    claim predicting no evidence has precision 1.0, recall credits a complete
    group regardless of the label. ``f1`` is 0.0 where the scorer would divide
    by zero.
    """
    gold = {}
    for rec in records:
        rid, label, groups = _gold_of(rec)
        if rid in gold:
            raise ValueError(f"duplicate record id {rid!r}")
        gold[rid] = (label, groups)
    seen = set()
    correct = strict = 0.0
    prec_sum = prec_n = rec_sum = rec_n = 0.0
    for pred in predictions:
        pid = str(pred["id"])
        if pid not in gold:
            raise ValueError(f"prediction for unknown record id {pid!r}")
        if pid in seen:
            raise ValueError(f"several predictions for record id {pid!r}")
        seen.add(pid)
        label, groups = gold[pid]
        evidence = list(pred.get("evidence") or [])
        top = evidence if max_evidence is None else evidence[:max_evidence]
        complete = has_complete_group(top, groups, None)
        label_ok = same_label(pred.get("label"), label)
        if label_ok:
            correct += 1
            if is_nei(label) or complete:
                strict += 1
        if not is_nei(label):
            all_gold = {i for g in groups for i in g}
            prec_sum += (sum(1 for i in top if i in all_gold) / len(top)) if top else 1.0
            prec_n += 1
            if not groups or complete:
                rec_sum += 1.0
            rec_n += 1
    missing = set(gold) - seen
    if missing:
        raise ValueError(f"no prediction for {len(missing)} record(s), e.g. {sorted(missing)[:3]}")
    total = len(predictions)
    if total == 0:
        raise ValueError("fever_score needs at least one prediction")
    pr = prec_sum / prec_n if prec_n else 1.0
    rc = rec_sum / rec_n if rec_n else 0.0
    return {
        "strict": strict / total,
        "accuracy": correct / total,
        "precision": pr,
        "recall": rc,
        "f1": (2 * pr * rc / (pr + rc)) if pr + rc > 0 else 0.0,
    }


def _gold_of(rec: Any) -> tuple[str, str, list[list]]:
    if hasattr(rec, "evidence") and hasattr(rec, "label"):  # ClaimRecord
        return str(rec.id), rec.label, [list(g) for g in rec.evidence]
    if "gold_label" in rec:
        return str(rec["id"]), rec["gold_label"], [list(g) for g in rec["gold_groups"]]
    return str(rec["id"]), rec["label"], [list(g) for g in rec["evidence"]]


def round0_predictions(claims: Sequence[Mapping]) -> list[dict]:
    """FEVER-style predictions from round 0 (ids in citation order, invented ones included)."""
    return [
        {"id": c["id"], "label": round_label(c["rounds"][0]), "evidence": named_ids(c["rounds"][0])}
        for c in claims
    ]


# ---------------------------------------------------------------------------
# FAE trajectory metrics
# ---------------------------------------------------------------------------


def round_accuracy(claims: Sequence[Mapping]) -> list[float | None]:
    """``a_0..a_R`` over SUPPORT/REFUTE claims; an invalid answer is wrong.

    At r >= 1 an evidence-grounded verifier answers NEI, which is wrong
    against the SUPPORT/REFUTE gold label: the ideal trajectory is a_0 high,
    then 0.
    """
    pop = evidence_claims(claims)
    R = n_rounds(claims)
    if not pop:
        return [None] * (R + 1)
    return [label_accuracy(pop, r) for r in range(R + 1)]


def is_flip(a: str | None, b: str | None) -> bool:
    """A direct SUPPORT <-> REFUTE switch (not through NEI or an invalid answer)."""
    return {a, b} == {SUPPORT, REFUTE}


def flip_rates(claims: Sequence[Mapping]) -> dict[str, float | None]:
    """Direct SUPPORT <-> REFUTE switches between consecutive rounds.

    ``flip_rate`` = flipping transitions / all R transitions of all claims;
    ``any_flip_rate`` = share of claims with at least one flip. A switch
    through NEI or an invalid answer is not a flip.
    """
    pop = evidence_claims(claims)
    R = n_rounds(claims)
    if not pop or R < 1:
        return {"flip_rate": None, "any_flip_rate": None}
    flips = anyf = 0
    for c in pop:
        labels = [round_label(rd) for rd in c["rounds"]]
        n = sum(is_flip(labels[r - 1], labels[r]) for r in range(1, R + 1))
        flips += n
        anyf += n > 0
    return {"flip_rate": flips / (len(pop) * R), "any_flip_rate": anyf / len(pop)}


def _round_share(claims: Sequence[Mapping], hit) -> list[float | None]:
    """Per round: share of SUPPORT/REFUTE claims whose round passes ``hit`` (reused answers included)."""
    pop = evidence_claims(claims)
    R = n_rounds(claims)
    if not pop:
        return [None] * (R + 1)
    return [sum(bool(hit(c["rounds"][r])) for c in pop) / len(pop) for r in range(R + 1)]


def invalid_rate(claims: Sequence[Mapping]) -> list[float | None]:
    """Per round: share of claims whose answer was invalid."""
    return _round_share(claims, lambda rd: not is_valid(rd))


def nei_answer_rate(claims: Sequence[Mapping]) -> list[float | None]:
    """Per round: share of claims answered NOT_ENOUGH_INFO (ideal: 0 at round 0, 1 after)."""
    return _round_share(claims, lambda rd: is_nei(round_label(rd)))


def truncated_rate(claims: Sequence[Mapping]) -> list[float | None]:
    """Per round: share of claims whose answer was cut off at ``max_new_tokens``.

    ``None`` for a round where no answer says whether it was cut off: runs
    made before backends reported it, or a backend that does not tell.
    """
    pop = evidence_claims(claims)
    shares = _round_share(pop, lambda rd: rd.get("truncated") is True)
    known = [any("truncated" in c["rounds"][r] for c in pop) for r in range(len(shares))]
    return [x if k else None for x, k in zip(shares, known)]


def hallucinated_id_rate(claims: Sequence[Mapping]) -> list[float | None]:
    """Per round: hallucinated ids / all ids named by valid answers (0.0 if none named).

    An id is hallucinated when it is not in the pool shown at that round:
    invented, or already ablated in an earlier round.
    """
    pop = evidence_claims(claims)
    R = n_rounds(claims)
    out: list[float | None] = []
    for r in range(R + 1):
        n_h = sum(len(c["rounds"][r].get("hallucinated") or []) for c in pop)
        n_all = sum(len(c["rounds"][r].get("cited") or []) for c in pop) + n_h
        out.append(n_h / n_all if n_all else (0.0 if pop else None))
    return out


def call_counts(claims: Sequence[Mapping]) -> dict[str, int]:
    """Rounds answered by the model vs reused from the previous round (unchanged pool)."""
    pop = evidence_claims(claims)
    reused = sum(bool(rd.get("reused")) for c in pop for rd in c["rounds"])
    total = sum(len(c["rounds"]) for c in pop)
    return {"reused_calls": reused, "model_calls": total - reused}


def truncation_note(metrics: Mapping[str, Any], max_new_tokens: int | None = None) -> str | None:
    """A hint to raise ``--max-new-tokens`` when any answer was cut off (``fae run`` and ``fae report``)."""
    rates = metrics.get("truncated_rate") or []
    if not any(rates):
        return None
    shown = ", ".join(f"r{r} {100 * x:.1f}%" for r, x in enumerate(rates) if x)
    cap = f" (was {max_new_tokens})" if max_new_tokens else ""
    return (f"answers were cut off at max_new_tokens ({shown} of claims); a cut-off answer is usually "
            f"invalid: raise --max-new-tokens{cap}")


# ---------------------------------------------------------------------------
# everything
# ---------------------------------------------------------------------------


INTERVAL_METRICS = ("label_accuracy", "strict_accuracy", "IS", "ER", "IO")


def _bootstrap_claims(claims: Sequence[Mapping], n_resamples: int, confidence_level: float,
                      seed: int) -> tuple[list[Mapping], Any, dict[str, Any]]:
    """The claims resampled by :func:`metric_intervals` and :func:`chance_comparison`: the population in
    id order (the same draws in any file order), the (resamples, claims) index of each draw, and the
    header both results start with. The shared draw lets their intervals be read side by side."""
    pop = sorted(evidence_claims(claims), key=lambda c: str(c["id"]))
    head = {"method": "percentile bootstrap over claims", "n_resamples": int(n_resamples),
            "confidence_level": confidence_level, "seed": seed, "n_claims": len(pop)}
    idx = draw_units(len(pop), n_resamples, seed) if pop else None
    return pop, idx, head


def metric_intervals(claims: Sequence[Mapping], *, n_resamples: int = 2000, confidence_level: float = 0.95,
                     seed: int = 0) -> dict[str, Any]:
    """Percentile-bootstrap intervals over claims of Acc, Strict, IS, ER and IO.

    Each resample draws the population's claims with replacement and computes the metrics exactly as
    :func:`compute_metrics` does (the same per-claim correctness: :func:`same_label`, :func:`cites_gold`;
    IS/ER/IO from its ``a_0..a_R`` through :func:`fae_scores`' formulas). A resample whose ``a_0`` is 0
    has no IS/ER/IO and is left out of theirs; ``defined`` is the share of resamples that had one. Claims
    are resampled in id order, so the intervals do not depend on the order of the run's claims.
    """
    import numpy as np

    pop, idx, out = _bootstrap_claims(claims, n_resamples, confidence_level, seed)
    R = n_rounds(pop) if pop else 0
    if not pop:
        return {**out, **{k: {"ci_low": None, "ci_high": None, "defined": 0.0} for k in INTERVAL_METRICS}}
    right = np.array([[same_label(round_label(c["rounds"][r]), c["gold_label"]) for r in range(R + 1)]
                      for c in pop], float)
    strict = np.array([same_label(round_label(c["rounds"][0]), c["gold_label"])
                       and cites_gold(c["rounds"][0].get("cited") or [], c["gold_groups"]) for c in pop], float)
    acc = right[idx].mean(axis=1)  # (resamples, R + 1): a_0..a_R of each resample
    draws = {"label_accuracy": acc[:, 0], "strict_accuracy": strict[idx].mean(axis=1)}
    if R >= 1:
        a0 = acc[:, 0]
        draws["IS"] = immediate_sensitivity(a0, acc[:, 1])
        draws["ER"] = end_state_retention(a0, acc[:, R])
        draws["IO"] = ideal_offset(a0, acc[:, 1:].mean(axis=1))
    for key in INTERVAL_METRICS:
        out[key] = percentile_interval(draws.get(key, []), confidence_level, n_units=len(pop))
    return out


def chance_comparison(claims: Sequence[Mapping], *, n_resamples: int = 2000, confidence_level: float = 0.95,
                      seed: int = 0) -> dict[str, Any]:
    """Round-0 accuracy against what a verifier that reads nothing gets on the same claims.

    A constant answer scores the share of its label among the claims, so the bar for Acc is the
    majority label's share (70% SUPPORT on SciFact dev's first 100 claims, not 50%). Balanced
    accuracy, the mean over gold labels of the share answered right, is 1/k for any constant answer
    (k gold labels present) whatever the label mix. ``above_chance`` holds when the lower end of the
    percentile-bootstrap interval (claims resampled as in :func:`metric_intervals`) clears the bar.
    """
    import numpy as np

    pop, idx, out = _bootstrap_claims(claims, n_resamples, confidence_level, seed)
    if not pop:
        return {**out, "majority_label": None, "majority_rate": None, "balanced_accuracy": None,
                "balanced_accuracy_chance": None, "label_accuracy_above_chance": None,
                "balanced_accuracy_above_chance": None}
    gold = [str(c["gold_label"]) for c in pop]
    labels = sorted(set(gold))
    counts = {lab: gold.count(lab) for lab in labels}
    majority = max(labels, key=lambda lab: (counts[lab], lab == SUPPORT))
    right = np.array([same_label(round_label(c["rounds"][0]), c["gold_label"]) for c in pop], float)
    member = np.array([[g == lab for lab in labels] for g in gold], float)  # (claims, labels)
    hits = (right[idx][:, :, None] * member[idx]).sum(axis=1)
    present = member[idx].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        recall = np.where(present > 0, hits / present, np.nan)
    balanced_draws = np.nanmean(recall, axis=1)
    acc_ci = percentile_interval(right[idx].mean(axis=1), confidence_level, n_units=len(pop))
    bal_ci = percentile_interval(balanced_draws, confidence_level, n_units=len(pop))
    majority_rate = counts[majority] / len(pop)
    balanced = float(np.mean([right[member[:, j] > 0].mean() for j in range(len(labels))]))
    return {**out, "gold_counts": counts, "majority_label": majority, "majority_rate": majority_rate,
            "label_accuracy": float(right.mean()), "label_accuracy_ci": acc_ci,
            "balanced_accuracy": balanced, "balanced_accuracy_ci": bal_ci,
            "balanced_accuracy_chance": 1 / len(labels),
            "label_accuracy_above_chance": acc_ci["ci_low"] is not None and acc_ci["ci_low"] > majority_rate,
            "balanced_accuracy_above_chance": (bal_ci["ci_low"] is not None
                                               and bal_ci["ci_low"] > 1 / len(labels))}


def compute_metrics(claims: Sequence[Mapping], n_excluded_nei: int = 0) -> dict[str, Any]:
    """All of ``metrics.json``: exactly :data:`METRIC_KEYS`, fractions in [0, 1].

    NEI-gold claims still in ``claims`` (runs made before ``fae run`` skipped
    them) are dropped here; ``n_excluded_nei`` adds the ones the run skipped.
    """
    claims = list(claims)
    R = n_rounds(claims)
    pop, n_nei = fae_claims(claims)

    def per_round(fn):  # an empty claim set has no rounds of its own: keep R from the input
        return fn(pop) if pop else [None] * (R + 1)

    acc = per_round(round_accuracy)
    prf = evidence_prf(pop)
    fae = fae_scores(acc)
    flips = flip_rates(pop)
    fever = fever_score(round0_predictions(pop), pop)["strict"] if pop else None
    out = {
        "n_claims": len(pop),
        "n_excluded_nei": n_nei + int(n_excluded_nei),
        "rounds": R,
        "label_accuracy": label_accuracy(pop),
        "strict_accuracy": strict_accuracy(pop),
        "fever_score": fever,
        "evidence_precision": prf["precision"],
        "evidence_recall": prf["recall"],
        "evidence_f1": prf["f1"],
        "evidence_precision_macro": prf["precision_macro"],
        "evidence_recall_macro": prf["recall_macro"],
        "evidence_f1_macro": prf["f1_macro"],
        "round_accuracy": acc,
        "retention": retention(acc),
        "retention_reason": retention_reason(acc),
        "IS": fae["IS"],
        "ER": fae["ER"],
        "IO": fae["IO"],
        "IS_reason": fae["IS_reason"],
        "ER_reason": fae["ER_reason"],
        "IO_reason": fae["IO_reason"],
        "flip_rate": flips["flip_rate"],
        "any_flip_rate": flips["any_flip_rate"],
        "invalid_rate": per_round(invalid_rate),
        "nei_answer_rate": per_round(nei_answer_rate),
        "truncated_rate": per_round(truncated_rate),
        "hallucinated_id_rate": per_round(hallucinated_id_rate),
        **call_counts(pop),
        "soft": soft_metrics(pop),  # soft FAE (fae.ablation.soft_metrics): label-probability metrics
        # the control arm (fae.ablation.control) and the sufficiency arms (fae.ablation.sufficiency: gold-only,
        # cited-only, size sweep); None for runs made without them
        "control": control_metrics(pop),
        "gold_only": gold_only_metrics(pop),
        "cited_only": cited_only_metrics(pop),
        "size_sweep": size_sweep_metrics(pop),
    }
    assert tuple(out) == METRIC_KEYS
    return out
