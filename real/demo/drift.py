"""Is my demo run the committed one? Its headline numbers against the committed summary of its CPU family,
and the Table-2 pattern.

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

Gold-only and size-sweep pools are where near ties live (one short pool, a
verifier half way between answering and abstaining), and other CPU families
moved more there: one run on an AMX Xeon and one on an AVX-512 EPYC differed
by 22 claims on no_enhancement's gold-only NOT_ENOUGH_INFO share. So the
demo keeps one committed summary per CPU family it was measured on
(:data:`REFERENCE_DIR`, named by :func:`real_fae_core.hardware.cpu_family`)
and compares a run with its own family's, at the tolerance above; on a family
without one it compares with another family's and says "another CPU" for
every number that moved, which is then not evidence of a change of code.

The Table-2 pattern is what the demo claims, each as one statement that can
fail (:func:`table2_pattern`); the CI test asserts the same statements.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from fae.ablation.control import paired_sensitivity

# at most 5 of 200 claims moved between two CPUs (module docstring), plus one of margin
FLIP_TOLERANCE_CLAIMS = 6
RATES = ("label_accuracy", "strict_accuracy", "evidence_f1")
RATIOS = ("IS", "ER", "IO")  # 1 - a_r / a_0: their denominator is the claims right at round 0
CONTROL_RATIOS = ("IS_ctrl", "IS_minus_IS_ctrl")
GOLD_ONLY_RATES = ("label_accuracy", "nei_answer_rate")
SUFFICIENCY_RATES = (("cited_only", "label_accuracy"), ("size_sweep", "sweep_accuracy"),
                     ("size_sweep", "min_accuracy"))
REFERENCE_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "demo_reference"


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
        draw = ctrl.get("draw", "random")  # a matched control's numbers are compared with a matched one's only
        for key in CONTROL_RATIOS:
            if ctrl.get(key) is not None:
                out[f"{variant}.control({draw}).{key}"] = (ctrl[key], (ctrl.get("n_control_claims") or 0) * a0)
        gold = m.get("gold_only") or {}
        for key in GOLD_ONLY_RATES:
            if gold.get(key) is not None:
                out[f"{variant}.gold_only.{key}"] = (gold[key], gold.get("n_claims") or 0)
        for block, key in SUFFICIENCY_RATES:
            b = m.get(block) or {}
            if b.get(key) is not None:
                out[f"{variant}.{block}.{key}"] = (b[key], b.get("n_claims") or 0)
    return out


# What the demo's necessary-and-sufficient variant shows (SPEC §4 real_sufficient): the thresholds of the
# issue that asked for it, each a statement; the reduced CI demo asserts its own, measured, margins.
SUFFICIENT_TARGETS = {"round0_accuracy": 0.98, "is_minus_is_ctrl": 0.75, "is_ctrl": 0.05, "gold_only": 0.95,
                      "cited_only": 0.95, "sweep_every_k": 0.95}
# The on-policy variant's goals (real-demo --on-policy; SPEC §4 `trainer: grpo`): the same statements, a higher
# evidence-specific IS (its reward asks for necessity under the control on every prompt).
ON_POLICY_TARGETS = {**SUFFICIENT_TARGETS, "is_minus_is_ctrl": 0.80}
# The on-policy variant's name (real-demo --on-policy): judged by its own goals (ON_POLICY_TARGETS, reported
# in drift.json), not by the Table-2 pattern, which is about the pairs-trained variants.
ON_POLICY = "on_policy"
# DemoSize fields that add a variant without changing the others: a run with them compares with a reference
# made without them on the numbers both have.
ADDED_VARIANT_FIELDS = ("on_policy", "on_policy_steps")


def comparable_size(size: Mapping[str, Any] | None) -> dict:
    """A run's size without the fields that only add a variant, so runs with and without it compare."""
    return {k: v for k, v in (size or {}).items() if k not in ADDED_VARIANT_FIELDS}


def sufficiency_pattern(m: Mapping[str, Any], targets: Mapping[str, float] = SUFFICIENT_TARGETS,
                        name: str = "real_sufficient") -> list[tuple[str, bool]]:
    """The necessary-and-sufficient statements for one variant's metrics: round-0 accuracy, the paired
    evidence-specific IS (fae.ablation.control.paired_sensitivity), IS_ctrl, and the gold-only, cited-only
    and every-k size-sweep accuracies, each against ``targets``."""
    paired = paired_sensitivity(m) or {}
    sweep = m.get("size_sweep") or {}
    per_k = [row["label_accuracy"] for row in sweep.get("per_k") or [] if row["label_accuracy"] is not None]
    t = targets
    return [
        (f"{name} reads the full pool: round-0 Acc >= {t['round0_accuracy']:.2f}",
         (m.get("label_accuracy") or 0) >= t["round0_accuracy"]),
        (f"{name} needs its evidence: IS - IS_ctrl (paired) >= {t['is_minus_is_ctrl']:.2f}",
         (paired.get("IS_minus_IS_ctrl") or 0) >= t["is_minus_is_ctrl"]),
        (f"{name} ignores other removals: IS_ctrl <= {t['is_ctrl']:.2f}",
         paired.get("IS_ctrl") is not None and paired["IS_ctrl"] <= t["is_ctrl"]),
        (f"{name} answers on the gold lines alone: gold-only Acc >= {t['gold_only']:.2f}",
         ((m.get("gold_only") or {}).get("label_accuracy") or 0) >= t["gold_only"]),
        (f"{name} answers on its own rationale: cited-only Acc >= {t['cited_only']:.2f}",
         ((m.get("cited_only") or {}).get("label_accuracy") or 0) >= t["cited_only"]),
        (f"{name} answers at every pool size: size-sweep Acc >= {t['sweep_every_k']:.2f} at every k",
         bool(per_k) and min(per_k) >= t["sweep_every_k"]),
    ]


def table2_pattern(summary: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """The demo's claims, each a statement with whether this run holds it (the CI test asserts the same)."""
    v = summary["variants"]
    sft, real = v["sft"], v["real"]
    checks = [
        ("every variant reads the pool: a_0 >= 0.8",
         all((m.get("round_accuracy") or [0])[0] >= 0.8 for name, m in v.items() if name != ON_POLICY)),
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


def reference_for(family: str, reference_dir: Path = REFERENCE_DIR) -> tuple[Path | None, bool]:
    """(the committed summary to compare with, whether it is this CPU family's own): this family's where one
    was measured, else another family's (the first by name), else None."""
    own = reference_dir / f"{family}.json"
    if own.is_file():
        return own, True
    others = sorted(reference_dir.glob("*.json")) if reference_dir.is_dir() else []
    return (others[0], False) if others else (None, False)


def drift_report(summary: Mapping[str, Any], reference_path: Path | None, *, same_family: bool = True,
                 family: str | None = None) -> dict[str, Any]:
    """The pattern, and the comparison with ``reference_path`` where it exists and was made at the same size.
    ``same_family``: the reference was measured on this run's CPU family (else a moved number is reported
    as "another CPU", not as a change of code)."""
    pattern = [{"statement": s, "held": held} for s, held in table2_pattern(summary)]
    report: dict[str, Any] = {"pattern": pattern, "pattern_held": all(p["held"] for p in pattern),
                              "reference": None if reference_path is None else str(reference_path),
                              "cpu_family": family, "same_cpu_family": same_family}
    if "real_sufficient" in (summary.get("variants") or {}):  # the goals of the variant, reported, not asserted
        report["sufficiency"] = [{"statement": s, "held": held}
                                 for s, held in sufficiency_pattern(summary["variants"]["real_sufficient"])]
    if ON_POLICY in (summary.get("variants") or {}):
        report[ON_POLICY] = [{"statement": s, "held": held} for s, held in
                             sufficiency_pattern(summary["variants"][ON_POLICY], ON_POLICY_TARGETS, ON_POLICY)]
    if reference_path is None or not reference_path.is_file():
        report["skipped"] = "no committed summary to compare with"
        return report
    reference = json.loads(reference_path.read_text(encoding="utf-8"))
    if comparable_size(reference.get("size")) != comparable_size(summary.get("size")):
        report["skipped"] = f"the committed summary was made at size {reference.get('size')}, this run at " \
                            f"{summary.get('size')}: only the pattern is checked"
        return report
    report.update(compare_with_reference(summary, reference))
    return report


def drift_lines(report: Mapping[str, Any]) -> list[str]:
    """What a user reads at the end of the demo."""
    lines = [f"Table-2 pattern: {'held' if report['pattern_held'] else 'NOT HELD'}"]
    lines += [f"  [{'ok' if p['held'] else 'FAILED'}] {p['statement']}" for p in report["pattern"]]
    if report.get("sufficiency"):
        lines.append("Necessary and sufficient (real_sufficient's goals):")
        lines += [f"  [{'ok' if p['held'] else 'missed'}] {p['statement']}" for p in report["sufficiency"]]
    if report.get(ON_POLICY):
        lines.append(f"Necessary and sufficient ({ON_POLICY}'s goals):")
        lines += [f"  [{'ok' if p['held'] else 'missed'}] {p['statement']}" for p in report[ON_POLICY]]
    if report.get("skipped"):
        return lines + [f"Against {report['reference']}: not compared ({report['skipped']})"]
    moved = report["moved"]
    if report.get("same_cpu_family", True):
        why = "a few near ties may flip; more is a change of code or data"
    else:
        why = (f"another CPU: no summary of this CPU family ({report.get('cpu_family')}) is committed, so this one "
               "was made on another, whose kernels flip other near ties; a moved number here is not evidence of "
               "a change of code")
    lines.append(f"Against {report['reference']}: {report['compared']} headline numbers compared, "
                 f"{len(moved)} moved by more than {report['tolerance_claims']} claims' worth ({why})")
    tag = "" if report.get("same_cpu_family", True) else " (another CPU)"
    lines += [f"  {m['number']}: {100 * m['reference']:.1f} -> {100 * m['this_run']:.1f} "
              f"(allowed ±{100 * m['allowed']:.1f}){tag}" for m in moved]
    return lines
