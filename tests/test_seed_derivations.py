"""Every per-claim seed comes from real_fae_core.hashing, and each derivation gives the values it always gave.

``derived_seed`` is the one derivation for new code; ``keyed_rng`` and ``sha256_seed`` reproduce the
derivations written before it, which committed results (FAE control and sweep draws, pairs data,
counterfactual requests and audits, the demo's reference numbers) depend on. The expected values
below were computed with the hand-written derivations these replaced; a change here moves those results.
"""

from __future__ import annotations

import random

import pytest

from real_fae_core.hashing import derived_seed, keyed_rng, sha256_seed
from data_prep.counterfactual.audit import stratified_sample
from data_prep.counterfactual.runner import request_seed
from data_prep.pairs.build import matched_removal, sufficiency_removals
from data_prep.records import ClaimRecord, Sentence
from fae.ablation.engine import control_order, sweep_order
from fae.pave.metrics import split_tune
from fae.study.replicates import unit_seed
from real.demo.annotators import ANNOTATORS, annotate


@pytest.fixture
def record() -> ClaimRecord:
    return ClaimRecord(id="claim-7", claim="c", label="SUPPORT",
                       sentences=[Sentence(id=i, text=f"s{i}") for i in range(10)], evidence=[[2, 5]])


def test_derived_seed_values():
    assert derived_seed("controls", "scifact", "c1") == 2104659491
    assert 0 <= derived_seed(1, "a") < 2**31
    # the paper protocol's unit seed is a spec'd hash: bit-identical forever
    assert unit_seed("scifact", "c1", "doc9", 13) == derived_seed("scifact", "c1", "doc9", 13) == 398726319
    assert unit_seed("fever", "c1", None, 13) == derived_seed("fever", "c1", "", 13) == 1352719235


def test_keyed_rng_is_the_joined_text_seed():
    assert keyed_rng("fae-control", 3, "claim-7").random() == random.Random("fae-control:3:claim-7").random()
    assert keyed_rng(5, ("a", "b"), sep="\0").random() == random.Random("5\0('a', 'b')").random()


def test_sha256_seed_values():
    assert sha256_seed(5, "rec", 2) == 17848349311682092388  # counterfactual entity swaps
    assert random.Random(sha256_seed(5, "rec", 2)).random() == 0.014034061314122104
    assert sha256_seed(2, "c0", sep=":") == 9695550492405116394  # PAVE's tuning split
    assert sha256_seed(5, "rec", 2, "flip", 0, bits=31) == 1276233952
    with pytest.raises(ValueError):
        sha256_seed(1, bits=65)


def test_fae_control_and_sweep_orders_are_unchanged(record):
    assert control_order(record, 3) == [4, 9, 6, 7, 1, 0, 5, 3, 2, 8]
    assert sweep_order(record, 3) == [9, 0, 8, 4, 1, 6, 3, 7]
    # the matched control's draw (engine: keyed_rng("fae-control-matched", control_seed, claim id, round))
    assert keyed_rng("fae-control-matched", 3, "claim-7", 1).sample(range(10), 4) == [2, 8, 3, 7]


def test_pairs_removals_are_unchanged(record):
    assert sufficiency_removals(record, [1], 4) == {
        "evidence_positive": [0, 3, 4, 6, 7, 8, 9], "sufficient_positive": [0, 3, 4, 6, 7, 8],
        "short_negative": [0, 1, 2, 3, 4, 5, 6, 8, 9]}
    assert sufficiency_removals(record, [1], None) == {
        "evidence_positive": [0, 3, 4, 6, 7, 8, 9], "sufficient_positive": [3, 6],
        "short_negative": [0, 1, 2, 5, 7, 8]}
    assert matched_removal(record, [1, 3], 4) == [4, 6]


def test_pave_tuning_split_is_unchanged():
    got = split_tune([f"c{i}" for i in range(16)], 0.5, seed=2)
    assert [int(x) for x in got] == [0, 1, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1]


def test_counterfactual_seeds_are_unchanged():
    assert request_seed(5, "rec", 2, "flip", 0) == 1276233952
    assert request_seed(5, "rec", 2, "flip", 1) == 1975576392
    instances = [{"source": s, "kind": k, "gold_label": g, "record_id": f"r{i}"} for i, (s, k, g) in enumerate(
        (s, k, g) for s in ("a", "b") for k in ("entity", "semantic") for g in ("SUPPORT", "REFUTE") for _ in range(3))]
    assert [x["record_id"] for x in stratified_sample(instances, 7, 11)] == ["r8", "r12", "r15", "r21", "r5", "r11", "r1"]


def test_demo_annotators_are_unchanged():
    messages = [{"role": "user", "content": "Claim: The colour of Zorbi is red .\nline0: The colour of Zorbi is red .\n"
                                            "line1: The size of Zorbi is big .\nline2: The colour of Zorbi is red ."}]
    got = [annotate(a, messages, seed=s) for a in ANNOTATORS for s in (0, 1, 2)]
    assert got == [[0, 2], [2], [0, 2], [0, 2], [0, 2], [0, 2], [0, 1, 2], [0, 1], [0, 2]]


@pytest.mark.parametrize("seed", [0, 1, 13, 20260916, "train-0", "test-7", "equivalence-3-1"])
def test_demo_world_draws_are_the_text_seeds_they_replaced(seed, monkeypatch):
    """real/demo/world.py drew from ``random.Random(f"demo-incomplete-gold-{seed}")`` and
    ``random.Random(f"demo-counterfactual-{seed}")``; it now asks keyed_rng for them: the same generator state."""
    import real.demo.world as world

    for name in ("demo-incomplete-gold", "demo-counterfactual"):
        assert keyed_rng(name, seed, sep="-").getstate() == random.Random(f"{name}-{seed}").getstate()
    made = []  # the generators the two sites build, compared with the text seeds they were written with
    monkeypatch.setattr(world, "keyed_rng", lambda *parts, sep: made.append((parts, sep)) or keyed_rng(*parts, sep=sep))
    w = world.build_world(n_entities=40, n_values=6, seed=0)
    facts, _ = world.train_test_facts(w, 6, 0, seed=1)
    world.add_counterfactuals(w, world.add_incomplete_gold(world.make_split(w, facts, seed=2, prefix="t"), seed),
                              seed)
    assert [keyed_rng(*parts, sep=sep).getstate() for parts, sep in made] == [
        random.Random(f"demo-incomplete-gold-{seed}").getstate(), random.Random(f"demo-counterfactual-{seed}").getstate()]
