"""PAVE analysis of the sampled lines (pure): arbitration profile and the JSD rule per kind
of counterfactual evidence, τ tuned on a held-out split of the claims."""

from __future__ import annotations

import math

import numpy as np

from data_prep.core.errors import UserError
from fae.comparison import pave_metrics as pm
from fae.comparison.pave_prompts import LEGACY_KIND, condition_name, kind_sort_key


def stability(cond: dict, mode: str) -> tuple[float, str]:
    """JSD of the runs' label distributions, or vote entropy; returns (value, variant used)."""
    probs = cond.get("probs") or []
    have = bool(probs) and all(p is not None for p in probs)
    if mode == "jsd" and not have:
        raise UserError("--stability jsd needs label probabilities for every run; this backend/endpoint "
                        "returned none (use --stability vote or auto)")
    if mode != "vote" and have:
        return pm.jsd(np.array(probs, float)), "jsd"
    return pm.vote_entropy(cond["answers"]), "vote"


def line_kinds(lines: list[dict]) -> list[str]:
    """Counterfactual kinds present in the sampled lines, in report order."""
    kinds = set()
    for ln in lines:
        for cond in ln["conditions"]:
            if cond == "counterfactual":
                kinds.add(LEGACY_KIND)
            elif cond.startswith("counterfactual_"):
                kinds.add(cond[len("counterfactual_"):])
    return sorted(kinds, key=kind_sort_key)


def analyse(lines: list[dict], *, tune_fraction: float, seed: int, mode: str, definite_only: bool) -> dict:
    notes = []
    if definite_only:
        kept = [ln for ln in lines if pm.prior_is_definite(ln["conditions"]["claim_only"]["answers"])]
        notes.append(f"--definite-prior-only dropped {len(lines) - len(kept)} claims whose claim-only majority "
                     "was NOT_ENOUGH_INFO or invalid")
        lines = kept
    if not lines:
        raise UserError("no claims left to analyse")
    kinds = line_kinds(lines)
    per_kind = {}
    for kind in kinds or [None]:
        kind_notes: list[str] = []
        profile, arbitration = _analyse_kind(lines, kind, tune_fraction=tune_fraction, seed=seed, mode=mode,
                                             notes=kind_notes)
        per_kind[kind] = {"profile": profile, "arbitration": arbitration}
        prefix = f"{kind}: " if kind is not None and len(kinds) > 1 else ""
        notes += [prefix + n for n in kind_notes if prefix + n not in notes]
    first = per_kind[kinds[0] if kinds else None]
    return pm.json_safe({
        "n_claims": len(lines),
        "profile": first["profile"],
        "arbitration": first["arbitration"],
        "primary_kind": kinds[0] if kinds else None,
        "kinds": {k: v for k, v in per_kind.items() if k is not None},
        "notes": notes,
    })


def _analyse_kind(lines: list[dict], kind: str | None, *, tune_fraction: float, seed: int, mode: str,
                  notes: list[str]) -> tuple[dict, dict]:
    """Arbitration profile and JSD rule with one kind of counterfactual evidence (None: none)."""
    gold = [ln["gold_label"] for ln in lines]
    co = [ln["conditions"]["claim_only"] for ln in lines]
    ge = [ln["conditions"]["gold_evidence"] for ln in lines]
    cond_name = condition_name(kind) if kind is not None else None
    cf = [ln["conditions"].get(cond_name) if cond_name else None for ln in lines]
    has_cf = [c is not None for c in cf]
    states = [pm.knowledge_state(c["answers"], g) for c, g in zip(co, gold)]
    profile = pm.arbitration_profile(
        states,
        [pm.correctness_rate(c["answers"], g) for c, g in zip(ge, gold)],
        [pm.correctness_rate(c["answers"], g) if c is not None else None for c, g in zip(cf, gold)],
    )
    profile["n_with_counterfactual"] = int(sum(has_cf))

    # JSD arbitration: claims with counterfactual evidence get CE and IE; others CE only.
    variants = set()

    def stab(c):
        v, variant = stability(c, mode)
        variants.add(variant)
        return v

    s_co = np.array([stab(c) for c in co])
    d_ce = s_co - np.array([stab(c) for c in ge])
    d_ie = np.array([s - stab(c) if c is not None else np.nan for s, c in zip(s_co, cf)])
    maj = lambda c: pm.majority_label(c["answers"])  # noqa: E731
    a_co = [maj(c) for c in co]
    a_ce = [maj(c) for c in ge]
    a_ie = [maj(c) if c is not None else None for c in cf]
    tune = pm.split_tune([ln["id"] for ln in lines], tune_fraction, seed)
    test = ~tune
    if tune.sum() == 0 or test.sum() == 0:
        notes.append("the tuning or the test split is empty (too few claims for --tune-split); "
                     "τ is tuned and evaluated on all claims")
        tune = test = np.ones(len(lines), bool)

    def part(mask, with_ie):
        idx = np.flatnonzero(mask & (np.array(has_cf) if with_ie else True))
        g = [gold[i] for i in idx]
        args = (g, [a_co[i] for i in idx], d_ce[idx], [a_ce[i] for i in idx])
        if with_ie:
            args += (d_ie[idx], [a_ie[i] for i in idx])
        return idx, args

    use_ie = bool(np.any(np.array(has_cf) & tune)) and bool(np.any(np.array(has_cf) & test))
    _, tune_args = part(tune, use_ie)
    tau, objective = pm.tune_tau(*tune_args)
    test_idx, test_args = part(test, use_ie)
    result = pm.ce_ie_oa(tau, *test_args)
    baselines = {
        "claim_only": pm.ce_ie_oa(math.inf, *test_args),  # τ = +inf: never take the evidence answer
        "evidence_only": pm.ce_ie_oa(-math.inf, *test_args),  # τ = -inf: always take it
    }
    if not use_ie:
        notes.append("no counterfactual_sentences on both splits: τ maximises CE only; IE and OA are undefined")
    all_d = np.concatenate([d_ce, d_ie[~np.isnan(d_ie)]])
    if "jsd" in variants and np.allclose(s_co, 0) and np.allclose(all_d, 0):
        notes.append("every run of a prompt had the same label distribution (JSD = 0 everywhere): with a "
                     "label-first answer format per-run probabilities do not vary; use --stability vote")
    arbitration = {
        "stability": sorted(variants),
        "tau": tau,
        "tune_objective": objective,
        "n_tune": int(tune.sum()),
        "n_test": int(len(test_idx)),
        "rule": "answer with the evidence-run majority when JSD(claim only) - JSD(with evidence) > tau",
        **result,
        "baselines": baselines,
    }
    return profile, arbitration
