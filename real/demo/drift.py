"""Is my demo run the committed one? Its headline numbers against the committed summary, and the Table-2 pattern.

On one machine the demo is bitwise deterministic; across CPUs it is not. fp32
matrix products sum in a different order on another instruction set (AVX-512
FMA chains, AMX tiles), the LoRA weights after a few hundred steps at lr 3e-3
differ in their last bits, and a greedy answer changes only where two tokens
were within that rounding of each other: a few near-tie claims flip, never a
systematic shift. Measured between a 2-core AMD EPYC and a 2-core AMX Xeon
(the same data, prompts and pairs): at most 5 of 200 claims moved any
headline number of the four Table-2 variants (no_ablation's strict accuracy,
81.5 vs 84.0). So the tolerance is counted in claims, not points:
:data:`FLIP_TOLERANCE_CLAIMS` claims of the number's own denominator (the
test claims for a rate; the claims right at round 0 for IS/ER/IO, which divide
by a_0; the control claims for the control). A number that moved further is a
change of code or data, not of host.

The Table-2 pattern is what the demo claims, each as one statement that can
fail (:func:`table2_pattern`); the CI test asserts the same statements.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

# at most 5 of 200 claims moved between two CPUs (module docstring), plus one of margin
FLIP_TOLERANCE_CLAIMS = 6
RATES = ("label_accuracy", "strict_accuracy", "evidence_f1")
RATIOS = ("IS", "ER", "IO")  # 1 - a_r / a_0: their denominator is the claims right at round 0
CONTROL_RATIOS = ("IS_ctrl", "IS_minus_IS_ctrl")
GOLD_ONLY_RATES = ("label_accuracy", "nei_answer_rate")


def headline_numbers(summary: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """``{name: (value, denominator in claims)}`` for every headline number of every variant."""
    out: dict[str, tuple[float, float]] = {}
    for variant, m in (summary.get("variants") or {}).items():
        n = m.get("n_claims") or 0
        a0 = (m.get("round_accuracy") or [0.0])[0] or 0.0
        for key in RATES:
            if m.get(key) is not None:
                out[f"{variant}.{key}"] = (m[key], n)
        for key in RATIOS:
            if m.get(key) is not None:
                out[f"{variant}.{key}"] = (m[key], n * a0)
        ctrl = m.get("control") or {}
        for key in CONTROL_RATIOS:
            if ctrl.get(key) is not None:
                out[f"{variant}.control.{key}"] = (ctrl[key], (ctrl.get("n_control_claims") or 0) * a0)
        gold = m.get("gold_only") or {}
        for key in GOLD_ONLY_RATES:
            if gold.get(key) is not None:
                out[f"{variant}.gold_only.{key}"] = (gold[key], gold.get("n_claims") or 0)
    return out


def table2_pattern(summary: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """The demo's claims, each a statement with whether this run holds it (the CI test asserts the same)."""
    v = summary["variants"]
    sft, real = v["sft"], v["real"]
    checks = [
        ("every variant reads the pool: a_0 >= 0.8",
         all((m.get("round_accuracy") or [0])[0] >= 0.8 for m in v.values())),
        ("ablation raises IS: REAL's IS - SFT's >= 0.5", real["IS"] - sft["IS"] >= 0.5),
        ("the control catches REAL's cue: REAL's IS_ctrl - SFT's >= 0.35",
         real["control"]["IS_ctrl"] - sft["control"]["IS_ctrl"] >= 0.35),
        ("REAL abstains on gold-only pools: its NEI share - SFT's >= 0.4",
         real["gold_only"]["nei_answer_rate"] - sft["gold_only"]["nei_answer_rate"] >= 0.4),
    ]
    if "no_ablation" in v:  # enhancement alone does not teach abstention
        checks.append(("no_ablation keeps its verdict: IS <= 0.1", v["no_ablation"]["IS"] <= 0.1))
    return checks


def compare_with_reference(summary: Mapping[str, Any], reference: Mapping[str, Any],
                           tolerance_claims: int = FLIP_TOLERANCE_CLAIMS) -> dict[str, Any]:
    """Every headline number of ``summary`` against ``reference``: which moved beyond ``tolerance_claims`` claims."""
    ours, theirs = headline_numbers(summary), headline_numbers(reference)
    moved, compared = [], 0
    for name, (value, units) in ours.items():
        if name not in theirs:
            continue
        compared += 1
        ref_value, ref_units = theirs[name]
        allowed = tolerance_claims / max(min(units, ref_units), 1.0)
        if abs(value - ref_value) > allowed + 1e-12:
            moved.append({"number": name, "reference": ref_value, "this_run": value,
                          "difference": value - ref_value, "allowed": allowed})
    return {"compared": compared, "moved": moved, "tolerance_claims": tolerance_claims,
            "only_here": sorted(set(ours) - set(theirs)), "only_in_reference": sorted(set(theirs) - set(ours))}


def drift_report(summary: Mapping[str, Any], reference_path: Path | None) -> dict[str, Any]:
    """The pattern, and the comparison with ``reference_path`` where it exists and was made at the same size."""
    pattern = [{"statement": s, "held": held} for s, held in table2_pattern(summary)]
    report: dict[str, Any] = {"pattern": pattern, "pattern_held": all(p["held"] for p in pattern),
                              "reference": None if reference_path is None else str(reference_path)}
    if reference_path is None or not reference_path.is_file():
        report["skipped"] = "no committed summary to compare with"
        return report
    reference = json.loads(reference_path.read_text(encoding="utf-8"))
    if reference.get("size") != summary.get("size"):
        report["skipped"] = f"the committed summary was made at size {reference.get('size')}, this run at " \
                            f"{summary.get('size')}: only the pattern is checked"
        return report
    report.update(compare_with_reference(summary, reference))
    return report


def drift_lines(report: Mapping[str, Any]) -> list[str]:
    """What a user reads at the end of the demo."""
    lines = [f"Table-2 pattern: {'held' if report['pattern_held'] else 'NOT HELD'}"]
    lines += [f"  [{'ok' if p['held'] else 'FAILED'}] {p['statement']}" for p in report["pattern"]]
    if report.get("skipped"):
        return lines + [f"Against {report['reference']}: not compared ({report['skipped']})"]
    moved = report["moved"]
    lines.append(f"Against {report['reference']}: {report['compared']} headline numbers compared, "
                 f"{len(moved)} moved by more than {report['tolerance_claims']} claims' worth "
                 "(another CPU flips a few near-tie answers; more is a change of code or data)")
    lines += [f"  {m['number']}: {100 * m['reference']:.1f} -> {100 * m['this_run']:.1f} "
              f"(allowed ±{100 * m['allowed']:.1f})" for m in moved]
    return lines
