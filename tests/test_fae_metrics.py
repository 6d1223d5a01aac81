"""FAE metrics on hand-computed cases (every number below is worked out by hand)."""

import json
import math

import pytest
from fae_helpers import NEI, claim, ideal_claims, mixed_claims, rnd

from fae.ablation import metrics as M

# ---------------------------------------------------------------------------
# the official FEVER scorer, five claims (reference: fever-scorer 2.0.39)
# ---------------------------------------------------------------------------
A0, B1, B2, C3, D4, X9 = 0, 1, 2, 3, 4, 9
FEVER_RECORDS = [
    {"id": "c1", "label": "SUPPORT", "evidence": [[A0], [B1, B2]]},
    {"id": "c2", "label": "REFUTE", "evidence": [[B1, B2]]},
    {"id": "c3", "label": NEI, "evidence": []},
    {"id": "c4", "label": "SUPPORT", "evidence": [[C3]]},
    {"id": "c5", "label": "SUPPORT", "evidence": [[D4]]},
]
FEVER_PREDS = [
    {"id": "c1", "label": "SUPPORT", "evidence": [A0, X9]},
    {"id": "c2", "label": "REFUTE", "evidence": [B1]},
    {"id": "c3", "label": NEI, "evidence": []},
    {"id": "c4", "label": "REFUTE", "evidence": [C3]},
    {"id": "c5", "label": "SUPPORT", "evidence": []},
]


def test_fever_score_matches_official_scorer_on_five_claims():
    s = M.fever_score(FEVER_PREDS, FEVER_RECORDS)
    assert s["strict"] == pytest.approx(0.4)
    assert s["accuracy"] == pytest.approx(0.8)
    assert s["precision"] == pytest.approx(0.875)
    assert s["recall"] == pytest.approx(0.5)
    assert s["f1"] == pytest.approx(0.6363636, abs=1e-6)


def test_fever_score_accepts_record_objects_claim_lines_and_any_order():
    from data_prep.records import ClaimRecord

    recs = [ClaimRecord.from_dict({**r, "claim": "x", "sentences": [{"id": i, "text": "s"} for i in range(10)]})
            for r in FEVER_RECORDS]
    lines = [{"id": r["id"], "gold_label": r["label"], "gold_groups": r["evidence"]} for r in FEVER_RECORDS]
    ref = M.fever_score(FEVER_PREDS, FEVER_RECORDS)
    assert M.fever_score(list(reversed(FEVER_PREDS)), recs) == ref
    assert M.fever_score(FEVER_PREDS, lines) == ref
    # the scorer's own NEI spelling is the same label
    alt = [dict(p, label="NOT ENOUGH INFO") if p["label"] == NEI else p for p in FEVER_PREDS]
    assert M.fever_score(alt, FEVER_RECORDS) == ref


def test_fever_score_only_first_five_ids_count():
    recs = [{"id": "a", "label": "SUPPORT", "evidence": [[6, 7]]}]
    preds = [{"id": "a", "label": "SUPPORT", "evidence": [0, 1, 2, 3, 6, 7]}]
    assert M.fever_score(preds, recs)["strict"] == 0.0  # 7 is the 6th id
    assert M.fever_score(preds, recs)["precision"] == pytest.approx(1 / 5)
    assert M.fever_score(preds, recs, max_evidence=None)["strict"] == 1.0


def test_fever_score_rejects_missing_and_unknown_predictions():
    with pytest.raises(ValueError, match="no prediction"):
        M.fever_score(FEVER_PREDS[:4], FEVER_RECORDS)
    with pytest.raises(ValueError, match="unknown record"):
        M.fever_score(FEVER_PREDS + [{"id": "zz", "label": NEI, "evidence": []}], FEVER_RECORDS)


# ---------------------------------------------------------------------------
# an ideal verifier: right at round 0, NEI once its evidence is gone
# ---------------------------------------------------------------------------


def test_ideal_verifier_scores_one_everywhere():
    m = M.compute_metrics(ideal_claims())
    assert m["IS"] == 1.0 and m["ER"] == 1.0 and m["IO"] == 1.0
    assert m["round_accuracy"] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert m["retention"] == [1.0, 0.0, 0.0, 0.0, 0.0]
    for k in ("label_accuracy", "strict_accuracy", "fever_score", "evidence_precision", "evidence_recall",
              "evidence_f1", "evidence_f1_macro"):
        assert m[k] == 1.0, k
    assert m["flip_rate"] == 0.0 and m["invalid_rate"] == [0.0] * 5
    assert m["model_calls"] == 3 * 2 and m["reused_calls"] == 3 * 3


# ---------------------------------------------------------------------------
# a mixed case, R = 2
# ---------------------------------------------------------------------------


def test_mixed_case_hand_computed():
    m = M.compute_metrics(mixed_claims())
    assert m["n_claims"] == 4 and m["rounds"] == 2
    assert m["label_accuracy"] == 0.75  # A, B, D
    assert m["strict_accuracy"] == 0.5  # A, B (D cites a non-gold sentence)
    assert m["fever_score"] == 0.25  # only A has a complete group
    # micro: predicted {0,1} {7,1} {} {0} vs gold {0,3} {1,2} {0} {1}: TP 2, 5 predicted, 6 gold
    assert m["evidence_precision"] == pytest.approx(2 / 5)
    assert m["evidence_recall"] == pytest.approx(2 / 6)
    assert m["evidence_f1"] == pytest.approx(2 * 0.4 * (1 / 3) / (0.4 + 1 / 3))
    # macro: A .5/.5/.5, B .5/.5/.5, C 0, D 0
    assert m["evidence_precision_macro"] == pytest.approx(0.25)
    assert m["evidence_recall_macro"] == pytest.approx(0.25)
    assert m["evidence_f1_macro"] == pytest.approx(0.25)
    assert m["round_accuracy"] == [0.75, 0.5, 0.25]
    assert m["retention"] == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert m["IS"] == pytest.approx(1 / 3)
    assert m["ER"] == pytest.approx(2 / 3)
    assert m["IO"] == pytest.approx(1 - (0.5 + 0.25) / 2)
    assert m["flip_rate"] == pytest.approx(2 / 8) and m["any_flip_rate"] == 0.25
    assert m["invalid_rate"] == [0.25, 0.25, 0.25]
    assert m["hallucinated_id_rate"] == pytest.approx([1 / 5, 0.0, 1.0])
    assert m["reused_calls"] == 2 and m["model_calls"] == 10


def test_metrics_json_has_exactly_the_contract_keys_and_serialises():
    m = M.compute_metrics(mixed_claims())
    assert list(m) == list(M.METRIC_KEYS)
    assert json.loads(json.dumps(m)) == m
    assert len(m["round_accuracy"]) == len(m["retention"]) == len(m["invalid_rate"]) == m["rounds"] + 1


def test_fever_uses_citation_order_first_five():
    # 5 invented ids first: the gold id in 6th place does not count for FEVER, but counts for Strict
    c = claim("E", "SUPPORT", [[2]], [rnd(0, [0, 1, 2], "SUPPORT", [2], [10, 11, 12, 13, 14],
                                         evidence=[10, 11, 12, 13, 14, 2])])
    m = M.compute_metrics([c])
    assert m["strict_accuracy"] == 1.0 and m["fever_score"] == 0.0


# ---------------------------------------------------------------------------
# edge cases: no NaN, undefined is None
# ---------------------------------------------------------------------------


def test_always_nei_verifier_has_undefined_retention_not_nan():
    cl = [claim(f"n{k}", "SUPPORT", [[0]], [rnd(r, [0, 1], NEI, reused=r > 0) for r in range(5)]) for k in range(3)]
    m = M.compute_metrics(cl)
    assert m["round_accuracy"] == [0.0] * 5
    assert m["retention"] == [None] * 5 and m["IS"] is None and m["ER"] is None
    # a_0 = 0: nothing to lose under ablation, so IO is undefined too (not 1.0, which would read as ideal)
    assert m["IO"] is None and m["IO_reason"] == m["IS_reason"] == m["retention_reason"] == "a_0 = 0"
    assert m["nei_answer_rate"] == [1.0] * 5
    assert m["evidence_precision"] == 0.0 and m["evidence_f1"] == 0.0
    assert not any(isinstance(v, float) and math.isnan(v) for v in m.values())


def test_zero_rounds_and_empty_input():
    m = M.compute_metrics([claim("z", "REFUTE", [[0]], [rnd(0, [0], "REFUTE", [0])])])
    assert m["rounds"] == 0 and m["IS"] is None and m["IO"] is None and m["flip_rate"] is None
    assert m["IS_reason"] == "R = 0 (no ablation rounds)" and m["retention"] == [1.0]
    assert m["retention_reason"] is None
    assert m["label_accuracy"] == 1.0
    e = M.compute_metrics([])
    assert e["n_claims"] == 0 and e["label_accuracy"] is None and e["fever_score"] is None
    assert e["IO_reason"] == "a_0 undefined (no SUPPORT/REFUTE claims)"


def test_nei_gold_claims_of_old_runs_are_excluded_from_every_metric():
    """SPEC §1: NEI-gold claims in claims.jsonl count in no metric (else Acc/Strict/FEVER: 4/5, 3/5)."""
    cl = mixed_claims() + [claim("N", NEI, [], [rnd(r, [0, 1], NEI, reused=r > 0) for r in range(3)])]
    m = M.compute_metrics(cl)
    ref = M.compute_metrics(mixed_claims())
    assert m["n_excluded_nei"] == 1 and ref["n_excluded_nei"] == 0
    assert {**m, "n_excluded_nei": 0} == ref  # every number is the SUPPORT/REFUTE claims' own
    assert m["label_accuracy"] == m["round_accuracy"][0] == 0.75  # Acc is a_0
    assert m["strict_accuracy"] == 0.5 and m["fever_score"] == 0.25 and m["n_claims"] == 4
    assert M.compute_metrics(cl, n_excluded_nei=2)["n_excluded_nei"] == 3  # + the ones `fae run` skipped


def test_mismatched_round_counts_are_an_error():
    cl = mixed_claims()
    cl[0]["rounds"] = cl[0]["rounds"][:2]
    with pytest.raises(ValueError, match="different numbers of rounds"):
        M.compute_metrics(cl)


# ---------------------------------------------------------------------------
# bootstrap intervals of the headline metrics
# ---------------------------------------------------------------------------

def _random_claims(n: int, seed: int, R: int = 2) -> list[dict]:
    """Claims whose round labels are drawn at random: right at round 0 with p 0.7, kept with p 0.4 after."""
    import random

    rng = random.Random(seed)
    out = []
    for k in range(n):
        gold = "SUPPORT" if k % 2 else "REFUTE"
        wrong = "REFUTE" if gold == "SUPPORT" else "SUPPORT"
        first = gold if rng.random() < 0.7 else wrong
        rounds = [rnd(0, [0, 1, 2, 3], first, [0] if rng.random() < 0.5 else [1])]
        for r in range(1, R + 1):
            rounds.append(rnd(r, [2, 3], gold if rng.random() < 0.4 else NEI, [2]))
        out.append(claim(f"c{k}", gold, [[0]], rounds))
    return out


def test_metric_intervals_hold_the_estimate_and_agree_with_scipys_bootstrap():
    import numpy as np
    from scipy.stats import bootstrap

    claims = _random_claims(120, seed=3)
    point = M.compute_metrics(claims)
    ci = M.metric_intervals(claims, n_resamples=3000, seed=0)
    assert ci == M.metric_intervals(claims, n_resamples=3000, seed=0) and ci["n_claims"] == 120
    for key in M.INTERVAL_METRICS:
        assert ci[key]["ci_low"] <= point[key] <= ci[key]["ci_high"], key
        assert ci[key]["defined"] == 1.0
    # a second measure of the accuracy's interval: scipy's percentile bootstrap of the round-0 correctness
    right0 = np.array([c["rounds"][0]["label"] == c["gold_label"] for c in claims], float)
    ref = bootstrap((right0,), np.mean, n_resamples=3000, method="percentile", rng=np.random.default_rng(1))
    assert ci["label_accuracy"]["ci_low"] == pytest.approx(ref.confidence_interval.low, abs=0.02)
    assert ci["label_accuracy"]["ci_high"] == pytest.approx(ref.confidence_interval.high, abs=0.02)
    # four times the claims, same process: about half the width
    wide = ci["IS"]["ci_high"] - ci["IS"]["ci_low"]
    big = M.metric_intervals(_random_claims(480, seed=4), n_resamples=3000, seed=0)
    assert big["IS"]["ci_high"] - big["IS"]["ci_low"] < 0.7 * wide


def test_metric_intervals_where_the_metrics_break():
    # the ideal verifier: IS = ER = IO = 1 in every resample
    ideal = [{**c, "id": f"{c['id']}-{k}"} for k in range(4) for c in ideal_claims()]
    ideal = M.metric_intervals(ideal, n_resamples=500, seed=0)
    assert ideal["IS"] == ideal["ER"] == ideal["IO"] == {"ci_low": 1.0, "ci_high": 1.0, "defined": 1.0}
    # too few claims to resample: no interval at all, and it says why
    few = M.metric_intervals(ideal_claims(), n_resamples=500, seed=0)
    assert few["IS"]["ci_low"] is None and "no interval below 10" in few["IS"]["reason"]
    # nothing right at round 0: no IS/ER/IO anywhere, and no interval claims otherwise
    wrong = [claim(f"w{k}", "SUPPORT", [[0]], [rnd(0, [0, 1], "REFUTE", [0]), rnd(1, [1], NEI)]) for k in range(12)]
    none = M.metric_intervals(wrong, n_resamples=200, seed=0)
    assert none["label_accuracy"] == {"ci_low": 0.0, "ci_high": 0.0, "defined": 1.0}
    assert none["IS"] == {"ci_low": None, "ci_high": None, "defined": 0.0}
    assert M.metric_intervals([], n_resamples=10)["IS"]["ci_low"] is None


def test_metric_intervals_do_not_depend_on_the_order_of_the_claims():
    claims = _random_claims(60, seed=5)
    assert M.metric_intervals(claims, n_resamples=300) == M.metric_intervals(list(reversed(claims)), n_resamples=300)


# ---------------------------------------------------------------------------
# accuracy against a verifier that reads nothing
# ---------------------------------------------------------------------------

def _answering(golds: list[str], answers: list[str]) -> list[dict]:
    return [claim(f"k{i:03d}", g, [[0]], [rnd(0, [0, 1], a, [0]), rnd(1, [1], a)])
            for i, (g, a) in enumerate(zip(golds, answers))]


def test_a_constant_verifier_is_never_above_chance_whatever_the_label_mix():
    golds = ["SUPPORT"] * 70 + ["REFUTE"] * 30  # SciFact dev's first 100 claims
    for answer in ("SUPPORT", "REFUTE", NEI):
        c = M.chance_comparison(_answering(golds, [answer] * 100), n_resamples=500)
        assert c["majority_label"] == "SUPPORT" and c["majority_rate"] == pytest.approx(0.7)
        assert c["label_accuracy"] == pytest.approx({"SUPPORT": 0.7, "REFUTE": 0.3, NEI: 0.0}[answer])
        # balanced accuracy: 1/2 for a constant label, 0 for a verifier that always abstains
        assert c["balanced_accuracy"] == pytest.approx(0.0 if answer == NEI else 0.5)
        assert c["balanced_accuracy_chance"] == 0.5
        assert not c["label_accuracy_above_chance"] and not c["balanced_accuracy_above_chance"]


def test_a_verifier_that_reads_the_evidence_is_above_chance_and_the_interval_holds_it():
    import random

    rng = random.Random(7)
    golds = ["SUPPORT"] * 70 + ["REFUTE"] * 30
    flip = {"SUPPORT": "REFUTE", "REFUTE": "SUPPORT"}
    answers = [g if rng.random() < 0.9 else flip[g] for g in golds]
    c = M.chance_comparison(_answering(golds, answers), n_resamples=2000)
    right = [a == g for a, g in zip(answers, golds)]
    assert c["label_accuracy"] == pytest.approx(sum(right) / 100)
    by_hand = (sum(right[:70]) / 70 + sum(right[70:]) / 30) / 2
    assert c["balanced_accuracy"] == pytest.approx(by_hand)
    for key in ("label_accuracy", "balanced_accuracy"):
        assert c[f"{key}_ci"]["ci_low"] <= c[key] <= c[f"{key}_ci"]["ci_high"]
    assert c["label_accuracy_above_chance"] and c["balanced_accuracy_above_chance"]
    # the same verifier on 10 claims: too few to tell
    small = M.chance_comparison(_answering(golds[::10], answers[::10]), n_resamples=2000)
    assert not small["label_accuracy_above_chance"]
    assert M.chance_comparison([])["majority_rate"] is None
