"""FAE metrics (SPEC §6) as pure functions over per-claim rounds.

Every function takes the claims exactly as ``RUN_DIR/claims.jsonl`` stores
them (``{"id", "gold_label", "gold_groups", "rounds": [...]}``), so metrics
can be recomputed from a run directory at any time and checked by hand.

Populations (what each metric averages over):

* **all claims** — ``label_accuracy``, ``strict_accuracy``, ``fever_score``,
  ``invalid_rate``, ``hallucinated_id_rate``, ``reused_calls``, ``model_calls``.
* **evidence claims** (gold label SUPPORT/REFUTE) — the evidence P/R/F1, the
  trajectory ``round_accuracy`` (``a_r``), ``retention`` (``g_r``), IS, ER,
  IO and the flip rates. SPEC §1 excludes NOT_ENOUGH_INFO-gold claims; when a
  records file still has some (``--keep-nei`` data), they count in round-0
  accuracy and the FEVER score (correct label = strictly correct, as in
  FEVER) but not in the ablation trajectory: ablating the "evidence" of a claim
  that has none measures nothing, and an abstaining verifier would score them
  correct at every round. Without NEI-gold claims ``a_0 == label_accuracy``.

An invalid answer has ``label = None``: it is wrong at every round and cites
nothing. All values are fractions in [0, 1] (``IS``/``ER`` may leave that
range when ``a_r > a_0``; they are not clamped, as in the paper), or ``None``
where a value is undefined (no claims, ``a_0 = 0``, ``R = 0``) — never NaN.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

NEI = "NOT_ENOUGH_INFO"
_NEI_ALIASES = {"NOT_ENOUGH_INFO", "NOT ENOUGH INFO", "NEI"}

METRIC_KEYS = (
    "n_claims",
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
    "IS",
    "ER",
    "IO",
    "flip_rate",
    "any_flip_rate",
    "invalid_rate",
    "hallucinated_id_rate",
    "reused_calls",
    "model_calls",
)


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def is_nei(label: str | None) -> bool:
    return label is not None and str(label).upper() in _NEI_ALIASES


def _same_label(pred: str | None, gold: str) -> bool:
    if pred is None:
        return False
    if is_nei(pred) and is_nei(gold):
        return True
    return pred.upper() == gold.upper()


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _f1(p: float | None, r: float | None) -> float | None:
    if p is None or r is None:
        return None
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def gold_union(claim: Mapping) -> set:
    """``E*``: the union of the claim's gold groups."""
    return {i for g in claim["gold_groups"] for i in g}


def evidence_claims(claims: Iterable[Mapping]) -> list[Mapping]:
    """Claims whose gold label is SUPPORT/REFUTE (the ablation population)."""
    return [c for c in claims if not is_nei(c["gold_label"])]


def named_ids(rnd: Mapping) -> list:
    """Every id an answer named, in citation order (cited + hallucinated).

    Runs store this as ``evidence``; older hand-built rounds may only have
    ``cited``/``hallucinated``, in which case citation order is cited first.
    """
    if "evidence" in rnd and rnd["evidence"] is not None:
        return list(rnd["evidence"])
    return list(rnd.get("cited") or []) + list(rnd.get("hallucinated") or [])


def _n_rounds(claims: Sequence[Mapping]) -> int:
    lengths = {len(c["rounds"]) for c in claims}
    if len(lengths) > 1:
        raise ValueError(f"claims have different numbers of rounds: {sorted(lengths)}")
    return (lengths.pop() - 1) if lengths else 0


# ---------------------------------------------------------------------------
# round-0 fact-checking metrics
# ---------------------------------------------------------------------------


def label_accuracy(claims: Sequence[Mapping], r: int = 0) -> float | None:
    """Share of all claims whose round-``r`` label equals the gold label."""
    if not claims:
        return None
    return sum(_same_label(c["rounds"][r]["label"], c["gold_label"]) for c in claims) / len(claims)


def strict_accuracy(claims: Sequence[Mapping]) -> float | None:
    """Round 0: label correct AND at least one gold sentence cited (the paper's Strict).

    Only ids present in the pool count as cited. An NEI-gold claim (no gold
    evidence) is strictly correct when its label is correct, as in FEVER.
    """
    if not claims:
        return None
    ok = 0
    for c in claims:
        r0 = c["rounds"][0]
        if not _same_label(r0["label"], c["gold_label"]):
            continue
        if is_nei(c["gold_label"]) or set(r0.get("cited") or []) & gold_union(c):
            ok += 1
    return ok / len(claims)


def evidence_prf(claims: Sequence[Mapping]) -> dict[str, float | None]:
    """Round-0 evidence precision/recall/F1, micro and macro, over evidence claims.

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
        "precision_macro": _mean(ps),
        "recall_macro": _mean(rs),
        "f1_macro": _mean(fs),
    }


def fever_score(
    predictions: Sequence[Mapping],
    records: Sequence[Any],
    max_evidence: int | None = 5,
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
        label_ok = _same_label(pred.get("label"), label)
        if label_ok:
            correct += 1
            if is_nei(label) or any(all(i in top for i in g) for g in groups):
                strict += 1
        if not is_nei(label):
            all_gold = {i for g in groups for i in g}
            prec_sum += (sum(1 for i in top if i in all_gold) / len(top)) if top else 1.0
            prec_n += 1
            if not groups or any(all(i in top for i in g) for g in groups):
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
        {"id": c["id"], "label": c["rounds"][0]["label"], "evidence": named_ids(c["rounds"][0])}
        for c in claims
    ]


# ---------------------------------------------------------------------------
# FAE trajectory metrics
# ---------------------------------------------------------------------------


def round_accuracy(claims: Sequence[Mapping]) -> list[float | None]:
    """``a_0..a_R`` over evidence claims; an invalid answer is wrong.

    At r >= 1 an evidence-grounded verifier answers NEI, which is wrong
    against the SUPPORT/REFUTE gold label: the ideal trajectory is a_0 high,
    then 0.
    """
    pop = evidence_claims(claims)
    R = _n_rounds(claims)
    if not pop:
        return [None] * (R + 1)
    return [label_accuracy(pop, r) for r in range(R + 1)]


def retention(acc: Sequence[float | None]) -> list[float | None]:
    """``g_r = a_r / a_0``; ``None`` for every r when ``a_0`` is 0 or undefined."""
    a0 = acc[0] if acc else None
    if not a0:
        return [None] * len(acc)
    return [None if a is None else a / a0 for a in acc]


def fae_scores(acc: Sequence[float | None]) -> dict[str, float | None]:
    """IS = 1 - g_1, ER = 1 - g_R, IO = 1 - mean(a_1..a_R) (SPEC §6).

    IS/ER are ``None`` when ``a_0 = 0`` (retention undefined); all three are
    ``None`` when R = 0 or there are no evidence claims. IO uses ``a_r``, not
    ``g_r``, so it is defined whenever a_1..a_R are.
    """
    R = len(acc) - 1
    if R < 1 or any(a is None for a in acc[1:]):
        return {"IS": None, "ER": None, "IO": None}
    g = retention(acc)
    return {
        "IS": None if g[1] is None else 1 - g[1],
        "ER": None if g[R] is None else 1 - g[R],
        "IO": 1 - sum(acc[1:]) / R,
    }


def is_flip(a: str | None, b: str | None) -> bool:
    """A direct SUPPORT <-> REFUTE switch (not through NEI or an invalid answer)."""
    return {a, b} == {"SUPPORT", "REFUTE"}


def flip_rates(claims: Sequence[Mapping]) -> dict[str, float | None]:
    """Direct SUPPORT <-> REFUTE switches between consecutive rounds.

    ``flip_rate`` = flipping transitions / all R transitions of all evidence
    claims; ``any_flip_rate`` = share of evidence claims with at least one flip.
    A switch through NEI or an invalid answer is not a flip.
    """
    pop = evidence_claims(claims)
    R = _n_rounds(claims)
    if not pop or R < 1:
        return {"flip_rate": None, "any_flip_rate": None}
    flips = anyf = 0
    for c in pop:
        labels = [rd["label"] for rd in c["rounds"]]
        n = sum(is_flip(labels[r - 1], labels[r]) for r in range(1, R + 1))
        flips += n
        anyf += n > 0
    return {"flip_rate": flips / (len(pop) * R), "any_flip_rate": anyf / len(pop)}


def invalid_rate(claims: Sequence[Mapping]) -> list[float | None]:
    """Per round: share of all claims whose answer was invalid (reused answers included)."""
    R = _n_rounds(claims)
    if not claims:
        return [None] * (R + 1)
    return [sum(not c["rounds"][r]["valid"] for c in claims) / len(claims) for r in range(R + 1)]


def hallucinated_id_rate(claims: Sequence[Mapping]) -> list[float | None]:
    """Per round: hallucinated ids / all ids named by valid answers (0.0 if none named).

    An id is hallucinated when it is not in the pool shown at that round:
    invented, or already ablated in an earlier round.
    """
    R = _n_rounds(claims)
    out: list[float | None] = []
    for r in range(R + 1):
        n_h = sum(len(c["rounds"][r].get("hallucinated") or []) for c in claims)
        n_all = sum(len(c["rounds"][r].get("cited") or []) for c in claims) + n_h
        out.append(n_h / n_all if n_all else (0.0 if claims else None))
    return out


def call_counts(claims: Sequence[Mapping]) -> dict[str, int]:
    """Rounds answered by the model vs reused from the previous round (unchanged pool)."""
    reused = sum(bool(rd.get("reused")) for c in claims for rd in c["rounds"])
    total = sum(len(c["rounds"]) for c in claims)
    return {"reused_calls": reused, "model_calls": total - reused}


# ---------------------------------------------------------------------------
# everything
# ---------------------------------------------------------------------------


def compute_metrics(claims: Sequence[Mapping]) -> dict[str, Any]:
    """All of ``metrics.json``: exactly :data:`METRIC_KEYS`, fractions in [0, 1]."""
    claims = list(claims)
    R = _n_rounds(claims)
    acc = round_accuracy(claims)
    prf = evidence_prf(claims)
    fae = fae_scores(acc)
    flips = flip_rates(claims)
    fever = fever_score(round0_predictions(claims), claims)["strict"] if claims else None
    out = {
        "n_claims": len(claims),
        "rounds": R,
        "label_accuracy": label_accuracy(claims),
        "strict_accuracy": strict_accuracy(claims),
        "fever_score": fever,
        "evidence_precision": prf["precision"],
        "evidence_recall": prf["recall"],
        "evidence_f1": prf["f1"],
        "evidence_precision_macro": prf["precision_macro"],
        "evidence_recall_macro": prf["recall_macro"],
        "evidence_f1_macro": prf["f1_macro"],
        "round_accuracy": acc,
        "retention": retention(acc),
        "IS": fae["IS"],
        "ER": fae["ER"],
        "IO": fae["IO"],
        "flip_rate": flips["flip_rate"],
        "any_flip_rate": flips["any_flip_rate"],
        "invalid_rate": invalid_rate(claims),
        "hallucinated_id_rate": hallucinated_id_rate(claims),
        **call_counts(claims),
    }
    assert tuple(out) == METRIC_KEYS
    return out
