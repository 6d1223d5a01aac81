"""The numbers of the evaluation-choice study (SPEC §10) from saved responses: one panel per dataset x model.

Every score is a function of per-unit column sums, built once per (format, input budget u, scoring budget
v) block and replicate: the four cells S_ab of score accounting (answers of source a, evidence of source b)
come from :mod:`fae.comparison.accounting` (``accounting_from_sums`` for the strict score,
``corpus_f1_from_sums`` for SciFact's F1 from corpus totals) and so do E0, E1 and their product /
covariance split; the intervals are its one paired bootstrap, here with its second axis: whole families
and, independently, the sampled seeds are drawn, the same draw for every block, and each drawn seed's
corpus score is computed from its summed counts before the seeds are averaged.

Scores. Strict (FEVER-style: Check-COVID as FEVER): a correct label, and for SUPPORT/REFUTE gold a
complete gold group among the submitted units; a correct NOT_ENOUGH_INFO needs no evidence. SciFact:
2C/(P+R) over abstracts (units), C a correct SUPPORT/REFUTE with a complete rationale submitted, P the
units answered SUPPORT/REFUTE, R the units whose gold is SUPPORT/REFUTE plus the gold abstracts retrieval
missed (rows of their own, in their claim's family). INVALID is wrong everywhere and never submitted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from real_fae_core.errors import UserError
from real_fae_core.labels import NOT_ENOUGH_INFO, REFUTE, SUPPORT
from fae.ablation.metrics import has_complete_group
from fae.comparison.accounting import (ACCOUNTING_COLUMNS, ACCOUNTING_OUTPUTS, F1_COLUMNS, accounting_from_sums,
                                       corpus_f1_from_sums)
from fae.intervals import paired_bootstrap
from fae.study.interfaces import INVALID, study_dataset

BOOTSTRAP_SEED = 20260916  # the paper's NumPy PCG64 seed
DRAWS = 50_000
ALPHA = 0.05
CELL_NAMES = ("S00", "S01", "S10", "S11", "E0", "E1")
CROSSING = ("input_first.input", "input_first.scoring", "scoring_first.scoring", "scoring_first.input")
OUT = {name: i for i, name in enumerate(ACCOUNTING_OUTPUTS)}


def metric_of(dataset: str) -> str:
    """``f1`` for SciFact, ``strict`` for the FEVER-style datasets; an unknown dataset is one line."""
    study_dataset(dataset)
    return "f1" if dataset == "scifact" else "strict"


def eligible(submitted: Sequence[int], groups: Sequence[Sequence[int]], gold: str, metric: str) -> float:
    """Does the submitted evidence hold a complete gold group (strict: a NOT_ENOUGH_INFO gold needs none)?"""
    if metric == "strict" and gold == NOT_ENOUGH_INFO:
        return 1.0
    return float(has_complete_group(submitted, groups, max_evidence=None))


def unit_columns(gold: str, groups, answers: tuple[str, str], submitted: tuple[list, list], metric: str) -> list:
    """One unit's columns of one block (answers of sources 0, 1; submitted evidence of sources 0, 1), then
    the identical-valid-answer column: ``same * a0 * (d1 - d0)``."""
    d = [eligible(s, groups, gold, metric) for s in submitted]
    if metric == "strict":
        a = [float(x == gold) for x in answers]
        cols = [1.0, a[0], a[1], d[0], d[1], a[0] * d[0], a[0] * d[1], a[1] * d[0], a[1] * d[1]]
    else:
        relevant = gold in (SUPPORT, REFUTE)
        a = [float(relevant and x == gold) for x in answers]
        p = [float(x in (SUPPORT, REFUTE)) for x in answers]
        cols = [1.0, p[0], p[1], float(relevant), a[0], a[1], d[0], d[1],
                a[0] * d[0], a[0] * d[1], a[1] * d[0], a[1] * d[1]]
    same = float(answers[0] == answers[1] and answers[0] != INVALID)
    return cols + [same * a[0] * (d[1] - d[0])]


def width(metric: str) -> int:
    return (len(ACCOUNTING_COLUMNS) if metric == "strict" else len(F1_COLUMNS)) + 1


def missed_row(metric: str) -> list:
    """A gold abstract no pool holds: in R, nothing else (SciFact only)."""
    row = [0.0] * width(metric)
    row[F1_COLUMNS.index("r")] = 1.0
    return row


@dataclass
class Panel:
    """One dataset x model: its units' columns per (replicate, block) and the resampling families."""

    dataset: str
    model: str
    metric: str
    formats: list[str]
    budgets: list[int]
    replicates: list[int]  # sampled replicate indices (1..), the seed axis
    blocks: list[tuple[str, int, int]]  # (format, input budget u, scoring budget v)
    sums: np.ndarray  # (families, 1 + len(replicates), blocks * width): replicate 0 (greedy) first
    n_units: int
    notes: list[str] = field(default_factory=list)

    def block(self, f: str, u: int, v: int) -> int:
        return self.blocks.index((f, u, v))


def build_sums(units: Sequence[dict], answers: dict, blocks, replicates: Sequence[int], metric: str,
               family_of: Callable[[dict], str], missed: dict[str, int]) -> tuple[np.ndarray, int]:
    """(sums per family, replicate and block column, number of families)."""
    w = width(metric)
    fams: dict[str, int] = {}
    rows: list[tuple[int, np.ndarray]] = []
    for u in units:
        fam = fams.setdefault(family_of(u), len(fams))
        cols = np.zeros((len(replicates), len(blocks) * w))
        for ri, r in enumerate(replicates):
            for bi, (f, x, v) in enumerate(blocks):
                ans = (answers[(u["id"], 0, x, f, r)], answers[(u["id"], 1, x, f, r)])
                sub = (u["submitted"][str(v)][0], u["submitted"][str(v)][1])
                cols[ri, bi * w:(bi + 1) * w] = unit_columns(u["gold_label"], u["groups"], ans, sub, metric)
        rows.append((fam, cols))
    if metric == "f1":
        for claim, n in sorted(missed.items()):
            fam = fams.setdefault(family_of({"id": None, "claim_id": claim}), len(fams))
            one = np.tile(np.array(missed_row(metric) * len(blocks)), (len(replicates), 1))
            rows += [(fam, one)] * n
    out = np.zeros((len(fams), len(replicates), len(blocks) * w))
    for fam, cols in rows:
        out[fam] += cols
    return out, len(fams)


def block_outputs(x: np.ndarray, metric: str) -> np.ndarray:
    """``ACCOUNTING_OUTPUTS`` (+ identical-answer E0 share) of one block's sums (last axis), any leading axes."""
    core = x[..., :-1]
    acc = accounting_from_sums(core) if metric == "strict" else corpus_f1_from_sums(core)
    if metric == "strict":
        share = 100.0 * x[..., -1] / core[..., 0]
    else:
        col = {n: core[..., i] for i, n in enumerate(F1_COLUMNS)}
        with np.errstate(divide="ignore", invalid="ignore"):
            share = 200.0 * x[..., -1] / (col["p0"] + col["r"])
    return np.concatenate([acc, share[..., None]], axis=-1)


def output_names(panel: Panel) -> list[str]:
    """The statistic's outputs, in order."""
    names = [f"{f}/{b}/{q}" for f in panel.formats for b in panel.budgets for q in CELL_NAMES]
    names += [f"{f}/{b}/E0_identical_answers" for f in panel.formats for b in panel.budgets]
    names += [f"{f}/{b}/accuracy0" for f in panel.formats for b in panel.budgets]
    names += [f"budget/{b}/{q}" for b in panel.budgets for q in ("E0", "E0_product", "E0_covariance")]
    if len(panel.formats) == 2:
        names.append("D_format")
    if len(panel.budgets) >= 2:
        names += ["D_context", *[f"crossing/{c}" for c in CROSSING]]
    return names


def statistic(panel: Panel) -> Callable[[np.ndarray], np.ndarray]:
    """Sums (..., seeds, columns) -> outputs (..., q): per-seed corpus scores averaged over the seed axis."""
    w = width(panel.metric)
    fs, bs = panel.formats, panel.budgets
    small, large = (bs[0], bs[-1]) if bs else (None, None)

    def stat(x: np.ndarray) -> np.ndarray:
        per = {blk: block_outputs(x[..., i * w:(i + 1) * w], panel.metric).mean(axis=-2)
               for i, blk in enumerate(panel.blocks)}

        def q(f, u, v, name):
            return per[(f, u, v)][..., OUT[name] if name in OUT else -1]

        out = [q(f, b, b, name) for f in fs for b in bs for name in CELL_NAMES]
        out += [q(f, b, b, "identical") for f in fs for b in bs]
        out += [q(f, b, b, "accuracy0") for f in fs for b in bs]
        out += [np.mean([q(f, b, b, name) for f in fs], axis=0)
                for b in bs for name in ("E0", "E0_product", "E0_covariance")]
        if len(fs) == 2:
            out.append(np.mean([q("labels", b, b, "E0") - q("codes", b, b, "E0") for b in bs], axis=0))
        if len(bs) >= 2:
            def big_f(u, v):
                return np.mean([q(f, u, v, "E0") for f in fs], axis=0)
            out += [big_f(large, large) - big_f(small, small),
                    big_f(large, small) - big_f(small, small), big_f(large, large) - big_f(large, small),
                    big_f(small, large) - big_f(small, small), big_f(large, large) - big_f(small, large)]
        return np.stack(out, axis=-1)

    return stat


def primary_names(panel: Panel) -> list[str]:
    return [n for n in ("D_format", "D_context") if n in output_names(panel)]


def analyse_panel(panel: Panel, n_primary: int, draws: int, seed: int = BOOTSTRAP_SEED) -> dict:
    """Point estimates (sampled mean, greedy, each seed), seed signs and the Bonferroni-adjusted intervals."""
    names = output_names(panel)
    stat = statistic(panel)
    sampled = panel.sums[:, 1:, :]
    total = panel.sums.sum(axis=0)
    greedy = stat(total[0:1])
    per_seed = [stat(total[1 + s:2 + s]) for s in range(sampled.shape[1])]
    confidence = 1 - ALPHA / max(n_primary, 1)
    res = None
    if sampled.shape[1] and sampled.shape[0] >= 2 and draws:
        check_draws_fit(len(names), draws)
        res = paired_bootstrap(sampled if sampled.shape[1] >= 2 else sampled[:, 0, :],
                               stat if sampled.shape[1] >= 2 else (lambda x: stat(x[..., None, :])),
                               n_resamples=draws, seed=seed, confidence=confidence)
    estimate = stat(sampled.sum(axis=0)) if sampled.shape[1] else greedy
    values = {}
    for i, name in enumerate(names):
        seeds = [float(p[i]) for p in per_seed]
        est = float(estimate[i])
        values[name] = {
            "estimate": _clean(est), "greedy": _clean(float(greedy[i])), "per_seed": [_clean(s) for s in seeds],
            "seed_signs_agreeing": int(sum(np.sign(s) == np.sign(est) and s != 0 for s in seeds)),
            "ci_low": _clean(res.ci_low[i]) if res is not None else None,
            "ci_high": _clean(res.ci_high[i]) if res is not None else None}
    return {"dataset": panel.dataset, "model": panel.model, "metric": panel.metric, "units": panel.n_units,
            "families": int(panel.sums.shape[0]), "seeds": len(panel.replicates),
            "bootstrap": {"draws": draws if res is not None else 0, "generator": "PCG64", "seed": seed,
                          "confidence": confidence, "bonferroni_k": n_primary,
                          "bounds": [ALPHA / (2 * max(n_primary, 1)), 1 - ALPHA / (2 * max(n_primary, 1))]},
            "values": values, "primary": primary_names(panel), "notes": panel.notes}


def check_draws_fit(n_outputs: int, draws: int) -> None:
    """Refuse a bootstrap whose draws cannot sit in the free memory (every draw of every output is kept, and
    scipy copies it): one line naming ``--draws``, before anything is drawn."""
    need = 3 * 8 * n_outputs * draws
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: the field's max alone
        return
    if need > free:
        raise UserError(f"--draws {draws}: the bootstrap of {n_outputs} outputs would hold about "
                        f"{need / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB of free memory; "
                        "give fewer draws")


def _clean(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def meets(value: dict, n_seeds: int, threshold: float = 2.0) -> int:
    """+1 / -1 when a contrast meets the local criteria in that direction (|effect| >= 2 points, adjusted
    interval excluding 0, at least 4 of 5 agreeing seed signs, the same share for other seed counts); 0 else."""
    est, lo, hi = value["estimate"], value["ci_low"], value["ci_high"]
    if est is None or lo is None or hi is None or abs(est) < threshold or lo <= 0 <= hi:
        return 0
    if n_seeds == 0 or value["seed_signs_agreeing"] < 0.8 * n_seeds:
        return 0
    return 1 if est > 0 else -1


def decision(panels: Sequence[dict]) -> dict:
    """The SPEC §10 decision rule over every panel's primary contrasts."""
    models = sorted({p["model"] for p in panels})
    datasets = sorted({p["dataset"] for p in panels})
    for factor in ("D_format", "D_context"):
        for direction in (1, -1):
            ok = [d for d in datasets if all(
                any(p["dataset"] == d and p["model"] == m and factor in p["values"]
                    and meets(p["values"][factor], p["seeds"]) == direction for p in panels) for m in models)]
            if len(ok) >= 2 and "scifact" in ok:
                return {"label": "replicated dependence", "factor": factor, "direction": direction, "datasets": ok}
    intervals = [p["values"][n] for p in panels for n in p["primary"]]
    silent = unanswered_formats(panels)
    if intervals and all(v["ci_low"] is not None and v["ci_high"] is not None and -2 <= v["ci_low"]
                         and v["ci_high"] <= 2 for v in intervals):
        if not silent:
            return {"label": "bounded stability", "contrasts": len(intervals)}
        return {"label": "restricted/mixed evidence", "contrasts": len(intervals), "unanswered": silent,
                "why": "every interval is inside [-2, 2], but where most answers are INVALID an interval near 0 "
                       "is the absence of answers, not stability"}
    return {"label": "restricted/mixed evidence", "contrasts": len(intervals),
            **({"unanswered": silent} if silent else {})}


UNANSWERED_INVALID_SHARE = 0.5  # a format whose primary answers are mostly INVALID says nothing about evidence


def unanswered_formats(panels: Sequence[dict]) -> list[dict]:
    """(dataset, model, format, invalid share) where more than half of a panel's primary answers in that
    format are INVALID (``diagnostics``: per format/budget/source/decoding, ``n`` and ``invalid_rate``)."""
    out = []
    for p in panels:
        counts: dict[str, list[float]] = {}
        for key, d in (p.get("diagnostics") or {}).items():
            if d.get("n") and d.get("invalid_rate") is not None:
                c = counts.setdefault(key.split("/")[0], [0.0, 0.0])
                c[0] += d["n"] * d["invalid_rate"] / 100.0
                c[1] += d["n"]
        for fmt, (invalid, n) in sorted(counts.items()):
            if n and invalid / n > UNANSWERED_INVALID_SHARE:
                out.append({"dataset": p["dataset"], "model": p["model"], "format": fmt,
                            "invalid_share": round(invalid / n, 4)})
    return out


def check_complete(units: Sequence[dict], answers: dict, sources, budgets, formats, replicates, where: str) -> None:
    """Every primary condition of every unit answered; the first one missing is one line."""
    for u in units:
        for s in sources:
            for b in budgets:
                for f in formats:
                    for r in replicates:
                        if (u["id"], s, b, f, r) not in answers:
                            raise UserError(f"{where}: missing condition: unit {u['id']} source {s} budget {b} "
                                            f"format {f} replicate {r} (finish the study: rerun `fae study`)")
