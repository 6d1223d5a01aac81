"""Sufficiency arms (cited-only, size sweep) and the control matched on the gap (SPEC §6).

Pure schedule tests drive :class:`fae.ablation.engine.ClaimSchedule` with scripted answers; the rest run
`fae run` against verifiers behind a real OpenAI-compatible server on 127.0.0.1 (tests/control_helpers.py):

- one that reads its evidence: every sufficiency arm at its round-0 accuracy;
- one that abstains on any pool shorter than the full one: IS_ctrl = IS, and every sufficiency arm at 0;
- one that abstains on pools of at most two lines: the size sweep rises with k exactly where the pools
  grow past two lines (counted from the pools themselves, the second measure).
"""

import json
import random

import pytest
from control_helpers import (api_key, records_file,  # noqa: F401 - fixtures
                             ENV, KEY, N_LINES, PROOF, abstains_when_shrunk, answer, fae_run, reads_evidence, records,
                             run_with)
from helpers import make_record_dict
from openai_server import LocalOpenAIServer, pool_lines

from data_prep.records import ClaimRecord, save_records
from fae.ablation.engine import (Arms, ablate, matched_control_removal, removal_gap, shows_gap, sweep_pools)
from fae.ablation.runio import read_claims
from fae.backends import Generation
from fae.cli import main


# ---------------------------------------------------------------------------
# the gap a removal leaves, and the matched draw
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kept,kinds", [
    ([10, 20, 30, 40], ()),
    ([20, 30, 40], ("leading",)),
    ([10, 30, 40], ("interior",)),
    ([10, 20, 30], ("trailing",)),
    ([20, 40], ("leading", "interior")),
    ([30], ("leading", "trailing")),
    ([], ("leading", "interior", "trailing")),
])
def test_removal_gap_names_where_lines_went(kept, kinds):
    assert removal_gap([10, 20, 30, 40], kept) == kinds


def test_only_a_leading_or_interior_hole_shows_and_only_under_original_ids():
    assert shows_gap(("leading",)) and shows_gap(("interior", "trailing"))
    assert not shows_gap(("trailing",)) and not shows_gap(())
    assert not shows_gap(("interior",), "renumbered")


def test_the_matched_draw_leaves_the_ablations_gap_kind_wherever_one_exists():
    full = list(range(8))
    for seed in range(30):
        rng = random.Random(seed)
        gone = sorted(rng.sample(full, rng.randint(1, 3)))
        ablated = [i for i in full if i not in gone]
        gold = {gone[0]}
        removed, need, have, how = matched_control_removal(full, ablated, gold, random.Random(seed))
        assert len(removed) == need == len(gone) and not set(removed) & (gold | set(gone))
        control = [i for i in full if i not in set(removed)]
        if how == "kind":
            assert removal_gap(full, control) == removal_gap(full, ablated)
        elif how == "shown":
            assert shows_gap(removal_gap(full, control)) == shows_gap(removal_gap(full, ablated))
        else:  # unmatched: no removal of the eligible lines shows the gap as the ablation does
            import itertools
            eligible = [i for i in ablated if i not in gold]
            assert all(shows_gap(removal_gap(full, [i for i in full if i not in c])) !=
                       shows_gap(removal_gap(full, ablated)) for c in itertools.combinations(eligible, need))


def test_an_ablation_of_the_last_line_cannot_be_matched_when_it_is_the_only_eligible_end():
    # the ablation took the last line (no hole shows); the control may not take it: every draw shows a hole
    removed, need, have, how = matched_control_removal([0, 1, 2, 3], [0, 1, 2], {0}, random.Random(0))
    assert how is None and need == 1 and removed[0] in (1, 2)


# ---------------------------------------------------------------------------
# the schedule: scripted answers, several lines removed over several rounds
# ---------------------------------------------------------------------------


def _record(rid="r", n=8, gold=(3,), ids=None):
    ids = list(range(n)) if ids is None else ids
    sents = [{"id": i, "text": f"line {i}"} for i in ids]
    return ClaimRecord.from_dict(make_record_dict(id=rid, claim=f"claim {rid}", label="SUPPORT", sentences=sents,
                                                  evidence=[list(gold)]))


def _scripted(cites_by_size):
    """A verifier that cites ``cites_by_size[len(pool)]`` shown numbers (SUPPORT), NOT_ENOUGH_INFO otherwise;
    it records the pools it was asked."""
    asked = []

    def generate(prompts, callback=None):
        out = []
        for messages in prompts:
            shown = [int(x) for x in __import__("re").findall(r"^line(\d+):", messages[-1]["content"], re.M)]
            asked.append(shown)
            cite = cites_by_size.get(len(shown))
            out.append(Generation(answer("SUPPORT", [shown[k] for k in cite]) if cite is not None
                                  else answer("NOT_ENOUGH_INFO")))
        return out

    return generate, asked


import re  # noqa: E402


def test_the_control_removes_the_ablations_running_count_at_every_round():
    # round 0 cites two lines (shown 0 and 5), round 1 two more, round 2 one: 2, 4, 5 lines gone
    rec = _record(n=12, gold=(11,))
    generate, _ = _scripted({12: [0, 5], 10: [1, 2], 8: [0]})
    for control in ("matched", "random"):
        [entry] = ablate([rec], generate, rounds=3, arms=Arms(control=control, cited_only=False, size_sweep=False))
        gone = [12 - len(rd["pool_ids"]) for rd in entry["rounds"]]
        assert gone == [0, 2, 4, 5]
        assert all("skipped" not in c for c in entry["control"])
        for r, ctrl in enumerate(entry["control"], start=1):
            assert len(ctrl["removed"]) == gone[r] and len(ctrl["pool_ids"]) == len(entry["rounds"][r]["pool_ids"])
            cited_before = {i for rd in entry["rounds"][:r] for i in rd["cited"]}
            assert not set(ctrl["removed"]) & (cited_before | {11})
        if control == "matched":
            assert all(c["gap_matched"] in ("kind", "shown") for c in entry["control"])
            for r, ctrl in enumerate(entry["control"], start=1):
                full = entry["rounds"][0]["pool_ids"]
                assert shows_gap(removal_gap(full, ctrl["pool_ids"])) == \
                    shows_gap(removal_gap(full, entry["rounds"][r]["pool_ids"]))


def test_renumbered_ids_map_shown_numbers_back_to_record_ids_in_every_arm():
    # record ids 10, 20, ... 70; under renumbered ids the prompt shows 0..n-1
    rec = _record(ids=[10, 20, 30, 40, 50, 60, 70], gold=(40,))
    generate, asked = _scripted({7: [3], 6: [2], 1: [0], 2: [0], 3: [1], 4: [1], 5: [2]})
    [entry] = ablate([rec], generate, rounds=1, arms=Arms(line_ids="renumbered"))
    assert all(shown == list(range(len(shown))) for shown in asked)  # numbers differ from the record ids
    assert entry["rounds"][0]["cited"] == [40] and entry["rounds"][0]["pool_ids"] == [10, 20, 30, 40, 50, 60, 70]
    assert entry["cited_only"]["pool_ids"] == [40] and entry["cited_only"]["reused"]  # = the gold-only pool
    assert entry["gold_only"]["cited"] == [40]
    for rd in entry["size_sweep"]["rounds"]:
        assert 40 in rd["pool_ids"] and set(rd["cited"]) <= set(rd["pool_ids"]) and rd["evidence"] == rd["cited"]


def test_the_sweep_is_nested_seeded_and_ends_one_line_short_of_the_full_pool():
    rec = _record(n=6, gold=(2,))
    order, pools = sweep_pools(rec, seed=0)
    assert [len(p) for p in pools] == [1, 2, 3, 4, 5]  # k = 0 .. n - |gold| - 1
    assert all(set(a) < set(b) for a, b in zip(pools, pools[1:])) and all(2 in p for p in pools)
    assert pools[0] == [2] and sorted(order) == [0, 1, 3, 4, 5]
    assert sweep_pools(rec, seed=0) == (order, pools) and sweep_pools(rec, seed=1)[0] != order
    assert sweep_pools(_record(n=2, gold=(0, 1)), 0) == "the pool holds only gold sentences"


def test_cited_only_is_round_zeros_rationale_and_skipped_when_it_cited_nothing():
    rec = _record(n=6, gold=(2,))
    generate, _ = _scripted({6: [2, 4]})  # cites the gold line and line 4; abstains on every shorter pool
    [entry] = ablate([rec], generate, rounds=1, arms=Arms())
    assert entry["cited_only"]["pool_ids"] == [2, 4] and entry["cited_only"]["label"] == "NOT_ENOUGH_INFO"
    sweep = entry["size_sweep"]["rounds"]
    assert [rd["k"] for rd in sweep] == [0, 1, 2, 3, 4] and sweep[0]["reused"]  # k = 0 is the gold-only pool
    generate, _ = _scripted({})
    [entry] = ablate([rec], generate, rounds=1, arms=Arms())
    assert entry["cited_only"] == {"skipped": "round 0 cited no line of the pool"}


def test_a_question_on_a_pool_already_answered_is_copied_not_asked():
    rec = _record(n=4, gold=(1,))
    generate, asked = _scripted({4: [1], 1: [0], 2: [0], 3: [0]})
    [entry] = ablate([rec], generate, rounds=2, arms=Arms())
    pools = [tuple(p) for p in asked]
    assert len(pools) == len(set(pools))  # no pool reaches the model twice
    assert entry["cited_only"]["reused"] and entry["cited_only"]["pool_ids"] == entry["gold_only"]["pool_ids"]


# ---------------------------------------------------------------------------
# fae run end to end
# ---------------------------------------------------------------------------


def abstains_on_short(body: dict) -> str:
    """Answers on its proving line only when the pool has more than two lines (the size cue)."""
    lines = pool_lines(body)
    proof = [i for i, text in lines.items() if text == PROOF]
    return answer("SUPPORT", proof) if proof and len(lines) > 2 else answer("NOT_ENOUGH_INFO")


def test_a_verifier_that_reads_its_evidence_is_sufficient_on_every_arm(records_file, tmp_path, capfd):
    m, claims = run_with(reads_evidence, records_file, tmp_path / "run")
    assert m["cited_only"]["label_accuracy"] == 1.0 and m["cited_only"]["kept_rate"] == 1.0
    assert m["size_sweep"]["min_accuracy"] == 1.0 and m["size_sweep"]["sweep_accuracy"] == 1.0
    assert [row["n_claims"] for row in m["size_sweep"]["per_k"]] == [len(claims)] * (N_LINES - 1)
    err = capfd.readouterr().err
    assert "cited-only on 40 claims: Acc 100.0" in err and "lowest 100.0" in err
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Sufficiency" in report and (tmp_path / "run" / "sufficiency.png").is_file()


def test_a_verifier_that_abstains_on_any_shorter_pool_fails_every_sufficiency_arm(records_file, tmp_path):
    m, _ = run_with(abstains_when_shrunk, records_file, tmp_path / "run")
    assert m["control"]["IS_ctrl"] == pytest.approx(m["control"]["IS"]) == 1.0
    assert m["cited_only"]["label_accuracy"] == 0.0 and m["cited_only"]["nei_answer_rate"] == 1.0
    assert m["size_sweep"]["sweep_accuracy"] == 0.0
    assert m["cited_only"]["round0_label_accuracy"] == 1.0  # beside round 0 on the same claims


def test_the_size_sweep_finds_the_pool_size_where_a_short_pool_cue_stops(records_file, tmp_path):
    m, claims = run_with(abstains_on_short, records_file, tmp_path / "run")
    per_k = m["size_sweep"]["per_k"]
    for row in per_k:  # the second measure: from the pools the claims were asked
        pools = [c["size_sweep"]["rounds"][row["k"]]["pool_ids"] for c in claims]
        assert row["label_accuracy"] == sum(len(p) > 2 for p in pools) / len(pools)
    assert [row["label_accuracy"] for row in per_k] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert m["size_sweep"]["min_accuracy"] == 0.0 and m["gold_only"]["label_accuracy"] == 0.0


def test_the_arms_can_be_skipped_and_a_resume_across_them_is_refused(records_file, tmp_path, capfd):
    out = tmp_path / "run"
    m, claims = run_with(reads_evidence, records_file, out, "--limit", "5", "--no-cited-only", "--no-size-sweep")
    assert m["cited_only"] is None and m["size_sweep"] is None
    assert all("cited_only" not in c and "size_sweep" not in c for c in claims)
    before = (out / "claims.jsonl").read_bytes()
    for change in ([], ["--no-cited-only"], ["--no-cited-only", "--no-size-sweep", "--sweep-seed", "3"]):
        with LocalOpenAIServer(responder=reads_evidence, api_key=KEY) as srv:
            code = fae_run(records_file, out, srv.base_url, *change)
        if change[-1:] == ["3"]:  # the seed of an arm not asked is not a setting: the same run resumes
            assert code == 0
            continue
        assert code == 2
        err = capfd.readouterr().err
        assert "different settings" in err and ("size_sweep" in err or "cited_only" in err)
        assert (out / "claims.jsonl").read_bytes() == before
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["cited_only"], cfg["size_sweep"], cfg["sweep_seed"]) == (False, False, None)


@pytest.mark.parametrize("flag,value", [("--sweep-seed", "abc"), ("--control", "gap"), ("--size-sweep", "maybe")])
def test_a_bad_value_of_a_new_flag_is_one_line_and_writes_nothing(records_file, tmp_path, capfd, flag, value):
    out = tmp_path / "run"
    assert main(["run", "--backend", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                 "--api-key-env", ENV, "--records", str(records_file), "--output", str(out), flag, value]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    # a value of the wrong type is argparse's usage and one error line; a wrong choice is one line
    assert "error" in err[-1] and (flag in err[-1] or flag.replace("-", "_")[2:] in err[-1] or value in err[-1])
    assert len(err) == 1 or err[0].startswith("usage:")
    assert not out.exists()


def test_records_whose_pool_is_only_gold_are_counted_out_of_the_sweep(tmp_path):
    only_gold = ClaimRecord.from_dict(make_record_dict(id="only", claim="claim only", label="SUPPORT",
                                                       evidence=[[0]], sentences=[{"id": 0, "text": PROOF}]))
    path = tmp_path / "recs.jsonl"
    save_records([*records(4), only_gold], path)
    m, claims = run_with(reads_evidence, path, tmp_path / "run")
    assert m["size_sweep"]["n_claims"] == 4 and m["size_sweep"]["n_skipped"] == 1
    assert m["size_sweep"]["skipped_reasons"] == {"the pool holds only gold sentences": 1}
    assert next(c for c in claims if c["id"] == "only")["size_sweep"] == {
        "skipped": "the pool holds only gold sentences"}


def test_shards_merge_to_the_same_sufficiency_arms_as_one_run(records_file, tmp_path):
    _, whole = run_with(abstains_on_short, records_file, tmp_path / "whole")
    out = tmp_path / "sharded"
    with LocalOpenAIServer(responder=abstains_on_short, api_key=KEY) as srv:
        for i in range(2):
            assert fae_run(records_file, out, srv.base_url, "--shard", f"{i}/2") == 0
    assert main(["merge", str(out)]) == 0
    merged = read_claims(out / "claims.jsonl")
    assert merged == whole and all("cited_only" in c and "size_sweep" in c for c in merged)
    m = json.loads((out / "metrics.json").read_text())
    whole_m = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    assert m["size_sweep"] == whole_m["size_sweep"] and m["cited_only"] == whole_m["cited_only"]
