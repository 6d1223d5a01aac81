"""Replicates of the evaluation-choice study (SPEC §10): greedy plus seeded samples, each unit its own seed.

A condition is answered ``1 + N`` times: replicate 0 greedy, replicates 1..N sampled (the paper: seeds
1103, 2207, 3301, 4409, 5519; temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.0, i.e. none).
A sampled answer's seed is :func:`unit_seed` of (dataset, claim, document, replicate seed): it names the
unit and the replicate and nothing else, so the same unit gets the same seed under both sources, both
formats and both budgets, and the contrasts between conditions compare answers drawn from the same
random numbers. The backends draw each prompt from its own seed (``Backend.generate_rows``), so a sample
depends on neither the batch it runs in nor the order of the prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

from real_fae_core.hashing import derived_seed
from fae.backends import RowDecoding
from fae.study.interfaces import ANSWER_TOKENS

PAPER_SEEDS: tuple[int, ...] = (1103, 2207, 3301, 4409, 5519)


@dataclass(frozen=True)
class SamplingParams:
    """The sampled replicates' settings; the defaults are the paper's."""

    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    seeds: tuple[int, ...] = PAPER_SEEDS

    def __post_init__(self):
        RowDecoding(seed=0, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)  # the ranges
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds {self.seeds!r}: each replicate needs its own")
        for s in self.seeds:
            RowDecoding(seed=s)


@dataclass(frozen=True)
class Replicate:
    """One replicate: ``index`` 0 is greedy (``seed`` None), 1..N the sampled ones with their base seeds."""

    index: int
    seed: int | None

    @property
    def greedy(self) -> bool:
        """Whether this is the greedy replicate (index 0, no seed)."""
        return self.seed is None


def replicate_plan(params: SamplingParams = SamplingParams()) -> tuple[Replicate, ...]:
    """Greedy first, then one replicate per seed of ``params`` in its order."""
    return (Replicate(0, None), *(Replicate(i, s) for i, s in enumerate(params.seeds, start=1)))


def unit_seed(dataset: str, claim: str, document: str | None, replicate: int) -> int:
    """The seed of one unit's sampled replicate (:func:`real_fae_core.hashing.derived_seed`, 31 bits).

    ``dataset``: the record's ``dataset``; ``claim``: the claim id; ``document``: the unit's document (a
    SciFact abstract; None or "" for a pool of several pages, as FEVER's); ``replicate``: the replicate's
    base seed, not its position, so dropping or reordering seeds leaves the other replicates' samples
    as they were. Source, format and budget are deliberately not parts of it.
    """
    return derived_seed(dataset, claim, "" if document is None else document, replicate)


def row_decoding(dataset: str, claim: str, document: str | None, replicate: Replicate,
                 params: SamplingParams = SamplingParams(), max_new_tokens: int = ANSWER_TOKENS) -> RowDecoding:
    """How the backend decodes one prompt of this unit and replicate (``Backend.generate_rows``)."""
    if replicate.greedy:
        return RowDecoding(max_new_tokens=max_new_tokens)
    return RowDecoding(seed=unit_seed(dataset, claim, document, replicate.seed), temperature=params.temperature,
                       top_p=params.top_p, top_k=params.top_k, max_new_tokens=max_new_tokens)
