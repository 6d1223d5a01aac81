"""PAVE formulas (fae/pave/metrics.py): states, CR/PR/Margin/odds, JSD, τ tuning, CE/IE/OA."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fae.pave import metrics

S, R, N = "SUPPORT", "REFUTE", "NOT_ENOUGH_INFO"


def test_majority_and_states():
    assert metrics.majority_label([S, R, R]) == R
    assert metrics.majority_label([R, S, S, R]) == R  # tie -> first sampled
    assert metrics.majority_label([None, None, S]) is None
    assert metrics.knowledge_state([S, S, S], S) == "KK"
    assert metrics.knowledge_state([R, R, R], S) == "KU"
    assert metrics.knowledge_state([S, R, S], S) == "UK"
    assert metrics.knowledge_state([S, R, R], S) == "UU"
    assert metrics.knowledge_state([None, None], S) == "KU"  # consistently invalid = confidently wrong
    assert metrics.prior_is_definite([S, N, S]) and not metrics.prior_is_definite([N, N, S])
    assert metrics.correctness_rate([S, R, S, None], S) == 0.5


def test_arbitration_profile_hand_checked():
    states = ["KK"] * 4 + ["KU"] * 2 + ["UK"] * 2 + ["UU"] * 2
    gold_ev = [1, 1, 1, 1, 1, 0, 1, 1, 1, 1]  # only KU/UU entries matter for CR
    cf = [1, 1, 0, 1, None, None, 0, 0.5, None, None]
    p = metrics.arbitration_profile(states, gold_ev, cf)
    st = p["states"]
    assert st["KU"]["CR"] == 0.5 and st["KU"]["OI"] == pytest.approx(1.0)
    assert st["UU"]["CR"] == 1.0 and st["UU"]["OI"] == math.inf
    assert st["KK"]["PR"] == 0.75 and st["KK"]["OI"] == pytest.approx(1 / 3)
    assert st["UK"]["PR"] == 0.25 and st["UK"]["OI"] == pytest.approx(3.0)
    assert [st[s]["ratio"] for s in metrics.STATES] == [0.4, 0.2, 0.2, 0.2]
    assert p["CR"] == 0.75 and p["PR"] == pytest.approx(3.5 / 6)
    # the paper's Margin: Known (PR_KK + CR_KU - 1) + Unknown (PR_UK + CR_UU - 1); the pooled figure differs
    assert p["margin_known"] == pytest.approx(0.25) and p["margin_unknown"] == pytest.approx(0.25)
    assert p["Margin"] == pytest.approx(0.5) and p["margin_undefined"] == []
    assert p["pooled_margin"] == pytest.approx(0.75 + 3.5 / 6 - 1)
    assert st["KK"]["correct_drop"] == pytest.approx(0.1) and st["UK"]["correct_drop"] == pytest.approx(0.15)
    assert p["correct_rate_prior"] == pytest.approx(0.6) and p["correct_rate_after"] == pytest.approx(0.35)
    assert p["wrong_rate_prior"] == pytest.approx(0.4) and p["wrong_rate_after"] == pytest.approx(0.1)


def test_profile_without_counterfactuals_leaves_persistence_undefined():
    p = metrics.arbitration_profile(["KK", "KU", "UU"], [1, 1, 0], None)
    assert p["CR"] == 0.5 and math.isnan(p["PR"]) and math.isnan(p["Margin"])
    assert p["margin_undefined"] == ["state KK has no claim with counterfactual evidence", "state UK is empty"]
    assert p["margin_known_undefined"] == ["state KK has no claim with counterfactual evidence"]
    assert math.isnan(p["states"]["KK"]["PR"]) and p["states"]["UK"]["n"] == 0
    safe = metrics.json_safe(p)
    assert safe["PR"] is None and safe["states"]["KU"]["OI"] is None  # CR = 1 -> odds inf -> null


def test_odds_and_table_bookkeeping_match_the_paper():
    # PAVE Table 1, Deepseek-v3 column: PR/CR -> OI and the Δ rows
    assert metrics.odds(1 - 0.7170) == pytest.approx(0.395, abs=1e-3)  # KK
    assert metrics.odds(1 - 0.4405) == pytest.approx(1.270, abs=2e-3)  # UK
    assert metrics.odds(0.4075) == pytest.approx(0.687, abs=2e-3)  # KU
    assert metrics.odds(0.6699) == pytest.approx(2.030, abs=2e-3)  # UU
    n = 10_000
    counts = {"KK": 6075, "UK": 342, "KU": 3215, "UU": 368}
    states = sum(([s] * c for s, c in counts.items()), [])
    rates = {"KK": 0.7170, "UK": 0.4405, "KU": 0.4075, "UU": 0.6699}
    ge = [rates[s] for s in states]
    p = metrics.arbitration_profile(states, ge, ge)
    assert len(states) == n
    assert p["states"]["KK"]["correct_drop"] == pytest.approx(0.1719, abs=1e-4)
    assert p["states"]["KU"]["wrong_reduction"] == pytest.approx(0.1310, abs=1e-4)
    assert p["correct_rate_after"] == pytest.approx(0.4506, abs=2e-4)
    assert p["wrong_rate_after"] == pytest.approx(0.2026, abs=2e-4)


# PAVE Table 1, Dimension 1 (counterfactual): published per-state rates (%) and Margins.
#            PR_KK  CR_KU  PR_UK  CR_UU  Margin
TABLE_1 = {
    "Deepseek-v3": (71.70, 40.75, 44.05, 66.99, +0.235),
    "Gemini-2.5": (56.33, 43.65, 48.50, 60.02, +0.085),
    "Phi-4": (49.43, 42.76, 48.84, 58.57, -0.004),
    "Qwen3-32B": (50.59, 29.75, 60.82, 47.37, -0.115),
    "Mistral-7B": (71.59, 26.36, 55.76, 27.26, -0.190),
    "GPT-4o-mini": (40.23, 24.73, 25.33, 57.59, -0.521),
    "Llama3-8B": (29.95, 30.80, 33.00, 40.16, -0.661),
}


@pytest.mark.parametrize("model", TABLE_1)
def test_margin_reproduces_the_papers_table_1(model):
    pr_kk, cr_ku, pr_uk, cr_uu, published = TABLE_1[model]
    assert round(metrics.paper_margin(pr_kk / 100, cr_ku / 100, pr_uk / 100, cr_uu / 100), 3) == published
    # and through the profile, from claims carrying those rates (one claim per state)
    p = metrics.arbitration_profile(["KK", "KU", "UK", "UU"], [0, cr_ku / 100, 0, cr_uu / 100],
                               [pr_kk / 100, None, pr_uk / 100, None])
    assert round(p["Margin"], 3) == published


def test_pooled_margin_is_not_the_papers():
    """The pooled CR + PR - 1 misses the paper's Margin (Llama3-8B: -0.356 vs -0.661 at Table 1's ratios)."""
    ratios = {"KK": 46.38, "UK": 14.87, "KU": 26.73, "UU": 12.02}
    pr_kk, cr_ku, pr_uk, cr_uu, published = TABLE_1["Llama3-8B"]
    rate = {"KK": pr_kk, "KU": cr_ku, "UK": pr_uk, "UU": cr_uu}
    states = sum(([s] * round(100 * r) for s, r in ratios.items()), [])
    p = metrics.arbitration_profile(states, [rate[s] / 100 for s in states], [rate[s] / 100 for s in states])
    assert round(p["Margin"], 3) == published
    assert p["pooled_margin"] == pytest.approx(-0.356, abs=2e-3)


def _oriented(answers, probs):
    """P(SUPPORT) per run from the probability of each sampled answer (binary task)."""
    return [p if a == "S" else 1 - p for a, p in zip(answers, probs)]


def test_jsd_reproduces_the_paper_case_study():
    # PAVE Table 9: JSD values of the three case studies
    c1 = [0.9965, 0.9950, 0.9971, 0.9858, 0.9950, 0.9965, 0.9965, 0.9965, 0.9971, 0.9958]
    e1 = [0.9399, 0.9241, 0.4115, 0.4620, 0.9399, 0.9399, 0.8808, 0.4620, 0.9399, 0.4046]
    assert metrics.jsd(c1) == pytest.approx(0.0011, abs=1e-4)  # the paper truncates to 4 decimals
    assert metrics.jsd(e1) == pytest.approx(0.2239, abs=1e-4)  # the paper truncates to 4 decimals
    c2 = _oriented("RRRRSRSSRS", [.9193, .6770, .6183, .6171, .3707, .6770, .8121, .3707, .6199, .8121])
    e2 = _oriented("SRSSSSSSSS", [.8175, .1480, .8519, .9526, .8175, .9526, .8519, .9046, .8519, .9046])
    assert metrics.jsd(c2) == pytest.approx(0.1438, abs=1e-4)  # the paper truncates to 4 decimals
    assert metrics.jsd(e2) == pytest.approx(0.0165, abs=2e-4)
    c3 = _oriented("RSRSRSRSRS", [.3760, .8485, .3760, .6764, .3760, .6183, .3760, .8485, .4360, .7230])
    assert metrics.jsd(c3) == pytest.approx(0.0316, abs=1e-4)  # the paper truncates to 4 decimals
    # the rule with the paper's τ ≈ -0.07: case 1 keeps the claim-only answer, cases 2-3 take the evidence
    tau = -0.07
    deltas = [metrics.jsd(c1) - metrics.jsd(e1), metrics.jsd(c2) - metrics.jsd(e2)]
    claim_only, evidence = ["prior", "prior"], ["evid", "evid"]
    assert metrics.arbitration_accuracy(deltas, tau, claim_only, evidence, ["prior", "evid"]) == 1.0
    assert metrics.arbitration_accuracy(deltas, tau, claim_only, evidence, ["evid", "prior"]) == 0.0
    # (K, L) rows and the binary vector agree
    assert metrics.jsd(np.stack([c2, 1 - np.array(c2)], 1)) == pytest.approx(metrics.jsd(c2))


def test_jsd_and_vote_entropy_basics():
    assert metrics.jsd([[0.2, 0.3, 0.5]] * 4) == pytest.approx(0.0, abs=1e-12)  # identical runs
    assert metrics.jsd([[1, 0, 0], [0, 1, 0]]) == pytest.approx(1.0)
    # the paper's vote-based variant: binary entropy of k_true/K, k_true = SUPPORT answers
    assert metrics.vote_entropy([S, S, R, R]) == pytest.approx(1.0)
    assert metrics.vote_entropy([S, S, S]) == 0.0 and metrics.vote_entropy([R, R, N]) == 0.0
    assert metrics.vote_entropy([S, R, N, None]) == pytest.approx(metrics.binary_entropy(0.25))  # 1 of 4 true
    assert metrics.vote_entropy([S, S, S, R]) == pytest.approx(-(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))
    # a second measure: the JSD of one-hot binary runs is the same entropy
    assert metrics.vote_entropy([S, S, S, R]) == pytest.approx(metrics.jsd([1, 1, 1, 0]))
    assert metrics.identical_runs([[0.2, 0.3, 0.5]] * 3) and not metrics.identical_runs([[0.2, 0.3, 0.5], [0.3, 0.2, 0.5]])


def test_tau_tuning_and_ce_ie_oa():
    gold = [S, S, R, R]
    prior = [S, R, R, S]  # claims 0, 2 right a priori
    ce_ans = [S, S, R, R]  # gold evidence: always right
    ie_ans = [R, R, S, S]  # counterfactual: always wrong
    # stable evidence runs (high Δ) on gold evidence for claims 1, 3, unstable on counterfactual ones
    ce_d = [-0.3, 0.4, -0.3, 0.5]
    ie_d = [-0.5, -0.4, -0.5, -0.2]
    r = metrics.ce_ie_oa(0.0, gold, prior, ce_d, ce_ans, ie_d, ie_ans)
    # τ = 0: CE picks prior for 0, 2 (right) and evidence for 1, 3 (right) -> 1.0; IE keeps priors -> 0.5
    assert r == {"CE": 1.0, "IE": 0.5, "OA": 0.75}
    tau, best = metrics.tune_tau(gold, prior, ce_d, ce_ans, ie_d, ie_ans)
    assert best == pytest.approx(0.75) and -0.2 < tau < 0.4
    # always trusting evidence (τ below every Δ) gives CE 1, IE 0
    low = metrics.ce_ie_oa(-10, gold, prior, ce_d, ce_ans, ie_d, ie_ans)
    assert (low["CE"], low["IE"]) == (1.0, 0.0)
    # CE-only tuning without counterfactuals
    tau_ce, best_ce = metrics.tune_tau(gold, prior, ce_d, ce_ans)
    assert best_ce == 1.0 and math.isnan(metrics.ce_ie_oa(tau_ce, gold, prior, ce_d, ce_ans)["IE"])


def test_split_tune_is_deterministic():
    ids = [f"c{i}" for i in range(2000)]
    a, b = metrics.split_tune(ids, 0.3, seed=1), metrics.split_tune(ids, 0.3, seed=1)
    assert (a == b).all() and 0.26 < a.mean() < 0.34
    assert not (metrics.split_tune(ids, 0.3, seed=2) == a).all()
    with pytest.raises(ValueError):
        metrics.split_tune(ids, 1.5)


def test_profile_intervals_cover_the_estimate_narrow_with_more_claims_and_say_when_undefined():
    from fae.pave.metrics import arbitration_profile, profile_intervals

    states = ["KK", "KU", "UK", "UU", "KK", "UK", "KU", "KK", "UU", "KK"]
    ge = [1, 0.8, 1, 0.6, 1, 0.9, 0.2, 1, 1, 0.7]
    cf = [0.9, None, 0.4, None, 0.2, 0.8, None, 1.0, None, 0.6]
    point = arbitration_profile(states, ge, cf)
    small = profile_intervals(states, ge, cf, n_resamples=500, seed=1)
    assert small == profile_intervals(states, ge, cf, n_resamples=500, seed=1)  # seeded
    for key in ("CR", "PR", "pooled_margin", "Margin"):
        ci = small[key]
        assert ci["ci_low"] <= point[key] <= ci["ci_high"], key
    big = profile_intervals(states * 20, ge * 20, cf * 20, n_resamples=500, seed=1)  # same rates, 20x the claims
    for key in ("CR", "PR", "pooled_margin"):
        assert big[key]["ci_high"] - big[key]["ci_low"] < (small[key]["ci_high"] - small[key]["ci_low"]) / 2, key
    # every claim alike: the interval is the point itself
    same = profile_intervals(["KK", "KU"] * 5, [1, 0.5] * 5, [0.8, None] * 5, n_resamples=200, seed=0)
    assert same["CR"]["ci_low"] == same["CR"]["ci_high"] == 0.5
    # no prior-wrong claim in the sample: CR and every margin have no value, and no interval
    none_wrong = profile_intervals(["KK", "UK"] * 5, [1] * 10, [0.5] * 10, n_resamples=200, seed=0)
    assert none_wrong["CR"] == {"ci_low": None, "ci_high": None, "defined": 0.0}
    assert none_wrong["Margin"]["ci_low"] is None and none_wrong["PR"]["defined"] == 1.0
    # one claim (the demo's and the real model's PAVE on a handful): no interval, whatever the draws
    one = profile_intervals(["KK"], [1], [0.5], n_resamples=200, seed=0)
    assert one["PR"]["ci_low"] is None and "no interval below 10" in one["PR"]["reason"]
