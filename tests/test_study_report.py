"""`fae study-report`'s numbers on grids whose answers are known: SciFact's corpus F1, D_context and the
budget-crossing split, the Bonferroni bound, the seeded bootstrap, the decision rule, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from real_fae_core.errors import UserError
from fae.comparison.accounting import paired_bootstrap
from fae.study import analysis
from fae.study import report as rep
from fae.study.interfaces import INVALID
from study_helpers import write_study

S, R, N = "SUPPORT", "REFUTE", "NOT_ENOUGH_INFO"


def unit(uid, gold, groups, sub0, sub1, claim=None, budgets=(256,)):
    return {"id": uid, "claim_id": claim or uid, "gold_label": gold, "groups": groups,
            "submitted": {str(b): [sub0, sub1] for b in budgets}}


def test_scifact_f1_counts_rationales_and_keeps_misses_in_r():
    units = [unit("u1", S, [[0, 1]], [0, 1], [0]),     # correct, complete rationale under source 0 only
             unit("u2", S, [[2]], [0, 1], [0, 1]),     # correct label, rationale not submitted: no C
             unit("u3", N, [], [0], [0]),              # NEI gold answered REFUTE: in P, never in C
             unit("u4", N, [], [0], [0]),              # NEI answered NEI: not submitted
             unit("u5", R, [], [0], [0], claim="c5"),  # a missed pool (no complete group): in R and P
             unit("u6", S, [[0]], [0], [0])]           # invalid answer: neither P nor C
    answers = {}
    for uid, ans in (("u1", S), ("u2", S), ("u3", R), ("u4", N), ("u5", R), ("u6", INVALID)):
        for s in (0, 1):
            answers[(uid, s, 256, "labels", 0)] = ans
    sums, n_fam = analysis.build_sums(units, answers, [("labels", 256, 256)], [0], "f1", lambda u: u["claim_id"],
                                {"c5": 1})  # one gold abstract of claim c5 was never retrieved
    out = analysis.block_outputs(sums.sum(axis=0)[0], "f1")
    # C00 = 1 (u1), P = 4 (u1, u2, u3, u5), R = 5 (u1, u2, u5, u6, the missed abstract): F1 = 2/9
    assert out[analysis.OUT["S00"]] == pytest.approx(200 * 1 / 9)
    assert out[analysis.OUT["S01"]] == pytest.approx(0.0)  # source 1 submits u1's rationale incomplete
    assert out[analysis.OUT["E0"]] == pytest.approx(-200 / 9)
    assert n_fam == 6  # the missed abstract joined its claim's family
    # product + covariance add up to E0 (the accounting split, scaled by 2n / (P + R))
    assert out[analysis.OUT["E0_product"]] + out[analysis.OUT["E0_covariance"]] == pytest.approx(out[analysis.OUT["E0"]])


def crossing_panel(n=10, k_small=3, k_large=7, seeds=2):
    """Gold SUPPORT, group [0]. Source 0 never submits it; source 1 submits it at 2048 only. Source-0 answers
    are right on k_small units at input 256 and on k_large at input 2048, whatever the format and seed."""
    budgets = (256, 2048)
    units = [{"id": f"u{i}", "claim_id": f"c{i}", "gold_label": S, "groups": [[0]],
              "submitted": {"256": [[1], [1]], "2048": [[1], [0]]}} for i in range(n)]
    answers = {}
    for i in range(n):
        for s in (0, 1):
            for b, k in ((256, k_small), (2048, k_large)):
                for f in ("codes", "labels"):
                    for r in range(seeds + 1):
                        answers[(f"u{i}", s, b, f, r)] = S if i < k else R
    blocks = [(f, u, v) for f in ("codes", "labels") for u in budgets for v in budgets]
    sums, _ = analysis.build_sums(units, answers, blocks, list(range(seeds + 1)), "strict", lambda u: u["claim_id"], {})
    return analysis.Panel("fever", "m", "strict", ["codes", "labels"], list(budgets), list(range(1, seeds + 1)), blocks,
                    sums, n)


def test_d_context_and_the_crossing_split_on_a_known_grid():
    res = analysis.analyse_panel(crossing_panel(), n_primary=2, draws=200)
    v = {k: x["estimate"] for k, x in res["values"].items()}
    # F(u, v) = 100 * mean(a0(u) * d1(v)): F(s,s) = F(l,s) = 0, F(s,l) = 30, F(l,l) = 70
    assert v["D_context"] == pytest.approx(70.0)
    assert v["crossing/input_first.input"] == pytest.approx(0.0)
    assert v["crossing/input_first.scoring"] == pytest.approx(70.0)
    assert v["crossing/scoring_first.scoring"] == pytest.approx(30.0)
    assert v["crossing/scoring_first.input"] == pytest.approx(40.0)
    assert v["D_format"] == pytest.approx(0.0)
    assert res["values"]["D_context"]["seed_signs_agreeing"] == 2
    assert v["budget/2048/E0_product"] + v["budget/2048/E0_covariance"] == pytest.approx(v["budget/2048/E0"])
    lo, hi = res["values"]["D_context"]["ci_low"], res["values"]["D_context"]["ci_high"]
    assert lo <= 70.0 <= hi and lo > 0


def noisy_panel(seed=0):
    rng = np.random.default_rng(seed)
    panel = crossing_panel(n=30, seeds=5)
    panel.sums = panel.sums * rng.integers(0, 2, size=panel.sums.shape)  # some noise, counts stay counts
    return panel


def test_bonferroni_bound_and_the_recorded_seed():
    panel = noisy_panel()
    two = analysis.analyse_panel(panel, n_primary=2, draws=400)
    twelve = analysis.analyse_panel(panel, n_primary=12, draws=400)
    assert twelve["bootstrap"]["bounds"] == [pytest.approx(0.05 / 24), pytest.approx(1 - 0.05 / 24)]
    assert twelve["bootstrap"]["confidence"] == pytest.approx(1 - 0.05 / 12)
    assert twelve["bootstrap"]["seed"] == 20260916 and twelve["bootstrap"]["generator"] == "PCG64"
    w2 = two["values"]["D_context"]["ci_high"] - two["values"]["D_context"]["ci_low"]
    w12 = twelve["values"]["D_context"]["ci_high"] - twelve["values"]["D_context"]["ci_low"]
    assert w12 > w2
    # the adjusted bound is the percentile at 0.05 / (2K) of the same draws
    direct = paired_bootstrap(panel.sums[:, 1:, :], analysis.statistic(panel), n_resamples=400, seed=20260916,
                              confidence=1 - 0.05 / 12)
    i = analysis.output_names(panel).index("D_context")
    assert twelve["values"]["D_context"]["ci_low"] == pytest.approx(direct.ci_low[i])


def test_bootstrap_is_reproducible_from_its_seed_and_resamples_seeds():
    panel = noisy_panel(1)
    a = analysis.analyse_panel(panel, 2, 300, seed=7)["values"]["D_context"]
    b = analysis.analyse_panel(panel, 2, 300, seed=7)["values"]["D_context"]
    c = analysis.analyse_panel(panel, 2, 300, seed=8)["values"]["D_context"]
    assert (a["ci_low"], a["ci_high"]) == (b["ci_low"], b["ci_high"])
    assert (a["ci_low"], a["ci_high"]) != (c["ci_low"], c["ci_high"])
    # one family per unit identical, seeds differing: the interval comes from the seed draw alone
    sums = np.zeros((4, 3, 1))
    sums[:, :, 0] = [1.0, 2.0, 3.0]
    res = paired_bootstrap(sums, lambda x: x[..., 0].mean(axis=-1, keepdims=True), n_resamples=200, seed=1)
    assert res.ci_high[0] - res.ci_low[0] > 1.0


def primary(dataset, model, est, lo, hi, signs=5):
    v = {"estimate": est, "ci_low": lo, "ci_high": hi, "seed_signs_agreeing": signs}
    return {"dataset": dataset, "model": model, "seeds": 5, "primary": ["D_format", "D_context"],
            "values": {"D_context": v, "D_format": {**v, "estimate": 0.0, "ci_low": -1.0, "ci_high": 1.0}}}


def test_decision_rule():
    rep_ = [primary(d, m, 3.0, 1.0, 5.0) for d in ("scifact", "fever") for m in ("a", "b")]
    assert analysis.decision(rep_)["label"] == "replicated dependence"
    rep_[0]["values"]["D_context"]["seed_signs_agreeing"] = 3  # one model on SciFact: 3 of 5 signs
    assert analysis.decision(rep_)["label"] == "restricted/mixed evidence"
    small = [primary(d, m, 0.5, -1.5, 1.9) for d in ("scifact", "fever") for m in ("a", "b")]
    assert analysis.decision(small)["label"] == "bounded stability"


def test_intervals_near_zero_from_invalid_answers_are_not_stability():
    """A model that answers nothing has E0 = 0 everywhere and intervals [0, 0]: inside [-2, 2], but that is
    the absence of answers. A format whose answers are mostly INVALID keeps the label off "bounded stability"
    and is named."""
    def with_invalid(panel, codes, labels):
        panel["diagnostics"] = {"codes/256/source0/greedy": {"n": 10, "invalid_rate": codes},
                                "labels/256/source0/greedy": {"n": 10, "invalid_rate": labels}}
        return panel

    answering = [with_invalid(primary(d, "a", 0.0, 0.0, 0.0), 0.0, 40.0) for d in ("scifact", "fever")]
    assert analysis.decision(answering)["label"] == "bounded stability"
    silent = answering + [with_invalid(primary("scifact", "g", 0.0, 0.0, 0.0), 100.0, 100.0)]
    got = analysis.decision(silent)
    assert got["label"] == "restricted/mixed evidence"
    assert got["unanswered"] == [{"dataset": "scifact", "model": "g", "format": f, "invalid_share": 1.0}
                                 for f in ("codes", "labels")]
    assert "Mostly unanswered" in rep.unanswered_lines(got)[0]


# ---------------------------------------------------------------- study directories by hand


def test_report_of_two_models_writes_json_markdown_and_figure(tmp_path):
    a = write_study(tmp_path / "a", model="a")
    b = write_study(tmp_path / "b", model="b")
    res = rep.run(rep.StudyReportConfig(studies=[str(a), str(b)], output=str(tmp_path / "out"), draws=100,
                                          exploratory_draws=100, post_hoc_draws=100))
    assert res.summary["primary_contrasts"] == 4
    assert (tmp_path / "out" / "contrasts.png").stat().st_size > 1000
    md = (tmp_path / "out" / "study_report.md").read_text()
    assert "| fever | b | D_context |" in md and "Bonferroni over K = 4" in md


@pytest.mark.parametrize("case, fragment", [
    ("missing", "missing condition: unit u0 source 0 budget 256 format codes replicate 0"),
    ("seeds", "differ in seeds"),
    ("pools", "different pools or corpora"),
    ("dataset", "has no label strings"),
    ("same", "both fever x m"),
])
def test_bad_studies_are_one_line_and_nothing_is_written(case, fragment, tmp_path):
    a = write_study(tmp_path / "a", drop=1 if case == "missing" else 0,
                    dataset="feverous" if case == "dataset" else "fever")
    extra = {"seeds": dict(model="b", seeds=(1103,)), "pools": dict(model="b", pools="p2"),
             "same": {}}.get(case)
    studies = [str(a)] + ([str(write_study(tmp_path / "b", **extra))] if extra is not None else [])
    out = tmp_path / "out"
    with pytest.raises(UserError) as err:
        rep.run(rep.StudyReportConfig(studies=studies, output=str(out), draws=50))
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


def test_two_invalid_answers_agree_on_nothing_in_the_valid_pairs():
    """A verifier that answers INVALID everywhere agrees with itself under every control: the rate says
    100, the valid pairs say there is nothing to agree on."""
    def line(kind, control, answer, unit="u1"):
        return {"kind": kind, "unit": unit, "source": 0, "budget": 256, "format": "codes", "replicate": 0,
                "control": control, "answer": answer}

    study = {"units": [{"id": "u1", "gold_label": "SUPPORT"}, {"id": "u2", "gold_label": "REFUTE"}],
             "lines": [line("primary", None, "INVALID"), line("primary", None, "SUPPORT", "u2"),
                       line("control", "order", "INVALID"), line("control", "order", "SUPPORT", "u2"),
                       line("control", "swap", "REFUTE", "u2"), line("control", "mapping", "INFEASIBLE"),
                       line("control", "claim_only", "INVALID")]}
    got = rep.controls(study)
    assert got["order"]["rate"] == 100.0 and got["order"]["valid_pairs"] == 1 and got["order"]["valid_rate"] == 100.0
    assert got["order"]["invalid"] == 1
    assert got["swap"]["rate"] == 0.0 and got["swap"]["valid_rate"] == 0.0
    assert got["mapping"]["feasible"] == 0 and got["mapping"]["valid_rate"] is None
    assert got["claim_only"]["valid_rate"] is None and got["claim_only"]["invalid"] == 1
