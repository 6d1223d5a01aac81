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

Here: the command's config and its run, and :func:`compare_runs` (what ``compare.json`` holds). Beside it:
:mod:`~fae.comparison.checks` (reading the runs, the checks that they are comparable),
:mod:`~fae.comparison.columns` (the per-claim columns and their statistic),
:mod:`~fae.comparison.markdown` (compare.md), :mod:`~fae.comparison.accounting` (the score accounting) and
:mod:`~fae.comparison.families_file` (the ``--families`` file).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from real_fae_core.atomicio import atomic_write_json, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_dir, only_names
from fae.comparison import accounting
from fae.comparison.checks import (Run, check_same_claims, check_same_decoding, check_same_dtype, check_same_line_ids,
                                   dtype_of, line_ids_of, load_compared)
from fae.comparison.columns import PairedColumns, interval_of
from fae.comparison.families_file import load_families
from fae.comparison.markdown import ci, fmt, render_markdown
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

def _round0(entry: dict) -> tuple[str | None, list[int]]:
    """Round-0 label (None if invalid) and every id it named, in citation order.

    Named ids include hallucinated ones: they never match gold at round 0, but
    they take up slots of the FEVER scorer's first five, as in ``fae.ablation.metrics``.
    """
    r0 = entry["rounds"][0]
    label = accounting.round_label(r0)
    return label, (accounting.named_ids(r0) if label is not None else [])


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
    table = PairedColumns(a, b, order, ind, notes)
    res = accounting.paired_bootstrap(accounting.unit_sums(table.columns, units), table.statistic, n_resamples=n_resamples,
                               seed=seed, confidence=confidence)
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
        name: {"A": interval_of(res, base + j), "B": interval_of(res, base + m + j),
               "difference": interval_of(res, base + 2 * m + j)}
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


def _accounting(res, ind, gold_labels) -> dict:
    """The decomposition (Table 3): G and its terms, accuracy and eligibility per run, E0/E1, Shapley."""
    pos = {n: i for i, n in enumerate(accounting.ACCOUNTING_OUTPUTS)}
    out: dict = {q: interval_of(res, pos[q]) for q in accounting.QUANTITIES}
    accounting.check_identities({q: res.estimate[pos[q]] for q in accounting.QUANTITIES}, tol=1e-6)
    est = {n: float(res.estimate[i]) for n, i in pos.items()}
    change = est["eligibility1"] - est["eligibility0"]
    out.update(
        answer_accuracy={"A": interval_of(res, pos["accuracy0"]), "B": interval_of(res, pos["accuracy1"])},
        evidence_eligibility={"A": interval_of(res, pos["eligibility0"]), "B": interval_of(res, pos["eligibility1"])},
        product_covariance={
            "E0": {"answers_fixed": "A", "answer_accuracy": est["accuracy0"], "eligibility_change": change,
                   "product": interval_of(res, pos["E0_product"]), "covariance": interval_of(res, pos["E0_covariance"])},
            "E1": {"answers_fixed": "B", "answer_accuracy": est["accuracy1"], "eligibility_change": change,
                   "product": interval_of(res, pos["E1_product"]), "covariance": interval_of(res, pos["E1_covariance"])},
        },
        shapley={"E": interval_of(res, pos["E_shapley"]), "A": interval_of(res, pos["A_shapley"])},
        by_gold_label=accounting.per_label_contributions(ind, gold_labels),
    )
    return out


def _run_info(run: Run, role: str) -> dict:
    cfg = run.config
    return {"path": str(run.path), "role": role, "model": cfg.get("model"), "adapter": cfg.get("adapter"),
            "records": cfg.get("records"), "records_sha256": cfg.get("records_sha256")}


def run(config: CompareConfig) -> CommandResult:
    """`fae compare` as a function: compare.json and compare.md in ``config.output``; runs of different
    decodings (or line ids, dtypes) are refused unless allowed; too few claims to resample is a :class:`UserError`."""
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
    print(f"G = {fmt(g['estimate'])} {ci(g)}  E0 = {fmt(res['E0']['estimate'])}  "
          f"E1 = {fmt(res['E1']['estimate'])}  ({res['metric']}, {res['n_claims']} claims)")
    ctrl = res.get("control")
    if ctrl:
        d = ctrl["IS_minus_IS_ctrl"]["difference"]
        print(f"IS - IS_ctrl, B - A = {fmt(d['estimate'])} {ci(d)}  ({ctrl['n_claims']} claims with a "
              "round-1 control in both runs)")
    for arm, name, label in (("gold_only", "label_accuracy", "gold-only accuracy"),
                             ("cited_only", "label_accuracy", "cited-only accuracy"),
                             ("size_sweep", "sweep_accuracy", "size-sweep accuracy")):
        block = res.get(arm)
        if block:
            d = block[name]["difference"]
            print(f"{label}, B - A = {fmt(d['estimate'])} {ci(d)}  ({block['n_claims']} claims)")
    print(f"wrote {out / 'compare.json'} and {out / 'compare.md'}")
    return CommandResult(outputs={"json": str(out / "compare.json"), "markdown": str(out / "compare.md")},
                         summary=res)
