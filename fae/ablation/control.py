"""The control arm and the gold-only pool (SPEC §6): is the accuracy FAE's ablation removes evidence?

IS says how much accuracy a verifier loses when its cited lines go. A verifier
that abstains whenever *any* line goes, or whenever the numbering shows a hole,
loses as much: IS alone cannot tell it from one that reads its evidence. The
control arm asks, at every round r >= 1, the full pool minus as many lines as
the ablation removed by then, drawn from the lines neither cited before nor
gold (:class:`fae.ablation.engine.ClaimSchedule`). Its metrics:

- ``a_r^ctrl``: label accuracy on the control pool of round r;
- ``IS_ctrl = 1 - a_1^ctrl / a_0`` and ``ER_ctrl = 1 - a_R^ctrl / a_0``;
- ``IS - IS_ctrl = (a_1^ctrl - a_1) / a_0``: the part of IS that is evidence.

The population is the claims with a control at that round (a claim whose pool
has too few eligible lines is counted in ``n_left_out`` and left out of the
control only), and ``a_0``/``a_1`` are taken over the same claims, so IS and
IS_ctrl here are paired: one percentile bootstrap over those claims gives both
intervals and the difference's. A verifier that reads its evidence has
``IS_ctrl`` near 0 and ``IS - IS_ctrl`` near IS; one that abstains whenever a
line goes has ``IS_ctrl`` = IS.

The gold-only pool (every non-gold line removed) is the other side: a verifier
that abstains on sufficient evidence shows there, beside round 0.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fae.intervals import draw_units, percentile_interval
from fae.ablation.population import evidence_claims, is_nei
from fae.ablation.scores import (
    evidence_specific_sensitivity,
    fae_scores,
    immediate_sensitivity,
    n_rounds,
    round_label,
    same_label,
    undefined_reason,
)


def has_control(claim: Mapping) -> bool:
    return claim.get("control") is not None


def _asked(rnd: Mapping | None) -> bool:
    return bool(rnd) and "skipped" not in rnd


def _right(rnd: Mapping, gold: str) -> bool:
    return same_label(round_label(rnd), gold)


def control_rows(claims: Sequence[Mapping]) -> tuple[list[Mapping], list[list[bool]], list[list[bool | None]]]:
    """(the population in id order, per claim ``right[r]`` for rounds 0..R of the ablation, per claim
    ``right_ctrl[r]`` for r = 1..R at index r, None where the control was left out, index 0 None)."""
    pop = sorted(evidence_claims(claims), key=lambda c: str(c["id"]))
    R = n_rounds(pop) if pop else 0
    right, ctrl = [], []
    for c in pop:
        gold = c["gold_label"]
        right.append([_right(rd, gold) for rd in c["rounds"]])
        control = list(c.get("control") or [])
        if len(control) != R:
            raise ValueError(f"claim {c['id']!r}: {len(control)} control rounds for R = {R}")
        ctrl.append([None] + [(_right(rd, gold) if _asked(rd) else None) for rd in control])
    return pop, right, ctrl


def control_metrics(claims: Sequence[Mapping], *, n_resamples: int = 2000, confidence_level: float = 0.95,
                    seed: int = 0) -> dict[str, Any] | None:
    """The control arm's metrics (module docstring), or None for a run made without it (``--control none``)."""
    pop_all = evidence_claims(claims)
    if not pop_all or not all(has_control(c) for c in pop_all):
        return None
    import numpy as np

    pop, right, ctrl = control_rows(pop_all)
    R = len(right[0]) - 1
    out: dict[str, Any] = {"rounds": R, "n_claims": len(pop)}
    left_out = [sum(row[r] is None for row in ctrl) for r in range(1, R + 1)]
    out["n_left_out"] = left_out  # per round 1..R: claims with too few lines neither cited nor gold
    acc_ctrl, nei_ctrl, a0_at = [], [], []
    for r in range(1, R + 1):
        keep = [k for k, row in enumerate(ctrl) if row[r] is not None]
        acc_ctrl.append(sum(ctrl[k][r] for k in keep) / len(keep) if keep else None)
        nei_ctrl.append(sum(is_nei(round_label(pop[k]["control"][r - 1])) for k in keep) / len(keep)
                        if keep else None)
        a0_at.append(sum(right[k][0] for k in keep) / len(keep) if keep else None)
    out["round_accuracy_ctrl"] = acc_ctrl
    out["nei_answer_rate_ctrl"] = nei_ctrl
    # IS over the claims with a round-1 control, beside IS_ctrl on the same claims (paired)
    keep1 = [k for k, row in enumerate(ctrl) if R >= 1 and row[1] is not None]
    out["n_control_claims"] = len(keep1)
    a = np.array([right[k] for k in keep1], float).reshape(len(keep1), R + 1)
    c1 = np.array([ctrl[k][1] for k in keep1], float)
    acc_same = [float(a[:, r].mean()) if keep1 else None for r in range(R + 1)]
    is_same = fae_scores(acc_same)["IS"] if keep1 else None
    reason = undefined_reason(acc_same) if keep1 else "no claim has a control at round 1"
    out["a0"] = acc_same[0] if keep1 else None
    out["IS"] = is_same
    out["IS_ctrl"] = None if reason else 1 - float(c1.mean()) / acc_same[0]
    out["IS_minus_IS_ctrl"] = None if reason else is_same - out["IS_ctrl"]
    keepR = [k for k, row in enumerate(ctrl) if R >= 1 and row[R] is not None]
    a0R = sum(right[k][0] for k in keepR) / len(keepR) if keepR else None
    out["ER_ctrl"] = (1 - acc_ctrl[-1] / a0R) if (R >= 1 and a0R) else None
    out["IS_ctrl_reason"] = reason
    head = {"method": "percentile bootstrap over the claims with a round-1 control", "n_resamples": int(n_resamples),
            "confidence_level": confidence_level, "seed": seed}
    out["intervals"] = head
    if reason is None:
        idx = draw_units(len(keep1), n_resamples, seed)
        a0 = a[:, 0][idx].mean(axis=1)
        a1 = a[:, 1][idx].mean(axis=1)
        ac = c1[idx].mean(axis=1)
        draws = {"IS": immediate_sensitivity(a0, a1), "IS_ctrl": immediate_sensitivity(a0, ac),
                 "IS_minus_IS_ctrl": evidence_specific_sensitivity(a0, a1, ac)}
        for key, d in draws.items():
            head[key] = percentile_interval(d, confidence_level, n_units=len(keep1))
    return out


def gold_only_metrics(claims: Sequence[Mapping]) -> dict[str, Any] | None:
    """Accuracy, NOT_ENOUGH_INFO share and invalid share on the gold-only pools, beside round 0's on the
    same claims; None for a run made without them (``--no-gold-only``)."""
    pop = evidence_claims(claims)
    if not pop or not all("gold_only" in c for c in pop):
        return None
    asked = [c for c in pop if _asked(c["gold_only"])]
    n = len(asked)

    def share(hit) -> float | None:
        return sum(bool(hit(c)) for c in asked) / n if n else None

    return {
        "n_claims": n,
        "n_skipped": len(pop) - n,
        "label_accuracy": share(lambda c: _right(c["gold_only"], c["gold_label"])),
        "nei_answer_rate": share(lambda c: is_nei(round_label(c["gold_only"]))),
        "invalid_rate": share(lambda c: round_label(c["gold_only"]) is None),
        "round0_label_accuracy": share(lambda c: _right(c["rounds"][0], c["gold_label"])),
        "model_calls": sum(not c["gold_only"].get("reused") for c in asked),
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def control_summary_line(m: Mapping[str, Any]) -> str | None:
    """One line for a terminal: IS beside IS_ctrl and the evidence-specific part with intervals, and the
    gold-only pools; None for a run made without them."""
    ctrl, gold = m.get("control"), m.get("gold_only")
    parts = []
    if ctrl:
        def ci(key):
            iv = (ctrl.get("intervals") or {}).get(key) or {}
            return "" if iv.get("ci_low") is None else f" [{_pct(iv['ci_low'])}, {_pct(iv['ci_high'])}]"

        left = ctrl["n_left_out"][0] if ctrl["n_left_out"] else 0
        parts.append(f"control on {ctrl['n_control_claims']} claims ({left} left out): IS {_pct(ctrl['IS'])}{ci('IS')}, "
                     f"IS_ctrl {_pct(ctrl['IS_ctrl'])}{ci('IS_ctrl')}, "
                     f"IS - IS_ctrl {_pct(ctrl['IS_minus_IS_ctrl'])}{ci('IS_minus_IS_ctrl')}")
    if gold:
        parts.append(f"gold-only on {gold['n_claims']} claims: Acc {_pct(gold['label_accuracy'])}, "
                     f"NOT_ENOUGH_INFO {_pct(gold['nei_answer_rate'])}%")
    return "; ".join(parts) or None
