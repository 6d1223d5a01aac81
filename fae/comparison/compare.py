"""`fae compare RUN_A RUN_B`: answer/evidence score accounting between two FAE runs (SPEC §8).

RUN_A is system 0, RUN_B system 1. From the round-0 answers saved in each
run's ``claims.jsonl`` it builds the 2x2 table S00/S01/S10/S11 (answers from
one run, evidence from the other), the decomposition G = E0 + A1 = A0 + E1
and I = E1 - E0, the product/covariance split of E0 and E1, per-gold-label
contributions, and paired differences of the run metrics (IS, ER, IO, ...)
recomputed per claim; every interval comes from one paired bootstrap over
claims (or whole families with ``--families``). When both runs asked the
control arm and the gold-only pools (SPEC §6), the paired differences B − A of
IS − IS_ctrl (with IS and IS_ctrl) and of gold-only accuracy and
NOT_ENOUGH_INFO share come from the same draws. Runs whose prompts numbered
the pool lines differently (config.json ``line_ids``) are refused unless
``--allow-mixed-line-ids``, and so are runs made in different dtypes (config.json
``decoding.dtype``: ``fae run``'s resolved ``--dtype``, or the dtype Inspect's provider
ran, carried over by ``fae from-inspect``) unless ``--allow-mixed-dtype``: greedy
answers flip on near ties between bf16 and fp32, so such a difference would mix the
verifiers with the arithmetic. Writes ``compare.json`` and ``compare.md`` (the
paper's Table 3 layout).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from real_fae_core.atomicio import atomic_write_json, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, add_config_arguments, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_dir, only_names
from fae.comparison.families_file import read_families
from fae.ablation.control import control_metrics, control_rows, has_control
from fae.ablation.sufficiency import (cited_only_metrics, gold_only_metrics, size_sweep_metrics,
                                       sweep_rounds)
from fae.ablation.metrics import round_label, same_label
from fae.ablation.population import is_nei
from fae.ablation.runio import CLAIMS, RUN_FINGERPRINT, RunData, load_run
from fae.ablation.scores import evidence_specific_sensitivity, immediate_sensitivity, safe_ratio
from fae.ablation.soft_metrics import (
    SOFT_COMPARE_NAMES,
    has_probs,
    soft_columns,
    soft_from_sums,
)
from fae.comparison import accounting
from fae.intervals import MAX_DRAWS


@dataclass
class CompareConfig(CommandConfig):
    """`fae compare`: answer/evidence score accounting between two runs."""

    run_a: str = option(positional=True, metavar="RUN_A",
                        help="FAE run directory of system 0 (e.g. the SFT verifier)")
    run_b: str = option(positional=True, metavar="RUN_B",
                        help="FAE run directory of system 1 (e.g. the REAL verifier)")
    output: str = option(aliases=("-o",), help="directory for compare.json and compare.md")
    metric: Literal["strict", "fever_score", "label_accuracy"] = option(  # accounting.METRICS
        "strict", choices=accounting.METRICS,
        help="joint score: strict (label correct AND >=1 gold sentence cited), fever_score (label correct AND a "
             "complete gold group in the first 5 cited ids) or label_accuracy (no evidence requirement; E0 = E1 = "
             "0). Default: strict")
    bootstrap: int = option(10_000, min=1, max=MAX_DRAWS, help=f"bootstrap draws, 1 to {MAX_DRAWS} (default 10000)")
    seed: int = option(20261099, min=0, help="bootstrap RNG seed (numpy PCG64)")
    confidence: float = option(0.95, above=0, below=1, help="interval level (default 0.95)")
    families: str | None = option(None, metavar="FILE",
                                  help="claim families resampled as whole units: a JSON object {record_id: "
                                       "family_id} or JSONL lines {\"id\": ..., \"family\": ...}")
    allow_mixed_decoding: bool = option(False, help="compare a schema-constrained run with an unconstrained one "
                                                    "(refused by default: their numbers are not comparable, see "
                                                    "docs/structured.md)")
    allow_mixed_line_ids: bool = option(False, help="compare runs whose prompts numbered the pool lines differently "
                                                    "(config.json line_ids original vs renumbered; refused by "
                                                    "default, see docs/compare.md); the outputs then carry a warning")
    allow_mixed_dtype: bool = option(False, help="compare runs whose weights ran in different dtypes (config.json "
                                                 "decoding.dtype, e.g. bfloat16 vs float32; refused by default, see "
                                                 "docs/compare.md); the outputs then carry a warning")

CONFIG = CompareConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p, CompareConfig)


# ---------------------------------------------------------------------------
# Reading runs
# ---------------------------------------------------------------------------


@dataclass
class Run:
    path: Path
    config: dict
    metrics: dict
    claims: dict[str, dict]  # id -> claims.jsonl entry
    order: list[str]


def _check_claim(data: RunData, obj: dict) -> None:
    """Refuse a claim without the fields the accounting needs, naming its line and field."""
    def fail(field, reason):
        raise data.claim_error(obj, field, reason)

    cid = obj.get("id")
    if not isinstance(cid, str) or not cid:
        fail("id", "missing or not a non-empty string")
    if not isinstance(obj.get("gold_label"), str):
        fail("gold_label", "missing or not a string")
    groups = obj.get("gold_groups")
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(isinstance(i, int) for i in g)
                                               for g in groups):
        fail("gold_groups", "must be a list of lists of sentence ids")
    rounds = obj.get("rounds")
    if not isinstance(rounds, list) or not rounds:
        fail("rounds", "missing or empty")
    for k, r in enumerate(rounds):
        if not isinstance(r, dict):
            fail(f"rounds[{k}]", "not an object")
        if r.get("round", k) != k:
            fail(f"rounds[{k}].round", f"expected {k}, got {r.get('round')!r}")
        if r.get("label") is not None and not isinstance(r.get("label"), str):
            fail(f"rounds[{k}].label", "must be a label string or null")
        for key in ("cited", "hallucinated", "evidence"):
            ids = r.get(key) or []
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                fail(f"rounds[{k}].{key}", "must be a list of sentence ids")


def load_compared(path: str | Path) -> Run:
    """Read a finished FAE run through :func:`fae.ablation.runio.load_run` (refuses unfinished or
    inconsistent runs), then check every claim has the fields the accounting needs."""
    data = load_run(path)
    if not data.claims:
        raise UserError(f"{data.path / CLAIMS}: no claims")
    claims: dict[str, dict] = {}
    for obj in data.claims:
        _check_claim(data, obj)
        claims[obj["id"]] = obj
    return Run(path=data.path, config=data.config, metrics=data.metrics or {}, claims=claims,
               order=list(claims))


def load_families(path: str | Path) -> dict[str, str]:
    """Family map from a JSON object ``{id: family}`` or JSONL ``{"id": ..., "family": ...}`` lines (strict:
    :mod:`fae.comparison.families_file`)."""
    return {fid: fam for fid, (fam, _) in read_families(path).items()}


def check_same_claims(a: Run, b: Run) -> list[str]:
    """Fail clearly unless both runs cover the same claims of the same record file; return the claim order."""
    sha_a, sha_b = a.config.get("records_sha256"), b.config.get("records_sha256")
    if sha_a and sha_b and sha_a != sha_b:
        raise UserError(
            f"the runs were made on different record files: {a.path} used {a.config.get('records')} "
            f"(sha256 {sha_a[:12]}...), {b.path} used {b.config.get('records')} (sha256 {sha_b[:12]}...)"
        )
    ids_a, ids_b = set(a.claims), set(b.claims)
    if ids_a != ids_b:
        only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
        parts = []
        if only_a:
            parts.append(f"{len(only_a)} only in {a.path} (e.g. {', '.join(map(repr, only_a[:3]))})")
        if only_b:
            parts.append(f"{len(only_b)} only in {b.path} (e.g. {', '.join(map(repr, only_b[:3]))})")
        raise UserError("the runs cover different claims: " + "; ".join(parts))
    for cid in a.order:
        ca, cb = a.claims[cid], b.claims[cid]
        if ca["gold_label"] != cb["gold_label"]:
            raise UserError(f"claim {cid!r} has gold label {ca['gold_label']} in {a.path} "
                            f"but {cb['gold_label']} in {b.path}")
        if sorted(map(sorted, ca["gold_groups"])) != sorted(map(sorted, cb["gold_groups"])):
            raise UserError(f"claim {cid!r} has different gold evidence groups in {a.path} and {b.path}")
    return list(a.order)


def _round0(entry: dict) -> tuple[str | None, list[int]]:
    """Round-0 label (None if invalid) and every id it named, in citation order.

    Named ids include hallucinated ones: they never match gold at round 0, but
    they take up slots of the FEVER scorer's first five, as in ``fae.ablation.metrics``.
    """
    r0 = entry["rounds"][0]
    label = accounting.round_label(r0)
    return label, (accounting.named_ids(r0) if label is not None else [])


def _n_rounds(run: Run, order: list[str]) -> tuple[int, str | None]:
    counts = {len(run.claims[c]["rounds"]) for c in order}
    if len(counts) == 1:
        return counts.pop() - 1, None
    return min(counts) - 1, (f"{run.path}: claims have between {min(counts)} and {max(counts)} rounds; "
                             f"round metrics use the first {min(counts)}")


# ---------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------


def line_ids_of(run: Run) -> str:
    """How the run's prompts numbered the pool lines (SPEC §3); runs made before the choice existed: original."""
    return run.config.get("line_ids") or RUN_FINGERPRINT.defaults["line_ids"]  # a compatibility default


def check_same_line_ids(a: Run, b: Run, allow_mixed: bool) -> str | None:
    """Refuse two runs whose prompts numbered the lines differently, unless allowed: then the warning to carry."""
    la, lb = line_ids_of(a), line_ids_of(b)
    if la == lb:
        return None
    if not allow_mixed:
        raise UserError(f"{a.path} numbered the pool lines {la} and {b.path} {lb} (config.json line_ids): a verifier "
                        "that reads the numbering (a hole where a line went) answers the two differently, so their "
                        "IS, IS_ctrl and accounting are not comparable; rerun one of them, or pass "
                        "--allow-mixed-line-ids to compare anyway")
    return (f"WARNING: mixed line numbering: A ({a.path}) used line_ids {la}, B ({b.path}) {lb}; every difference "
            "B - A mixes the verifiers with the numbering (a hole where a line went shows only under original)")


# Spellings of one dtype across the backends' records (fae run's resolved torch name, a vllm/Inspect arg)
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
# Recorded values that name no dtype: a server's choice, vllm's own resolution, or nothing recorded
UNKNOWN_DTYPES = (None, "", "auto", "server")


def dtype_of(run: Run) -> str | None:
    """The dtype the run's weights ran in (config.json ``decoding.dtype``); None where the run does not know
    it: a server's (``fae run --backend openai``, Inspect's API providers), vllm's ``auto``, an older run."""
    value = (run.config.get("decoding") or {}).get("dtype")
    value = str(value).removeprefix("torch.") if value is not None else None
    return None if value in UNKNOWN_DTYPES else DTYPE_NAMES.get(value, value)


def check_same_dtype(a: Run, b: Run, allow_mixed: bool) -> str | None:
    """Refuse two runs made in different known dtypes, unless allowed: then the warning to carry. A run whose
    dtype is unknown (a server's) is compared as it is: nothing recorded says the two differ."""
    da, db = dtype_of(a), dtype_of(b)
    if da is None or db is None or da == db:
        return None
    if not allow_mixed:
        raise UserError(f"{a.path} ran in {da} and {b.path} in {db} (config.json decoding.dtype): greedy answers "
                        "flip on near ties between dtypes, so the difference would mix the verifiers with the "
                        "arithmetic; rerun one of them (fae run --dtype), or pass --allow-mixed-dtype to compare "
                        "anyway")
    return (f"WARNING: mixed dtypes: A ({a.path}) ran in {da}, B ({b.path}) in {db}; every difference B - A mixes "
            "the verifiers with the dtype (greedy answers flip on near ties)")


def compare_runs(a: Run, b: Run, *, metric: str, n_resamples: int, seed: int, confidence: float = 0.95,
                 families: dict[str, str] | None = None, allow_mixed_line_ids: bool = False,
                 allow_mixed_dtype: bool = False) -> dict:
    """Everything ``compare.json`` holds, computed from two loaded runs."""
    line_note = check_same_line_ids(a, b, allow_mixed_line_ids)
    dtype_note = check_same_dtype(a, b, allow_mixed_dtype)
    order = check_same_claims(a, b)
    order, n_nei = accounting.fae_claim_order(order, a.claims)  # SPEC §1: the claim set of metrics.json
    if not order:
        raise UserError(f"{a.path}: no SUPPORT/REFUTE claim to compare (all {n_nei} are NOT_ENOUGH_INFO-gold)")
    gold_labels = [a.claims[c]["gold_label"] for c in order]
    ind = _indicators(a, b, order, metric)
    try:
        units = accounting.unit_index(order, families)
    except KeyError as exc:
        raise UserError(f"--families: {exc.args[0]}") from None
    notes = [n for n in (line_note, dtype_note) if n]
    if n_nei:
        notes.append(f"{n_nei} NOT_ENOUGH_INFO-gold claims of older runs are left out (SPEC §1)")
    table = _PairedColumns(a, b, order, ind, notes)
    res = accounting.paired_bootstrap(accounting.unit_sums(table.columns, units), table.statistic,
                                      n_resamples=n_resamples, seed=seed, confidence=confidence)
    decomposition = _accounting(res, ind, gold_labels)
    out = {q: decomposition.pop(q) for q in accounting.QUANTITIES}
    out.update(
        n_claims=len(order), n_units=res.n_units,
        resampling_unit="family" if families is not None else "claim",
        metric=metric, bootstrap=n_resamples, seed=seed, confidence=confidence, scale="points (0-100)",
        runs={"A": _run_info(a, "system 0"), "B": _run_info(b, "system 1")},
        line_ids={"A": line_ids_of(a), "B": line_ids_of(b), "mixed": line_ids_of(a) != line_ids_of(b)},
        dtype={"A": dtype_of(a), "B": dtype_of(b), "mixed": dtype_note is not None},
        **decomposition,
    )
    base, m = len(accounting.ACCOUNTING_OUTPUTS), len(table.common)
    out["metrics"] = {
        name: {"A": _interval(res, base + j), "B": _interval(res, base + m + j),
               "difference": _interval(res, base + 2 * m + j)}
        for j, name in enumerate(table.common)
    }
    out.update(table.arms.report(res, base + 3 * m, n_resamples=n_resamples, seed=seed))
    if metric == "label_accuracy":
        notes.append("metric label_accuracy has no evidence requirement, so swapping evidence changes "
                     "nothing: E0 = E1 = I = 0 and G = A0 = A1 by construction")
    if families is not None:
        notes.append(f"{len(order)} claims in {res.n_units} families; whole families are resampled together")
    out["notes"] = notes
    return out


def _indicators(a: Run, b: Run, order: list, metric: str):
    """Per-claim correctness of each run's round-0 answer and of each answer under the other's evidence."""
    ans_a = [_round0(a.claims[c]) for c in order]
    ans_b = [_round0(b.claims[c]) for c in order]
    return accounting.indicators_from_answers(
        [a.claims[c]["gold_label"] for c in order], [a.claims[c]["gold_groups"] for c in order],
        [x[0] for x in ans_a], [x[1] for x in ans_a],
        [x[0] for x in ans_b], [x[1] for x in ans_b],
        metric,
    )


class _PairedColumns:
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
        self.arms = _ArmColumns(claims_a, claims_b, order, notes)
        self.columns = np.hstack([acc_cols, cols_a, cols_b, soft_a, soft_b, self.arms.columns])

    def statistic(self, sums):
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



class _ArmColumns:
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
                block[name] = {"A": _interval(res, i + j), "B": _interval(res, i + m + j),
                               "difference": _interval(res, i + 2 * m + j)}
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


def _interval(res, i: int) -> dict:
    d = accounting.as_interval_dict(res.estimate[i], res.ci_low[i], res.ci_high[i])
    if res.undefined_draws[i]:
        d["undefined_draws"] = int(res.undefined_draws[i])
    return d


def _accounting(res, ind, gold_labels) -> dict:
    """The decomposition (Table 3): G and its terms, accuracy and eligibility per run, E0/E1, Shapley."""
    pos = {n: i for i, n in enumerate(accounting.ACCOUNTING_OUTPUTS)}
    out: dict = {q: _interval(res, pos[q]) for q in accounting.QUANTITIES}
    accounting.check_identities({q: res.estimate[pos[q]] for q in accounting.QUANTITIES}, tol=1e-6)
    est = {n: float(res.estimate[i]) for n, i in pos.items()}
    change = est["eligibility1"] - est["eligibility0"]
    out.update(
        answer_accuracy={"A": _interval(res, pos["accuracy0"]), "B": _interval(res, pos["accuracy1"])},
        evidence_eligibility={"A": _interval(res, pos["eligibility0"]), "B": _interval(res, pos["eligibility1"])},
        product_covariance={
            "E0": {"answers_fixed": "A", "answer_accuracy": est["accuracy0"], "eligibility_change": change,
                   "product": _interval(res, pos["E0_product"]), "covariance": _interval(res, pos["E0_covariance"])},
            "E1": {"answers_fixed": "B", "answer_accuracy": est["accuracy1"], "eligibility_change": change,
                   "product": _interval(res, pos["E1_product"]), "covariance": _interval(res, pos["E1_covariance"])},
        },
        shapley={"E": _interval(res, pos["E_shapley"]), "A": _interval(res, pos["A_shapley"])},
        by_gold_label=accounting.per_label_contributions(ind, gold_labels),
    )
    return out


def _run_info(run: Run, role: str) -> dict:
    cfg = run.config
    return {"path": str(run.path), "role": role, "model": cfg.get("model"), "adapter": cfg.get("adapter"),
            "records": cfg.get("records"), "records_sha256": cfg.get("records_sha256")}


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _ci(d: dict) -> str:
    return f"[{_fmt(d['ci_low'])}, {_fmt(d['ci_high'])}]"


_MD_NAMES = {"G": "$G$", "E0": "$E_{0}$", "A1": "$A_{1}$", "A0": "$A_{0}$", "E1": "$E_{1}$",
             "I": "$I=E_{1}-E_{0}$"}


def render_markdown(res: dict) -> str:
    """compare.md: the score table, its decomposition, the marginal rates, per-label rows, run metrics, notes."""
    pct = int(round(100 * res["confidence"]))
    lines = _md_warning(res) + _md_scores(res, pct) + _md_marginal_rates(res, pct) + _md_by_label(res) \
        + _md_run_metrics(res, pct) + _md_arms(res, pct)
    if res["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def _md_scores(res: dict, pct: int) -> list[str]:
    a, b = res["runs"]["A"], res["runs"]["B"]
    unit = "claim" if res["resampling_unit"] == "claim" else "claim-family"
    lines = [
        f"# Score accounting ({res['metric']})",
        "",
        f"- System 0 (A): `{a['path']}` — model `{a['model']}`" + (f", adapter `{a['adapter']}`" if a["adapter"] else ""),
        f"- System 1 (B): `{b['path']}` — model `{b['model']}`" + (f", adapter `{b['adapter']}`" if b["adapter"] else ""),
        f"- {res['n_claims']} claims, {res['n_units']} resampling units; {res['bootstrap']} paired {unit} "
        f"bootstrap draws (seed {res['seed']}), pointwise {pct}% percentile intervals. Points on a 0-100 scale.",
        "",
        "## Score table",
        "",
        "Each row holds answers fixed; each column holds submitted evidence fixed.",
        "",
        "| Saved answers | System 0 scoring evidence | System 1 scoring evidence |",
        "| --- | --- | --- |",
        f"| Generated by system 0 (A) | $S_{{00}}$ = {_fmt(res['S00']['estimate'])} {_ci(res['S00'])} "
        f"| $S_{{01}}$ = {_fmt(res['S01']['estimate'])} {_ci(res['S01'])} |",
        f"| Generated by system 1 (B) | $S_{{10}}$ = {_fmt(res['S10']['estimate'])} {_ci(res['S10'])} "
        f"| $S_{{11}}$ = {_fmt(res['S11']['estimate'])} {_ci(res['S11'])} |",
        "",
        "## Score decomposition",
        "",
        f"| Quantity | Change | Estimate | {pct}% interval |",
        "| --- | --- | --- | --- |",
    ]
    for q in accounting.COMPONENTS:
        lines.append(f"| {_MD_NAMES[q]} | {accounting.DESCRIPTIONS[q]} | {_fmt(res[q]['estimate'])} | {_ci(res[q])} |")
    return lines


def _md_marginal_rates(res: dict, pct: int) -> list[str]:
    pc = res["product_covariance"]
    lines = [
        "",
        "## Marginal rates: product and covariance",
        "",
        "$E = 100\\,[\\overline{a}\\,\\overline{\\Delta d} + \\mathrm{Cov}_n(a, \\Delta d)]$: the product is what "
        "answer accuracy times the eligibility-rate change predicts; the covariance is what it misses.",
        "",
        f"| Evidence gain | Answers fixed | Answer accuracy | Eligibility change | Product [{pct}%] "
        f"| Covariance [{pct}%] | Total |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for q, who in (("E0", "system 0 (A)"), ("E1", "system 1 (B)")):
        p = pc[q]
        lines.append(
            f"| {_MD_NAMES[q]} | {who} | {_fmt(p['answer_accuracy'])} | {_fmt(p['eligibility_change'])} | "
            f"{_fmt(p['product']['estimate'])} {_ci(p['product'])} | "
            f"{_fmt(p['covariance']['estimate'])} {_ci(p['covariance'])} | {_fmt(res[q]['estimate'])} |"
        )
    lines += [
        "",
        f"Averaging both orders (Shapley): evidence {_fmt(res['shapley']['E']['estimate'])} "
        f"{_ci(res['shapley']['E'])}, answers {_fmt(res['shapley']['A']['estimate'])} {_ci(res['shapley']['A'])}. "
        f"Answer accuracy A {_fmt(res['answer_accuracy']['A']['estimate'])}, "
        f"B {_fmt(res['answer_accuracy']['B']['estimate'])}; evidence eligibility A "
        f"{_fmt(res['evidence_eligibility']['A']['estimate'])}, B {_fmt(res['evidence_eligibility']['B']['estimate'])}.",
    ]
    return lines


def _md_by_label(res: dict) -> list[str]:
    lines = [
        "",
        "## Contributions by gold label",
        "",
        f"Each contribution uses all {res['n_claims']} claims as denominator; columns sum to the overall scores.",
        "",
        "| Gold label | Claims | $S_{00}$ | $S_{01}$ | $S_{10}$ | $S_{11}$ | Gain $G$ |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in res["by_gold_label"].items():
        lines.append(f"| {label} | {row['n_claims']} | " + " | ".join(_fmt(row[k]) for k in accounting.CELLS)
                     + f" | {_fmt(row['G'])} |")
    return lines


def _md_run_metrics(res: dict, pct: int) -> list[str]:
    lines: list[str] = []
    if res["metrics"]:
        lines += [
            "",
            "## Run metrics (paired)",
            "",
            "Recomputed per claim from each run's claims.jsonl (x100); ratios such as IS = 1 - a_1/a_0 are "
            "recomputed on every bootstrap draw.",
            "",
            f"| Metric | A | B | B - A | {pct}% interval |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, m in res["metrics"].items():
            undefined = m["difference"].get("undefined_draws")
            lines.append(f"| {name} | {_fmt(m['A']['estimate'])} | {_fmt(m['B']['estimate'])} | "
                         f"{_fmt(m['difference']['estimate'])} | {_ci(m['difference'])}"
                         + (f" ({undefined} draws undefined)" if undefined else "") + " |")
    return lines


def _md_warning(res: dict) -> list[str]:
    """A banner above everything when the two runs numbered their pool lines differently or ran in two dtypes."""
    li, dt = res.get("line_ids") or {}, res.get("dtype") or {}
    out = []
    if li.get("mixed"):
        out += [f"> **WARNING: mixed line numbering.** A used `line_ids` {li['A']}, B {li['B']}: every B − A below "
                "mixes the verifiers with the numbering (compared with `--allow-mixed-line-ids`).", ""]
    if dt.get("mixed"):
        out += [f"> **WARNING: mixed dtypes.** A ran in {dt['A']}, B in {dt['B']}: every B − A below mixes the "
                "verifiers with the dtype (compared with `--allow-mixed-dtype`).", ""]
    return out


def _md_arms(res: dict, pct: int) -> list[str]:
    """The control arm and the sufficiency pools of both runs, paired on the same draws (SPEC §6)."""
    ctrl, gold = res.get("control"), res.get("gold_only")
    cited, sweep = res.get("cited_only"), res.get("size_sweep")
    lines = ["", "## Control arm and sufficiency pools (paired)", ""]
    if not any((ctrl, gold, cited, sweep)):
        return lines + ["Not compared: both runs need the control arm or a sufficiency pool (runs made with "
                        "`--control none` / `--no-gold-only` / `--no-cited-only` / `--no-size-sweep`, or before "
                        "they existed, lack them)."]
    lines += [
        "IS − IS_ctrl is the part of IS that is evidence: the accuracy lost when the cited lines go, beyond what "
        "the control (as many lines removed, none cited or gold) loses. Per metric, over the claims both runs "
        f"have it for (x100); B − A with its {pct}% interval from the same paired bootstrap draws as every "
        f"other interval here (seed {res['seed']}).",
        "",
        f"| Metric | Claims | A | B | B - A | {pct}% interval |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for block, names, label in ((ctrl, ("IS_minus_IS_ctrl", "IS_ctrl", "IS"), "control"),
                                (gold, ("label_accuracy", "nei_answer_rate"), "gold-only"),
                                (cited, ("label_accuracy", "nei_answer_rate"), "cited-only"),
                                (sweep, ("sweep_accuracy", "sweep_nei_share"), "size sweep")):
        if not block:
            lines.append(f"| {label}: not compared (a run lacks it) | | | | | |")
            continue
        for name in names:
            m = block[name]
            undefined = m["difference"].get("undefined_draws")
            lines.append(f"| {label} {name} | {block['n_claims']} | {_fmt(m['A']['estimate'])} | "
                         f"{_fmt(m['B']['estimate'])} | {_fmt(m['difference']['estimate'])} | {_ci(m['difference'])}"
                         + (f" ({undefined} draws undefined)" if undefined else "") + " |")
    return lines


def check_same_decoding(a: Run, b: Run, allow_mixed: bool) -> None:
    """Refuse a constrained vs unconstrained comparison (docs/structured.md) unless allowed."""
    ca, cb = bool(a.config.get("constrained_decoding")), bool(b.config.get("constrained_decoding"))
    if ca != cb and not allow_mixed:
        on, off = (a, b) if ca else (b, a)
        raise UserError(f"{on.path} was run with --constrained-decoding and {off.path} without: answers held "
                        "to a schema are not comparable with free answers; rerun one of them, or pass "
                        "--allow-mixed-decoding to compare anyway")


def run(config: CompareConfig) -> CommandResult:
    if config.bootstrap < 1:
        raise UserError("--bootstrap must be at least 1")
    if not 0 < config.confidence < 1:
        raise UserError("--confidence must be between 0 and 1")
    guard = claim_dir(config.output, "fae compare", inputs=[config.run_a, config.run_b, config.families],
                      legacy=only_names("compare.json", "compare.md"))
    a, b = load_compared(config.run_a), load_compared(config.run_b)
    check_same_decoding(a, b, config.allow_mixed_decoding)
    for mixed in (check_same_line_ids(a, b, config.allow_mixed_line_ids),  # refused here, before any bootstrap
                  check_same_dtype(a, b, config.allow_mixed_dtype)):
        if mixed:
            print(mixed, file=sys.stderr)
    families = load_families(config.families) if config.families else None
    try:
        res = compare_runs(a, b, metric=config.metric, n_resamples=config.bootstrap, seed=config.seed,
                           confidence=config.confidence, families=families,
                           allow_mixed_line_ids=config.allow_mixed_line_ids,
                           allow_mixed_dtype=config.allow_mixed_dtype)
    except ValueError as exc:  # e.g. fewer than 2 resampling units
        raise UserError(str(exc)) from None
    out = Path(config.output)
    guard.mark()
    atomic_write_json(out / "compare.json", res)
    atomic_write_text(out / "compare.md", render_markdown(res))
    g = res["G"]
    print(f"G = {_fmt(g['estimate'])} {_ci(g)}  E0 = {_fmt(res['E0']['estimate'])}  "
          f"E1 = {_fmt(res['E1']['estimate'])}  ({res['metric']}, {res['n_claims']} claims)")
    ctrl = res.get("control")
    if ctrl:
        d = ctrl["IS_minus_IS_ctrl"]["difference"]
        print(f"IS - IS_ctrl, B - A = {_fmt(d['estimate'])} {_ci(d)}  ({ctrl['n_claims']} claims with a "
              "round-1 control in both runs)")
    for arm, name, label in (("gold_only", "label_accuracy", "gold-only accuracy"),
                             ("cited_only", "label_accuracy", "cited-only accuracy"),
                             ("size_sweep", "sweep_accuracy", "size-sweep accuracy")):
        block = res.get(arm)
        if block:
            d = block[name]["difference"]
            print(f"{label}, B - A = {_fmt(d['estimate'])} {_ci(d)}  ({block['n_claims']} claims)")
    print(f"wrote {out / 'compare.json'} and {out / 'compare.md'}")
    return CommandResult(outputs={"json": str(out / "compare.json"), "markdown": str(out / "compare.md")},
                         summary=res)
