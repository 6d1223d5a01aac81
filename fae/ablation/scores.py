"""The FAE formulas every metric module shares (SPEC §6): is an answer right, IS/ER/IO from ``a_0..a_R`` and the
control arm's IS_ctrl/ER_ctrl.

:mod:`fae.ablation.metrics` (the ablation's metrics) and :mod:`fae.ablation.control` (the control arm's)
both build on these; one definition, so the control's IS_ctrl is IS's own formula on other pools.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fae.ablation.population import is_nei


def safe_ratio(num, den, empty: float = float("nan")):
    """``num / den`` elementwise over arrays (a bootstrap's draws) or scalars; ``empty`` where ``den <= 0``."""
    import numpy as np

    num, den = np.asarray(num, float), np.asarray(den, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), empty)


def immediate_sensitivity(a0, a1):
    """IS = ``1 - a_1 / a_0`` (SPEC §6), elementwise; NaN where ``a_0`` is 0. IS_ctrl is the same formula
    with the control's ``a_1``."""
    return 1 - safe_ratio(a1, a0)


def end_state_retention(a0, aR):
    """ER = ``1 - a_R / a_0``, elementwise; NaN where ``a_0`` is 0."""
    return 1 - safe_ratio(aR, a0)


def ideal_offset(a0, mean_after):
    """IO = ``1 - mean(a_1..a_R)``, elementwise; NaN where ``a_0`` is 0 (nothing right to lose)."""
    import numpy as np

    return np.where(np.asarray(a0, float) > 0, 1 - np.asarray(mean_after, float), np.nan)


def evidence_specific_sensitivity(a0, a1, a1_ctrl):
    """IS - IS_ctrl = ``(a_1^ctrl - a_1) / a_0``, elementwise; NaN where ``a_0`` is 0."""
    import numpy as np

    return safe_ratio(np.asarray(a1_ctrl, float) - np.asarray(a1, float), a0)


# The control arm's point estimates (SPEC §6): IS's and ER's own formulas on the control's pools, and IS − IS_ctrl.
# Each takes its own a_0, the round-0 accuracy over the claims with a control at that round (round 1 for IS_ctrl,
# round R for ER_ctrl), so that the ratio is paired; :mod:`fae.ablation.control` reports them.

def control_sensitivity(a0: float | None, a1_ctrl: float | None) -> float | None:
    """IS_ctrl = ``1 - a_1^ctrl / a_0``; None where ``a_0`` is 0 or undefined or ``a_1^ctrl`` undefined."""
    return None if not a0 or a1_ctrl is None else float(immediate_sensitivity(a0, a1_ctrl))


def control_retention(a0: float | None, aR_ctrl: float | None) -> float | None:
    """ER_ctrl = ``1 - a_R^ctrl / a_0``; None where ``a_0`` is 0 or undefined or ``a_R^ctrl`` undefined."""
    return None if not a0 or aR_ctrl is None else float(end_state_retention(a0, aR_ctrl))


def control_evidence_part(IS: float | None, IS_ctrl: float | None) -> float | None:
    """IS − IS_ctrl as metrics.json reports it: the difference of the two point estimates reported beside it, so
    the three add up exactly (the same quantity as :func:`evidence_specific_sensitivity`, which the bootstrap's
    draws use); None where either is undefined."""
    return None if IS is None or IS_ctrl is None else IS - IS_ctrl


def same_label(pred: str | None, gold: str) -> bool:
    """Is an answer's label the gold label? The one definition (score accounting uses it too).

    Exact: an invalid answer (None) is wrong; only NEI has two spellings.
    """
    if pred is None:
        return False
    return pred == gold or (is_nei(pred) and is_nei(gold))


def is_valid(rnd: Mapping) -> bool:
    """Whether a round's answer parsed. Hand-built rounds without ``valid`` are valid when they have a label."""
    return bool(rnd.get("valid", rnd.get("label") is not None))


def round_label(rnd: Mapping) -> str | None:
    """The round's label; None when the answer was invalid (wrong at every round)."""
    return rnd.get("label") if is_valid(rnd) else None


def n_rounds(claims: Sequence[Mapping], *, strict: bool = True) -> int:
    """R, the ablation rounds after round 0. ``strict``: every claim must have the same number (a run's
    claims do); otherwise the most any claim has (soft metrics read claims whose later rounds may be
    missing), 0 for none."""
    if not strict:
        return max((len(c.get("rounds") or []) for c in claims), default=1) - 1
    lengths = {len(c["rounds"]) for c in claims}
    if len(lengths) > 1:
        raise ValueError(f"claims have different numbers of rounds: {sorted(lengths)}")
    return (lengths.pop() - 1) if lengths else 0


def retention_reason(acc: Sequence[float | None]) -> str | None:
    """Why ``g_r = a_r / a_0`` is undefined (``a_0`` is 0 or undefined), or None when it is defined."""
    if not acc or acc[0] is None:
        return "a_0 undefined (no SUPPORT/REFUTE claims)"
    if acc[0] == 0:
        return "a_0 = 0"
    return None


def undefined_reason(acc: Sequence[float | None]) -> str | None:
    """Why IS/ER/IO cannot be computed from ``a_0..a_R``, or None when they can."""
    reason = retention_reason(acc)
    if reason is None and len(acc) < 2:
        return "R = 0 (no ablation rounds)"
    return reason


def retention(acc: Sequence[float | None]) -> list[float | None]:
    """``g_r = a_r / a_0``; ``None`` for every r when ``a_0`` is 0 or undefined."""
    a0 = acc[0] if acc else None
    if not a0:
        return [None] * len(acc)
    return [None if a is None else a / a0 for a in acc]


def fae_scores(acc: Sequence[float | None]) -> dict[str, Any]:
    """IS = 1 - g_1, ER = 1 - g_R, IO = 1 - mean(a_1..a_R) (SPEC §6), each with a reason when null.

    All three are ``None`` when ``a_0`` is 0 or undefined, or R = 0; then
    ``IS_reason``/``ER_reason``/``IO_reason`` say why (e.g. ``"a_0 = 0"``).
    IO itself only needs a_1..a_R, but a verifier with nothing right at round
    0 has nothing to lose: one whose every answer is invalid would score the
    ideal IO = 1.
    """
    reason = undefined_reason(acc)
    out: dict[str, Any] = {"IS": None, "ER": None, "IO": None}
    if reason is None:
        R = len(acc) - 1
        out = {"IS": float(immediate_sensitivity(acc[0], acc[1])), "ER": float(end_state_retention(acc[0], acc[R])),
               "IO": float(ideal_offset(acc[0], sum(acc[1:]) / R))}
    return {**out, "IS_reason": reason, "ER_reason": reason, "IO_reason": reason}
