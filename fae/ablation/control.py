"""The control arm and the gold-only pool (SPEC §6): is the accuracy FAE's ablation removes evidence?

IS says how much accuracy a verifier loses when its cited lines go. A verifier
that abstains whenever *any* line goes, or whenever the numbering shows a hole,
loses as much: IS alone cannot tell it from one that reads its evidence. The
control arm asks, at every round r >= 1, the full pool minus as many lines as
the ablation removed by then, drawn from the lines neither cited before nor
gold (:class:`fae.ablation.engine.ClaimSchedule`). Its metrics:

- ``a_r^ctrl``: label accuracy on the control pool of round r;
- ``IS_ctrl = 1 - a_1^ctrl / a_0`` and ``ER_ctrl = 1 - a_R^ctrl / a_0``
  (:func:`fae.ablation.scores.control_sensitivity`, :func:`~fae.ablation.scores.control_retention`);
- ``IS - IS_ctrl = (a_1^ctrl - a_1) / a_0``: the part of IS that is evidence
  (:func:`~fae.ablation.scores.control_evidence_part`).

The population is the claims with a control at that round (a claim whose pool
has too few eligible lines is counted in ``n_left_out`` and left out of the
control only), and ``a_0``/``a_1`` are taken over the same claims, so IS and
IS_ctrl here are paired: one percentile bootstrap over those claims gives both
intervals and the difference's. A verifier that reads its evidence has
``IS_ctrl`` near 0 and ``IS - IS_ctrl`` near IS; one that abstains whenever a
line goes has ``IS_ctrl`` = IS.

The control is matched on what the pool shows (``--control matched``, the
default): under original line ids removing the pool's last line leaves no hole
in the numbering while removing an earlier one does, so a control that removed
its lines anywhere would be easier or harder to spot than the ablation, and a
verifier that abstains on holes alone would score IS − IS_ctrl > 0.
:func:`gap_balance` reports, per round, the share of ablated and of control
pools that show a hole and the claims whose control could not be matched.

The gold-only, cited-only and size-sweep pools (sufficiency: does it answer on
the evidence alone?) are :mod:`fae.ablation.sufficiency`'s.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fae.intervals import draw_units, percentile_interval
from fae.ablation.engine import VISIBLE_GAP_KINDS, removal_gap
from fae.ablation.population import evidence_claims, is_nei
from fae.ablation.scores import (
    control_evidence_part,
    control_retention,
    control_sensitivity,
    evidence_specific_sensitivity,
    fae_scores,
    immediate_sensitivity,
    n_rounds,
    round_label,
    undefined_reason,
)
from fae.ablation.sufficiency import asked
from fae.ablation.sufficiency import right as is_right


def has_control(claim: Mapping) -> bool:
    """Whether the claim carries a control ablation (its ``control`` entry is set and not None)."""
    return claim.get("control") is not None


def control_rows(claims: Sequence[Mapping]) -> tuple[list[Mapping], list[list[bool]], list[list[bool | None]]]:
    """(the population in id order, per claim ``right[r]`` for rounds 0..R of the ablation, per claim
    ``right_ctrl[r]`` for r = 1..R at index r, None where the control was left out, index 0 None)."""
    pop = sorted(evidence_claims(claims), key=lambda c: str(c["id"]))
    R = n_rounds(pop) if pop else 0
    right, ctrl = [], []
    for c in pop:
        gold = c["gold_label"]
        right.append([is_right(rd, gold) for rd in c["rounds"]])
        control = list(c.get("control") or [])
        if len(control) != R:
            raise ValueError(f"claim {c['id']!r}: {len(control)} control rounds for R = {R}")
        ctrl.append([None] + [(is_right(rd, gold) if asked(rd) else None) for rd in control])
    return pop, right, ctrl


def _visible(kinds) -> bool:
    return any(k in VISIBLE_GAP_KINDS for k in kinds)


def control_unmatched(claim: Mapping, r: int) -> bool:
    """Whether the control of round r left another gap than the ablation in a way a prompt can show: the
    draw's own record (``gap_matched`` None) for a matched control; for a ``random`` control (or a run made
    before matching) whether one pool has a hole before or between kept lines and the other not."""
    ctrl = claim["control"][r - 1]
    if "gap_matched" in ctrl:
        return ctrl["gap_matched"] is None
    full = claim["rounds"][0]["pool_ids"]
    return _visible(removal_gap(full, claim["rounds"][r]["pool_ids"])) != _visible(removal_gap(full, ctrl["pool_ids"]))


def gap_balance(pop: Sequence[Mapping], R: int) -> dict[str, Any]:
    """Per round 1..R, over the claims with a control: the share of ablated and of control pools whose
    removal leaves a hole before or between kept lines (what a prompt under original line ids shows as a
    missing number; a removal at the end shows nothing), and the claims whose control could not leave a gap
    shown as the ablation's was (:func:`control_unmatched`), by id: the ablation took the last line, say,
    which no control may take. A verifier that abstains on a visible hole scores the same on both arms of a
    matched claim."""
    ablated, control, unmatched = [], [], []
    for r in range(1, R + 1):
        rows = [c for c in pop if asked(c["control"][r - 1])]
        n = len(rows)
        full = [c["rounds"][0]["pool_ids"] for c in rows]
        ablated.append(sum(_visible(removal_gap(f, c["rounds"][r]["pool_ids"])) for f, c in zip(full, rows)) / n
                       if n else None)
        control.append(sum(_visible(removal_gap(f, c["control"][r - 1]["pool_ids"])) for f, c in zip(full, rows)) / n
                       if n else None)
        unmatched.append(sorted(str(c["id"]) for c in rows if control_unmatched(c, r)))
    return {"ablation_gap_share": ablated, "control_gap_share": control,
            "n_unmatched": [len(u) for u in unmatched], "unmatched_ids": unmatched}


def paired_sensitivity(metrics: Mapping[str, Any]) -> dict[str, Any] | None:
    """IS, IS_ctrl and IS − IS_ctrl on the same claims (those with a round-1 control), with their intervals
    and that claim count: the one source of every paired number a report, summary or doc prints. IS over
    all claims (``metrics["IS"]``) is another population and never stands beside IS_ctrl. None for a run
    made without the control."""
    ctrl = metrics.get("control")
    if not ctrl:
        return None
    iv = ctrl.get("intervals") or {}
    return {"n_claims": ctrl["n_control_claims"], "n_left_out": ctrl["n_left_out"][0] if ctrl["n_left_out"] else 0,
            "IS": ctrl["IS"], "IS_ctrl": ctrl["IS_ctrl"], "IS_minus_IS_ctrl": ctrl["IS_minus_IS_ctrl"],
            "intervals": {k: iv.get(k) for k in ("IS", "IS_ctrl", "IS_minus_IS_ctrl")}}


def control_metrics(claims: Sequence[Mapping], *, n_resamples: int = 2000, confidence_level: float = 0.95,
                    seed: int = 0) -> dict[str, Any] | None:
    """The control arm's metrics (module docstring), or None for a run made without it (``--control none``)."""
    pop_all = evidence_claims(claims)
    if not pop_all or not all(has_control(c) for c in pop_all):
        return None
    pop, right, ctrl = control_rows(pop_all)
    R = len(right[0]) - 1
    out: dict[str, Any] = {"rounds": R, "n_claims": len(pop)}
    # how the control drew its lines: "matched" on the gap (entries carry gap_matched) or "random"
    out["draw"] = "matched" if any(rd and "gap_matched" in rd for c in pop for rd in c["control"]) else "random"
    left_out = [sum(row[r] is None for row in ctrl) for r in range(1, R + 1)]
    out["n_left_out"] = left_out  # per round 1..R: claims with too few lines neither cited nor gold
    acc_ctrl, nei_ctrl, a0_at = [], [], []
    for r in range(1, R + 1):
        keep = [k for k, row in enumerate(ctrl) if row[r] is not None]
        acc_ctrl.append(sum(ctrl[k][r] for k in keep) / len(keep) if keep else None)
        nei_ctrl.append(sum(is_nei(round_label(pop[k]["control"][r - 1])) for k in keep) / len(keep)
                        if keep else None)
        a0_at.append(sum(right[k][0] for k in keep) / len(keep) if keep else None)
    out["gap"] = gap_balance(pop, R)
    out["round_accuracy_ctrl"] = acc_ctrl
    out["nei_answer_rate_ctrl"] = nei_ctrl
    # IS over the claims with a round-1 control, beside IS_ctrl on the same claims (paired)
    keep1 = [k for k, row in enumerate(ctrl) if R >= 1 and row[1] is not None]
    out["n_control_claims"] = len(keep1)
    paired = _paired(right, ctrl, keep1, R, n_resamples, confidence_level, seed,
                     "percentile bootstrap over the claims with a round-1 control")
    out["a0"] = paired["a0"]
    out["IS"], out["IS_ctrl"], out["IS_minus_IS_ctrl"] = paired["IS"], paired["IS_ctrl"], paired["IS_minus_IS_ctrl"]
    keepR = [k for k, row in enumerate(ctrl) if R >= 1 and row[R] is not None]
    a0R = sum(right[k][0] for k in keepR) / len(keepR) if keepR else None
    out["ER_ctrl"] = control_retention(a0R, acc_ctrl[-1] if acc_ctrl else None)
    out["IS_ctrl_reason"] = paired["reason"]
    out["intervals"] = paired["intervals"]
    # the same, over the claims whose round-1 control shows its gap as the ablation's does
    unmatched = set(out["gap"]["unmatched_ids"][0]) if R >= 1 else set()
    keep_matched = [k for k in keep1 if str(pop[k]["id"]) not in unmatched]
    gap_matched = _paired(right, ctrl, keep_matched, R, n_resamples, confidence_level, seed,
                          "percentile bootstrap over the claims with a round-1 control matched on the gap")
    out["gap_matched"] = {"n_claims": len(keep_matched), **{k: gap_matched[k] for k in (
        "IS", "IS_ctrl", "IS_minus_IS_ctrl", "intervals")}}
    return out


def _paired(right, ctrl, keep: Sequence[int], R: int, n_resamples: int, confidence_level: float, seed: int,
            method: str) -> dict[str, Any]:
    """IS, IS_ctrl and IS − IS_ctrl over the claims ``keep`` (rows of :func:`control_rows`), with one
    percentile bootstrap over those claims for all three."""
    import numpy as np

    a = np.array([right[k] for k in keep], float).reshape(len(keep), R + 1)
    c1 = np.array([ctrl[k][1] for k in keep], float)
    acc_same = [float(a[:, r].mean()) if keep else None for r in range(R + 1)]
    is_same = fae_scores(acc_same)["IS"] if keep else None
    reason = undefined_reason(acc_same) if keep else "no claim has a control at round 1"
    out = {"a0": acc_same[0] if keep else None, "IS": is_same, "reason": reason,
           "IS_ctrl": None if reason else control_sensitivity(acc_same[0], float(c1.mean()))}
    out["IS_minus_IS_ctrl"] = None if reason else control_evidence_part(is_same, out["IS_ctrl"])
    head = {"method": method, "n_resamples": int(n_resamples), "confidence_level": confidence_level, "seed": seed}
    out["intervals"] = head
    if reason is None:
        idx = draw_units(len(keep), n_resamples, seed)
        a0 = a[:, 0][idx].mean(axis=1)
        a1 = a[:, 1][idx].mean(axis=1)
        ac = c1[idx].mean(axis=1)
        draws = {"IS": immediate_sensitivity(a0, a1), "IS_ctrl": immediate_sensitivity(a0, ac),
                 "IS_minus_IS_ctrl": evidence_specific_sensitivity(a0, a1, ac)}
        for key, d in draws.items():
            head[key] = percentile_interval(d, confidence_level, n_units=len(keep))
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def control_summary_line(m: Mapping[str, Any]) -> str | None:
    """One line for a terminal: IS beside IS_ctrl and the evidence-specific part with intervals, and the
    gold-only pools; None for a run made without them."""
    paired, gold = paired_sensitivity(m), m.get("gold_only")
    parts = []
    if paired:
        def ci(key):
            iv = paired["intervals"].get(key) or {}
            return "" if iv.get("ci_low") is None else f" [{_pct(iv['ci_low'])}, {_pct(iv['ci_high'])}]"

        parts.append(f"control on {paired['n_claims']} claims ({paired['n_left_out']} left out): "
                     f"IS {_pct(paired['IS'])}{ci('IS')}, IS_ctrl {_pct(paired['IS_ctrl'])}{ci('IS_ctrl')}, "
                     f"IS - IS_ctrl {_pct(paired['IS_minus_IS_ctrl'])}{ci('IS_minus_IS_ctrl')}")
    if gold:
        parts.append(f"gold-only on {gold['n_claims']} claims: Acc {_pct(gold['label_accuracy'])}, "
                     f"NOT_ENOUGH_INFO {_pct(gold['nei_answer_rate'])}%")
    return "; ".join(parts) or None
