"""The demo's synthetic world: fictional entities, their facts, and claims about them.

Seeded and generated in code, so the demo needs nothing from outside. Every
fact is rendered as one short sentence ("The capital of Zorvia is Quellin .");
a claim restates a fact (SUPPORT) or alters its value (REFUTE). Pools hold
the gold line plus distractors: other facts about the same entity and the
same attribute of other entities, so the verifier must really read the
lines. The encyclopedia (every fact) is what the demo base model was
pretrained on: it "knows" the world, as an LLM knows Wikipedia.

Gold annotations are incomplete on purpose (:func:`add_incomplete_gold`): for
a share of claims a second source repeats the proving fact and the gold names
only one of the two lines, as FEVER's annotators stop at one sufficient set.
No record carries ``enhanced_evidence``: ``real-data enhance`` fills it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from real_fae_core.hashing import keyed_rng
from data_prep.records import REFUTE, SUPPORT, ClaimRecord, Sentence

ATTRIBUTES = ("capital", "river", "founder", "mascot", "export", "festival")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr", "zh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "eo", "ia")
_CODAS = ("", "n", "r", "s", "l", "th", "x", "m")


@dataclass(frozen=True)
class Fact:
    entity: str
    attribute: str
    value: str

    def sentence(self, value: str | None = None) -> str:
        """The fact as the demo's one sentence form; with ``value``, the same sentence stating that value instead."""
        return f"The {self.attribute} of {self.entity} is {value or self.value} ."


@dataclass
class World:
    entities: list[str]
    values: dict[str, list[str]]  # attribute -> its value vocabulary
    facts: dict[tuple[str, str], Fact]  # (entity, attribute) -> fact

    def encyclopedia(self) -> list[str]:
        """Every fact of the world as a sentence: the text the base model learns its knowledge from."""
        return [f.sentence() for f in self.facts.values()]

    def words(self) -> set[str]:
        """Every word a world sentence can hold: the tokenizer's vocabulary is built from them."""
        out = {"The", "of", "is", "."} | set(ATTRIBUTES) | set(self.entities)
        for vals in self.values.values():
            out |= set(vals)
        return out


def _names(rng: random.Random, n: int, taken: set[str], capitalize: bool = True) -> list[str]:
    out = []
    while len(out) < n:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(rng.choice((2, 3))))
        word += rng.choice(_CODAS)
        word = word.capitalize() if capitalize else word
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def build_world(n_entities: int = 300, n_values: int = 16, seed: int = 0) -> World:
    """A world of ``n_entities`` made-up entities, each with one value per attribute from ``n_values`` made-up
    names; the same arguments build the same world."""
    rng = random.Random(seed)
    taken: set[str] = set()
    entities = _names(rng, n_entities, taken)
    values = {a: _names(rng, n_values, taken) for a in ATTRIBUTES}
    facts = {(e, a): Fact(e, a, rng.choice(values[a])) for e in entities for a in ATTRIBUTES}
    return World(entities, values, facts)


def make_record(world: World, fact: Fact, label: str, rng: random.Random, pool_size: int, rid: str) -> ClaimRecord:
    """A claim about ``fact`` with a pool of ``pool_size`` lines (gold + distractors)."""
    if label == SUPPORT:
        claimed = fact.value
    else:
        claimed = rng.choice([v for v in world.values[fact.attribute] if v != fact.value])
    distractors: list[Fact] = []
    same_entity = [world.facts[(fact.entity, a)] for a in ATTRIBUTES if a != fact.attribute]
    others = [e for e in world.entities if e != fact.entity]
    n_same = min(len(same_entity), rng.randint(1, max(1, pool_size - 2)))
    distractors += rng.sample(same_entity, n_same)
    while len(distractors) < pool_size - 1:
        other = rng.choice(others)
        attr = fact.attribute if rng.random() < 0.5 else rng.choice(ATTRIBUTES)
        cand = world.facts[(other, attr)]
        if cand not in distractors:
            distractors.append(cand)
    lines = [fact] + distractors
    rng.shuffle(lines)
    sentences = [Sentence(id=i, text=f.sentence(), doc=f.entity) for i, f in enumerate(lines)]
    gold = lines.index(fact)
    return ClaimRecord(
        id=rid,
        dataset="demo-world",
        claim=fact.sentence(claimed),
        label=label,
        sentences=sentences,
        evidence=[[gold]],
        extra={"entity": fact.entity, "attribute": fact.attribute},
    )


def make_split(
    world: World, facts: list[Fact], seed: int, prefix: str, min_pool: int = 3, max_pool: int = 6
) -> list[ClaimRecord]:
    """One claim per fact, labels alternating by a seeded coin."""
    rng = random.Random(seed)
    out = []
    for i, fact in enumerate(facts):
        label = SUPPORT if rng.random() < 0.5 else REFUTE
        out.append(make_record(world, fact, label, rng, rng.randint(min_pool, max_pool), f"{prefix}-{i}"))
    return out


def train_test_facts(world: World, n_train: int, n_test: int, seed: int) -> tuple[list[Fact], list[Fact]]:
    """Disjoint fact sets: test claims are about facts the verifier was never fine-tuned on
    (but that the base model read in its encyclopedia)."""
    facts = sorted(world.facts.values(), key=lambda f: (f.entity, f.attribute))
    rng = random.Random(seed)
    rng.shuffle(facts)
    return facts[:n_train], facts[n_train : n_train + n_test]


SECOND_SOURCE = "almanac"  # the ``doc`` of the repeated proving line


def add_incomplete_gold(records: list[ClaimRecord], seed: int | str, share: float = 0.35) -> list[ClaimRecord]:
    """Make the gold annotation incomplete for about ``share`` of the claims (seeded).

    Such a claim's pool gains a second line that proves it: the same fact
    sentence from a second source (``doc`` = ``"almanac"``; the verifier sees
    only the text, and the word-level demo tokenizer knows every word of it),
    inserted at a random position; the pool is renumbered in reading order
    and ``evidence`` names one of the two copies, chosen by a coin. Every
    record gets ``extra["proving_ids"]`` (the lines that really prove or
    refute it, for the enhancement and subset reports) and
    ``extra["incomplete_gold"]``. Drawn from an RNG of its own, after the
    records exist: ``make_record``/``make_split`` (which the base builder draws
    its training data from) and their random stream are untouched.
    """
    rng = keyed_rng("demo-incomplete-gold", seed, sep="-")  # the text seed "demo-incomplete-gold-{seed}"
    for rec in records:
        (gold,) = rec.gold_ids
        if rng.random() >= share:
            rec.extra.update(incomplete_gold=False, proving_ids=[gold])
            continue
        sents = list(rec.sentences)
        original = sents[gold]
        copy = Sentence(id=-1, text=original.text, doc=SECOND_SOURCE)
        sents.insert(rng.randint(0, len(sents)), copy)
        proving = [k for k, s in enumerate(sents) if s is original or s is copy]
        named = proving[rng.randrange(2)]
        rec.sentences = [Sentence(id=k, text=s.text, doc=s.doc) for k, s in enumerate(sents)]
        rec.evidence = [[named]]
        rec.extra.update(incomplete_gold=True, proving_ids=proving)
    return records


def add_counterfactuals(world: World, records: list[ClaimRecord], seed: int) -> list[ClaimRecord]:
    """Give each claim ``counterfactual_sentences`` of both kinds for ``fae pave`` (SPEC §9).

    Each counterfactual carries the verdict opposite to the claim's gold
    label (PAVE's label consistency), provable here by rule because every
    (entity, attribute) has exactly one value. ``entity`` changes the gold
    line's value (one span, a fine-grained error): for a SUPPORT claim away
    from the claim's (true) value, so the line refutes it; for a REFUTE claim
    to the claim's own (false) value, so the line supports it. ``semantic``
    contradicts the fact as a whole: the line gives the entity that value and
    says that the true value belongs to a different entity. (``fae pave``
    shows the counterfactual line alone, as it shows the gold lines alone,
    so a second proving copy never sits beside it.) Drawn from an RNG of its
    own, after the world and the records exist, so the world's random stream
    (and the demo's FAE numbers) are what they were without counterfactuals;
    the draws are the same for every claim, so SUPPORT claims get the lines
    they got before counterfactuals were claim-aware.
    """
    rng = keyed_rng("demo-counterfactual", seed, sep="-")  # the text seed "demo-counterfactual-{seed}"
    for rec in records:
        fact = world.facts[(rec.extra["entity"], rec.extra["attribute"])]
        (gold,) = rec.gold_ids
        others = [v for v in world.values[fact.attribute] if v != fact.value]
        swapped = rng.choice(others)
        holder = rng.choice([e for e in world.entities
                             if e != fact.entity and world.facts[(e, fact.attribute)].value != fact.value])
        moved = Fact(holder, fact.attribute, fact.value).sentence()
        contradicting = rng.choice(others)
        if rec.label == REFUTE:  # the claim states a false value: the counterfactual states it too
            swapped = contradicting = claimed_value(rec)
        rec.extra["counterfactual_sentences"] = {
            "entity": [{"id": gold, "text": fact.sentence(swapped), "doc": fact.entity, "check": "rule"}],
            "semantic": [{"id": gold, "text": f"{fact.sentence(contradicting)} {moved}", "doc": fact.entity,
                          "check": "rule"}],
        }
    return records


def claimed_value(rec: ClaimRecord) -> str:
    """The value a claim states ("The capital of Zorvia is Brelon ." -> "Brelon")."""
    return rec.claim.split()[-2]
