"""`real-data counterfactual-audit`: PAVE's human validity audit of counterfactual evidence, as a tool.

    real-data counterfactual-audit --records cf.jsonl --output audit/    # sample + 3 blank sheets
    real-data counterfactual-audit-score audit/                           # filled sheets -> rates, κ

``counterfactual-audit`` draws M instances (default 100; one instance = one claim's
counterfactual pool of one kind, as ``fae pave`` shows it) stratified by
source (the records' ``dataset``) × kind × gold label, as equal per stratum
as the strata allow, and writes one CSV sheet per annotator (default three)
with the paper's four binary criteria left blank, ``audit.json`` (the
sample) and ``instructions.md``. ``counterfactual-audit-score`` reads the filled sheets back and
reports, per kind and overall, each criterion's majority-vote pass rate,
Fleiss' κ, and the instances valid by the paper's rule (a majority passes
the first three criteria). Writes ``score.json`` and ``score.md`` in the
audit directory (:mod:`data_prep.counterfactual.audit_score`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections import defaultdict
from pathlib import Path

from real_fae_core.atomicio import atomic_write_json, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.hashing import keyed_rng
from real_fae_core.outputs import Output, any_of, claim_dir
from data_prep.records import load_records_or_fail

from .rewrite import OPPOSITE

# (column, the paper's wording): PAVE App. D, "Human validity audit".
CRITERIA: tuple[tuple[str, str], ...] = (
    ("claim_relevance", "the evidence still concerns the same claim or event"),
    ("intervention_consistency", "it introduces the intended factual conflict"),
    ("label_consistency", "it provides the intended misleading verification signal for the original claim "
                          "(the intended verdict column)"),
    ("artifact_free", "it is fluent and free of obvious generation artifacts"),
)
VALIDITY_CRITERIA = ("claim_relevance", "intervention_consistency", "label_consistency")
INFO_COLUMNS = ("item", "record_id", "source", "kind", "gold_label", "intended_verdict", "claim",
                "gold_evidence", "counterfactual_evidence", "check")
COLUMNS = INFO_COLUMNS + tuple(c for c, _ in CRITERIA) + ("comment",)
SAMPLE_FILE = "audit.json"
AUDIT = "real-data counterfactual-audit"


# ---------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------

def allocate(sizes: dict, m: int) -> dict:
    """Stratum -> how many to draw: as equal as the strata allow, M in all (or everything, if fewer)."""
    want = {k: 0 for k in sizes}
    left = min(m, sum(sizes.values()))
    open_ = sorted(k for k in sizes if sizes[k] > 0)
    while left > 0 and open_:
        share, extra = divmod(left, len(open_))
        for i, k in enumerate(open_):
            take = min(share + (1 if i < extra else 0), sizes[k] - want[k])
            want[k] += take
            left -= take
        open_ = [k for k in open_ if want[k] < sizes[k]]
    return want


def audit_instances(records: list[dict]) -> list[dict]:
    """Every (claim, kind) counterfactual pool of a records file, with what an annotator needs to judge it."""
    out = []
    for rec in records:
        pools = rec.get("counterfactual_sentences")
        if not isinstance(pools, dict) or rec.get("label") not in OPPOSITE:
            continue
        texts = {s.get("id"): s.get("text", "") for s in rec.get("sentences", []) if isinstance(s, dict)}
        gold = sorted({i for group in rec.get("evidence") or [] for i in group})
        for kind, pool in sorted(pools.items()):
            if not isinstance(pool, list) or not pool:
                continue
            out.append({
                "record_id": str(rec.get("id")),
                "source": str(rec.get("dataset") or "unknown"),
                "kind": kind,
                "gold_label": rec["label"],
                "intended_verdict": OPPOSITE[rec["label"]],
                "claim": rec.get("claim", ""),
                "gold_evidence": " ".join(f"[{i}] {texts.get(i, '')}" for i in gold),
                "counterfactual_evidence": " ".join(f"[{s.get('id')}] {s.get('text', '')}" for s in pool),
                "check": ",".join(sorted({str(s.get("check")) for s in pool if s.get("check")})),
            })
    return out


def stratified_sample(instances: list[dict], m: int, seed: int) -> list[dict]:
    """M instances, stratified by source × kind × gold label; the same for the same input and seed."""
    strata: dict[tuple, list[dict]] = defaultdict(list)
    for inst in instances:
        strata[(inst["source"], inst["kind"], inst["gold_label"])].append(inst)
    want = allocate({k: len(v) for k, v in strata.items()}, m)
    picked = []
    for key in sorted(strata):
        pool = sorted(strata[key], key=lambda x: x["record_id"])
        rng = keyed_rng(seed, key, sep="\0")
        picked += rng.sample(pool, want[key])
    order = keyed_rng(seed, "order", sep="\0")
    order.shuffle(picked)  # annotators see the strata mixed
    return [{"item": k + 1, **inst} for k, inst in enumerate(picked)]


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------

def write_sheets(out: Path, sample: list[dict], raters: int, settings: dict) -> list[Path]:
    """The audit key (the sample and its settings), one blank CSV sheet per annotator and instructions.md
    in ``out``; the sheets' paths."""
    Output(out, AUDIT).mark(files=())
    atomic_write_json(out / SAMPLE_FILE, {**settings, "criteria": dict(CRITERIA), "sample": sample},
                      ensure_ascii=False)
    paths = []
    for r in range(1, raters + 1):
        path = out / f"sheet-{r}.csv"
        rows = [dict(inst, **{c: "" for c, _ in CRITERIA}, comment="") for inst in sample]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: row.get(k, "") for k in COLUMNS} for row in rows)
        atomic_write_text(path, buf.getvalue())
        paths.append(path)
    crit = "\n".join(f"- `{c}`: {text}." for c, text in CRITERIA)
    atomic_write_text(out / "instructions.md", (
        "# Counterfactual evidence audit\n\n"
        f"Each of the {raters} annotators fills one sheet (`sheet-N.csv`) alone. Every row is one claim's "
        "counterfactual evidence (`counterfactual_evidence`), made from its gold evidence (`gold_evidence`) so that "
        "it should lead a reader to `intended_verdict`, the opposite of the claim's gold label.\n\n"
        "Write 1 (pass) or 0 (fail) in each criterion column:\n\n" + crit + "\n\n"
        "Leave the other columns as they are. Then run `real-data counterfactual-audit-score` on this directory.\n"))
    return paths


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class AuditConfig(CommandConfig):
    """`real-data counterfactual-audit`: a stratified sample of counterfactual evidence as blank sheets."""

    records: str = option(help="records with counterfactual_sentences (JSONL)")
    output: str = option(help="audit directory")
    size: int = option(100, min=1, help="instances M (default 100, as the paper)")
    raters: int = option(3, min=2, help="annotators, one sheet each (default 3, as the paper)")  # agreement: two
    seed: int = 0


def run(config: AuditConfig) -> CommandResult:
    """`real-data counterfactual-audit` as a function: a stratified sample as one sheet per annotator in
    ``config.output``; records without counterfactual evidence are a :class:`UserError`."""
    claim_dir(config.output, AUDIT, inputs=[config.records], legacy=any_of(SAMPLE_FILE))
    records = _read_records(Path(config.records))
    instances = audit_instances(records)
    if not instances:
        made = _counterfactual_summary(Path(config.records))
        if made is None:
            raise UserError(f"{config.records}: no record carries counterfactual_sentences "
                            "(run `real-data counterfactual` first)")
        return _nothing_to_audit(config, made)
    sample = stratified_sample(instances, config.size, config.seed)
    strata: dict[str, int] = defaultdict(int)
    for s in sample:
        strata[f"{s['source']} / {s['kind']} / {s['gold_label']}"] += 1
    out = Path(config.output)
    paths = write_sheets(out, sample, config.raters,
                         {"records": str(config.records), "size": config.size, "seed": config.seed,
                          "raters": config.raters, "instances_available": len(instances), "strata": dict(strata)})
    print(f"counterfactual audit: {len(sample)} of {len(instances)} instances in {len(strata)} strata "
          f"(source / kind / gold label):")
    for key, n in sorted(strata.items()):
        print(f"  {n:4d}  {key}")
    print(f"sheets: {', '.join(str(p) for p in paths)}; criteria in {out / 'instructions.md'}")
    outputs = {"audit_dir": str(out), "sample": str(out / SAMPLE_FILE), "instructions": str(out / "instructions.md"),
               **{p.stem: str(p) for p in paths}}
    return CommandResult(outputs=outputs, summary={"instances": len(sample), "instances_available": len(instances),
                                                   "strata": dict(sorted(strata.items()))})


def _counterfactual_summary(records: Path) -> dict | None:
    """The summary `real-data counterfactual` wrote beside its output, when it finished (else None)."""
    try:
        summary = json.loads(Path(f"{records}.summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("complete") and summary.get("kinds") else None


def _nothing_to_audit(config: AuditConfig, made: dict) -> CommandResult:
    """`real-data counterfactual` ran and kept no sentence: empty sheets that say why, not an error that would
    stop a pipeline after hours of work (PAVE then reports PR and the Margin as undefined)."""
    dropped: dict[str, int] = defaultdict(int)
    sentences = 0
    for kind in made["kinds"].values():
        sentences += int(kind.get("sentences") or 0)
        for reason, n in (kind.get("dropped_by_reason") or {}).items():
            dropped[reason] += int(n)
    why = "; ".join(f"{n} {reason}" for reason, n in sorted(dropped.items(), key=lambda kv: -kv[1]))
    note = (f"nothing to audit: `real-data counterfactual` kept none of the {sentences} gold sentences it tried"
            + (f" ({why})" if why else ""))
    out = Path(config.output)
    paths = write_sheets(out, [], config.raters,
                         {"records": str(config.records), "size": config.size, "seed": config.seed,
                          "raters": config.raters, "instances_available": 0, "strata": {}, "note": note})
    print(f"counterfactual audit: {note}; empty sheets in {out}")
    return CommandResult(outputs={"audit_dir": str(out), "sample": str(out / SAMPLE_FILE),
                                  **{p.stem: str(p) for p in paths}},
                         summary={"instances": 0, "instances_available": 0, "strata": {}, "note": note})


def _read_records(path: Path) -> list[dict]:
    return [r.to_dict() for r in load_records_or_fail(path)]
