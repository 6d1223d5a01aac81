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
from fae.intervals import pooled_paired_bootstrap
from fae.study.interfaces import INVALID, study_dataset

BOOTSTRAP_SEED = 20260916  # the paper's NumPy PCG64 seed
DRAWS = 50_000  # the primary family's draws (the paper's)
ALPHA = 0.05
CELL_NAMES = ("S00", "S01", "S10", "S11", "E0", "E1")
CROSSING = ("input_first.input", "input_first.scoring", "scoring_first.scoring", "scoring_first.input")
# The per-claim partition by identical valid answers (Table 20): the E0 and E1 parts of claims whose every unit
# has the same valid answer under both sources (SciFact: all three abstracts), and the share of such claims.
PARTITION_OUTPUTS = ("E0_identical", "E1_identical", "identical_claims")
OUT = {name: i for i, name in enumerate(ACCOUNTING_OUTPUTS + PARTITION_OUTPUTS)}

# Secondary inference (the paper's §6.2-6.3, Appendices K and L): two families beside the primary one, each
# Bonferroni-adjusted over its own comparisons, with its own draws. The paper's draws for both: 10^6, pooled
# from four independently seeded 250,000-draw batches (Appendix K); its K (3 datasets x 2 models) below.
SECONDARY_DRAWS = 1_000_000
SECONDARY_BATCH_DRAWS = 250_000
PAPER_K = {"primary": 12, "exploratory": 60, "post_hoc": 42}
# Exploratory (Table 7 and the supplement's format and endpoint comparisons): D_format and D_context of E1,
# E_avg = (E0 + E1) / 2, both endpoints S00 and S11 and the source gain G = S11 - S00: 10 a panel, 60 for
# the paper's six panels. Post hoc (Tables 8, 24, 28): the four crossed-budget components, the input-scoring
# interaction, and the direct change in E1 - E0 with context and with format: 7 a panel, 42 for six.
EXPLORATORY = ("E1", "E_avg", "S00", "S11", "G")
POST_HOC_ORDERS = ("E1-E0",)
QUANTITY = {"E0": "E0", "E1": "E1", "E_avg": "E_shapley", "S00": "S00", "S11": "S11", "G": "G", "E1-E0": "I"}
# Each secondary batch's seed is drawn from --seed by NumPy's SeedSequence, spawn key (family stream, batch):
# the families' draws are independent of each other and of the primary draw, and reproducible from one seed.
FAMILY_STREAM = {"exploratory": 1, "post_hoc": 2}
# A secondary family computes its draws this many (seed x column) sums at a time (32 MB a batch array), so a
# million draws of a wide panel never sit in memory at once; with the seed axis the compute batch is part of
# the draw (fae.intervals.paired_bootstrap), so it is fixed here, not tuned per machine.
SECONDARY_COMPUTE_ELEMENTS = 4_000_000


def metric_of(dataset: str) -> str:
    """``f1`` for SciFact, ``strict`` for the FEVER-style datasets; an unknown dataset is one line."""
    study_dataset(dataset)
    return "f1" if dataset == "scifact" else "strict"


def eligible(submitted: Sequence[int], groups: Sequence[Sequence[int]], gold: str, metric: str) -> float:
    """Does the submitted evidence hold a complete gold group (strict: a NOT_ENOUGH_INFO gold needs none)?"""
    if metric == "strict" and gold == NOT_ENOUGH_INFO:
        return 1.0
    return float(has_complete_group(submitted, groups, max_evidence=None))


def unit_columns(gold: str, groups, answers: tuple[str, str], submitted: tuple[list, list], metric: str,
                 same_claim: bool | None = None, first_of_claim: bool = True) -> list:
    """One unit's columns of one block (answers of sources 0, 1; submitted evidence of sources 0, 1), then the
    partition columns: the claim count (1 on its first unit), the identical-answer claim count, and
    ``same * a0 * (d1 - d0)``, ``same * a1 * (d1 - d0)``. ``same_claim``: every unit of the unit's claim has
    the same valid answer under both sources (SciFact: a claim's three abstracts together, so the partition
    is per claim); None: this unit alone (a one-unit claim)."""
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
    same = float(answers[0] == answers[1] and answers[0] != INVALID) if same_claim is None else float(same_claim)
    first = float(first_of_claim)
    return cols + [first, first * same, same * a[0] * (d[1] - d[0]), same * a[1] * (d[1] - d[0])]


N_PARTITION_COLUMNS = 4  # claim, identical claim, E0 part, E1 part (unit_columns' last four)


def width(metric: str) -> int:
    """Columns per unit and block for ``metric`` (``strict``: the accounting's, else F1's), partition ones included."""
    return (len(ACCOUNTING_COLUMNS) if metric == "strict" else len(F1_COLUMNS)) + N_PARTITION_COLUMNS


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
        """The index of block (format, input budget ``u``, scoring budget ``v``); ValueError when the panel has none."""
        return self.blocks.index((f, u, v))


def build_sums(units: Sequence[dict], answers: dict, blocks, replicates: Sequence[int], metric: str,
               family_of: Callable[[dict], str], missed: dict[str, int]) -> tuple[np.ndarray, int]:
    """(sums per family, replicate and block column, number of families).

    The identical-answer partition is per claim: a claim's units (SciFact's abstracts) count as identical
    only when every one of them has the same valid answer under both sources in that condition."""
    w = width(metric)
    fams: dict[str, int] = {}
    rows: list[tuple[int, np.ndarray]] = []
    of_claim: dict[str, list[str]] = {}
    for u in units:
        of_claim.setdefault(u["claim_id"], []).append(u["id"])

    def same(claim, x, f, r) -> bool:
        pairs = [(answers[(uid, 0, x, f, r)], answers[(uid, 1, x, f, r)]) for uid in of_claim[claim]]
        return all(a == b and a != INVALID for a, b in pairs)

    for u in units:
        fam = fams.setdefault(family_of(u), len(fams))
        first = of_claim[u["claim_id"]][0] == u["id"]
        cols = np.zeros((len(replicates), len(blocks) * w))
        for ri, r in enumerate(replicates):
            for bi, (f, x, v) in enumerate(blocks):
                ans = (answers[(u["id"], 0, x, f, r)], answers[(u["id"], 1, x, f, r)])
                sub = (u["submitted"][str(v)][0], u["submitted"][str(v)][1])
                cols[ri, bi * w:(bi + 1) * w] = unit_columns(u["gold_label"], u["groups"], ans, sub, metric,
                                                             same(u["claim_id"], x, f, r), first)
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
    """``ACCOUNTING_OUTPUTS`` + ``PARTITION_OUTPUTS`` of one block's sums (last axis), any leading axes.

    The partition's E parts are on the full denominator (n; SciFact P_a + R), so a part and the rest sum to
    the whole, F1 included; ``identical_claims`` is a percentage of claims."""
    core = x[..., :-N_PARTITION_COLUMNS]
    claims, same, e0, e1 = (x[..., i] for i in range(-N_PARTITION_COLUMNS, 0))
    acc = accounting_from_sums(core) if metric == "strict" else corpus_f1_from_sums(core)
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "strict":
            part = [100.0 * e0 / core[..., 0], 100.0 * e1 / core[..., 0]]
        else:
            col = {n: core[..., i] for i, n in enumerate(F1_COLUMNS)}
            part = [200.0 * e0 / (col["p0"] + col["r"]), 200.0 * e1 / (col["p1"] + col["r"])]
        part.append(100.0 * same / claims)
    return np.concatenate([acc, np.stack(part, axis=-1)], axis=-1)


def output_names(panel: Panel) -> list[str]:
    """The statistic's outputs, in order."""
    names = [f"{f}/{b}/{q}" for f in panel.formats for b in panel.budgets for q in CELL_NAMES]
    names += [f"{f}/{b}/E0_identical_answers" for f in panel.formats for b in panel.budgets]
    names += [f"{f}/{b}/E1_identical_answers" for f in panel.formats for b in panel.budgets]
    names += [f"{f}/{b}/identical_claims" for f in panel.formats for b in panel.budgets]
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
            return per[(f, u, v)][..., OUT[name]]

        out = [q(f, b, b, name) for f in fs for b in bs for name in CELL_NAMES]
        out += [q(f, b, b, "E0_identical") for f in fs for b in bs]
        out += [q(f, b, b, "E1_identical") for f in fs for b in bs]
        out += [q(f, b, b, "identical_claims") for f in fs for b in bs]
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
    """The panel's primary contrasts (D_format, D_context) that its grid can measure, in that order."""
    return [n for n in ("D_format", "D_context") if n in output_names(panel)]


def family_names(panel: Panel, family: str) -> list[str]:
    """The comparisons of a secondary family that this panel has (D_format needs both formats, D_context and
    the crossing two budgets): their count, summed over panels, is the family's Bonferroni K."""
    factors = [f for f, ok in (("D_format", len(panel.formats) == 2), ("D_context", len(panel.budgets) >= 2)) if ok]
    if family == "exploratory":
        return [f"{f}/{q}" for f in factors for q in EXPLORATORY]
    if family == "post_hoc":
        crossing = [f"crossing/{c}" for c in (*CROSSING, "interaction")] if len(panel.budgets) >= 2 else []
        return crossing + [f"{f}/{q}" for f in factors[::-1] for q in POST_HOC_ORDERS]
    raise ValueError(f"unknown family {family!r}")


def contrast(panel: Panel, per: dict, name: str) -> np.ndarray:
    """One named comparison from per-block outputs (seed-averaged): ``D_context/Q`` = mean over formats of
    Q(largest budget) - Q(smallest); ``D_format/Q`` = mean over budgets of Q(labels) - Q(codes); ``crossing/X``
    from T(u, v) = E0 with answers at input budget u and evidence at scoring budget v, averaged over formats
    (``interaction`` = T(l,l) - T(l,s) - T(s,l) + T(s,s), the difference between the orders' components)."""
    fs, bs = panel.formats, panel.budgets
    s, l = bs[0], bs[-1]
    factor, _, what = name.partition("/")

    def q(f, u, v, key):
        return per[(f, u, v)][..., OUT[key]]

    if factor == "crossing":
        def t(u, v):
            return np.mean([q(f, u, v, "E0") for f in fs], axis=0)
        parts = {"input_first.input": t(l, s) - t(s, s), "input_first.scoring": t(l, l) - t(l, s),
                 "scoring_first.scoring": t(s, l) - t(s, s), "scoring_first.input": t(l, l) - t(s, l),
                 "interaction": t(l, l) - t(l, s) - t(s, l) + t(s, s)}
        return parts[what]
    key = QUANTITY[what]
    if factor == "D_context":
        return np.mean([q(f, l, l, key) - q(f, s, s, key) for f in fs], axis=0)
    if factor == "D_format":
        return np.mean([q("labels", b, b, key) - q("codes", b, b, key) for b in bs], axis=0)
    raise ValueError(f"unknown comparison {name!r}")


def family_statistic(panel: Panel, names: Sequence[str]) -> Callable[[np.ndarray], np.ndarray]:
    """Sums (..., seeds, columns) -> the named comparisons (..., q): only these are drawn, so a family's
    million draws hold q outputs, not every output of the panel."""
    w = width(panel.metric)
    crossed = any(n.startswith("crossing/") for n in names)  # else only the blocks with u = v are read
    used = [(i, blk) for i, blk in enumerate(panel.blocks) if crossed or blk[1] == blk[2]]

    def stat(x: np.ndarray) -> np.ndarray:
        per = {blk: block_outputs(x[..., i * w:(i + 1) * w], panel.metric).mean(axis=-2) for i, blk in used}
        return np.stack([contrast(panel, per, n) for n in names], axis=-1)

    return stat


def family_batches(family: str, draws: int, seed: int) -> list[tuple[int, int]]:
    """(draws, seed) per batch. The primary family: one batch with ``seed`` itself (the paper's draw). A
    secondary family: batches of at most ``SECONDARY_BATCH_DRAWS``, batch b seeded with the first word of
    ``SeedSequence(seed, spawn_key=(FAMILY_STREAM[family], b))``."""
    if family == "primary":
        return [(draws, seed)]
    sizes = [SECONDARY_BATCH_DRAWS] * (draws // SECONDARY_BATCH_DRAWS)
    sizes += [draws % SECONDARY_BATCH_DRAWS] if draws % SECONDARY_BATCH_DRAWS else []
    return [(n, int(np.random.SeedSequence(seed, spawn_key=(FAMILY_STREAM[family], b)).generate_state(1)[0]))
            for b, n in enumerate(sizes)]


def family_level(k: int) -> dict:
    """The Bonferroni level of a family of ``k`` comparisons: confidence 1 - 0.05/K, tails 0.05/(2K)."""
    k = max(k, 1)
    return {"bonferroni_k": k, "confidence": 1 - ALPHA / k, "tail": ALPHA / (2 * k),
            "bounds": [ALPHA / (2 * k), 1 - ALPHA / (2 * k)]}


def secondary_compute_batch(panel: Panel) -> int:
    """Draws a secondary family computes at a time: ``SECONDARY_COMPUTE_ELEMENTS`` over the wider of a draw's
    unit counts and its (seed x column) sums."""
    _, n_seeds, n_cols = panel.sums[:, 1:, :].shape
    return max(1, SECONDARY_COMPUTE_ELEMENTS // max(panel.sums.shape[0], n_seeds * n_cols, 1))


def _bootstrap(panel: Panel, stat, n_outputs: int, k: int, batches: list[tuple[int, int]], option: str,
               compute_batch: int | None = None):
    """The family x seed bootstrap of ``stat`` at the level of ``k`` comparisons (None without draws, seeds
    or two families); ``compute_batch`` None keeps :func:`fae.intervals.paired_bootstrap`'s own batching
    (the primary family's recorded draw)."""
    sampled = panel.sums[:, 1:, :]
    draws = sum(n for n, _ in batches)
    if not (sampled.shape[1] and sampled.shape[0] >= 2 and draws):
        return None
    check_draws_fit(n_outputs, draws, option, max(n for n, _ in batches) if len(batches) > 1 else None)
    if sampled.shape[1] >= 2:
        sums, st = sampled, stat
    else:
        sums, st = sampled[:, 0, :], (lambda x: stat(x[..., None, :]))
    return pooled_paired_bootstrap(sums, st, batches=batches, confidence=family_level(k)["confidence"],
                                   batch_draws=compute_batch)


def _values(panel: Panel, names: Sequence[str], stat, res) -> dict:
    """Per name: the sampled-seed mean, greedy, each seed's value, agreeing seed signs and the interval."""
    sampled = panel.sums[:, 1:, :]
    total = panel.sums.sum(axis=0)
    greedy = stat(total[0:1])
    per_seed = [stat(total[1 + s:2 + s]) for s in range(sampled.shape[1])]
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
    return values


def analyse_panel(panel: Panel, n_primary: int, draws: int, seed: int = BOOTSTRAP_SEED) -> dict:
    """Point estimates (sampled mean, greedy, each seed), seed signs and the Bonferroni-adjusted intervals."""
    names = output_names(panel)
    stat = statistic(panel)
    res = _bootstrap(panel, stat, len(names), n_primary, family_batches("primary", draws, seed), "--draws")
    level = family_level(n_primary)
    return {"dataset": panel.dataset, "model": panel.model, "metric": panel.metric, "units": panel.n_units,
            "families": int(panel.sums.shape[0]), "seeds": len(panel.replicates),
            "bootstrap": {"draws": draws if res is not None else 0, "generator": "PCG64", "seed": seed,
                          "confidence": level["confidence"], "bonferroni_k": n_primary, "bounds": level["bounds"]},
            "values": _values(panel, names, stat, res), "primary": primary_names(panel), "notes": panel.notes}


def analyse_family(panel: Panel, family: str, k: int, draws: int, seed: int = BOOTSTRAP_SEED,
                   option: str = "--draws") -> dict:
    """A secondary family's comparisons in one panel: estimates, seed signs, and intervals at the family's
    own level (``k`` = its comparisons over every panel) from its own independently seeded batches."""
    names = family_names(panel, family)
    stat = family_statistic(panel, names)
    batches = family_batches(family, draws, seed)
    res = _bootstrap(panel, stat, len(names), k, batches, option, secondary_compute_batch(panel)) if names else None
    return {"comparisons": names, "draws": draws if res is not None else 0,
            "values": _values(panel, names, stat, res) if names else {},
            "batch_endpoints": batch_endpoints(names, res)}


def batch_endpoints(names: Sequence[str], res) -> dict:
    """Per comparison, each batch's own lower and upper percentile endpoints at the family's level, in the
    order of the family's batches (the paper's Table 27): the Monte Carlo spread behind the pooled interval.
    They are the bounds every batch's draws already gave (:func:`fae.intervals.pooled_paired_bootstrap`),
    so nothing is drawn again; empty without an interval."""
    if res is None or res.batch_bounds is None:
        return {}
    return {n: [{"ci_low": _clean(lo[i]), "ci_high": _clean(hi[i])} for lo, hi in res.batch_bounds]
            for i, n in enumerate(names)}


def check_draws_fit(n_outputs: int, draws: int, option: str = "--draws", batch: int | None = None) -> None:
    """Refuse a bootstrap whose draws cannot sit in the free memory (every draw of every output is kept, and
    scipy copies it; pooled batches keep the pool and one batch's copies): one line naming the option, before
    anything is drawn."""
    need = 3 * 8 * n_outputs * (batch or draws) + (8 * n_outputs * draws if batch else 0)
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: the field's max alone
        return
    if need > free:
        raise UserError(f"{option} {draws}: the bootstrap of {n_outputs} outputs would hold about "
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


def submitted_of(unit: dict, source: int, budget: int) -> list[int]:
    """The evidence ``source`` submits for scoring at ``budget`` (units.jsonl), the scorer's prefix."""
    return unit["submitted"][str(budget)][source]


def claim_eligibility(units: Sequence[dict], metric: str, sources: Sequence[int], budgets: Sequence[int],
                      evidence: Callable[[dict, int, int], Sequence[int]] = submitted_of) -> dict:
    """claim -> {(source, budget): its eligible units}, by :func:`eligible` on ``evidence(unit, source,
    budget)`` (default the submitted prefix). The one per-claim count behind the eligibility profiles, the
    visible ones and the group where source 1 adds eligibility, so the three cannot drift apart."""
    count: dict[str, dict[tuple[int, int], float]] = {}
    for u in units:
        row = count.setdefault(u["claim_id"], {(s, b): 0.0 for s in sources for b in budgets})
        for s in sources:
            for b in budgets:
                row[(s, b)] += eligible(evidence(u, s, b), u["groups"], u["gold_label"], metric)
    return count


def eligibility_profiles(units: Sequence[dict], metric: str, sources: Sequence[int], budgets: Sequence[int],
                         evidence: Callable[[dict, int, int], Sequence[int]] = submitted_of) -> dict:
    """Per source x budget, how much submitted evidence is eligible, counted per claim (Figure 2, Appendix J),
    and per claim how eligibility changes from source 0 to source 1 over the budgets.

    A claim's count is its eligible units: 0 or 1 for FEVER-style datasets (a NOT_ENOUGH_INFO gold is
    eligible: it needs no evidence), its eligible retrieved abstracts for SciFact (an abstract without a
    gold rationale is never eligible; gold abstracts retrieval missed are no units and count nothing). A
    *gain*: source 1's count is higher at one or both budgets and lower at neither; a *loss* the reverse;
    *mixed* higher at one, lower at another; else *unchanged*. Answers play no part: these describe the
    evidence the sources submit, the same for every model. ``evidence``: which ids are judged, the submitted
    prefix by default; the evidence shown to the model gives the visible profile (Appendix J: what the model
    saw is not what the scorer received)."""
    count = claim_eligibility(units, metric, sources, budgets, evidence)
    n = len(count)
    profiles = [{"source": s, "budget": b, "claims": n, "eligible": sum(c[(s, b)] for c in count.values()),
                 "per_claim": sum(c[(s, b)] for c in count.values()) / n if n else None}
                for s in sources for b in budgets]
    changes: dict[str, list[str]] = {"gain": [], "loss": [], "mixed": [], "unchanged": []}
    if len(sources) >= 2:
        s0, s1 = sources[0], sources[-1]
        for claim, c in sorted(count.items()):
            up = any(c[(s1, b)] > c[(s0, b)] for b in budgets)
            down = any(c[(s1, b)] < c[(s0, b)] for b in budgets)
            changes["mixed" if up and down else "gain" if up else "loss" if down else "unchanged"].append(claim)
    return {"unit": "eligible abstracts per claim" if metric == "f1" else "claims with eligible evidence",
            "profiles": profiles, "changes": {k: len(v) for k, v in changes.items()},
            "gain_claims": changes["gain"], "loss_claims": changes["loss"]}


def visible_not_submitted(units: Sequence[dict], metric: str, sources: Sequence[int], budgets: Sequence[int],
                          shown: Callable[[dict, int, int], Sequence[int]]) -> dict:
    """Presentations (unit x source x budget; SciFact a claim-abstract pair) whose shown evidence is eligible
    while the submitted prefix is not: a complete gold group the model saw but the scorer never received
    (the paper's 497 FEVEROUS presentations, Appendix J). Per source x budget and in all; :func:`eligible`
    judges both sides, so a NOT_ENOUGH_INFO gold (eligible either way) never counts."""
    rows = []
    for s in sources:
        for b in budgets:
            hit = sum(eligible(shown(u, s, b), u["groups"], u["gold_label"], metric)
                      > eligible(submitted_of(u, s, b), u["groups"], u["gold_label"], metric) for u in units)
            rows.append({"source": s, "budget": b, "presentations": len(units), "count": int(hit)})
    return {"presentations": sum(r["presentations"] for r in rows), "count": sum(r["count"] for r in rows),
            "conditions": rows}


def _on_denominator(part: np.ndarray, total: np.ndarray, metric: str, n_blocks: int) -> np.ndarray:
    """``part``'s sums with ``total``'s denominator columns in every block (strict n; F1 n, P0, P1, R): its
    cells and E0 are then the part's contribution on the full denominator, and a part and the rest add up."""
    w = width(metric)
    den = [0] if metric == "strict" else [F1_COLUMNS.index(c) for c in ("n", "p0", "p1", "r")]
    out = part.copy()
    for bi in range(n_blocks):
        for c in den:
            out[..., bi * w + c] = total[..., bi * w + c]
    return out


def added_eligibility(units: Sequence[dict], answers: dict, metric: str, formats: Sequence[str],
                      budgets: Sequence[int], replicates: Sequence[int], missed: dict[str, int]) -> dict:
    """Where source 1 adds eligibility (the paper's Table 9, post hoc): the claims whose source-1 count of
    eligible units (:func:`claim_eligibility`, submitted evidence) exceeds source 0's at the smallest
    budget, at the largest, at both, and their union; within the union's units the answer accuracy (label
    equals gold, INVALID wrong) of the answers made with each source's evidence at each budget, the mean over
    formats and the sampled ``replicates``; and the union's part of E0 on the full denominator (n; SciFact
    P0 + R) at each budget (input = scoring budget) and of the input component at each scoring budget v,
    E0(largest input, v) - E0(smallest input, v) (the paper's 1.065 and 1.085 points), each the mean over
    formats of the seed-averaged value, beside the other claims' part and the whole (the two parts add up to
    it). The group is chosen from submitted evidence alone, the same for every model of a dataset: the
    answers only fill in its accuracies and contributions, so it localizes a change in E0 without selecting
    claims by their outcome."""
    sources = (0, 1)
    small, large = budgets[0], budgets[-1]
    decoding = "sampled" if replicates else "greedy"  # a study without seeds: its greedy answers
    replicates = list(replicates) or [0]
    count = claim_eligibility(units, metric, sources, budgets)
    adds = {b: {c for c, n in count.items() if n[(1, b)] > n[(0, b)]} for b in (small, large)}
    union = adds[small] | adds[large]
    group = [u for u in units if u["claim_id"] in union]
    rest = [u for u in units if u["claim_id"] not in union]

    def accuracy(s, b):
        hits = [answers[(u["id"], s, b, f, r)] == u["gold_label"] for u in group for f in formats for r in replicates]
        return 100.0 * float(np.mean(hits)) if hits else None

    blocks = [(f, x, v) for f in formats for x in budgets for v in budgets]
    w = width(metric)

    def sums(of, miss):
        return build_sums(of, answers, blocks, replicates, metric, lambda u: "all", miss)[0][0]

    total = sums(units, missed)
    # each part's numerators over the whole's denominators (a missed abstract is in R alone: the whole's)
    part, others = (_on_denominator(sums(x, {}) if x else np.zeros_like(total), total, metric, len(blocks))
                    for x in (group, rest))

    def e0(x, u, v):  # the mean over formats of the seed-averaged E0 with answers at u, evidence at v
        i = [blocks.index((f, u, v)) for f in formats]
        return float(np.mean([block_outputs(x[..., j * w:(j + 1) * w], metric).mean(axis=-2)[OUT["E0"]] for j in i]))

    def split(fn):
        return {"group": _clean(fn(part)), "rest": _clean(fn(others)), "total": _clean(fn(total))}

    return {"smallest_budget": small, "largest_budget": large, "decoding": decoding, "claims": len(count),
            "adds_smallest": len(adds[small]), "adds_largest": len(adds[large]),
            "adds_both": len(adds[small] & adds[large]), "union": len(union), "union_units": len(group),
            "union_claims": sorted(union),
            "accuracy": {f"source{s}": {str(b): accuracy(s, b) for b in budgets} for s in sources},
            "E0": {str(b): split(lambda x, b=b: e0(x, b, b)) for b in budgets},
            "input_component": {str(v): split(lambda x, v=v: e0(x, large, v) - e0(x, small, v)) for v in budgets}
            if len(budgets) >= 2 else {}}


def truncated_invalid(lines: Sequence[dict], formats: Sequence[str]) -> dict:
    """Per format, the INVALID primary responses and those of them cut off at the generation limit
    (``finish_reason == "length"``; the paper's Table 22): their count and share of the INVALID ones, sampled
    replicates alone and greedy included. Only INVALID responses are the denominator: the question is how
    much of the format failure the token limit explains. ``unknown``: INVALID lines without a finish reason."""
    out = {f: {k: {"invalid": 0, "length": 0, "unknown": 0} for k in ("sampled", "all")} for f in formats}
    for x in lines:
        if x["kind"] != "primary" or x["answer"] != INVALID:
            continue
        for k in ("sampled", "all") if x["replicate"] else ("all",):
            row = out[x["format"]][k]
            row["invalid"] += 1
            row["length"] += x.get("finish_reason") == "length"
            row["unknown"] += x.get("finish_reason") is None
    for f in out.values():
        for row in f.values():
            row["length_share"] = 100.0 * row["length"] / row["invalid"] if row["invalid"] else None
    return out


def invalid_observations(units: Sequence[dict], answers: dict, formats: Sequence[str], budgets: Sequence[int],
                         replicates: Sequence[int], sources: Sequence[int] = (0, 1)) -> dict:
    """Per format, claim-condition observations (claim x budget x replicate) flagged when any of their
    responses is INVALID: both sources and, for SciFact, every abstract of the claim (the paper's Table 25).
    ``sampled``: the sampled replicates; ``all``: greedy too (the paper pools its six replicates). A claim
    contributes one observation per budget and replicate however many units it has, so a rate per response
    would weigh SciFact's claims by their abstracts."""
    of_claim: dict[str, list[str]] = {}
    for u in units:
        of_claim.setdefault(u["claim_id"], []).append(u["id"])
    out = {}
    for f in formats:
        rows = {k: {"observations": 0, "flagged": 0} for k in ("sampled", "all")}
        for ids in of_claim.values():
            for b in budgets:
                for r in replicates:
                    flagged = any(answers[(uid, s, b, f, r)] == INVALID for uid in ids for s in sources)
                    for k in ("sampled", "all") if r else ("all",):
                        rows[k]["observations"] += 1
                        rows[k]["flagged"] += flagged
        for row in rows.values():
            row["rate"] = 100.0 * row["flagged"] / row["observations"] if row["observations"] else None
        out[f] = rows
    return out
