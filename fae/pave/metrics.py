"""PAVE prior-state diagnostics and JSD arbitration (SPEC §9), as pure functions.

Paper: "Diagnosing LLM Arbitration Behavior over Pre-evidence Epistemic States
in RAG-based Fact-Checking". From N sampled claim-only answers a claim's
*knowledge-boundary state* is

- Known   = all N answers identical, Unknown otherwise;
- Knows   = the majority answer equals gold, Unknows otherwise;

giving KK (Known-Knows), KU (Known-Unknows), UK (Unknown-Knows), UU
(Unknown-Unknows). Arbitration under prior-context discrepancy:

- CR (correction rate): on prior-wrong claims (KU, UU), the share of
  with-gold-evidence answers that are correct;
- PR (persistence rate): on prior-right claims (KK, UK), the share of
  with-counterfactual-evidence answers that stay correct;
- Margin (the paper's Table 1 headline) = Known-state margin
  (PR_KK + CR_KU - 1) + Unknown-state margin (PR_UK + CR_UU - 1); undefined
  when one of the four states has no rate. The pooled CR + PR - 1 over all
  prior-wrong / prior-right claims is kept as ``pooled_margin``. Odds of
  influence OI = CR/(1-CR) on wrong priors and (1-PR)/PR on right priors;
- the paper's Table-1 bookkeeping: state ratio, Δ correct drop = ratio·(1-PR),
  Δ wrong reduction = ratio·CR, correct/wrong rates before and after.

JSD arbitration: for K sampled runs with per-run label distributions p_k,
``JSD = H(mean_k p_k) - mean_k H(p_k)`` (bits). With Δ = JSD(claim only) -
JSD(with evidence), answer with the evidence-run majority when Δ > τ, else
with the claim-only majority; τ is tuned on held-out claims. CE / IE =
accuracy with correct / incorrect (counterfactual) evidence, OA = (CE+IE)/2.
The vote-based variant (paper App. C.2), for verifiers whose per-run
probabilities are missing or identical by construction, replaces JSD by the
binary entropy of k_true/K, the share of the K runs answering SUPPORT.

Rates here are fractions in [0, 1] (the paper's convention); an undefined
rate (empty state) is NaN, an odds with a zero denominator is inf.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from real_fae_core.hashing import sha256_seed
from real_fae_core.labels import REFUTE, SUPPORT
from fae.ablation.metrics import same_label
from fae.intervals import draw_units, percentile_interval

STATES = ("KK", "KU", "UK", "UU")
STATE_NAMES = {"KK": "Known-Knows", "KU": "Known-Unknows", "UK": "Unknown-Knows", "UU": "Unknown-Unknows"}


# ---------------------------------------------------------------------------
# Knowledge-boundary states
# ---------------------------------------------------------------------------


def majority_label(samples: Sequence[str | None]) -> str | None:
    """The most frequent answer; ties go to the answer sampled first (deterministic).

    Invalid answers (None) count as an answer of their own, so a majority of
    invalid outputs yields None (a wrong prior).
    """
    if not samples:
        raise ValueError("no samples")
    counts = Counter(samples)
    best = max(counts.values())
    return next(s for s in samples if counts[s] == best)


def knowledge_state(samples: Sequence[str | None], gold: str) -> str:
    """KK/KU/UK/UU from N claim-only answers: Known = all identical, Knows = majority is gold."""
    known = len(set(samples)) == 1
    knows = same_label(majority_label(samples), gold)
    return ("K" if known else "U") + ("K" if knows else "U")


def prior_is_definite(samples: Sequence[str | None]) -> bool:
    """Whether the claim-only majority is a verdict (not NEI, not invalid): the paper's refusal filter."""
    return majority_label(samples) in (SUPPORT, REFUTE)


def correctness_rate(samples: Sequence[str | None], gold: str) -> float:
    """Share of sampled answers equal to gold (the per-claim rate averaged over runs)."""
    if not samples:
        raise ValueError("no samples")
    return sum(1 for s in samples if same_label(s, gold)) / len(samples)


# ---------------------------------------------------------------------------
# CR, PR, Margin, odds of influence
# ---------------------------------------------------------------------------


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if len(x) else math.nan


def odds(p: float) -> float:
    """p / (1 - p); inf at p = 1, NaN when p is undefined."""
    if math.isnan(p):
        return math.nan
    return math.inf if p >= 1 else p / (1 - p)


def arbitration_profile(
    states: Sequence[str],
    gold_evidence_correct: Sequence[float],
    counterfactual_correct: Sequence[float | None] | None = None,
) -> dict:
    """PAVE's arbitration profile from per-claim states and per-claim correctness rates.

    ``gold_evidence_correct[i]``: share (or 0/1) of claim i's with-gold-evidence
    answers that are correct; used for CR on prior-wrong claims.
    ``counterfactual_correct[i]``: the same with counterfactual evidence (None
    where a claim has none); used for PR on prior-right claims. Without any
    counterfactual evidence PR, Margin and the persistence odds are NaN.
    """
    states = np.asarray(states)
    n = len(states)
    if n == 0:
        raise ValueError("no claims")
    ge = np.asarray(gold_evidence_correct, float)
    cf = (np.full(n, np.nan) if counterfactual_correct is None
          else np.array([np.nan if v is None else v for v in counterfactual_correct], float))
    if len(ge) != n or len(cf) != n:
        raise ValueError("states and correctness arrays differ in length")
    out: dict = {"n_claims": n, "states": {}}
    for s in STATES:
        mask = states == s
        row: dict = {"name": STATE_NAMES[s], "n": int(mask.sum()), "ratio": float(mask.mean())}
        if s[1] == "U":  # prior wrong: correction with gold evidence
            cr = _mean(ge[mask])
            row.update(CR=cr, OI=odds(cr), wrong_reduction=row["ratio"] * cr if row["n"] else 0.0)
        else:  # prior right: persistence under counterfactual evidence
            m = mask & ~np.isnan(cf)
            pr = _mean(cf[m])
            row.update(PR=pr, OI=odds(1 - pr) if not math.isnan(pr) else math.nan, n_counterfactual=int(m.sum()),
                       correct_drop=(row["ratio"] * (1 - pr)) if row["n"] else 0.0)
        out["states"][s] = row
    wrong = np.isin(states, ["KU", "UU"])
    right = ~wrong & ~np.isnan(cf)
    cr_all, pr_all = _mean(ge[wrong]), _mean(cf[right])
    st = out["states"]
    margin_known = st["KU"]["CR"] + st["KK"]["PR"] - 1
    margin_unknown = st["UU"]["CR"] + st["UK"]["PR"] - 1
    correct_prior = st["KK"]["ratio"] + st["UK"]["ratio"]
    wrong_prior = st["KU"]["ratio"] + st["UU"]["ratio"]
    undefined = {s: why for s in STATES if (why := _rate_undefined(st[s], s))}
    out.update(
        CR=cr_all,
        PR=pr_all,
        Margin=paper_margin(st["KK"]["PR"], st["KU"]["CR"], st["UK"]["PR"], st["UU"]["CR"]),
        margin_known=margin_known,
        margin_unknown=margin_unknown,
        margin_undefined=[undefined[s] for s in STATES if s in undefined],
        margin_known_undefined=[undefined[s] for s in ("KK", "KU") if s in undefined],
        margin_unknown_undefined=[undefined[s] for s in ("UK", "UU") if s in undefined],
        pooled_margin=cr_all + pr_all - 1,
        OI_correction=odds(cr_all),
        OI_persistence=odds(1 - pr_all) if not math.isnan(pr_all) else math.nan,
        correct_rate_prior=correct_prior,
        correct_rate_after=correct_prior - st["KK"]["correct_drop"] - st["UK"]["correct_drop"],
        wrong_rate_prior=wrong_prior,
        wrong_rate_after=wrong_prior - st["KU"]["wrong_reduction"] - st["UU"]["wrong_reduction"],
    )
    return out


INTERVAL_KEYS = ("Margin", "margin_known", "margin_unknown", "CR", "PR", "pooled_margin")


def profile_intervals(states: Sequence[str], gold_evidence_correct: Sequence[float],
                      counterfactual_correct: Sequence[float | None] | None = None, *,
                      n_resamples: int = 2000, confidence_level: float = 0.95, seed: int = 0) -> dict:
    """Percentile-bootstrap intervals (claims resampled with replacement) of the profile's rates and margins.

    A resample in which a margin is undefined (a state it needs is empty) is left out of that margin's
    interval; ``defined`` says in what share of the resamples it was defined, so an interval drawn from few
    resamples is visible as such. A value undefined in more than half of them gets no interval, nor does
    any value over fewer than ``MIN_INTERVAL_UNITS`` claims.
    """
    states = np.asarray(states)
    n = len(states)
    ge = np.asarray(gold_evidence_correct, float)
    cf = None if counterfactual_correct is None else list(counterfactual_correct)
    draws = {k: [] for k in INTERVAL_KEYS}
    for idx in draw_units(n, n_resamples, seed):  # one draw (resample) at a time: the profile is not vectorised
        prof = arbitration_profile(states[idx], ge[idx], None if cf is None else [cf[i] for i in idx])
        for k in INTERVAL_KEYS:
            draws[k].append(prof[k])
    out = {"method": "percentile bootstrap over claims", "n_resamples": int(n_resamples),
           "confidence_level": confidence_level, "seed": seed}
    for k, values in draws.items():
        out[k] = percentile_interval(values, confidence_level, n_units=n)
    return out


def _rate_undefined(row: dict, state: str) -> str | None:
    """Why a state's CR/PR (and so every margin using it) has no value, or None when it has one."""
    if row["n"] == 0:
        return f"state {state} is empty"
    if state[1] == "K" and row["n_counterfactual"] == 0:
        return f"state {state} has no claim with counterfactual evidence"
    return None


def paper_margin(pr_kk: float, cr_ku: float, pr_uk: float, cr_uu: float) -> float:
    """The paper's Table 1 Margin from its four per-state rates (fractions)."""
    return (pr_kk + cr_ku - 1) + (pr_uk + cr_uu - 1)


# ---------------------------------------------------------------------------
# JSD stability and arbitration
# ---------------------------------------------------------------------------


def jsd(probs) -> float:
    """Generalised Jensen-Shannon divergence of K runs' label distributions, in bits.

    ``probs`` is (K, L) (rows are distributions; a length-K vector is read as
    binary p(label 1)). ``H(mean p) - mean H(p)``: 0 when all runs agree on the
    same distribution, larger when runs disagree.
    """
    from scipy.stats import (
        entropy,  # lazy: keeps scipy out of every `fae` command's startup
    )

    p = np.asarray(probs, float)
    if p.ndim == 1:
        p = np.stack([p, 1 - p], axis=-1)
    if p.ndim != 2 or p.shape[0] == 0:
        raise ValueError("probs must be (K, L) with K >= 1")
    p = p / p.sum(axis=-1, keepdims=True)
    value = float(entropy(p.mean(axis=0), base=2) - np.mean(entropy(p, base=2, axis=-1)))
    return max(value, 0.0)  # guard -1e-17 rounding


def binary_entropy(p: float) -> float:
    """H(p) in bits; 0 at p = 0 or 1."""
    if p <= 0 or p >= 1:
        return 0.0
    return float(-p * math.log2(p) - (1 - p) * math.log2(1 - p))


def vote_entropy(samples: Sequence[str | None], true_label: str = SUPPORT) -> float:
    """The paper's vote-based stability (App. C.2): binary entropy of k_true/K, k_true = runs answering SUPPORT.

    REFUTE, NOT_ENOUGH_INFO and invalid answers all count as "not true", as
    in the paper's binary task; K = len(samples).
    """
    if not samples:
        raise ValueError("no samples")
    return binary_entropy(sum(1 for s in samples if s == true_label) / len(samples))


def identical_runs(probs: Sequence[Sequence[float] | None], tol: float = 1e-9) -> bool:
    """Whether every run of one prompt has the same label distribution (JSD = 0 for any answers)."""
    p = np.asarray(probs, float)
    return bool(np.all(np.abs(p - p[0]) <= tol))


def arbitration_accuracy(deltas, tau: float, claim_answers, evidence_answers, gold) -> float:
    """Accuracy of the arbitrated answers over claims: per claim the evidence-run majority when
    Δ = JSD(claim only) - JSD(evidence) > τ, else the claim-only majority."""
    d = np.asarray(deltas, float)
    chosen = np.where(d > tau, np.asarray(evidence_answers, object), np.asarray(claim_answers, object))
    return float(np.mean(chosen == np.asarray(gold, object))) if len(d) else math.nan


def ce_ie_oa(tau: float, gold, claim_answers, ce_deltas, ce_answers, ie_deltas=None, ie_answers=None) -> dict:
    """CE (correct evidence), IE (incorrect evidence) and OA = (CE + IE)/2 of the rule at τ."""
    ce = arbitration_accuracy(ce_deltas, tau, claim_answers, ce_answers, gold)
    ie = math.nan if ie_deltas is None else arbitration_accuracy(ie_deltas, tau, claim_answers, ie_answers, gold)
    return {"CE": ce, "IE": ie, "OA": (ce + ie) / 2 if not math.isnan(ie) else math.nan}


def candidate_taus(*delta_arrays) -> np.ndarray:
    """Thresholds that realise every distinct decision pattern: midpoints of sorted Δs plus both ends."""
    vals = np.unique(np.concatenate([np.asarray(d, float).ravel() for d in delta_arrays if d is not None]))
    if len(vals) == 0:
        return np.array([0.0])
    mids = (vals[:-1] + vals[1:]) / 2
    return np.concatenate([[vals[0] - 1.0], mids, [vals[-1] + 1.0]])


def tune_tau(gold, claim_answers, ce_deltas, ce_answers, ie_deltas=None, ie_answers=None) -> tuple[float, float]:
    """τ maximising OA on tuning claims (CE alone when there is no counterfactual evidence).

    Among equally good thresholds the one closest to 0 wins (no preference
    for either source beyond what the data show). Returns (τ, objective).
    """
    best_tau, best = 0.0, -math.inf
    for tau in sorted(candidate_taus(ce_deltas, ie_deltas), key=abs):
        r = ce_ie_oa(tau, gold, claim_answers, ce_deltas, ce_answers, ie_deltas, ie_answers)
        score = r["CE"] if ie_deltas is None else r["OA"]
        if score > best + 1e-12:
            best_tau, best = float(tau), score
    return best_tau, best


def split_tune(ids: Sequence[str], fraction: float, seed: int = 0) -> np.ndarray:
    """Deterministic held-out split: True for tuning claims (hash of seed and id below ``fraction``)."""
    if not 0 < fraction < 1:
        raise ValueError("tune fraction must be in (0, 1)")

    def u(cid: str) -> float:
        return sha256_seed(seed, cid, sep=":") / 2**64

    return np.array([u(c) < fraction for c in ids], bool)


def json_safe(obj):
    """Replace NaN/inf floats by None (JSON has neither) recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (np.floating,)):
        return json_safe(float(obj))
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, Mapping):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
