"""The per-claim columns `fae compare` resamples, and the statistic that turns their resampled sums back
into every reported quantity (SPEC §8).

:class:`PairedColumns`: the accounting's indicators, both runs' FAE metrics and (when both have them) soft
FAE; :class:`ArmColumns`: the control arm and the sufficiency pools of both runs, on the same draws.
:func:`interval_of` reads one quantity's estimate and interval out of the bootstrap's result.
"""

from __future__ import annotations

import numpy as np

from fae.ablation.control import control_metrics, control_rows, has_control
from fae.ablation.sufficiency import (cited_only_metrics, gold_only_metrics, size_sweep_metrics,
                                       sweep_rounds)
from fae.ablation.metrics import round_label, same_label
from fae.ablation.population import is_nei
from fae.ablation.scores import evidence_specific_sensitivity, immediate_sensitivity, safe_ratio
from fae.ablation.soft_metrics import (
    SOFT_COMPARE_NAMES,
    has_probs,
    soft_columns,
    soft_from_sums,
)
from fae.comparison import accounting
from fae.comparison.checks import Run


def _n_rounds(run: Run, order: list[str]) -> tuple[int, str | None]:
    counts = {len(run.claims[c]["rounds"]) for c in order}
    if len(counts) == 1:
        return counts.pop() - 1, None
    return min(counts) - 1, (f"{run.path}: claims have between {min(counts)} and {max(counts)} rounds; "
                             f"round metrics use the first {min(counts)}")


class PairedColumns:
    """Per-claim columns of the accounting, both runs' FAE metrics and (when both have them) soft FAE,
    and the statistic that turns resampled column sums back into every reported quantity."""

    def __init__(self, a: Run, b: Run, order: list, ind, notes: list[str]):
        ra, note_a = _n_rounds(a, order)
        rb, note_b = _n_rounds(b, order)
        notes += [n for n in (note_a, note_b) if n]
        claims_a, claims_b = [a.claims[c] for c in order], [b.claims[c] for c in order]
        cols_a, cols_b = accounting.run_metric_columns(claims_a, ra), accounting.run_metric_columns(claims_b, rb)
        names_a, names_b = accounting.run_metric_names(ra), accounting.run_metric_names(rb)
        self.common = [n for n in names_a if n in names_b]
        self.ia = [names_a.index(n) for n in self.common]
        self.ib = [names_b.index(n) for n in self.common]
        acc_cols = accounting.accounting_columns(ind)
        self.k0, self.ka, self.kb, self.ra, self.rb = acc_cols.shape[1], cols_a.shape[1], cols_b.shape[1], ra, rb
        # soft FAE: label-probability metrics, paired on the same draws, when both runs have them
        self.soft_r = min(ra, rb)
        self.with_soft = has_probs(claims_a) and has_probs(claims_b)
        if self.with_soft:
            soft_a, soft_b = soft_columns(claims_a, self.soft_r), soft_columns(claims_b, self.soft_r)
            both = soft_a[:, :1] * soft_b[:, :1]  # claims with probabilities in both runs
            soft_a, soft_b = soft_a * both, soft_b * both
            self.common = self.common + list(SOFT_COMPARE_NAMES)
            notes.append("soft_IS, nei_area, p_gold_0, ece: label-probability metrics (soft FAE) over the claims "
                         "that have probabilities at every round in both runs")
        else:
            soft_a = soft_b = np.zeros((len(order), 0))
        self.ks = soft_a.shape[1]
        # the control arm and gold-only pools (SPEC §6), when both runs asked them: on the same draws
        self.arms = ArmColumns(claims_a, claims_b, order, notes)
        self.columns = np.hstack([acc_cols, cols_a, cols_b, soft_a, soft_b, self.arms.columns])

    def statistic(self, sums):
        """Every reported quantity from resampled column sums (last axis: the columns): the accounting, A's and
        B's metrics, B − A, then the arms' numbers; leading axes (the draws) are kept."""
        k0, ka, kb = self.k0, self.ka, self.kb
        out_acc = accounting.accounting_from_sums(sums[..., :k0])
        ma = accounting.run_metrics_from_sums(sums[..., k0:k0 + ka], self.ra)[..., self.ia]
        mb = accounting.run_metrics_from_sums(sums[..., k0 + ka:k0 + ka + kb], self.rb)[..., self.ib]
        base, ks = k0 + ka + kb, self.ks
        if self.with_soft:  # x100, like the run metrics
            ma = np.concatenate([ma, 100 * soft_from_sums(sums[..., base:base + ks], self.soft_r)], axis=-1)
            mb = np.concatenate([mb, 100 * soft_from_sums(sums[..., base + ks:base + 2 * ks], self.soft_r)], axis=-1)
        arms = self.arms.statistic(sums[..., base + 2 * ks:])
        return np.concatenate([out_acc, ma, mb, mb - ma, arms], axis=-1)


class ArmColumns:
    """Per-claim columns of the control arm and the sufficiency pools of both runs (SPEC §6,
    :mod:`fae.ablation.control`, :mod:`fae.ablation.sufficiency`), on the claims both runs share, and their
    statistic (x100).

    Control: the claims with a round-1 control in both runs (a claim is left out of a run's control when
    it has too few lines neither cited nor gold, which depends on what that run cited); per run the
    columns [claim, right at round 0, right at round 1, right on the round-1 control], whence
    IS = 1 - a_1/a_0, IS_ctrl = 1 - a_1^ctrl/a_0 and IS - IS_ctrl = (a_1^ctrl - a_1)/a_0 as in
    :func:`control_metrics` (whose values on these claims are the point estimates; checked). Each
    sufficiency pool (gold-only, cited-only, the size sweep): the claims asked it in both runs; per run
    [claim, right, NOT_ENOUGH_INFO] (for the sweep: the claim's share of its pools right and answered
    NOT_ENOUGH_INFO), whence the accuracy and NOT_ENOUGH_INFO share of :mod:`fae.ablation.sufficiency`.
    """

    CONTROL = ("IS", "IS_ctrl", "IS_minus_IS_ctrl")
    # arm, its two statistics (keys of its metrics block), what a run without it was made with
    POOLS = (("gold_only", ("label_accuracy", "nei_answer_rate"), "--no-gold-only"),
             ("cited_only", ("label_accuracy", "nei_answer_rate"), "--no-cited-only"),
             ("size_sweep", ("sweep_accuracy", "sweep_nei_share"), "--no-size-sweep"))

    def __init__(self, claims_a: list[dict], claims_b: list[dict], order: list[str], notes: list[str]):
        n = len(order)
        self.claims_a, self.claims_b, self.order = claims_a, claims_b, order
        self.with_control = all(map(has_control, claims_a)) and all(map(has_control, claims_b))
        self.pool_on = {arm: all(c.get(arm) is not None for c in claims_a + claims_b) for arm, _, _ in self.POOLS}
        self.missing = {}
        flags = {"control": "--control none", **{arm: flag for arm, _, flag in self.POOLS}}
        for arm in flags:
            a_has = all(map(has_control, claims_a)) if arm == "control" else all(c.get(arm) is not None
                                                                                 for c in claims_a)
            b_has = all(map(has_control, claims_b)) if arm == "control" else all(c.get(arm) is not None
                                                                                 for c in claims_b)
            if not (a_has and b_has):
                who = [w for w, has in (("A", a_has), ("B", b_has)) if not has]
                name = arm.replace("_", "-")
                self.missing[arm] = (f"{name} not compared: run {' and '.join(who)} has no {name} data "
                                     f"(fae run {flags[arm]}, or a run made before it)")
                notes.append(self.missing[arm])
        cols = [np.zeros((n, 0))]
        self.ctrl_ids: list[str] = []
        if self.with_control:
            ra, rb = self._control_rows(claims_a), self._control_rows(claims_b)
            both = np.array([ra[c][0] * rb[c][0] for c in order], float)[:, None]
            self.ctrl_ids = [c for c, m in zip(order, both[:, 0]) if m]
            cols += [np.array([ra[c] for c in order], float) * both, np.array([rb[c] for c in order], float) * both]
            notes.append(f"IS, IS_ctrl, IS_minus_IS_ctrl: over the {len(self.ctrl_ids)} of {n} claims with a round-1 "
                         "control in both runs (the control arm, SPEC §6)")
        self.pool_ids: dict[str, list[str]] = {}
        for arm, names, _ in self.POOLS:
            if not self.pool_on[arm]:
                continue
            ga, gb = self._pool_rows(claims_a, arm), self._pool_rows(claims_b, arm)
            both = np.array([ga[k][0] * gb[k][0] for k in range(n)], float)[:, None]
            self.pool_ids[arm] = [c for c, m in zip(order, both[:, 0]) if m]
            cols += [np.array(ga, float) * both, np.array(gb, float) * both]
            notes.append(f"{arm.replace('_', '-')} {', '.join(names)}: over the {len(self.pool_ids[arm])} of {n} "
                         "claims asked it in both runs")
        self.columns = np.hstack(cols)

    @staticmethod
    def _control_rows(claims: list[dict]) -> dict[str, tuple[int, int, int, int]]:
        """Per claim id: (has a round-1 control, right at round 0, at round 1, on the round-1 control)."""
        pop, right, ctrl = control_rows(claims)  # the control arm's own reading of claims.jsonl
        out = {}
        for c, rt, ct in zip(pop, right, ctrl):
            ok = len(rt) > 1 and ct[1] is not None
            out[str(c["id"])] = (1, int(rt[0]), int(rt[1]), int(ct[1])) if ok else (0, 0, 0, 0)
        return out

    @staticmethod
    def _pool_rows(claims: list[dict], arm: str) -> list[tuple[float, float, float]]:
        """Per claim: (asked the arm's pool, right there, answered NOT_ENOUGH_INFO there); for the size sweep
        the shares over the claim's pools."""
        out = []
        for c in claims:
            rounds = sweep_rounds(c) if arm == "size_sweep" else ([] if "skipped" in c[arm] else [c[arm]])
            if not rounds:
                out.append((0, 0, 0))
                continue
            n = len(rounds)
            out.append((1, sum(same_label(round_label(rd), c["gold_label"]) for rd in rounds) / n,
                        sum(is_nei(round_label(rd)) for rd in rounds) / n))
        return out

    def statistic(self, sums):
        """The arms' numbers (×100) from their column sums: IS and IS_ctrl of A, of B and B − A, then each asked
        pool's accuracy and NEI share; an empty last axis when no arm was asked in both runs."""
        parts = [np.zeros(sums.shape[:-1] + (0,))]
        k = 0
        if self.with_control:
            pa, pb, k = sums[..., 0:4], sums[..., 4:8], 8
            stats = []
            for s in (pa, pb):
                a0, a1, c1 = s[..., 1], s[..., 2], s[..., 3]
                stats.append(np.stack([immediate_sensitivity(a0, a1), immediate_sensitivity(a0, c1),
                                       evidence_specific_sensitivity(a0, a1, c1)], axis=-1))
            parts += [100 * stats[0], 100 * stats[1], 100 * (stats[1] - stats[0])]
        for arm, _, _ in self.POOLS:
            if not self.pool_on[arm]:
                continue
            ga, gb = sums[..., k:k + 3], sums[..., k + 3:k + 6]
            k += 6
            stats = [np.stack([safe_ratio(g[..., 1], g[..., 0]), safe_ratio(g[..., 2], g[..., 0])], axis=-1)
                     for g in (ga, gb)]
            parts += [100 * stats[0], 100 * stats[1], 100 * (stats[1] - stats[0])]
        return np.concatenate(parts, axis=-1)

    def report(self, res, start: int, *, n_resamples: int, seed: int) -> dict:
        """compare.json's ``control``, ``gold_only``, ``cited_only`` and ``size_sweep`` blocks (None where a run
        lacks the arm), the point estimates checked against the arms' metrics on the same claims."""
        out: dict = {"control": None, **{arm: None for arm, _, _ in self.POOLS}}
        draws = {"bootstrap": n_resamples, "seed": seed,
                 "resampling": "the draws of every other interval in this file (paired over claims)"}
        i = start
        arms = [("control", self.CONTROL, self.ctrl_ids, self.with_control)]
        arms += [(arm, names, self.pool_ids.get(arm, []), self.pool_on[arm]) for arm, names, _ in self.POOLS]
        for arm, names, ids, on in arms:
            if not on:
                continue
            m = len(names)
            block = {"n_claims": len(ids), **draws}
            for j, name in enumerate(names):
                block[name] = {"A": interval_of(res, i + j), "B": interval_of(res, i + m + j),
                               "difference": interval_of(res, i + 2 * m + j)}
            self._check(arm, names, ids, block)
            out[arm] = block
            i += 3 * m
        return out

    def _subset(self, claims: list[dict], ids: list[str]) -> list[dict]:
        keep = set(ids)
        return [c for c in claims if str(c["id"]) in keep]

    def _check(self, arm: str, names, ids: list[str], block: dict) -> None:
        metrics = {"control": lambda cl: control_metrics(cl, n_resamples=1), "gold_only": gold_only_metrics,
                   "cited_only": cited_only_metrics, "size_sweep": size_sweep_metrics}[arm]
        for who, claims in (("A", self.claims_a), ("B", self.claims_b)):
            ref = metrics(self._subset(claims, ids)) if ids else None
            for name in names:
                _same(block[name][who]["estimate"], None if ref is None else ref[name],
                      f"{arm.replace('_', '-')} {name} of {who}")


def _same(estimate, reference, what: str) -> None:
    """The bootstrap's point estimate (x100) is fae.ablation.control's value on the same claims."""
    ref = None if reference is None else 100 * reference
    if (estimate is None) != (ref is None) or (ref is not None and abs(estimate - ref) > 1e-6):
        raise RuntimeError(f"{what}: {estimate} from the per-claim columns, {ref} from fae.ablation.control")


def interval_of(res, i: int) -> dict:
    """Quantity ``i`` of a bootstrap result as ``{estimate, ci_low, ci_high}`` (NaN: None), with the count
    of draws where it was undefined when there were any."""
    d = accounting.as_interval_dict(res.estimate[i], res.ci_low[i], res.ci_high[i])
    if res.undefined_draws[i]:
        d["undefined_draws"] = int(res.undefined_draws[i])
    return d

