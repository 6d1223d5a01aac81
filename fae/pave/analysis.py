"""PAVE analysis of the sampled lines (pure): arbitration profile and the JSD rule per kind
of counterfactual evidence, τ tuned on a held-out split of the claims."""

from __future__ import annotations

import math

import numpy as np

from real_fae_core.errors import UserError
from fae.pave import metrics
from fae.pave.prompts import PLAIN_LIST_KIND, condition_name, kind_sort_key


VARIANT_TEXT = {
    "jsd": "JSD over each run's label distribution (paper §5, App. C.1)",
    "vote": "vote-based variant: binary entropy of k_true/K, k_true = runs answering SUPPORT (paper App. C.2)",
}
TAU_GRID = ("every midpoint between sorted Δ values of the tuning claims, plus one below and one above "
            "all of them (every decision pattern a τ can make); ties go to the τ closest to 0")


def choose_variant(conditions: list[dict], mode: str) -> tuple[str, str]:
    """The stability measure for the whole analysis and why: ``jsd`` or ``vote``.

    auto = JSD when every run of every prompt has a label distribution and they
    are not all identical run for run; identical distributions (a label-first
    answer format scored at the same prefix) make JSD = 0 for every prompt
    whatever the answers, so the rule could only ever pick one source.
    """
    have = all(c.get("probs") and all(p is not None for p in c["probs"]) for c in conditions)
    identical = have and all(metrics.identical_runs(c["probs"]) for c in conditions)
    if mode == "jsd" and not have:
        raise UserError("--stability jsd needs label probabilities for every run; this backend/endpoint "
                        "returned none (use --stability vote or auto)")
    if mode == "vote":
        return "vote", "asked for (--stability vote)"
    if mode == "jsd":
        return "jsd", ("asked for (--stability jsd); WARNING: every run of every prompt has the same label "
                       "distribution, so JSD = 0 everywhere and the rule cannot tell the sources apart"
                       if identical else "asked for (--stability jsd)")
    if not have:
        return "vote", "the backend returned no label probabilities for some runs"
    if identical:
        return "vote", ("every run of every prompt has the same label distribution by construction "
                        "(JSD = 0 for all of them), so JSD measures nothing here")
    return "jsd", "every run has its own label distribution"


def stability(cond: dict, variant: str) -> float:
    """JSD of the runs' label distributions, or the vote-based binary entropy."""
    if variant == "jsd":
        return metrics.jsd(np.array(cond["probs"], float))
    return metrics.vote_entropy(cond["answers"])


def line_kinds(lines: list[dict]) -> list[str]:
    """Counterfactual kinds present in the sampled lines, in report order."""
    kinds = set()
    for ln in lines:
        for cond in ln["conditions"]:
            if "@" in cond:  # the JSD rule's runs of a condition (pave_io.JSD_SUFFIX)
                continue
            if cond == "counterfactual":
                kinds.add(PLAIN_LIST_KIND)
            elif cond.startswith("counterfactual_"):
                kinds.add(cond[len("counterfactual_"):])
    return sorted(kinds, key=kind_sort_key)


def refusal_filter(lines: list[dict]) -> tuple[list[dict], dict]:
    """The paper's refusal filtering: keep claims whose claim-only majority is a verdict; count the rest per state."""
    removed = {st: 0 for st in metrics.STATES}
    kept = []
    for ln in lines:
        answers = ln["conditions"]["claim_only"]["answers"]
        if metrics.prior_is_definite(answers):
            kept.append(ln)
        else:
            removed[metrics.knowledge_state(answers, ln["gold_label"])] += 1
    return kept, removed


def analyse(lines: list[dict], *, tune_fraction: float, seed: int, mode: str, refusals: bool = True,
            jsd_condition=lambda cond: cond, jsd_settings: dict | None = None) -> dict:
    """pave.json's numbers from samples.jsonl lines.

    ``refusals=True`` filters abstaining priors out first (the paper's default);
    ``jsd_condition`` names where the JSD rule's runs of a condition are.
    """
    notes = []
    filt = {"on": refusals, "claims_before": len(lines), "removed": 0,
            "removed_by_state": {st: 0 for st in metrics.STATES}}
    if refusals:
        lines, removed = refusal_filter(lines)
        filt.update(removed=sum(removed.values()), removed_by_state=removed)
        if filt["removed"]:
            notes.append(f"refusal filtering removed {filt['removed']} of {filt['claims_before']} claims whose "
                         "claim-only majority was NOT_ENOUGH_INFO or invalid (by state before filtering: "
                         + ", ".join(f"{k} {v}" for k, v in removed.items() if v) + ")")
    if not lines:  # every prior abstains: nothing to profile, said plainly rather than as an error
        notes.append(f"no claim is left after refusal filtering: the verifier abstained (NOT_ENOUGH_INFO or "
                     f"invalid majority) on the claim-only prompt of all {filt['claims_before']} claims, so states, "
                     "CR, PR, Margin and the JSD rule are undefined; --keep-refusals analyses them as wrong priors")
        return metrics.json_safe({"n_claims": 0, "refusal_filter": filt, "profile": None, "arbitration": None,
                             "primary_kind": None, "kinds": {}, "notes": notes})
    kinds = line_kinds(lines)
    jsd_conds = [ln["conditions"][jsd_condition(name)] for ln in lines for name in ln["conditions"]
                 if "@" not in name]
    variant, why = choose_variant(jsd_conds, mode)
    if variant == "vote" and mode == "auto":
        notes.append(f"JSD rule: vote-based variant because {why}")
    per_kind = {}
    for kind in kinds or [None]:
        kind_notes: list[str] = []
        profile, arbitration = _analyse_kind(lines, kind, tune_fraction=tune_fraction, seed=seed, variant=variant,
                                             jsd_condition=jsd_condition, notes=kind_notes)
        arbitration.update(variant=variant, variant_text=VARIANT_TEXT[variant], variant_reason=why,
                           tau_grid=TAU_GRID, **(jsd_settings or {}))
        per_kind[kind] = {"profile": profile, "arbitration": arbitration}
        prefix = f"{kind}: " if kind is not None and len(kinds) > 1 else ""
        notes += [prefix + n for n in kind_notes if prefix + n not in notes]
    first = per_kind[kinds[0] if kinds else None]
    return metrics.json_safe({
        "n_claims": len(lines),
        "refusal_filter": filt,
        "profile": first["profile"],
        "arbitration": first["arbitration"],
        "primary_kind": kinds[0] if kinds else None,
        "kinds": {k: v for k, v in per_kind.items() if k is not None},
        "notes": notes,
    })


def _analyse_kind(lines: list[dict], kind: str | None, *, tune_fraction: float, seed: int, variant: str,
                  jsd_condition, notes: list[str]) -> tuple[dict, dict]:
    """Arbitration profile and JSD rule with one kind of counterfactual evidence (None: none)."""
    gold = [ln["gold_label"] for ln in lines]
    co = [ln["conditions"]["claim_only"] for ln in lines]
    ge = [ln["conditions"]["gold_evidence"] for ln in lines]
    cond_name = condition_name(kind) if kind is not None else None
    cf = [ln["conditions"].get(cond_name) if cond_name else None for ln in lines]
    has_cf = [c is not None for c in cf]
    states = [metrics.knowledge_state(c["answers"], g) for c, g in zip(co, gold)]
    ge_correct = [metrics.correctness_rate(c["answers"], g) for c, g in zip(ge, gold)]
    cf_correct = [metrics.correctness_rate(c["answers"], g) if c is not None else None for c, g in zip(cf, gold)]
    profile = metrics.arbitration_profile(states, ge_correct, cf_correct)
    # resampled in claim-id order: the intervals do not depend on the order of the records file
    order = sorted(range(len(lines)), key=lambda i: str(lines[i]["id"]))
    profile["intervals"] = metrics.profile_intervals([states[i] for i in order], [ge_correct[i] for i in order],
                                                [cf_correct[i] for i in order], seed=seed)
    profile["n_with_counterfactual"] = int(sum(has_cf))
    profile["gold_evidence_accuracy"] = float(np.mean([metrics.correctness_rate(c["answers"], g)
                                                       for c, g in zip(ge, gold)]))

    # JSD arbitration on the rule's own runs: claims with counterfactual evidence get CE and IE; others CE only.
    def runs(name):
        return [ln["conditions"].get(jsd_condition(name)) for ln in lines]

    co, ge = runs("claim_only"), runs("gold_evidence")
    cf = runs(cond_name) if cond_name else [None] * len(lines)
    stab = lambda c: stability(c, variant)  # noqa: E731
    s_co = np.array([stab(c) for c in co])
    d_ce = s_co - np.array([stab(c) for c in ge])
    d_ie = np.array([s - stab(c) if c is not None else np.nan for s, c in zip(s_co, cf)])
    maj = lambda c: metrics.majority_label(c["answers"])  # noqa: E731
    a_co = [maj(c) for c in co]
    a_ce = [maj(c) for c in ge]
    a_ie = [maj(c) if c is not None else None for c in cf]
    tune = metrics.split_tune([ln["id"] for ln in lines], tune_fraction, seed)
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
    tau, objective = metrics.tune_tau(*tune_args)
    test_idx, test_args = part(test, use_ie)
    result = metrics.ce_ie_oa(tau, *test_args)
    baselines = {
        "claim_only": metrics.ce_ie_oa(math.inf, *test_args),  # τ = +inf: never take the evidence answer
        "evidence_only": metrics.ce_ie_oa(-math.inf, *test_args),  # τ = -inf: always take it
    }
    if not use_ie:
        notes.append("no counterfactual_sentences on both splits: τ maximises CE only; IE and OA are undefined")
    arbitration = {
        "stability": [variant],
        "tau": tau,
        "tune_objective": objective,
        "n_tune": int(tune.sum()),
        "n_test": int(len(test_idx)),
        "rule": "answer with the evidence-run majority when JSD(claim only) - JSD(with evidence) > tau",
        **result,
        "baselines": baselines,
    }
    return profile, arbitration


FAE_GAP_POINTS = 10.0  # a gap larger than this between the two accuracies is flagged


def fae_round0_check(lines: list[dict], fae_claims: list[dict], *, fae_run: str, temperature: float) -> dict:
    """PAVE's gold-evidence accuracy beside a `fae run`'s round-0 accuracy on the claims both hold.

    Both read the same verifier's label on the same claims with the evidence it
    needs; a large gap means the two inputs differ in a way that matters (PAVE:
    the gold sentences only, sampled; FAE round 0: the full pool, greedy).
    """
    fae = {str(c["id"]): c for c in fae_claims}
    both = [ln for ln in lines if ln["id"] in fae]
    if not both:
        raise UserError(f"--check-run {fae_run}: no claim id in common with --records")
    pave_acc = float(np.mean([metrics.correctness_rate(ln["conditions"]["gold_evidence"]["answers"], ln["gold_label"])
                              for ln in both]))
    fae_acc = float(np.mean([metrics.same_label(fae[ln["id"]]["rounds"][0].get("label"), ln["gold_label"])
                             for ln in both]))
    answers = [a for ln in both for a in ln["conditions"]["gold_evidence"]["answers"]]
    abstain = sum(1 for a in answers if a is not None and metrics.same_label(a, "NOT_ENOUGH_INFO")) / len(answers)
    invalid = sum(1 for a in answers if a is None) / len(answers)
    diff = pave_acc - fae_acc
    out = {"fae_run": fae_run, "n_claims": len(both), "pave_gold_evidence_accuracy": pave_acc,
           "fae_round0_accuracy": fae_acc, "difference": diff, "threshold_points": FAE_GAP_POINTS,
           "disagree": abs(diff) * 100 > FAE_GAP_POINTS,
           "pave_gold_evidence_abstain_share": abstain, "pave_gold_evidence_invalid_share": invalid,
           "explanation": None}
    if out["disagree"]:
        out["explanation"] = (
            "the two accuracies read different inputs: PAVE shows only the gold sentences (a gold-only pool) and "
            f"samples at temperature {temperature}; FAE round 0 shows the full pool and decodes greedily. On "
            f"gold-only pools this verifier answered NOT_ENOUGH_INFO {100 * abstain:.0f}% and invalidly "
            f"{100 * invalid:.0f}% of the time. A verifier trained on full pools (REAL learns to abstain or to "
            "cite ids of a larger pool) can behave differently on a pool it never sees in FAE; PAVE's CR and "
            "wrong-rate rows then describe that input, not the verifier FAE scores")
    return out
