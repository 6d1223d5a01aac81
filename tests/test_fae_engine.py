"""The ablation loop: pool arithmetic, reuse, invalid answers, chunking."""

import json

import pytest
from fae_helpers import Scripted, rec
from helpers import make_record_dict

from data_prep.records import ClaimRecord
from fae.ablation.engine import (
    ablate,
    make_round,
    next_pool,
    pool_after,
    reuse_round,
    run_ablation,
)


def test_next_pool_removes_only_present_ids_and_keeps_order():
    assert next_pool([5, 1, 3, 9], [3, 5]) == [1, 9]
    assert next_pool([5, 1, 3], [42, 3, 3]) == [5, 1]
    assert next_pool([5, 1], []) == [5, 1]
    assert next_pool([], [1]) == []


def test_make_round_parses_against_the_shown_pool():
    r = make_round(1, [2, 3], '{"label": "REFUTE", "evidence": [3, 0, "line2"]}')
    assert r["label"] == "REFUTE" and r["cited"] == [3, 2] and r["hallucinated"] == [0]
    assert r["evidence"] == [3, 0, 2] and r["valid"] and not r["reused"]
    assert pool_after(r) == []
    bad = make_round(0, [0, 1], "I think it is true")
    assert bad["label"] is None and not bad["valid"] and bad["cited"] == [] and bad["error"]
    assert pool_after(bad) == [0, 1]
    again = reuse_round(bad, 1)
    assert again["round"] == 1 and again["reused"] and again["raw_output"] == bad["raw_output"]
    assert bad["round"] == 0 and not bad["reused"]  # the copy does not alias


def test_ablation_removes_cited_ids_round_by_round():
    gen = Scripted()
    out = ablate([rec("a", n=3)], gen, rounds=4)
    rounds = out[0]["rounds"]
    assert [r["pool_ids"] for r in rounds] == [[0, 1, 2], [1, 2], [2], [], []]
    assert [r["label"] for r in rounds] == ["SUPPORT"] * 3 + ["NOT_ENOUGH_INFO"] * 2
    assert [r["reused"] for r in rounds] == [False, False, False, False, True]
    assert len(gen.calls) == 4  # the last round reused the unchanged empty pool
    assert out[0]["gold_label"] == "SUPPORT" and out[0]["gold_groups"] == [[0]] and out[0]["id"] == "a"


def test_invalid_and_hallucinated_answers_never_crash_and_remove_nothing():
    script = {
        "garbage": lambda ids: "<<<not json>>>",
        "inventor": lambda ids: json.dumps({"label": "SUPPORT", "evidence": [99]}),
        "halfway": lambda ids: json.dumps({"label": "REFUTE", "evidence": [ids[0], 77]}) if len(ids) > 2
        else "",
    }
    recs = [ClaimRecord.from_dict(make_record_dict(
        id=name, claim=name, sentences=[{"id": i, "text": f"s{i}"} for i in range(4)], evidence=[[0]]))
        for name in script]
    gen = Scripted(script)
    out = {c["id"]: c["rounds"] for c in ablate(recs, gen, rounds=3)}
    g = out["garbage"]
    assert all(not r["valid"] and r["label"] is None for r in g)
    assert [r["reused"] for r in g] == [False, True, True, True]
    i = out["inventor"]
    assert i[0]["hallucinated"] == [99] and i[0]["cited"] == [] and i[0]["valid"]
    assert [r["pool_ids"] for r in i] == [[0, 1, 2, 3]] * 4 and i[1]["reused"]
    h = out["halfway"]
    assert [r["pool_ids"] for r in h] == [[0, 1, 2, 3], [1, 2, 3], [2, 3], [2, 3]]
    assert h[1]["hallucinated"] == [77] and not h[2]["valid"] and h[3]["reused"]
    # model calls: garbage 1, inventor 1, halfway 3
    assert len(gen.calls) == 5


def test_chunking_does_not_change_answers_and_writes_in_order():
    recs = [rec(f"r{k}", n=1 + k % 4) for k in range(7)]
    whole = ablate(recs, Scripted(), rounds=2)
    written = []
    stats = run_ablation(recs, Scripted(), 2, written.extend, chunk_size=3, progress=False)
    # a window smaller than the input takes claims by prompt length, and writes them in that order
    assert sorted(written, key=lambda c: c["id"]) == sorted(whole, key=lambda c: c["id"])
    assert [c["id"] for c in written] == ["r0", "r4", "r1", "r5", "r2", "r6", "r3"]
    in_order = []
    run_ablation(recs, Scripted(), 2, in_order.extend, chunk_size=len(recs), progress=False)
    assert in_order == whole  # a window holding every claim: input order
    assert stats["claims"] == 7
    assert stats["model_calls"] + stats["reused_calls"] == 7 * 3
    assert stats["reused_calls"] == sum(r["reused"] for c in whole for r in c["rounds"])


def test_backend_returning_wrong_count_is_an_error():
    with pytest.raises(RuntimeError, match="answers for"):
        ablate([rec("a")], lambda prompts, callback=None: [], rounds=1)
