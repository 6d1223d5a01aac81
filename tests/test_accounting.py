"""Score accounting formulas (fae/comparison/accounting.py): identities, hand-checked cases, bootstrap coverage."""

from __future__ import annotations

import numpy as np
import pytest

from fae.comparison import accounting


def _ind(a0, a1, d0, d1):
    f = lambda x: np.asarray(x, float)  # noqa: E731
    return accounting.Indicators(f(a0), f(a1), f(d0), f(d1))


def cells_by_definition(ind):
    """The 2x2 table straight from SPEC §8, ``S_ab = 100 * mean(a_a * d_b)``: the second measure."""
    a, d = {"0": ind.a0, "1": ind.a1}, {"0": ind.d0, "1": ind.d1}
    return {f"S{x}{y}": 100.0 * float(np.mean(a[x] * d[y])) for x in "01" for y in "01"}


def score_cells(ind):
    """The cells as ``fae compare`` computes them: from the sums of the per-claim columns."""
    out = dict(zip(accounting.ACCOUNTING_OUTPUTS, accounting.accounting_from_sums(accounting.accounting_columns(ind).sum(0))))
    return {k: float(out[k]) for k in accounting.CELLS}


def _random_ind(rng, n):
    return _ind(*(rng.integers(0, 2, n) for _ in range(4)))


# -- decomposition identities ------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_identities_hold_on_random_data(seed):
    rng = np.random.default_rng(seed)
    ind = _random_ind(rng, int(rng.integers(2, 500)))
    cells = cells_by_definition(ind)
    d = accounting.decompose(cells)
    assert d["G"] == pytest.approx(d["E0"] + d["A1"], abs=1e-12)
    assert d["G"] == pytest.approx(d["A0"] + d["E1"], abs=1e-12)
    assert d["I"] == pytest.approx(d["E1"] - d["E0"], abs=1e-12)
    assert d["G"] == pytest.approx(cells["S11"] - cells["S00"], abs=1e-12)
    accounting.check_identities(d)
    # product + covariance = the evidence gain at fixed answers, for both orders
    pc0 = accounting.product_covariance(ind.a0, ind.d0, ind.d1)
    pc1 = accounting.product_covariance(ind.a1, ind.d0, ind.d1)
    assert pc0["product"] + pc0["covariance"] == pytest.approx(d["E0"], abs=1e-9)
    assert pc1["product"] + pc1["covariance"] == pytest.approx(d["E1"], abs=1e-9)
    # the sums-based statistic (used by the bootstrap) agrees with the direct formulas
    out = dict(zip(accounting.ACCOUNTING_OUTPUTS, accounting.accounting_from_sums(accounting.accounting_columns(ind).sum(0))))
    for k in accounting.QUANTITIES:
        assert out[k] == pytest.approx({**cells, **d}[k], abs=1e-9)
    assert out["E0_product"] == pytest.approx(pc0["product"], abs=1e-9)
    assert out["E1_covariance"] == pytest.approx(pc1["covariance"], abs=1e-9)
    # per-label contributions sum to the overall cells
    gold = rng.choice(["SUPPORT", "REFUTE"], len(ind))
    by = accounting.per_label_contributions(ind, gold)
    for k in accounting.CELLS + ("G",):
        assert sum(row[k] for row in by.values()) == pytest.approx({**cells, **d}[k], abs=1e-9)


def test_identity_violation_is_caught():
    with pytest.raises(AssertionError):
        accounting.check_identities({"G": 1.0, "E0": 0.5, "A1": 0.4, "A0": 0.5, "E1": 0.5, "I": 0.0})


# -- hand-checked small case -------------------------------------------------


def test_hand_checked_four_claims():
    # claim:      1  2  3  4
    ind = _ind(a0=[1, 1, 0, 0], a1=[1, 0, 1, 0], d0=[0, 1, 0, 0], d1=[1, 1, 1, 0])
    cells = score_cells(ind)
    assert cells == {"S00": 25.0, "S01": 50.0, "S10": 0.0, "S11": 50.0}
    d = accounting.decompose(cells)
    assert d == {"G": 25.0, "E0": 25.0, "A1": 0.0, "A0": -25.0, "E1": 50.0, "I": 25.0}
    # mean(a0)=.5, mean(Δd)=.5 -> product 25; a0 and Δd uncorrelated -> cov 0
    pc0 = accounting.product_covariance(ind.a0, ind.d0, ind.d1)
    assert pc0["product"] == pytest.approx(25.0) and pc0["covariance"] == pytest.approx(0.0)
    # a1 == Δd exactly: cov_n = .25 -> 25 points
    pc1 = accounting.product_covariance(ind.a1, ind.d0, ind.d1)
    assert pc1["product"] == pytest.approx(25.0) and pc1["covariance"] == pytest.approx(25.0)
    by = accounting.per_label_contributions(ind, ["SUPPORT", "REFUTE", "SUPPORT", "REFUTE"])
    # SUPPORT claims 1,3: a0d0=(0,0) a0d1=(1,0) a1d0=(0,0) a1d1=(1,1) over n=4
    assert by["SUPPORT"] == {"n_claims": 2, "S00": 0.0, "S01": 25.0, "S10": 0.0, "S11": 50.0,
                             "G": 50.0, "E0": 25.0, "A1": 25.0, "A0": 0.0, "E1": 50.0, "I": 25.0}
    assert by["REFUTE"]["S00"] == 25.0 and by["REFUTE"]["G"] == -25.0


def test_eligibility_rules():
    groups = [[0], [3, 4]]
    # strict: any single gold sentence suffices, even half a group
    assert accounting.evidence_eligible([4], groups, "SUPPORT", "strict")
    assert not accounting.evidence_eligible([1, 2], groups, "SUPPORT", "strict")
    assert not accounting.evidence_eligible([], groups, "REFUTE", "strict")
    # fever_score: a complete group within the first five cited ids
    assert not accounting.evidence_eligible([4], groups, "SUPPORT", "fever_score")
    assert accounting.evidence_eligible([9, 4, 3], groups, "SUPPORT", "fever_score")
    assert accounting.evidence_eligible([0], groups, "SUPPORT", "fever_score")
    assert not accounting.evidence_eligible([9, 8, 7, 6, 5, 0], groups, "SUPPORT", "fever_score")
    assert accounting.evidence_eligible([9, 8, 7, 6, 0, 5], groups, "SUPPORT", "fever_score")
    # NEI gold: correct label suffices (FEVER scorer); label_accuracy never needs evidence
    assert accounting.evidence_eligible([], [], "NOT_ENOUGH_INFO", "fever_score")
    assert accounting.evidence_eligible([], groups, "SUPPORT", "label_accuracy")
    with pytest.raises(ValueError, match="unknown metric"):
        accounting.evidence_eligible([], groups, "SUPPORT", "f1")


def test_indicators_from_answers_and_invalid_answers():
    ind = accounting.indicators_from_answers(
        gold_labels=["SUPPORT", "REFUTE", "SUPPORT"],
        gold_groups=[[[0]], [[1, 2]], [[5]]],
        labels0=["SUPPORT", None, "REFUTE"], cited0=[[0], [1, 2], [5]],
        labels1=["SUPPORT", "REFUTE", "SUPPORT"], cited1=[[3], [2], [5, 6]],
        metric="fever_score",
    )
    assert ind.a0.tolist() == [1, 0, 0]  # invalid (None) counts as wrong
    assert ind.a1.tolist() == [1, 1, 1]
    assert ind.d0.tolist() == [1, 1, 1]
    assert ind.d1.tolist() == [0, 0, 1]
    cells = score_cells(ind)
    assert cells["S00"] == pytest.approx(100 / 3) and cells["S11"] == pytest.approx(100 / 3)
    assert cells["S10"] == pytest.approx(100.0) and cells["S01"] == pytest.approx(0.0)


def test_label_accuracy_metric_has_no_evidence_component():
    rng = np.random.default_rng(3)
    n = 50
    labels = ["SUPPORT", "REFUTE"]
    gold = list(rng.choice(labels, n))
    ind = accounting.indicators_from_answers(
        gold, [[[0]]] * n, list(rng.choice(labels, n)), [[1]] * n, list(rng.choice(labels, n)), [[0]] * n,
        "label_accuracy",
    )
    d = accounting.decompose(score_cells(ind))
    assert d["E0"] == 0 and d["E1"] == 0 and d["I"] == 0 and d["G"] == d["A0"] == d["A1"]


# -- units and bootstrap -----------------------------------------------------


def test_unit_index_and_sums():
    ids = ["a", "b", "c", "d"]
    assert accounting.unit_index(ids, None).tolist() == [0, 1, 2, 3]
    units = accounting.unit_index(ids, {"a": "f1", "b": "f2", "c": "f1", "d": "f3", "zz": "f9"})
    assert units.tolist() == [0, 1, 0, 2]
    sums = accounting.unit_sums(np.array([[1, 2], [1, 3], [1, 4], [1, 5]]), units)
    assert sums.tolist() == [[2, 6], [1, 3], [1, 5]]
    with pytest.raises(KeyError, match="2 claim id"):
        accounting.unit_index(ids, {"a": "f1", "b": "f1"})


def test_bootstrap_is_paired_seeded_and_contains_estimate():
    rng = np.random.default_rng(0)
    ind = _random_ind(rng, 300)
    sums = accounting.unit_sums(accounting.accounting_columns(ind), accounting.unit_index(list(map(str, range(300))), None))
    r1 = accounting.paired_bootstrap(sums, accounting.accounting_from_sums, n_resamples=500, seed=7)
    r2 = accounting.paired_bootstrap(sums, accounting.accounting_from_sums, n_resamples=500, seed=7)
    r3 = accounting.paired_bootstrap(sums, accounting.accounting_from_sums, n_resamples=500, seed=8)
    np.testing.assert_array_equal(r1.ci_low, r2.ci_low)
    assert not np.array_equal(r1.ci_low, r3.ci_low)
    assert np.all(r1.ci_low <= r1.estimate + 1e-9) and np.all(r1.estimate <= r1.ci_high + 1e-9)
    # identity holds on every draw, so the draws are shared across quantities:
    # the interval of G - (E0 + A1) computed per draw is exactly [0, 0]
    stat = lambda s: (lambda o: np.stack([o[..., 4] - o[..., 5] - o[..., 6]], -1))(accounting.accounting_from_sums(s))  # noqa: E731
    r = accounting.paired_bootstrap(sums, stat, n_resamples=300, seed=1)
    assert abs(r.ci_low[0]) < 1e-9 and abs(r.ci_high[0]) < 1e-9
    # pairing: two identical systems give a degenerate G interval
    same = _ind(ind.a0, ind.a0, ind.d0, ind.d0)
    rs = accounting.paired_bootstrap(accounting.accounting_columns(same), accounting.accounting_from_sums, n_resamples=300, seed=1)
    g = accounting.ACCOUNTING_OUTPUTS.index("G")
    assert rs.ci_low[g] == 0 and rs.ci_high[g] == 0 and rs.ci_high[0] > rs.ci_low[0]


def _simulate(rng, n_families, family_size):
    """Two systems whose true strict-score gain is 100*(.7*.6 - .6*.4) = 18 points."""
    a0 = rng.random(n_families) < 0.6
    d0 = rng.random(n_families) < 0.4
    a1 = rng.random(n_families) < 0.7
    d1 = rng.random(n_families) < 0.6
    rep = lambda x: np.repeat(x.astype(float), family_size)  # noqa: E731
    return _ind(rep(a0), rep(a1), rep(d0), rep(d1))


TRUE_G = 100 * (0.7 * 0.6 - 0.6 * 0.4)


def _covers(ind, units, n_resamples, seed):
    g = accounting.ACCOUNTING_OUTPUTS.index("G")
    r = accounting.paired_bootstrap(accounting.unit_sums(accounting.accounting_columns(ind), units), accounting.accounting_from_sums,
                             n_resamples=n_resamples, seed=seed)
    return r.ci_low[g] <= TRUE_G <= r.ci_high[g]


def test_bootstrap_coverage_about_95_percent():
    rng = np.random.default_rng(20261099)
    reps, n = 200, 200
    hits = sum(_covers(_simulate(rng, n, 1), np.arange(n), 999, seed=k) for k in range(reps))
    # binomial(200, .95): sd ~ 3.1 draws; allow ~3 sd either side
    assert 184 <= hits <= 199, hits


def test_family_bootstrap_covers_where_claim_bootstrap_does_not():
    rng = np.random.default_rng(11)
    reps, n_fam, size = 120, 60, 5
    fam_hits = claim_hits = 0
    for k in range(reps):
        ind = _simulate(rng, n_fam, size)
        fam_hits += _covers(ind, np.repeat(np.arange(n_fam), size), 499, seed=k)
        claim_hits += _covers(ind, np.arange(n_fam * size), 499, seed=k)
    assert fam_hits / reps >= 0.89, fam_hits
    assert claim_hits / reps <= 0.80, claim_hits  # duplicated claims make the claim bootstrap overconfident


# -- run metrics from per-claim contributions ----------------------------------


def _claim(gold, groups, labels, cited0=(), hallucinated=None, cid="c"):
    hallucinated = hallucinated or [[] for _ in labels]
    return {"id": cid, "gold_label": gold, "gold_groups": groups, "rounds": [
        {"round": r, "label": lab, "valid": lab is not None, "cited": list(cited0) if r == 0 else [],
         "hallucinated": hallucinated[r]} for r, lab in enumerate(labels)]}


def test_run_metrics_hand_checked():
    claims = [
        _claim("SUPPORT", [[0], [3]], ["SUPPORT", "REFUTE", "SUPPORT"], [0, 1], [[], [7], []]),
        _claim("REFUTE", [[2]], ["REFUTE", "NOT_ENOUGH_INFO", None], [5]),
        _claim("SUPPORT", [[4]], [None, "SUPPORT", "NOT_ENOUGH_INFO"], []),
    ]
    cols = accounting.run_metric_columns(claims, 2)
    m = dict(zip(accounting.run_metric_names(2), accounting.run_metrics_from_sums(cols.sum(0), 2)))
    # a_0 = 2/3, a_1 = 1/3 (claim 3), a_2 = 1/3 (claim 1)
    assert m["label_accuracy"] == pytest.approx(200 / 3)
    assert m["round_accuracy_1"] == pytest.approx(100 / 3) and m["round_accuracy_2"] == pytest.approx(100 / 3)
    assert m["IS"] == pytest.approx(50.0) and m["ER"] == pytest.approx(50.0)
    assert m["IO"] == pytest.approx(100 * (1 - 1 / 3))
    # strict: claim 1 (cites 0); claim 2 cites 5, not gold 2 -> 1/3
    assert m["strict_accuracy"] == pytest.approx(100 / 3) and m["fever_score"] == pytest.approx(100 / 3)
    # micro evidence: tp=1, named=3, gold=2+1+1=4
    assert m["evidence_precision"] == pytest.approx(100 / 3)
    assert m["evidence_recall"] == pytest.approx(25.0)
    assert m["evidence_f1"] == pytest.approx(100 * 2 * (1 / 3) * 0.25 / (1 / 3 + 0.25))
    # flips: claim 1 S->R and R->S = 2 of 6 transitions; one claim of three with any flip
    assert m["flip_rate"] == pytest.approx(100 / 3) and m["any_flip_rate"] == pytest.approx(100 / 3)
    assert [m[f"invalid_rate_{r}"] for r in range(3)] == pytest.approx([100 / 3, 0, 100 / 3])
    assert m["hallucinated_id_rate_1"] == pytest.approx(100.0) and m["hallucinated_id_rate_0"] == 0
    with pytest.raises(ValueError, match="rounds"):
        accounting.run_metric_columns(claims, 3)


def _random_claims(rng, n, R):
    labels = ["SUPPORT", "REFUTE", "NOT_ENOUGH_INFO", None]
    out = []
    for i in range(n):
        gold = str(rng.choice(["SUPPORT", "REFUTE", "SUPPORT", "REFUTE", "NOT_ENOUGH_INFO"]))
        groups = [] if gold == "NOT_ENOUGH_INFO" else [sorted(rng.choice(8, int(rng.integers(1, 3)), replace=False).tolist())]
        labs = [labels[int(rng.integers(0, 4))] for _ in range(R + 1)]
        cited = rng.choice(8, int(rng.integers(0, 7)), replace=False).tolist()
        halluc = [[int(x) for x in rng.choice([20, 21], int(rng.integers(0, 2)), replace=False)] for _ in range(R + 1)]
        c = _claim(gold, groups, labs, cited, halluc, cid=f"c{i}")
        for rd in c["rounds"]:
            if rd["label"] is None:
                rd["cited"], rd["hallucinated"] = [], []
            rd["evidence"] = rd["cited"] + rd["hallucinated"]
        out.append(c)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_run_metrics_agree_with_fae_metrics(seed):
    """Per-claim columns reproduce metrics.json's definitions (fae.ablation.metrics) exactly."""
    from fae.ablation.metrics import compute_metrics

    rng = np.random.default_rng(seed)
    R = int(rng.integers(1, 4))
    claims = _random_claims(rng, 60, R)
    ref = compute_metrics(claims)
    m = dict(zip(accounting.run_metric_names(R),
                 accounting.run_metrics_from_sums(accounting.run_metric_columns(claims, R).sum(0), R)))
    for key in ("label_accuracy", "strict_accuracy", "fever_score", "evidence_precision", "evidence_recall",
                "evidence_f1", "IS", "ER", "IO", "flip_rate", "any_flip_rate"):
        if ref[key] is None:
            assert not np.isfinite(m[key]), key
        else:
            assert m[key] == pytest.approx(100 * ref[key], abs=1e-9), key
    for r in range(R + 1):
        assert m[f"round_accuracy_{r}"] == pytest.approx(100 * ref["round_accuracy"][r], abs=1e-9)
        assert m[f"invalid_rate_{r}"] == pytest.approx(100 * ref["invalid_rate"][r], abs=1e-9)
        assert m[f"hallucinated_id_rate_{r}"] == pytest.approx(100 * ref["hallucinated_id_rate"][r], abs=1e-9)


def test_ratio_metric_is_recomputed_per_draw():
    """IS = 1 - a1/a0 is a ratio of means; its bootstrap must recompute the ratio, not average per-claim ratios."""
    rng = np.random.default_rng(5)
    claims = [_claim("SUPPORT", [[0]], [str(rng.choice(["SUPPORT", "REFUTE"])),
                                         str(rng.choice(["SUPPORT", "NOT_ENOUGH_INFO"]))], [0]) for _ in range(200)]
    cols = accounting.run_metric_columns(claims, 1)
    i = accounting.run_metric_names(1).index("IS")
    r = accounting.paired_bootstrap(cols, lambda s: accounting.run_metrics_from_sums(s, 1), n_resamples=400, seed=0)
    a = cols[:, 2:4].mean(0)
    assert r.estimate[i] == pytest.approx(100 * (1 - a[1] / a[0]))
    assert r.ci_low[i] < r.estimate[i] < r.ci_high[i]
