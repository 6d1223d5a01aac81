"""The control arm, gold-only pools and --line-ids (SPEC §3, §6) on real `fae run` paths.

Three verifiers behind a real OpenAI-compatible server on 127.0.0.1, each a shortcut the control
must catch or a reader it must clear:

- one that abstains whenever the pool is smaller than the full pool: IS_ctrl = IS;
- one that abstains whenever the numbering shows a hole and answers from memory otherwise:
  IS_ctrl = the share of control pools that leave a hole (counted here from the pools themselves),
  and with --line-ids renumbered its IS and IS_ctrl fall to 0;
- one that answers only when its proving line is shown: IS_ctrl = 0 under both numberings.
"""

import json
import re

import pytest
from control_helpers import (api_key, records_file,  # noqa: F401 - fixtures
                             ENV, KEY, N_LINES, PROOF, abstains_on_hole, abstains_when_shrunk, fae_run, has_hole,
                             reads_evidence, records, run_with)
from helpers import make_record_dict
from openai_server import LocalOpenAIServer

from data_prep.records import ClaimRecord, save_records
from fae.ablation.runio import read_claims
from fae.cli import main

def test_a_verifier_that_abstains_whenever_a_line_goes_has_is_ctrl_equal_to_is(records_file, tmp_path):
    m, claims = run_with(abstains_when_shrunk, records_file, tmp_path / "run")
    ctrl = m["control"]
    assert m["IS"] == 1.0
    assert ctrl["n_control_claims"] == len(claims) and ctrl["n_left_out"] == [0, 0]
    assert ctrl["IS_ctrl"] == pytest.approx(1.0) and ctrl["IS_minus_IS_ctrl"] == pytest.approx(0.0)
    iv = ctrl["intervals"]["IS_minus_IS_ctrl"]
    assert iv["ci_low"] <= 0 <= iv["ci_high"]
    for c in claims:  # the control removes what the ablation did, never a cited or gold line
        for r, rnd in enumerate(c["control"], start=1):
            removed = set(rnd["removed"])
            ablated = N_LINES - len(c["rounds"][r]["pool_ids"])
            assert len(removed) == ablated
            assert not removed & {i for g in c["gold_groups"] for i in g}
            assert not removed & {i for rd in c["rounds"][:r] for i in rd["cited"]}
    # the gold-only pool is smaller than the full pool, so this verifier abstains there too
    assert m["gold_only"]["nei_answer_rate"] == 1.0 and m["gold_only"]["label_accuracy"] == 0.0


def test_a_verifier_that_reads_the_numbering_is_caught_and_renumbering_removes_the_cue(records_file, tmp_path):
    # the random control (earlier versions'): only some of its pools show a hole, so IS - IS_ctrl > 0 for a
    # verifier that reads nothing but the numbering
    m, claims = run_with(abstains_on_hole, records_file, tmp_path / "random", "--control", "random")
    holes = [has_hole(c["control"][0]["pool_ids"]) for c in claims]  # the second measure: from the pools
    assert 0 < sum(holes) < len(holes)
    assert m["IS"] == 1.0
    assert m["control"]["IS_ctrl"] == pytest.approx(sum(holes) / len(holes))
    assert m["control"]["IS_minus_IS_ctrl"] > 0.2
    # the matched control (default) shows a hole wherever the ablation does: the cue scores IS - IS_ctrl = 0
    m, claims = run_with(abstains_on_hole, records_file, tmp_path / "original")
    assert all(has_hole(c["control"][0]["pool_ids"]) == has_hole(c["rounds"][1]["pool_ids"]) for c in claims)
    assert m["IS"] == 1.0 and m["control"]["IS_ctrl"] == pytest.approx(1.0)
    assert m["control"]["IS_minus_IS_ctrl"] == pytest.approx(0.0)
    gap = m["control"]["gap"]
    assert gap["ablation_gap_share"][0] == gap["control_gap_share"][0] == 1.0 and gap["n_unmatched"] == [0, 0]
    m2, claims2 = run_with(abstains_on_hole, records_file, tmp_path / "renumbered", "--line-ids", "renumbered")
    assert m2["IS"] == 0.0 and m2["control"]["IS_ctrl"] == 0.0
    # renumbered answers are stored in record ids: round 1 lost the line shown first, i.e. the lowest id
    assert all(c["rounds"][0]["cited"] == [min(c["rounds"][0]["pool_ids"])] for c in claims2)
    assert json.loads((tmp_path / "renumbered" / "config.json").read_text())["line_ids"] == "renumbered"


@pytest.mark.parametrize("line_ids", ["original", "renumbered"])
def test_a_verifier_that_reads_its_evidence_has_no_control_loss(records_file, tmp_path, line_ids, capfd):
    m, claims = run_with(reads_evidence, records_file, tmp_path / line_ids, "--line-ids", line_ids)
    err = capfd.readouterr().err  # the terminal says it too
    assert "IS_ctrl 0.0 [0.0, 0.0], IS - IS_ctrl 100.0 [100.0, 100.0]" in err and "NOT_ENOUGH_INFO 0.0%" in err
    assert m["label_accuracy"] == 1.0 and m["IS"] == 1.0
    assert m["control"]["IS_ctrl"] == 0.0 and m["control"]["IS_minus_IS_ctrl"] == 1.0
    assert m["control"]["intervals"]["IS_minus_IS_ctrl"]["ci_low"] == 1.0
    assert m["gold_only"]["label_accuracy"] == 1.0 and m["gold_only"]["nei_answer_rate"] == 0.0
    for c in claims:  # cited numbers are mapped back to record ids under either numbering
        assert c["rounds"][0]["cited"] == c["gold_groups"][0]
        assert c["gold_only"]["pool_ids"] == c["gold_groups"][0]


def test_control_draws_are_seeded_recorded_and_none_skips_them(records_file, tmp_path):
    _, a = run_with(abstains_on_hole, records_file, tmp_path / "a")
    _, b = run_with(abstains_on_hole, records_file, tmp_path / "b")
    assert [c["control"] for c in a] == [c["control"] for c in b]
    _, c = run_with(abstains_on_hole, records_file, tmp_path / "c", "--control-seed", "7")
    assert [x["control"][0]["removed"] for x in a] != [x["control"][0]["removed"] for x in c]
    m, d = run_with(abstains_on_hole, records_file, tmp_path / "d", "--control", "none", "--no-gold-only")
    assert m["control"] is None and m["gold_only"] is None
    assert all("control" not in x and "gold_only" not in x for x in d)


def test_claims_with_too_few_free_lines_are_left_out_of_the_control_only(tmp_path):
    recs = records(6)
    small = ClaimRecord.from_dict(make_record_dict(  # the verifier cites both lines, one gold: none left to draw
        id="small", claim="claim small", label="SUPPORT", evidence=[[1]],
        sentences=[{"id": 0, "text": PROOF}, {"id": 1, "text": PROOF}]))
    path = tmp_path / "recs.jsonl"
    save_records([*recs, small], path)
    m, claims = run_with(reads_evidence, path, tmp_path / "run")
    assert m["n_claims"] == 7 and m["control"]["n_left_out"][0] == 1
    assert m["control"]["n_control_claims"] == 6
    assert "skipped" in next(c for c in claims if c["id"] == "small")["control"][0]


@pytest.mark.parametrize("flag,value", [("--line-ids", "shuffled"), ("--control", "sometimes")])
def test_an_unknown_choice_is_one_line_and_writes_nothing(records_file, tmp_path, capfd, flag, value):
    out = tmp_path / "run"
    assert main(["run", "--backend", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                 "--api-key-env", ENV, "--records", str(records_file), "--output", str(out), flag, value]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and value in err[0] and flag in err[0]
    assert not out.exists()


@pytest.mark.parametrize("change", [["--line-ids", "renumbered"], ["--control", "none"], ["--control-seed", "3"],
                                    ["--no-gold-only"]])
def test_a_resume_across_the_numbering_or_the_control_is_refused(records_file, tmp_path, capfd, change):
    out = tmp_path / "run"
    run_with(reads_evidence, records_file, out, "--limit", "5")
    before = (out / "claims.jsonl").read_bytes()
    with LocalOpenAIServer(responder=reads_evidence, api_key=KEY) as srv:
        assert fae_run(records_file, out, srv.base_url, *change) == 2
    err = capfd.readouterr().err
    assert "different settings" in err and re.search(r"line_ids|control|gold_only", err)
    assert (out / "claims.jsonl").read_bytes() == before


def test_the_report_shows_the_control_and_gold_only_columns(records_file, tmp_path):
    run_with(reads_evidence, records_file, tmp_path / "run")
    report = (tmp_path / "run" / "report.md").read_text()
    assert "IS_ctrl" in report and "IS − IS_ctrl" in report and "gold-only" in report


def test_shards_merge_to_the_same_control_and_gold_only_as_one_run(records_file, tmp_path):
    _, whole = run_with(abstains_on_hole, records_file, tmp_path / "whole")
    out = tmp_path / "sharded"
    with LocalOpenAIServer(responder=abstains_on_hole, api_key=KEY) as srv:
        for i in range(2):
            assert fae_run(records_file, out, srv.base_url, "--shard", f"{i}/2") == 0
    assert main(["merge", str(out)]) == 0
    merged = read_claims(out / "claims.jsonl")
    assert merged == whole and all("control" in c and "gold_only" in c for c in merged)
    m = json.loads((out / "metrics.json").read_text())
    assert m["control"] == json.loads((tmp_path / "whole" / "metrics.json").read_text())["control"]


def test_is_minus_is_ctrl_is_the_difference_of_the_two_point_estimates():
    """control_metrics' IS − IS_ctrl comes from fae.ablation.scores (control_evidence_part): bitwise the
    difference it computed by hand before, IS - IS_ctrl."""
    from fae.ablation.scores import control_evidence_part, control_sensitivity, immediate_sensitivity

    for a0, a1, c1 in ((0.7, 0.3, 0.6), (1 / 3, 1 / 7, 2 / 9), (0.9, 0.9, 0.1)):
        IS, IS_ctrl = float(immediate_sensitivity(a0, a1)), control_sensitivity(a0, c1)
        assert control_evidence_part(IS, IS_ctrl) == IS - IS_ctrl
    assert control_evidence_part(None, 0.2) is None and control_evidence_part(0.2, None) is None
