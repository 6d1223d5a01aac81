"""What the viewer shows, computed once in Python: a compact index and per-claim detail shards.

The index holds one short summary per claim (id, text, gold label, dataset,
and per run the label of every round plus per-round bit masks: correct,
invalid, cut off, hallucinated ids, reused; flipped; strict; P(gold) per
round; the control arm's label per round, the gold-only and cited-only labels and the size
sweep's label per k, when the run asked them) — enough to filter, sort and count tens of thousands of
claims in the browser without touching the details. Everything else (pool sentences, raw
answers, cited ids, probabilities) goes to shards of ``shard_size`` claims
that the page loads only when a claim is opened.

Correctness, flips and strictness come from :mod:`fae.ablation.metrics`
(``same_label``, ``round_label``, ``is_flip``, ``cites_gold``), so the counts
the viewer shows are the counts behind ``metrics.json``. The control arm's and
the sufficiency arms' metrics (IS_ctrl, IS − IS_ctrl, gold-only and cited-only
accuracy and NOT_ENOUGH_INFO share, the size sweep's accuracy per k) are the
run's ``metrics.json`` values, or :func:`fae.ablation.control.control_metrics`
/ :mod:`fae.ablation.sufficiency`'s ``gold_only_metrics``,
``cited_only_metrics`` and ``size_sweep_metrics`` for a metrics.json written
before they existed; the viewer never recomputes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from real_fae_core.labels import NOT_ENOUGH_INFO, REFUTE, SUPPORT
from data_prep.records import load_records_or_fail
from fae.ablation.control import control_metrics
from fae.ablation.sufficiency import cited_only_metrics, gold_only_metrics, size_sweep_metrics
from fae.ablation.metrics import cites_gold, is_flip, is_valid, round_label, same_label
from fae.ablation.population import is_nei
from fae.ablation.report import load_reported
from fae.ablation.runio import resolve_records

INDEX_VERSION = 1
DEFAULT_SHARD_SIZE = 100
# One character per round in the index: the answer's label, x = invalid answer.
LABEL_CODES = {SUPPORT: "S", REFUTE: "R", NOT_ENOUGH_INFO: "N"}
INVALID_CODE, OTHER_CODE = "x", "?"
MASKS = ("correct", "invalid", "truncated", "hallucinated", "reused")
# The arms beside the ablation in the index, in the label codes above: ``ctrl`` one character per
# control round (position r for round r; position 0 is NO_ROUND_CODE); ``gold_only`` and
# ``cited_only`` one character; ``sweep`` one per size-sweep pool k = 0, 1, ... (position k).
# LEFT_OUT_CODE where the claim was left out ("skipped": the whole sweep is then one "-"); ""
# where the run did not ask the arm (--control none, --no-gold-only, --no-cited-only,
# --no-size-sweep, runs made before the arms existed).
NO_ROUND_CODE, LEFT_OUT_CODE = ".", "-"
ARM_KEYS = ("ctrl", "gold_only", "cited_only", "sweep")
# run_entry's ``arms`` flags: the claims.jsonl keys of the arms
ARM_CLAIM_KEYS = ("control", "gold_only", "cited_only", "size_sweep")


def label_code(rnd: Mapping) -> str:
    """S / R / N for the round's label, x for an invalid answer, ? for any other label string."""
    label = round_label(rnd)
    if label is None:
        return INVALID_CODE
    if is_nei(label):
        return LABEL_CODES[NOT_ENOUGH_INFO]
    return LABEL_CODES.get(label, OTHER_CODE)


def arm_code(rnd: Mapping | None) -> str:
    """The label code of a control or gold-only answer; ``-`` when the claim was left out of it."""
    if not isinstance(rnd, Mapping) or "skipped" in rnd:
        return LEFT_OUT_CODE
    return label_code(rnd)


def sweep_code(sweep: Mapping | None) -> str:
    """The size sweep's codes: one per pool k = 0, 1, ... in k order; ``-`` when the claim was left out of
    it; "" when it was not asked."""
    if sweep is None:
        return ""
    if not isinstance(sweep, Mapping) or "skipped" in sweep:
        return LEFT_OUT_CODE
    return "".join(arm_code(rnd) for rnd in sweep.get("rounds") or []) or LEFT_OUT_CODE


def arm_summary(claim: Mapping) -> dict[str, str]:
    """``ctrl``: ``.`` then one code per control round r = 1..R; ``gold_only`` and ``cited_only``: one code;
    ``sweep``: one code per size-sweep pool k (module constants)."""
    control = claim.get("control")
    ctrl = "" if control is None else NO_ROUND_CODE + "".join(arm_code(rnd) for rnd in control)
    gold = "" if claim.get("gold_only") is None else arm_code(claim["gold_only"])
    cited = "" if claim.get("cited_only") is None else arm_code(claim["cited_only"])
    return {"ctrl": ctrl, "gold_only": gold, "cited_only": cited, "sweep": sweep_code(claim.get("size_sweep"))}


def round_bits(rounds: Sequence[Mapping], hit) -> int:
    """Bit r set when round r passes ``hit``: one integer per claim instead of a list."""
    return sum(1 << r for r, rnd in enumerate(rounds) if hit(rnd))


def answer_summary(claim: Mapping) -> dict[str, Any]:
    """The per-run fields of one claim in the index (see the module docstring)."""
    rounds = claim["rounds"]
    gold = claim.get("gold_label")
    labels = [round_label(rnd) for rnd in rounds]
    probs = [rnd.get("label_probs") if isinstance(rnd.get("label_probs"), Mapping) else None for rnd in rounds]
    r0 = rounds[0] if rounds else {}
    return {
        "labels": "".join(label_code(rnd) for rnd in rounds),
        "correct": round_bits(rounds, lambda rnd: same_label(round_label(rnd), gold)),
        "invalid": round_bits(rounds, lambda rnd: not is_valid(rnd)),
        "truncated": round_bits(rounds, lambda rnd: rnd.get("truncated") is True),
        "hallucinated": round_bits(rounds, lambda rnd: bool(rnd.get("hallucinated"))),
        "reused": round_bits(rounds, lambda rnd: bool(rnd.get("reused"))),
        "flipped": int(any(is_flip(a, b) for a, b in zip(labels, labels[1:]))),
        "strict": int(bool(rounds) and same_label(labels[0], gold)
                      and cites_gold(r0.get("cited") or [], claim.get("gold_groups") or [])),
        "p_gold": None if not any(probs) else
        [None if p is None else round(float(p.get(gold, 0.0)), 4) for p in probs],
        **arm_summary(claim),
    }


@dataclass
class ViewRun:
    """One run as the viewer needs it: name, where it came from, metrics and claims by id."""

    name: str
    dir: str
    config: dict
    metrics: dict
    claims: list[dict]
    records: dict[str, Any] = field(default_factory=dict)  # claim id -> ClaimRecord (its records file)


def aligned_ids(runs: Sequence[ViewRun]) -> tuple[list[str], set[str]]:
    """Every claim id once: the first run's order, then ids only later runs have, then the
    NEI-gold records of the records files (left out of every run, SPEC §1). Also which ids are
    NEI-gold (excluded from the metrics)."""
    order: dict[str, None] = {}
    excluded: set[str] = set()
    for run in runs:
        for c in run.claims:
            order.setdefault(str(c["id"]), None)
            if is_nei(c.get("gold_label")):
                excluded.add(str(c["id"]))
    for run in runs:
        for rid, rec in run.records.items():
            if is_nei(rec.label):
                order.setdefault(rid, None)
                excluded.add(rid)
    return list(order), excluded


def _record_of(cid: str, runs: Sequence[ViewRun]):
    return next((run.records[cid] for run in runs if cid in run.records), None)


def build_view(runs: Sequence[ViewRun], shard_size: int = DEFAULT_SHARD_SIZE,
               title: str = "FAE claims") -> tuple[dict, Iterator[list[dict]]]:
    """The index (a dict) and an iterator over the detail shards (lists of claim details, in index order)."""
    ids, excluded = aligned_ids(runs)
    by_id = [{str(c["id"]): c for c in run.claims} for run in runs]
    labels: dict[str, int] = {lab: k for k, lab in enumerate((SUPPORT, REFUTE, NOT_ENOUGH_INFO))}
    datasets: dict[str, int] = {}
    claims: dict[str, list] = {"id": ids, "text": [], "gold": [], "dataset": [], "excluded": []}
    answers = [{key: [] for key in ("labels", *MASKS, "flipped", "strict", "p_gold", *ARM_KEYS, "known")}
               for _ in runs]
    for cid in ids:
        rec = _record_of(cid, runs)
        gold = next((c[cid].get("gold_label") for c in by_id if cid in c), None) or (rec.label if rec else "?")
        claims["text"].append(rec.claim if rec else "")
        claims["gold"].append(labels.setdefault(gold, len(labels)))
        claims["dataset"].append(datasets.setdefault(rec.dataset if rec else "", len(datasets)))
        claims["excluded"].append(int(cid in excluded))
        for k, claim_of in enumerate(by_id):
            claim = claim_of.get(cid)
            summary = answer_summary(claim) if claim is not None else \
                {"labels": "", **{m: 0 for m in MASKS}, "flipped": 0, "strict": 0, "p_gold": None,
                 **{a: "" for a in ARM_KEYS}}
            for key, value in summary.items():
                answers[k][key].append(value)
            answers[k]["known"].append(int(claim is not None or cid in runs[k].records))
    index = {
        "version": INDEX_VERSION,
        "title": title,
        "rounds": max((int(run.metrics.get("rounds") or 0) for run in runs), default=0),
        "shard_size": shard_size,
        "n_claims": len(ids),
        "labels": list(labels),
        "datasets": list(datasets),
        "runs": [run_entry(run) for run in runs],
        "claims": claims,
        "answers": answers,
    }
    return index, _shards(ids, runs, by_id, shard_size)


ARM_METRICS = (("control", control_metrics), ("gold_only", gold_only_metrics),
               ("cited_only", cited_only_metrics), ("size_sweep", size_sweep_metrics))


def arm_metrics(metrics: Mapping, claims: Sequence[Mapping]) -> dict:
    """``metrics`` with ``control``, ``gold_only``, ``cited_only`` and ``size_sweep`` (SPEC §6): metrics.json's
    own, or, for a metrics.json written before they existed, :func:`control_metrics` and
    :mod:`fae.ablation.sufficiency`'s functions of the claims (None for a run without them)."""
    out = dict(metrics)
    for key, compute in ARM_METRICS:
        if key not in out:
            try:
                out[key] = compute(claims)
            except (ValueError, KeyError, TypeError):  # control rounds that do not match the rounds
                out[key] = None
    return out


def run_entry(run: ViewRun) -> dict:
    """The run table's row: where the run came from, its metrics (metrics.json, hide nothing) and which
    arms beside the ablation it asked (``arms``: control, gold_only, cited_only, size_sweep; line_ids: how
    prompts numbered lines)."""
    c = run.config
    return {"name": run.name, "dir": run.dir, "backend": c.get("backend"), "model": c.get("model"),
            "adapter": c.get("adapter"), "records": c.get("records"), "rounds": run.metrics.get("rounds"),
            "line_ids": c.get("line_ids") or "original",
            "arms": {arm: any(cl.get(arm) is not None for cl in run.claims) for arm in ARM_CLAIM_KEYS},
            "metrics": arm_metrics(run.metrics, run.claims)}


def claim_detail(cid: str, runs: Sequence[ViewRun], by_id: Sequence[Mapping[str, dict]]) -> dict:
    """Everything the claim page shows: the record (claim, pool, gold) and each run's rounds as written,
    with, per run, its control rounds (rounds 1..R), gold-only and cited-only answers and size sweep
    (``order`` and one round per k) as written (None: not asked)."""
    rec = _record_of(cid, runs)
    first = next((c[cid] for c in by_id if cid in c), None)
    return {
        "id": cid,
        "claim": rec.claim if rec else None,
        "dataset": rec.dataset if rec else None,
        "gold_label": (first or {}).get("gold_label") or (rec.label if rec else None),
        "gold_groups": (first or {}).get("gold_groups") if first else (rec.evidence if rec else []),
        "sentences": None if rec is None else [[s.id, s.text, s.doc] for s in rec.sentences],
        "runs": [c[cid]["rounds"] if cid in c else None for c in by_id],
        "control": [c[cid].get("control") if cid in c else None for c in by_id],
        "gold_only": [c[cid].get("gold_only") if cid in c else None for c in by_id],
        "cited_only": [c[cid].get("cited_only") if cid in c else None for c in by_id],
        "size_sweep": [c[cid].get("size_sweep") if cid in c else None for c in by_id],
    }


def _shards(ids: Sequence[str], runs: Sequence[ViewRun], by_id, shard_size: int) -> Iterator[list[dict]]:
    for start in range(0, len(ids), shard_size):
        yield [claim_detail(cid, runs, by_id) for cid in ids[start:start + shard_size]]


def load_view_runs(run_dirs: Sequence[str | Path], names: Sequence[str] | None = None,
                   records: str | None = None) -> list[ViewRun]:
    """Read each run with the one run reader (``fae report``'s :func:`load_reported`) and its records file.

    The records file is the one in the run's config.json (or ``records``), checked against the
    stored sha256: the claim text and the pool sentences come from it.
    """
    loaded: dict[Path, dict[str, Any]] = {}
    out = []
    for k, run_dir in enumerate(run_dirs):
        rep = load_reported(run_dir, names[k] if names else None)
        path = resolve_records(Path(run_dir), rep["config"], records).resolve()
        if path not in loaded:
            loaded[path] = {r.id: r for r in load_records_or_fail(path)}
        out.append(ViewRun(rep["name"], rep["dir"], rep["config"], rep["metrics"], rep["claims"], loaded[path]))
    return out
