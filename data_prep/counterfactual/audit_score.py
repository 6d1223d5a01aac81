"""`real-data counterfactual-audit-score AUDIT_DIR`: the filled audit sheets -> pass rates and Fleiss' κ.

Reads back the sheets `real-data counterfactual-audit` (:mod:`data_prep.counterfactual.audit`) wrote and
reports, per kind and overall, each criterion's majority-vote pass rate, Fleiss' κ, and the instances
valid by the paper's rule (a majority passes the first three criteria): ``score.json`` and ``score.md`` in
the audit directory (PAVE Table 10).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from pathlib import Path
from typing import Sequence

from real_fae_core.atomicio import atomic_write_json, atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError

from .audit import CRITERIA, SAMPLE_FILE, VALIDITY_CRITERIA

_YES = {"1", "y", "yes", "true", "pass", "x"}
_NO = {"0", "n", "no", "false", "fail"}


@dataclasses.dataclass
class AuditScoreConfig(CommandConfig):
    """`real-data counterfactual-audit-score`: the filled sheets of an audit, scored."""

    audit_dir: str = option(positional=True, help="the directory `real-data counterfactual-audit` wrote")
    sheets: list[str] | None = option(None, help="the filled sheets (default AUDIT_DIR/sheet-*.csv)")

    def __post_init__(self) -> None:
        if isinstance(self.sheets, (list, tuple)):  # sheets given as paths
            self.sheets = [os.fspath(p) if isinstance(p, os.PathLike) else p for p in self.sheets]
        super().__post_init__()


def fleiss_kappa(counts: Sequence[Sequence[int]]) -> float | None:
    """Fleiss' κ for ``counts[i][j]`` = raters who put subject i in category j (same raters per subject).

    κ = (P̄ − P̄e) / (1 − P̄e) with P̄ the mean per-subject agreement and P̄e
    the agreement expected from the category shares (Fleiss 1971). None when
    it is undefined: no subjects, fewer than two raters, or every rating in
    one category (P̄e = 1).
    """
    rows = [list(map(int, r)) for r in counts]
    if not rows:
        return None
    n = sum(rows[0])
    if any(sum(r) != n for r in rows):
        raise ValueError("every subject needs the same number of ratings")
    if n < 2:
        return None
    total = n * len(rows)
    shares = [sum(r[j] for r in rows) / total for j in range(len(rows[0]))]
    p_e = sum(p * p for p in shares)
    if p_e >= 1.0:
        return None
    p_bar = sum((sum(c * c for c in r) - n) / (n * (n - 1)) for r in rows) / len(rows)
    return (p_bar - p_e) / (1 - p_e)


def binary_counts(ratings: Sequence[Sequence[bool]]) -> list[list[int]]:
    """Per subject, [fails, passes] from each rater's pass/fail."""
    return [[sum(not r for r in subject), sum(bool(r) for r in subject)] for subject in ratings]


def majority(votes: Sequence[bool]) -> bool:
    """Pass when more than half of the raters pass (2 of 3)."""
    return 2 * sum(bool(v) for v in votes) > len(votes)


def score(sample: list[dict], sheets: dict[str, dict[int, dict[str, bool]]]) -> dict:
    """Pass rates (majority vote), Fleiss' κ and valid instances, per kind and overall (PAVE Table 10)."""
    raters = sorted(sheets)
    groups = {"overall": sample}
    for kind in sorted({s["kind"] for s in sample}):
        groups[kind] = [s for s in sample if s["kind"] == kind]
    out = {"raters": raters, "instances": len(sample), "criteria": [c for c, _ in CRITERIA], "groups": {}}
    for name, items in groups.items():
        g: dict = {"instances": len(items), "pass_rate": {}, "kappa": {}}
        pooled = []
        for crit, _ in CRITERIA:
            votes = [[sheets[r][s["item"]][crit] for r in raters] for s in items]
            g["pass_rate"][crit] = sum(majority(v) for v in votes) / len(items) if items else None
            g["kappa"][crit] = fleiss_kappa(binary_counts(votes))
            pooled += votes
        g["kappa_all_criteria"] = fleiss_kappa(binary_counts(pooled))
        valid = [s for s in items
                 if all(majority([sheets[r][s["item"]][c] for r in raters]) for c in VALIDITY_CRITERIA)]
        g["valid"] = len(valid)
        g["valid_rate"] = len(valid) / len(items) if items else None
        out["groups"][name] = g
    out["invalid_items"] = [{"item": s["item"], "record_id": s["record_id"], "kind": s["kind"]}
                            for s in sample
                            if not all(majority([sheets[r][s["item"]][c] for r in raters]) for c in VALIDITY_CRITERIA)]
    return out


def score_markdown(result: dict) -> str:
    """score.md of a scored audit: majority pass rates (%) and Fleiss' κ per criterion, per group then overall."""
    groups = [g for g in result["groups"] if g != "overall"] + ["overall"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}"  # noqa: E731
    kap = lambda x: "undefined" if x is None else f"{x:.2f}"  # noqa: E731
    lines = [f"# Counterfactual audit: {result['instances']} instances, {len(result['raters'])} annotators", "",
             "Majority-vote pass rates (%) and Fleiss' κ, as PAVE's Table 10. An instance is valid when the "
             "majority passes the first three criteria.", "",
             "| Criterion | " + " | ".join(f"{g} (n={result['groups'][g]['instances']})" for g in groups) + " |",
             "|---|" + "---|" * len(groups)]
    for crit, _ in CRITERIA:
        lines.append(f"| {crit} | " + " | ".join(pct(result["groups"][g]["pass_rate"][crit]) for g in groups) + " |")
    lines.append("| valid (first three pass) | " + " | ".join(pct(result["groups"][g]["valid_rate"]) for g in groups)
                 + " |")
    lines.append("| Fleiss' κ (all criteria) | "
                 + " | ".join(kap(result["groups"][g]["kappa_all_criteria"]) for g in groups) + " |")
    for crit, _ in CRITERIA:
        lines.append(f"| κ {crit} | " + " | ".join(kap(result["groups"][g]["kappa"][crit]) for g in groups) + " |")
    return "\n".join(lines) + "\n"


def _truth(value: str | None) -> bool | None:
    v = (value or "").strip().lower()
    return True if v in _YES else False if v in _NO else None


def read_sheet(path: Path, sample: list[dict]) -> dict[int, dict[str, bool]]:
    """item -> criterion -> pass; one clear error naming file, line and field for anything else."""
    by_item = {s["item"]: s for s in sample}
    try:
        text = path.read_text(encoding="utf-8-sig")  # a spreadsheet may save a BOM
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the sheet ({exc})") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in ("item", "record_id", *[c for c, _ in CRITERIA]) if c not in (reader.fieldnames or [])]
    if missing:
        raise UserError(f"{path}:1: field {missing[0]!r}: column missing from the header")
    out: dict[int, dict[str, bool]] = {}
    for row in reader:
        line = reader.line_num
        try:
            item = int(row["item"])
        except (TypeError, ValueError):
            raise UserError(f"{path}:{line}: field 'item': {row['item']!r} is not an item number") from None
        inst = by_item.get(item)
        if inst is None or str(row["record_id"]) != inst["record_id"]:
            raise UserError(f"{path}:{line}: field 'record_id': item {item} is not "
                            f"{row['record_id']!r} in {SAMPLE_FILE} (a sheet of another sample?)")
        if item in out:
            raise UserError(f"{path}:{line}: field 'item': item {item} appears twice")
        marks = {}
        for crit, _ in CRITERIA:
            mark = _truth(row.get(crit))
            if mark is None:
                raise UserError(f"{path}:{line}: field {crit!r}: {row.get(crit)!r} is not 1/0 (yes/no, pass/fail)")
            marks[crit] = mark
        out[item] = marks
    absent = sorted(set(by_item) - set(out))
    if absent:
        raise UserError(f"{path}: field 'item': {len(absent)} items of {SAMPLE_FILE} are missing (first: {absent[0]})")
    return out


def run(config: AuditScoreConfig) -> CommandResult:
    """`real-data counterfactual-audit-score` as a function: score.json and score.md beside the sample; at least
    two filled sheets, every item of the sample in each (else one located error)."""
    audit_dir = Path(config.audit_dir)
    key = audit_dir / SAMPLE_FILE
    if not key.is_file():
        raise UserError(f"{key}: not found (write the sample with `real-data counterfactual-audit`)")
    try:
        sample = json.loads(key.read_text(encoding="utf-8"))["sample"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"{key}: field 'sample': not an audit sample ({exc})") from None
    paths = [Path(p) for p in config.sheets] if config.sheets else sorted(audit_dir.glob("sheet-*.csv"))
    if len(paths) < 2:
        raise UserError(f"{audit_dir}: {len(paths)} sheet(s); agreement needs at least two filled sheets")
    sheets = {p.name: read_sheet(p, sample) for p in paths}
    result = score(sample, sheets)
    md = score_markdown(result)
    atomic_write_json(audit_dir / "score.json", result)
    atomic_write_text(audit_dir / "score.md", md)
    print(md, end="")
    print(f"written: {audit_dir / 'score.json'}, {audit_dir / 'score.md'}")
    return CommandResult(outputs={"score_json": str(audit_dir / "score.json"), "score_md": str(audit_dir / "score.md")},
                         summary=result)
