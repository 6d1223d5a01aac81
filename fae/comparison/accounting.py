"""Answer/evidence score accounting between two verifiers (SPEC §8).

Paper: "What Changes When Fact-Verification Scores Improve?". For two systems
0 and 1 with saved answers (labels) and submitted evidence (cited ids) on the
same claims, ``S_ab`` is the corpus score (0-100) of system a's answers scored
with system b's evidence. Because answer correctness and evidence eligibility
factorise per claim (``score_i = a_i * d_i``), every cell is a mean of
products of four per-claim indicators ``a0, a1, d0, d1``:

    S_ab = 100 * mean(a_a * d_b)
    G  = S11 - S00 = E0 + A1 = A0 + E1
    E0 = S01 - S00,  A1 = S11 - S01,  A0 = S10 - S00,  E1 = S11 - S10,
    I  = E1 - E0
    E0 = 100 * [mean(a0) * mean(d1 - d0) + Cov_n(a0, d1 - d0)]   (same for E1 with a1)

Uncertainty: a paired bootstrap over claims (or over whole claim families):
one set of resampled units per draw, shared by every quantity, percentile
intervals via ``scipy.stats.bootstrap`` (:func:`fae.intervals.paired_bootstrap`; :mod:`fae.intervals`' docstring
states the project's one interval convention). All statistics here are functions of
per-unit *sums* of per-claim columns, so resampling families (units of
unequal size) is exact: a drawn family contributes its claims' sums and its
claim count, and each statistic is recomputed as a ratio of resampled sums.

Everything in this module is pure (no files, no printing) and tested in
``tests/test_accounting.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from real_fae_core.labels import NOT_ENOUGH_INFO as NEI
from real_fae_core.labels import REFUTE, SUPPORT
from fae.ablation.metrics import (
    cites_gold,
    gold_union,
    has_complete_group,
    is_flip,
    is_valid,
    named_ids,
    round_label,
)
from fae.ablation.population import fae_claims, is_nei
from fae.ablation.scores import end_state_retention, ideal_offset, immediate_sensitivity, safe_ratio
from fae.intervals import BootstrapResult, paired_bootstrap, unit_index, unit_sums  # noqa: F401 - re-exported

# An answer is correct when its label equals gold (invalid answers are wrong): the one
# definition of metrics.json, so accounting and metrics can never disagree on a claim.
from fae.ablation.metrics import same_label as label_correct

METRICS = ("strict", "fever_score", "label_accuracy")

CELLS = ("S00", "S01", "S10", "S11")
COMPONENTS = ("G", "E0", "A1", "A0", "E1", "I")
QUANTITIES = CELLS + COMPONENTS

# What each quantity means, in the paper's Table 3 wording.
DESCRIPTIONS = {
    "S00": "answers 0, evidence 0 (original endpoint)",
    "S01": "answers 0, evidence 1 (evidence replaced)",
    "S10": "answers 1, evidence 0 (answers replaced)",
    "S11": "answers 1, evidence 1 (new endpoint)",
    "G": "Total source gain",
    "E0": "Evidence replaced first",
    "A1": "Answers replaced second",
    "A0": "Answers replaced first",
    "E1": "Evidence replaced second",
    "I": "Difference between orders",
}


# ---------------------------------------------------------------------------
# Per-claim indicators
# ---------------------------------------------------------------------------


def fae_claim_order(order: Sequence[str], claims: Mapping[str, Mapping]) -> tuple[list[str], int]:
    """The claim ids of ``order`` that FAE evaluates (gold SUPPORT/REFUTE) and how many were left out.

    The same claim set as ``metrics.json`` (:func:`fae.ablation.population.fae_claims`):
    runs made before ``fae run`` skipped NOT_ENOUGH_INFO-gold claims still hold them.
    """
    kept, n_nei = fae_claims([{"id": cid, "gold_label": claims[cid]["gold_label"]} for cid in order])
    return [c["id"] for c in kept], n_nei


def evidence_eligible(
    cited: Sequence[int],
    gold_groups: Sequence[Sequence[int]],
    gold_label: str,
    metric: str,
) -> bool:
    """Does the submitted evidence satisfy ``metric``'s evidence requirement for the gold answer?

    - ``strict``: at least one gold sentence (any group) among the cited ids (SPEC §6).
    - ``fever_score``: one complete gold group within the first 5 cited ids
      (the official FEVER scorer's ``max_evidence=5``).
    - ``label_accuracy``: no evidence requirement (always eligible).

    NOT_ENOUGH_INFO-gold claims have nothing to cite: as in the FEVER scorer, a
    correct label suffices, so they are always eligible (for both metrics).
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if metric == "label_accuracy" or is_nei(gold_label):
        return True
    if metric == "strict":
        return cites_gold(cited, gold_groups)
    return has_complete_group(cited, gold_groups)


def claim_score(label, cited, gold_label, gold_groups, metric) -> bool:
    """The per-claim score of one (answer, evidence) pair: correct AND eligible."""
    return label_correct(label, gold_label) and evidence_eligible(cited, gold_groups, gold_label, metric)


@dataclass(frozen=True)
class Indicators:
    """Per-claim 0/1 arrays: answer correctness ``a0, a1`` and evidence eligibility ``d0, d1``."""

    a0: np.ndarray
    a1: np.ndarray
    d0: np.ndarray
    d1: np.ndarray

    def __post_init__(self):
        n = len(self.a0)
        for name in ("a1", "d0", "d1"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"indicator {name} has length {len(getattr(self, name))}, expected {n}")

    def __len__(self) -> int:
        return len(self.a0)


def indicators_from_answers(
    gold_labels: Sequence[str],
    gold_groups: Sequence[Sequence[Sequence[int]]],
    labels0: Sequence[str | None],
    cited0: Sequence[Sequence[int]],
    labels1: Sequence[str | None],
    cited1: Sequence[Sequence[int]],
    metric: str,
) -> Indicators:
    """Build ``a0, a1, d0, d1`` from two systems' saved answers on the same claims (same order)."""
    n = len(gold_labels)
    for name, seq in (("gold_groups", gold_groups), ("labels0", labels0), ("cited0", cited0),
                      ("labels1", labels1), ("cited1", cited1)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries, expected {n}")
    f = np.array
    return Indicators(
        a0=f([label_correct(l, g) for l, g in zip(labels0, gold_labels)], dtype=float),
        a1=f([label_correct(l, g) for l, g in zip(labels1, gold_labels)], dtype=float),
        d0=f([evidence_eligible(c, gg, g, metric) for c, gg, g in zip(cited0, gold_groups, gold_labels)],
             dtype=float),
        d1=f([evidence_eligible(c, gg, g, metric) for c, gg, g in zip(cited1, gold_groups, gold_labels)],
             dtype=float),
    )


# ---------------------------------------------------------------------------
# Point estimates
# ---------------------------------------------------------------------------


def decompose(cells: Mapping[str, float]) -> dict[str, float]:
    """G, E0, A1, A0, E1, I from the four cells (works on arrays too, elementwise)."""
    s00, s01, s10, s11 = (cells[k] for k in CELLS)
    e0, a1 = s01 - s00, s11 - s01
    a0, e1 = s10 - s00, s11 - s10
    return {"G": s11 - s00, "E0": e0, "A1": a1, "A0": a0, "E1": e1, "I": e1 - e0}


def product_covariance(a: np.ndarray, d0: np.ndarray, d1: np.ndarray) -> dict[str, float]:
    """Split the fixed-answer evidence gain ``100*mean(a*(d1-d0))`` into product and covariance.

    ``100*mean(a*Δd) = 100*mean(a)*mean(Δd) + 100*Cov_n(a, Δd)`` with the
    population (ddof=0) covariance, so the two terms add up exactly. The
    product is what marginal accuracy and eligibility rates predict; the
    covariance is what they miss (which claims combine a correct answer with an
    evidence change).
    """
    a, delta = np.asarray(a, float), np.asarray(d1, float) - np.asarray(d0, float)
    product = 100.0 * float(a.mean() * delta.mean())
    cov = 100.0 * float(np.mean((a - a.mean()) * (delta - delta.mean())))
    return {
        "answer_accuracy": 100.0 * float(a.mean()),
        "eligibility_change": 100.0 * float(delta.mean()),
        "product": product,
        "covariance": cov,
        "total": 100.0 * float(np.mean(a * delta)),
    }


def per_label_contributions(ind: Indicators, gold_labels: Sequence[str]) -> dict[str, dict[str, float]]:
    """Each gold label's share of every cell and of G, on the full-population denominator.

    Columns sum over labels to the overall scores (paper Table 14).
    """
    gold = np.asarray(gold_labels)
    n = len(gold)
    cells_full = {f"S{x}{y}": getattr(ind, f"a{x}") * getattr(ind, f"d{y}") for x in "01" for y in "01"}
    out: dict[str, dict[str, float]] = {}
    for label in [lab for lab in (SUPPORT, REFUTE, NEI) if lab in set(gold)] + sorted(
        set(gold) - {SUPPORT, REFUTE, NEI}
    ):
        mask = gold == label
        row = {k: 100.0 * float(v[mask].sum()) / n for k, v in cells_full.items()}
        row.update(decompose(row))
        out[label] = {"n_claims": int(mask.sum()), **row}
    return out


# ---------------------------------------------------------------------------
# Sufficient sums: every statistic is a function of per-unit column sums
# ---------------------------------------------------------------------------

ACCOUNTING_COLUMNS = ("n", "a0", "a1", "d0", "d1", "a0d0", "a0d1", "a1d0", "a1d1")


def accounting_columns(ind: Indicators) -> np.ndarray:
    """Per-claim columns (n_claims, 9) whose sums determine every accounting quantity."""
    one = np.ones(len(ind))
    return np.column_stack([
        one, ind.a0, ind.a1, ind.d0, ind.d1,
        ind.a0 * ind.d0, ind.a0 * ind.d1, ind.a1 * ind.d0, ind.a1 * ind.d1,
    ])


ACCOUNTING_OUTPUTS = QUANTITIES + (
    "E0_product", "E0_covariance", "E1_product", "E1_covariance",
    "accuracy0", "accuracy1", "eligibility0", "eligibility1", "E_shapley", "A_shapley",
)


def accounting_from_sums(sums: np.ndarray) -> np.ndarray:
    """All accounting outputs (``ACCOUNTING_OUTPUTS`` order, last axis) from column sums (last axis).

    Vectorised over leading axes so it serves both the point estimate and every
    bootstrap draw at once.
    """
    s = np.asarray(sums, float)
    n = s[..., 0]
    m = {name: s[..., i] / n for i, name in enumerate(ACCOUNTING_COLUMNS) if name != "n"}
    cells = {"S00": m["a0d0"], "S01": m["a0d1"], "S10": m["a1d0"], "S11": m["a1d1"]}
    cells = {k: 100.0 * v for k, v in cells.items()}
    comp = decompose(cells)
    dd = m["d1"] - m["d0"]
    e0_prod = 100.0 * m["a0"] * dd
    e1_prod = 100.0 * m["a1"] * dd
    out = [cells[k] for k in CELLS] + [comp[k] for k in COMPONENTS] + [
        e0_prod, comp["E0"] - e0_prod, e1_prod, comp["E1"] - e1_prod,
        100.0 * m["a0"], 100.0 * m["a1"], 100.0 * m["d0"], 100.0 * m["d1"],
        (comp["E0"] + comp["E1"]) / 2.0, (comp["A0"] + comp["A1"]) / 2.0,
    ]
    return np.stack(out, axis=-1)


# The corpus F1 of SciFact (abstract-rationalized, SPEC §10): S_ab = 2 C_ab / (P_a + R), with C_ab the
# abstracts whose answer a is a correct SUPPORT/REFUTE and whose evidence b holds a complete rationale,
# P_a the abstracts answer a submits (not NEI, not invalid), R the relevant gold abstracts (retrieval
# misses included). Not a mean of per-claim products, so it has columns of its own; the same cells then go
# through the same decomposition, and the evidence terms split as E0 = k0 * 100 * [mean(a0) mean(Δd) +
# Cov_n(a0, Δd)] with k0 = 2n / (P0 + R).
F1_COLUMNS = ("n", "p0", "p1", "r", "a0", "a1", "d0", "d1", "a0d0", "a0d1", "a1d0", "a1d1")


def corpus_f1_from_sums(sums: np.ndarray) -> np.ndarray:
    """The ``ACCOUNTING_OUTPUTS`` of corpus F1 from ``F1_COLUMNS`` sums (last axis; leading axes vectorised)."""
    s = np.asarray(sums, float)
    col = {name: s[..., i] for i, name in enumerate(F1_COLUMNS)}
    n = col["n"]
    with np.errstate(divide="ignore", invalid="ignore"):
        den = {x: col[f"p{x}"] + col["r"] for x in "01"}
        cells = {f"S{x}{y}": 200.0 * col[f"a{x}d{y}"] / den[x] for x in "01" for y in "01"}
        comp = decompose(cells)
        m = {k: col[k] / n for k in ("a0", "a1", "d0", "d1")}
        dd = m["d1"] - m["d0"]
        k = {x: 2.0 * n / den[x] for x in "01"}
        e0_prod, e1_prod = k["0"] * 100.0 * m["a0"] * dd, k["1"] * 100.0 * m["a1"] * dd
    out = [cells[c] for c in CELLS] + [comp[c] for c in COMPONENTS] + [
        e0_prod, comp["E0"] - e0_prod, e1_prod, comp["E1"] - e1_prod,
        100.0 * m["a0"], 100.0 * m["a1"], 100.0 * m["d0"], 100.0 * m["d1"],
        (comp["E0"] + comp["E1"]) / 2.0, (comp["A0"] + comp["A1"]) / 2.0,
    ]
    return np.stack(out, axis=-1)


# ---------------------------------------------------------------------------
# Units (claims or families) and the paired bootstrap
# ---------------------------------------------------------------------------


# The unit bootstrap itself lives in fae.intervals (every interval of the project comes from there);
# its names stay importable from here, where `fae compare` and the study report reach them.


# ---------------------------------------------------------------------------
# Run-level FAE metrics from per-claim contributions (SPEC §6), for paired comparison
# ---------------------------------------------------------------------------
#
# Same definitions and populations as ``fae.ablation.metrics`` (which computes
# metrics.json), but split into per-claim columns whose sums determine each
# metric, so a bootstrap draw can recompute every metric — including ratios
# of means such as IS = 1 - a_1/a_0 — from the drawn claims.


def run_metric_names(n_rounds: int) -> list[str]:
    """Metrics computed by ``run_metrics_from_sums`` for runs with R = n_rounds rounds after round 0."""
    names = ["label_accuracy", "strict_accuracy", "fever_score",
             "evidence_precision", "evidence_recall", "evidence_f1"]
    if n_rounds >= 1:
        names += ["IS", "ER", "IO", "flip_rate", "any_flip_rate"]
    names += [f"round_accuracy_{r}" for r in range(n_rounds + 1)]
    names += [f"invalid_rate_{r}" for r in range(n_rounds + 1)]
    names += [f"hallucinated_id_rate_{r}" for r in range(n_rounds + 1)]
    return names


def run_metric_columns(claims: Sequence[Mapping], n_rounds: int) -> np.ndarray:
    """Per-claim columns (n_claims, 11 + 4(R+1)) whose sums give every run metric.

    ``claims`` are claims.jsonl entries (``gold_label``, ``gold_groups``,
    ``rounds``). Columns: 1, evidence-claim flag e, a_0..a_R, correct_0,
    strict_0, fever_0, |named ∩ E*|, |named|, |E*|, flips, transitions,
    any flip, invalid_r (R+1), hallucinated ids_r (R+1), named ids_r (R+1).
    A NOT_ENOUGH_INFO-gold claim (an old run's) gets a row of zeros: like
    ``fae.ablation.metrics``, every metric leaves it out (SPEC §1).
    """
    rows = []
    for c in claims:
        rounds = c["rounds"]
        if len(rounds) < n_rounds + 1:
            raise ValueError(f"claim {c.get('id')!r} has {len(rounds)} rounds, expected {n_rounds + 1}")
        rounds = rounds[: n_rounds + 1]
        gold_label, groups = c["gold_label"], c["gold_groups"]
        e = 0.0 if is_nei(gold_label) else 1.0
        labels = [round_label(r) for r in rounds]
        acc = [float(label_correct(l, gold_label)) for l in labels]
        r0 = rounds[0]
        named0 = named_ids(r0)
        gold = gold_union(c)
        flips = sum(is_flip(prev, cur) for prev, cur in zip(labels[:-1], labels[1:]))
        rows.append([e * x for x in (
             1.0, e, *(e * a for a in acc), acc[0],
             float(claim_score(labels[0], r0.get("cited") or [], gold_label, groups, "strict")),
             float(claim_score(labels[0], named0, gold_label, groups, "fever_score")),
             e * len(set(named0) & gold), e * len(set(named0)), e * len(gold),
             e * flips, e * n_rounds, e * float(flips > 0),
             *(float(not is_valid(r)) for r in rounds),
             *(float(len(r.get("hallucinated") or [])) for r in rounds),
             *(float(len(r.get("cited") or []) + len(r.get("hallucinated") or [])) for r in rounds))])
    width = 11 + 4 * (n_rounds + 1)
    return np.array(rows, float).reshape(-1, width)



def run_metrics_from_sums(sums: np.ndarray, n_rounds: int) -> np.ndarray:
    """Run metrics (``run_metric_names`` order, x100) from summed columns; vectorised over leading axes.

    One population as in ``fae.ablation.metrics``: SUPPORT/REFUTE-gold claims.
    IS = 1 - a_1/a_0, ER = 1 - a_R/a_0, IO = 1 - mean_{r>=1} a_r, all three
    undefined (NaN) when a_0 = 0 (or there are no claims).
    Precision/recall are micro over named ids (0 when nothing was named);
    hallucinated-id rate = hallucinated ids / named ids per round.
    """
    s = np.asarray(sums, float)
    R = n_rounds
    n, ev = s[..., 0], s[..., 1]
    acc = [safe_ratio(s[..., 2 + r], ev) for r in range(R + 1)]
    k = 3 + R
    label_acc, strict, fever = safe_ratio(s[..., k], n), safe_ratio(s[..., k + 1], n), safe_ratio(s[..., k + 2], n)
    tp, named, gold = s[..., k + 3], s[..., k + 4], s[..., k + 5]
    flips, transitions, anyflip = s[..., k + 6], s[..., k + 7], s[..., k + 8]
    base = k + 9
    invalid = [safe_ratio(s[..., base + r], n) for r in range(R + 1)]
    halluc = [safe_ratio(s[..., base + (R + 1) + r], s[..., base + 2 * (R + 1) + r], 0.0) for r in range(R + 1)]
    prec = safe_ratio(tp, named, 0.0)
    rec = safe_ratio(tp, gold, 0.0)
    f1 = safe_ratio(2 * prec * rec, prec + rec, 0.0)
    out = [label_acc, strict, fever, prec, rec, f1]
    if R >= 1:
        out += [immediate_sensitivity(acc[0], acc[1]), end_state_retention(acc[0], acc[R]),
                ideal_offset(acc[0], sum(acc[1:]) / R),  # NaN a_0 compares False: undefined
                safe_ratio(flips, transitions), safe_ratio(anyflip, ev)]
    out += acc + invalid + halluc
    return 100.0 * np.stack(out, axis=-1)


def as_interval_dict(estimate: float, low: float, high: float) -> dict[str, float | None]:
    """JSON-safe ``{"estimate", "ci_low", "ci_high"}`` (NaN -> None)."""

    def clean(x):
        x = float(x)
        return None if not np.isfinite(x) else x

    return {"estimate": clean(estimate), "ci_low": clean(low), "ci_high": clean(high)}


def check_identities(values: Mapping[str, float], tol: float = 1e-9) -> None:
    """Assert G = E0 + A1 = A0 + E1 and I = E1 - E0 (a guard on every computed table)."""
    g = values["G"]
    for lhs, rhs in ((g, values["E0"] + values["A1"]), (g, values["A0"] + values["E1"]),
                     (values["I"], values["E1"] - values["E0"])):
        if abs(lhs - rhs) > tol:
            raise AssertionError(f"decomposition identity violated: {lhs} != {rhs}")

