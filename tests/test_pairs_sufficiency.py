"""Sufficiency pairs (SPEC §4 real_sufficient / no_enhancement_sufficient): positives on the evidence alone and on
shorter pools that hold it, negatives at every pool size, so that neither size, gap nor position predicts
NOT_ENOUGH_INFO."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.pairs.build import (EVIDENCE_POSITIVE, MATCHED_POSITIVE, NEGATIVE, POSITIVE, SHORT_NEGATIVE,
                                   SUFFICIENT_POSITIVE, build_pairs, sufficiency_removals)
from data_prep.records import NOT_ENOUGH_INFO, ClaimRecord
from fae.ablation.engine import removal_gap
from helpers import make_record_dict


def record(rid: str, n: int, gold: list[int], label: str = "SUPPORT", enhanced: list[int] | None = None):
    rec = ClaimRecord.from_dict(make_record_dict(
        id=rid, claim=f"claim {rid}", label=label, evidence=[gold],
        sentences=[{"id": i, "text": f"sentence {i} of {rid}"} for i in range(n)]))
    rec.enhanced_evidence = sorted(set(enhanced if enhanced is not None else gold))
    return rec


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), data=st.data(), seed=st.integers(0, 10_000))
def test_every_sufficiency_row_keeps_or_removes_exactly_the_evidence(n, data, seed):
    gold = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    extra = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n)))
    rec = record("r", n, gold, enhanced=gold + extra)
    evidence = set(rec.enhanced_evidence) | set(gold)
    others = [i for i in range(n) if i not in evidence]
    rows, info = build_pairs([rec], "real_sufficient", seed=seed)
    by_kind = {r["kind"]: r for r in rows}
    assert Counter(r["kind"] for r in rows)[SUFFICIENT_POSITIVE] <= 1
    if not others:  # the pool is all evidence: no negative and nothing shorter to show
        assert set(by_kind) == {POSITIVE} and info["dropped"]["empty_ablated_pool"] == 1
        return
    if others:
        alone = by_kind[EVIDENCE_POSITIVE]
        assert set(alone["pool_ids"]) == evidence and alone["label"] == "SUPPORT"
    if len(others) >= 2:
        pos, neg = by_kind[SUFFICIENT_POSITIVE], by_kind[SHORT_NEGATIVE]
        assert evidence <= set(pos["pool_ids"]) and len(evidence) < len(pos["pool_ids"]) < n
        assert not evidence & set(neg["pool_ids"]) and 1 <= len(neg["pool_ids"]) < len(others)
        assert neg["label"] == NOT_ENOUGH_INFO and pos["label"] == "SUPPORT"
        assert set(pos["removed_ids"]) == set(range(n)) - set(pos["pool_ids"])
    else:
        assert SUFFICIENT_POSITIVE not in by_kind and SHORT_NEGATIVE not in by_kind
    # real_matched's rows are all there, unchanged
    matched, _ = build_pairs([rec], "real_matched", seed=None)
    ours, _ = build_pairs([rec], "real_sufficient", seed=None)
    assert [r for r in ours if r["kind"] in (POSITIVE, NEGATIVE, MATCHED_POSITIVE)] == \
        [{**r, "variant": "real_sufficient"} for r in matched]


def test_the_draws_are_seeded_by_record_and_not_by_file_order():
    recs = [record(f"r{k}", 8, [k % 8]) for k in range(20)]
    a = {rec.id: sufficiency_removals(rec, rec.gold_ids, 7) for rec in recs}
    b = {rec.id: sufficiency_removals(rec, rec.gold_ids, 7) for rec in reversed(recs)}
    c = {rec.id: sufficiency_removals(rec, rec.gold_ids, 8) for rec in recs}
    assert a == b and a != c


def test_neither_pool_size_nor_gap_predicts_not_enough_info():
    """Over many records, at every pool size and every gap kind that has rows, both answers occur; the matched
    variant alone never shows a pool of one line, so what a verifier does there was never taught."""
    recs = [record(f"r{k}", 3 + k % 5, [k % (3 + k % 5)]) for k in range(300)]

    def labels_by(rows, key):
        out: dict = {}
        for r in rows:
            full = list(range(int(r["record_id"][1:]) % 5 + 3))
            out.setdefault(key(r, full), set()).add(r["label"] == NOT_ENOUGH_INFO)
        return out

    rows, _ = build_pairs(recs, "no_enhancement_sufficient", seed=0)
    by_size = labels_by(rows, lambda r, full: len(r["pool_ids"]))
    by_gap = labels_by(rows, lambda r, full: removal_gap(full, r["pool_ids"]))
    assert all(both == {True, False} for size, both in by_size.items() if size < 7), by_size
    assert all(both == {True, False} for gap, both in by_gap.items() if gap), by_gap
    assert by_size[1] == {True, False}
    matched, _ = build_pairs(recs, "no_enhancement_matched", seed=0)
    assert 1 not in labels_by(matched, lambda r, full: len(r["pool_ids"]))
