"""`fae study --sample N [--families FILE]`: a subset sized to the compute, whole families, by hash."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from real_fae_core.errors import UserError
from fae.study.runner import StudyConfig, limited
from fae.study.grid import Pools, StudyUnit, sample_claims


def _unit(claim: str, doc: str = "d") -> StudyUnit:
    return StudyUnit(f"scifact-{claim}:{doc}", claim, "scifact", f"claim {claim}", "SUPPORT", [], {}, [[]], {},
                     doc)


def _units(n_claims: int, docs: int = 2) -> list[StudyUnit]:
    return [_unit(str(c), str(d)) for c in range(n_claims) for d in range(docs)]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 40), st.integers(1, 6))
def test_a_sample_takes_whole_families_until_n_claims(n_claims, n, family_size):
    units = _units(n_claims)
    families = {u.id: f"fam{int(u.claim_id) // family_size}" for u in units}
    chosen = sample_claims(units, n, families)
    assert chosen == sample_claims(list(reversed(units)), n, families)  # by hash, not by position
    by_family: dict[str, set[str]] = {}
    for u in units:
        by_family.setdefault(families[u.id], set()).add(u.claim_id)
    taken = {f for f, claims in by_family.items() if claims & set(chosen)}
    assert set(chosen) == set().union(*(by_family[f] for f in taken))  # whole families only
    assert len(chosen) >= min(n, n_claims)
    # the last family taken is what crossed n: without it the sample would be short of n
    assert len(chosen) - max(len(by_family[f]) for f in taken) < n or len(chosen) == n_claims


def test_without_a_families_file_each_claim_is_its_own_family_and_the_choice_is_a_hash_not_the_first():
    units = _units(40)
    chosen = sample_claims(units, 10, {})
    assert len(chosen) == 10
    assert chosen != sorted({u.claim_id for u in units})[:10]  # not the first ten
    assert sample_claims(units, 10, {}) == chosen


def _pools(units):
    return Pools("scifact", units, [256], 2, {u.claim_id: 1 for u in units}, "0" * 64, "pools")


def _config(**kw):
    return StudyConfig(pools="pools", output="out", model="m", **kw)


def test_limited_applies_the_sample_and_keeps_every_unit_of_a_claim(tmp_path):
    units = _units(12, docs=3)
    fam = tmp_path / "families.jsonl"
    fam.write_text("".join(json.dumps({"id": u.id, "family": f"f{int(u.claim_id) % 4}"}) + "\n" for u in units))
    kept = limited(_pools(units), _config(sample=4, families=str(fam)))
    claims = {u.claim_id for u in kept.units}
    assert len(kept.units) == 3 * len(claims) and len(claims) == 6  # one family of three claims, then another
    assert len({int(c) % 4 for c in claims}) == 2
    assert set(kept.missed_relevant) == claims


def test_limit_and_sample_together_and_families_alone_are_refused(tmp_path):
    pools = _pools(_units(3))
    with pytest.raises(UserError, match="--limit, --sample and --units-from each choose the claims"):
        limited(pools, _config(sample=2, limit=2))
    with pytest.raises(UserError, match="--families chooses whole families for --sample"):
        limited(pools, _config(families=str(tmp_path / "f.jsonl")))
    with pytest.raises(UserError, match="families file not found"):
        limited(pools, _config(sample=1, families=str(tmp_path / "missing.jsonl")))
    assert limited(pools, dataclasses.replace(_config(), limit=None)) is pools


def test_a_families_file_leaving_a_pool_out_is_refused_before_sampling(tmp_path):
    """A families file built from records.jsonl alone names no missed pool: the sample would take such a pool as
    a family of its own apart from its twins, so the file is refused, naming the pool."""
    units = _units(3)
    fam = tmp_path / "families.jsonl"
    fam.write_text("".join(json.dumps({"id": u.id, "family": "f"}) + "\n" for u in units[:-1]))
    with pytest.raises(UserError, match=r"unit 'scifact-2:1' of --pools pools is in no family"):
        limited(_pools(units), _config(sample=1, families=str(fam)))


def _reference(tmp_path, ids, sha="0" * 64, sample=None):
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "study.json").write_text(json.dumps({"pools_sha256": sha, "limit": None, "sample": sample}))
    (ref / "units.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    return ref


def test_units_from_keeps_exactly_the_other_studys_units_and_carries_its_record(tmp_path):
    from fae.study.runner import selection_of

    units = _units(12, docs=3)
    ids = [u.id for u in units if u.claim_id in ("3", "7")]
    record = {"claims": 2, "families_sha256": "a" * 64, "selected_claims": 2}
    ref = _reference(tmp_path, ids, sample=record)
    config = _config(units_from=str(ref))
    kept = limited(_pools(units), config)
    assert [u.id for u in kept.units] == ids and set(kept.missed_relevant) == {"3", "7"}
    assert selection_of(config, kept) == {"limit": None, "sample": record, "units_from": str(ref)}
    assert selection_of(_config(limit=3), kept) == {"limit": 3, "sample": None}


@pytest.mark.parametrize("case", ["other pools", "unknown unit", "no units file", "with a sample", "with families"])
def test_units_from_is_refused_on_other_pools_unknown_units_or_beside_a_sample(tmp_path, case):
    units = _units(3)
    ref = _reference(tmp_path, [units[0].id] + (["scifact-9:0"] if case == "unknown unit" else []),
                     sha="1" * 64 if case == "other pools" else "0" * 64)
    if case == "no units file":
        (ref / "units.jsonl").unlink()
    fragment = {"other pools": "its study asked other pools", "unknown unit": "unit 'scifact-9:0' is not in --pools",
                "no units file": "units.jsonl not found", "with a sample": "each choose the claims",
                "with families": "--families chooses whole families for --sample"}[case]
    with pytest.raises(UserError, match=fragment):
        limited(_pools(units), _config(units_from=str(ref), sample=2 if case == "with a sample" else None,
                                       families=str(ref / "f.jsonl") if case == "with families" else None))
