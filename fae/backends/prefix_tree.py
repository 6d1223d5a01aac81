"""Answers for prompts that share prefixes: every shared prefix is read once, every replicate decoded from it.

The evaluation-choice study (SPEC §10) asks each unit 48 times: two sources x two budgets x two answer
formats x six replicates. The six replicates of a condition are the same prompt, the two formats differ
only in the instruction after the evidence, and the shorter budget's evidence is a prefix of the longer
one's. Batching such prompts side by side (:func:`fae.backends.hf.generate_batched`) computes the same
keys and values many times over; on a CPU, where prefill is bound by matmul FLOPs, that repetition is
nearly all of the cost.

:func:`generate_shared` arranges the token sequences in a prefix tree (a trie over token ids) and walks
it depth first with one KV cache: at each branching point the cache holds the shared prefix, each branch
extends a copy of it by its own tokens, and each distinct prompt (a leaf) is decoded once for all its
rows, the cache repeated across them (``batch_repeat_interleave``). The prompt's last token is left out
of the cache, so ``generate`` itself runs it and decodes as it would from scratch: greedy rows unchanged,
sampled rows drawn from their own seeded generators (:mod:`fae.backends.seeded`), so a row's answer does
not depend on which rows share its leaf.

What differs from reading each prompt whole is the arithmetic's grouping: a prefix computed in pieces
runs matmuls of other shapes, which can move a logit in its last bits (as left padding does in a batch).
``benchmarks/study_throughput.py`` counts the answers that differ from one prompt at a time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Sequence

from fae.backends import Generation, RowDecoding
from fae.backends.padding import finish_reasons
from fae.backends.reserved_cache import cache_kwarg, reserved_cache
from fae.backends.seeded import seeded_kwargs


@dataclass
class Leaf:
    """One distinct prompt (token ids and answer cap) and the rows that ask it."""

    ids: tuple[int, ...]
    cap: int
    rows: list[int] = field(default_factory=list)


def leaves_of(token_ids: Sequence[Sequence[int]], caps: Sequence[int]) -> list[Leaf]:
    """The distinct (prompt, cap) pairs in the order of their first row, each with its rows."""
    by_key: dict[tuple, Leaf] = {}
    for i, (ids, cap) in enumerate(zip(token_ids, caps)):
        key = (tuple(ids), int(cap))
        if key not in by_key:
            if not ids:
                raise ValueError(f"prompt {i} has no tokens")
            by_key[key] = Leaf(key[0], key[1])
        by_key[key].rows.append(i)
    return list(by_key.values())


def common_prefix(leaves: Sequence[Leaf], start: int) -> int:
    """The length of the token prefix every leaf shares (at least ``start``, which they are known to share)."""
    first = leaves[0].ids
    end = min(len(leaf.ids) for leaf in leaves)
    n = start
    while n < end and all(leaf.ids[n] == first[n] for leaf in leaves[1:]):
        n += 1
    return n


@dataclass
class SharedPrefixDecoder:
    """The model, tokenizer and generation settings of one :func:`generate_shared` call."""

    lm: object
    tok: object
    config_for_cap: Callable[[int], object]  # answer cap -> a greedy GenerationConfig (fae.backends.hf.greedy_config)
    decodings: Sequence[RowDecoding]
    out: list
    callback: Callable[[int], None] | None = None
    stats: dict = field(default_factory=lambda: {"prefill_tokens": 0, "prompt_tokens": 0, "leaves": 0})

    def new_cache(self, reserve: int):
        cache = reserved_cache(self.lm, reserve)
        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.lm.config)
        return cache

    def extend(self, cache, ids: Sequence[int]) -> None:
        """Append ``ids`` (one row) to ``cache`` by a forward pass; only the last position's logits are kept."""
        import torch

        if not ids:
            return
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.lm.device)
        with torch.inference_mode():
            self.lm(input_ids=x, use_cache=True, logits_to_keep=1, **{cache_kwarg(self.lm): cache})
        self.stats["prefill_tokens"] += len(ids)

    def walk(self, leaves: list[Leaf], cache, done: int) -> None:
        """Answer ``leaves``, whose first ``done`` tokens are in ``cache``; ``cache`` is theirs to consume."""
        stop = min(common_prefix(leaves, done), min(len(leaf.ids) for leaf in leaves) - 1)
        if stop > done:
            self.extend(cache, leaves[0].ids[done:stop])
            done = stop
        ready = [leaf for leaf in leaves if len(leaf.ids) == done + 1]
        branches: dict[int, list[Leaf]] = {}
        for leaf in leaves:
            if len(leaf.ids) > done + 1:
                branches.setdefault(leaf.ids[done], []).append(leaf)
        parts: list = [[leaf] for leaf in ready] + list(branches.values())
        for n, part in enumerate(parts):
            mine = cache if n == len(parts) - 1 else copy.deepcopy(cache)  # the last part takes the cache itself
            if len(part) == 1 and len(part[0].ids) == done + 1:
                self.decode(part[0], mine)
            else:
                self.walk(part, mine, done)

    def decode(self, leaf: Leaf, cache) -> None:
        """Every row of ``leaf`` from the cache of its prompt minus the last token: one ``generate`` call."""
        import torch

        gc = self.config_for_cap(leaf.cap)
        k = len(leaf.rows)
        if k > 1:
            cache.batch_repeat_interleave(k)
        ids = torch.tensor([list(leaf.ids)] * k, dtype=torch.long, device=self.lm.device)
        extra = seeded_kwargs({}, [self.decodings[i] for i in leaf.rows])
        with torch.inference_mode():
            gen = self.lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc,
                                   **{cache_kwarg(self.lm): cache}, **extra)
        new = gen[:, ids.shape[1]:]
        texts = self.tok.batch_decode(new, skip_special_tokens=True)
        for i, text, why in zip(leaf.rows, texts, finish_reasons(new, gc.eos_token_id, gc.max_new_tokens)):
            self.out[i] = Generation(text, why)
        self.stats["prefill_tokens"] += 1
        self.stats["leaves"] += 1
        if self.callback:
            self.callback(k)


def generate_shared(lm, tok, token_ids: Sequence[Sequence[int]], decodings: Sequence[RowDecoding],
                    config_for_cap: Callable[[int], object], default_cap: int,
                    callback: Callable[[int], None] | None = None) -> tuple[list[Generation], dict]:
    """One answer per prompt (``token_ids[i]`` decoded as ``decodings[i]`` says), each shared prefix read once.

    Returns the answers in input order and counts: ``prompt_tokens`` (what reading every prompt whole
    would prefill), ``prefill_tokens`` (what was read), ``leaves`` (distinct prompts decoded).
    """
    caps = [d.max_new_tokens or default_cap for d in decodings]
    leaves = leaves_of(token_ids, caps)
    decoder = SharedPrefixDecoder(lm, tok, config_for_cap, decodings, [Generation("")] * len(token_ids), callback)
    decoder.stats["prompt_tokens"] = sum(len(ids) for ids in token_ids)
    if leaves:
        decoder.walk(leaves, decoder.new_cache(max(caps)), 0)
    return decoder.out, decoder.stats
