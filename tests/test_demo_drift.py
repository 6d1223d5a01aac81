"""real-demo's comparison with the committed summary: a tolerance in flipped claims, and its Table-2 pattern."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from real_fae_core.errors import EXIT_FAILURE, EXIT_OK
from real.demo import DemoConfig, pipeline, run
from real.demo.drift import (
    FLIP_TOLERANCE_CLAIMS,
    comparable_size,
    compare_with_reference,
    drift_lines,
    drift_report,
    headline_numbers,
    reference_for,
    sufficiency_pattern,
    table2_pattern,
)
from real_fae_core.hardware import cpu_family

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
AMX = json.loads((RESULTS / "demo_cpu_summary_amx.json").read_text())
EPYC = json.loads((RESULTS / "demo_cpu_summary.json").read_text())


AMX_PATH = RESULTS / "demo_cpu_summary_amx.json"


def test_the_committed_run_holds_its_pattern_and_matches_itself():
    assert pipeline.REFERENCE_DIR == RESULTS / "demo_reference"
    assert all(held for _, held in table2_pattern(AMX))
    same = drift_report(AMX, AMX_PATH)
    assert same["pattern_held"] and same["moved"] == [] and same["compared"] >= 40


def test_every_committed_reference_is_a_full_run_of_its_cpu_family_that_holds_the_pattern():
    refs = sorted((RESULTS / "demo_reference").glob("*.json"))
    assert refs, "no committed demo reference"
    for path in refs:
        summary = json.loads(path.read_text())
        assert summary["cpu_family"] == path.stem and summary["dtype"] == "fp32"
        assert comparable_size(summary["size"]) == comparable_size(
            {**json.loads(json.dumps(pipeline.asdict(pipeline.DemoSize()))), "seed": 0})
        assert set(summary["variants"]) == set(pipeline.VARIANTS)
        assert all(held for _, held in table2_pattern(summary)), path


def test_the_reference_of_the_own_cpu_family_is_chosen_else_another_is_named_another_cpu(tmp_path):
    (tmp_path / "intel-amx.json").write_text("{}")
    (tmp_path / "amd-avx512-bf16.json").write_text("{}")
    assert reference_for("intel-amx", tmp_path) == (tmp_path / "intel-amx.json", True)
    assert reference_for("amd-avx2", tmp_path) == (tmp_path / "amd-avx512-bf16.json", False)
    assert reference_for("amd-avx2", tmp_path / "none") == (None, False)
    # the case measured between two CPU families: 22 claims of no_enhancement's gold-only NEI share moved
    moved = copy.deepcopy(AMX)
    gold = moved["variants"]["no_enhancement"]["gold_only"]
    gold["nei_answer_rate"] = min(1.0, gold["nei_answer_rate"] + 22 / gold["n_claims"])
    other = drift_report(moved, AMX_PATH, same_family=False, family="amd-avx2")
    assert [m["number"] for m in other["moved"]] == ["no_enhancement.gold_only.nei_answer_rate"]
    lines = drift_lines(other)
    assert any("another CPU" in line and "amd-avx2" in line for line in lines)
    assert any(line.endswith("(another CPU)") for line in lines)
    own = drift_lines(drift_report(moved, AMX_PATH, same_family=True, family="intel-amx"))
    assert not any("another CPU" in line for line in own) and any("change of code" in line for line in own)


def test_cpu_family_reads_vendor_and_instruction_set(tmp_path):
    def info(vendor, flags):
        path = tmp_path / f"{vendor}-{len(flags)}"
        path.write_text(f"vendor_id\t: {vendor}\nflags\t\t: {' '.join(flags)}\n")
        return str(path)

    assert cpu_family(info("GenuineIntel", ["avx2", "avx512f", "avx512_bf16", "amx_tile"])) == "intel-amx"
    assert cpu_family(info("AuthenticAMD", ["avx2", "avx512f", "avx512_bf16"])) == "amd-avx512-bf16"
    assert cpu_family(info("AuthenticAMD", ["sse2", "avx2"])) == "amd-avx2"


def test_a_matched_controls_numbers_are_never_compared_with_a_random_ones():
    matched = copy.deepcopy(AMX)
    for m in matched["variants"].values():
        m["control"]["draw"] = "matched"
    names = set(headline_numbers(matched))
    assert "real.control(matched).IS_ctrl" in names and "real.control(random).IS_ctrl" in set(headline_numbers(AMX))
    report = compare_with_reference(matched, AMX)
    assert "real.control(matched).IS_ctrl" in report["only_here"] and report["moved"] == []


def test_the_sufficiency_statements_fail_where_the_variant_abstains_on_short_pools():
    m = {"label_accuracy": 1.0, "control": {"n_control_claims": 10, "n_left_out": [0], "IS": 0.9, "IS_ctrl": 0.0,
                                            "IS_minus_IS_ctrl": 0.9, "intervals": {}},
         "gold_only": {"label_accuracy": 1.0}, "cited_only": {"label_accuracy": 0.97},
         "size_sweep": {"per_k": [{"label_accuracy": 1.0}, {"label_accuracy": 0.99}]}}
    assert all(held for _, held in sufficiency_pattern(m))
    m["size_sweep"]["per_k"][0]["label_accuracy"] = 0.5  # abstains on the shortest pools
    failed = [s for s, held in sufficiency_pattern(m) if not held]
    assert len(failed) == 1 and "every k" in failed[0]


def test_another_cpu_stays_inside_the_tolerance_and_a_real_change_does_not():
    """The measured EPYC vs AMX runs (same code for four variants) differ in dozens of numbers, none beyond a few
    claims; one variant's IS moved by one claim more than the tolerance is reported."""
    across_hosts = compare_with_reference(EPYC, AMX)
    assert across_hosts["compared"] >= 24 and across_hosts["moved"] == []
    changed = copy.deepcopy(AMX)
    real = changed["variants"]["real"]
    c0 = real["n_claims"] * real["round_accuracy"][0]
    real["IS"] -= (FLIP_TOLERANCE_CLAIMS + 1) / c0
    moved = compare_with_reference(changed, AMX)["moved"]
    assert [m["number"] for m in moved] == ["real.IS"]
    real["IS"] = AMX["variants"]["real"]["IS"] - (FLIP_TOLERANCE_CLAIMS - 1) / c0
    assert compare_with_reference(changed, AMX)["moved"] == []


def test_other_size_is_not_compared_and_says_why(tmp_path):
    small = copy.deepcopy(AMX)
    small["size"] = {**AMX["size"], "n_test": 50}
    report = drift_report(small, AMX_PATH)
    assert "moved" not in report and "size" in report["skipped"]
    assert any("not compared" in line for line in drift_lines(report))


def test_a_broken_pattern_is_named_and_fails_the_command(monkeypatch, tmp_path):
    broken = copy.deepcopy(AMX)
    broken["variants"]["real"]["IS"] = broken["variants"]["sft"]["IS"]
    report = drift_report(broken, AMX_PATH)
    assert not report["pattern_held"]
    assert "  [FAILED] ablation raises IS: REAL's IS - SFT's >= 0.5" in drift_lines(report)
    for summary, code in ((broken, EXIT_FAILURE), (AMX, EXIT_OK)):
        monkeypatch.setattr(pipeline, "run_demo", lambda *a, s=summary, **k: s)
        assert run(DemoConfig(output=str(tmp_path))).exit_code == code


def test_a_run_with_the_on_policy_variant_is_compared_with_a_reference_made_without_it(tmp_path):
    """--on-policy adds a variant after the others and changes none of theirs: its run is compared with the
    reference on every number both have, and its own goals are stated."""
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps(AMX))
    with_op = copy.deepcopy(AMX)
    with_op["size"] = {**AMX["size"], "on_policy": True, "on_policy_steps": None}
    with_op["variants"]["on_policy"] = copy.deepcopy(AMX["variants"]["real"])
    report = drift_report(with_op, ref)
    assert "skipped" not in report and report["moved"] == [] and "on_policy.IS" in report["only_here"]
    assert [p["statement"].split(":")[0] for p in report["on_policy"]][:2] == [
        "on_policy reads the full pool", "on_policy needs its evidence"]
    assert "IS - IS_ctrl (paired) >= 0.80" in report["on_policy"][1]["statement"]
    assert any("on_policy's goals" in line for line in drift_lines(report))
    collapsed = copy.deepcopy(with_op)  # an unreadable on-policy variant misses its own goals, not Table 2's
    collapsed["variants"]["on_policy"].update(round_accuracy=[0.12, 0.1], label_accuracy=0.12)
    assert all(held for _, held in table2_pattern(collapsed))
    assert drift_report(collapsed, ref)["on_policy"][0]["held"] is False
    other = copy.deepcopy(with_op)
    other["size"]["n_test"] = 100  # a size that changes every variant is still not compared
    assert "size" in drift_report(other, ref)["skipped"]
