"""`real-data pairs --keep-pairs-together`: records shuffled, each positive right before its negative."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.pairs.build import build_pairs
from data_prep.records import ClaimRecord


def _record(i: int, label: str, pool: int, gold: list[int]) -> ClaimRecord:
    return ClaimRecord.from_dict({
        "id": f"r{i}", "claim": f"claim {i}", "label": label, "dataset": "t",
        "sentences": [{"id": k, "text": f"sentence {k} of {i}"} for k in range(pool)],
        "evidence": [gold] if label != "NOT_ENOUGH_INFO" else []})




@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(0, 10**6))
def test_grouped_rows_are_the_same_rows_with_each_negative_after_its_positive(data, seed):
    spec = data.draw(st.lists(st.tuples(st.sampled_from(["SUPPORT", "REFUTE", "NOT_ENOUGH_INFO"]),
                                        st.integers(1, 5)), max_size=25))
    records = []
    for i, (label, pool) in enumerate(spec):
        gold = sorted(data.draw(st.sets(st.integers(0, pool - 1), min_size=1)))
        records.append(_record(i, label, pool, gold))
    grouped, info_g = build_pairs(records, "no_enhancement", seed=seed, keep_pairs_together=True)
    plain, info_p = build_pairs(records, "no_enhancement", seed=seed)
    key = lambda r: (r["record_id"], r["kind"])  # noqa: E731
    assert Counter(map(key, grouped)) == Counter(map(key, plain))
    assert info_g == info_p
    for k, row in enumerate(grouped):
        if row["kind"] == "negative":  # its positive is the row just before it
            assert k > 0 and grouped[k - 1]["record_id"] == row["record_id"] and grouped[k - 1]["kind"] == "positive"
    # the same seed gives the same file
    again, _ = build_pairs(records, "no_enhancement", seed=seed, keep_pairs_together=True)
    assert again == grouped


def test_grouping_still_shuffles_records():
    records = [_record(i, "SUPPORT" if i % 2 else "REFUTE", 4, [0]) for i in range(40)]
    grouped, _ = build_pairs(records, "no_enhancement", seed=1, keep_pairs_together=True)
    order = [r["record_id"] for r in grouped if r["kind"] == "positive"]
    assert sorted(order) == sorted(f"r{i}" for i in range(40)) and order != [f"r{i}" for i in range(40)]
