"""Answers for prompts that share prefixes: every shared prefix is read once, every replicate decoded from it.

The evaluation-choice study (SPEC §10) asks each unit 48 times: two sources x two budgets x two answer
formats x six replicates. The six replicates of a condition are the same prompt, the two formats differ
only in the instruction after the evidence, and the shorter budget's evidence is a prefix of the longer
one's. Batching such prompts side by side (:func:`fae.backends.hf.generate_batched`) computes the same
keys and values many times over; on a CPU, where prefill is bound by matmul FLOPs, that repetition is
nearly all of the cost.

:func:`generate_shared` arranges the token sequences in a prefix tree (a trie over token ids) and walks
it depth first with one KV cache: at each branching point the cache holds the shared prefix, and each
branch extends a copy of it by its own tokens (sibling edges of similar length in one forward pass,
:func:`sibling_groups`). With the lean step on a CPU an edge is prefilled by its ``extend``
(:meth:`fae.backends.decode_step.LeanLlamaStep.extend`): the cached prefix read once for every sibling
without a mask, each edge's own tokens under the kernel's causal mask, which skips the blocks above the
diagonal that a masked call over prefix and edge computes (about half of a long edge's attention). A
distinct prompt (a leaf) ends with the cache of all its tokens but the last. The leaves are then decoded
together, up to ``max_rows`` rows per pass. With the lean decoding step on a CPU
each prompt's keys and values are held once and read once a step for all its rows
(:class:`fae.backends.shared_prompt_cache.SharedPromptCache`); otherwise (transformers' forward,
``generate``) the caches are left-padded with zeros to one length (the attention mask hides the padding,
and positions follow the mask, exactly as in a left-padded batch), each repeated once per row that asks
the prompt. Each prompt's last token is run first; greedy rows then decode as from scratch, sampled rows
draw from their own seeded generators (:mod:`fae.backends.seeded`), so a row's answer does not depend on
the rows beside it. Caches with layers that are not plain full attention (a sliding window drops positions
by its own rule) are not padded: such a leaf is decoded alone, its cache repeated across its rows.

What differs from reading each prompt whole is the arithmetic's grouping: a prefix computed in pieces
runs matmuls of other shapes, which can move a logit in its last bits (as left padding does in a batch).
``benchmarks/study_throughput.py`` counts the answers that differ from one prompt at a time.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

from fae.backends import Generation, RowDecoding
from fae.backends.decode_step import hf_step
from fae.backends.padding import finish_reasons, left_pad, length_groups
from fae.backends.reserved_cache import cache_kwarg, new_cache, reserving_layer_class
from fae.backends.seeded import draw_token, seeded_kwargs
from fae.backends.shared_prompt_cache import SharedPromptCache


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


def edge_end(leaves: Sequence[Leaf], start: int) -> int:
    """Where the tree edge from ``start`` ends: the leaves' common prefix, but short of every leaf's last
    token (``generate`` runs that one, so the cache never holds a whole prompt)."""
    return min(common_prefix(leaves, start), min(len(leaf.ids) for leaf in leaves) - 1)


def sibling_groups(parts: list[list[Leaf]], done: int) -> list[list[list[Leaf]]]:
    """Branches whose first edges (after ``done`` tokens) are read in one forward pass, right-padded to the
    longest of their group (:func:`fae.backends.padding.length_groups`: at Check-COVID's budgets, padding a
    format instruction to the evidence beside it was most of the tokens a unit's tree computed)."""
    lengths = [edge_end(part, done) - done for part in parts]
    return [[parts[i] for i in group] for group in length_groups(lengths)]


@dataclass
class SharedPrefixDecoder:
    """The model, tokenizer and generation settings of one :func:`generate_shared` call."""

    lm: object
    tok: object
    config_for_cap: Callable[[int], object]  # answer cap -> a greedy GenerationConfig (fae.backends.hf.greedy_config)
    decodings: Sequence[RowDecoding]
    out: list
    callback: Callable[[int], None] | None = None
    max_rows: int = 64  # rows decoded together, across leaves
    step: Callable | None = None  # one decoding step (fae.backends.decode_step); None: transformers' forward
    ready: list = field(default_factory=list)  # (leaf, cache) pairs waiting to be decoded
    stats: dict = field(default_factory=lambda: {"prefill_tokens": 0, "prompt_tokens": 0, "leaves": 0,
                                                 "decode_calls": 0})

    def __post_init__(self) -> None:
        if self.step is None:
            self.step = hf_step(self.lm)

    def new_cache(self, reserve: int):
        """An empty KV cache for the model, with ``reserve`` positions set aside where the cache type allows."""
        return new_cache(self.lm, reserve)

    def extend(self, cache, ids: Sequence[int]) -> None:
        """Append ``ids`` (one row) to ``cache`` by a forward pass; only the last position's logits are kept."""
        import torch

        if not ids:
            return
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.lm.device)
        with torch.inference_mode():
            if self.extends_lean(cache):
                for n, (k, v) in enumerate(self.step.extend(x, cache)):
                    cache.update(k, v, n)
            else:
                self.lm(input_ids=x, use_cache=True, logits_to_keep=1, **{cache_kwarg(self.lm): cache})
        self.stats["prefill_tokens"] += len(ids)

    def extends_lean(self, cache) -> bool:
        """True when the step can prefill an edge after ``cache`` itself (the lean step's ``extend``, on a
        CPU: its attention is PyTorch's CPU kernel) and ``cache`` is a plain one-row (or empty) cache."""
        return hasattr(self.step, "extend") and self.lm.device.type == "cpu" and plain_single_row(cache)

    def walk(self, leaves: list[Leaf], cache, done: int) -> None:
        """Answer ``leaves``, whose first ``done`` tokens are in ``cache``; ``cache`` is theirs to consume."""
        stop = edge_end(leaves, done)
        if stop > done:
            self.extend(cache, leaves[0].ids[done:stop])
            done = stop
        ready = [leaf for leaf in leaves if len(leaf.ids) == done + 1]
        branches: dict[int, list[Leaf]] = {}
        for leaf in leaves:
            if len(leaf.ids) > done + 1:
                branches.setdefault(leaf.ids[done], []).append(leaf)
        parts = list(branches.values())
        if len(parts) > 1 and mergeable(cache):  # branches' first edges of similar length in one forward pass
            for leaf in ready:
                self.add_ready(leaf, copy.deepcopy(cache))
            groups = sibling_groups(parts, done)
            for g, group in enumerate(groups):
                mine = cache if g == len(groups) - 1 else copy.deepcopy(cache)
                if len(group) == 1:
                    self.walk(group[0], mine, done)
                    continue
                for part, (child, at) in zip(group, self.extend_siblings(mine, group, done)):
                    self.walk(part, child, at)
            return
        parts = [[leaf] for leaf in ready] + parts
        for n, part in enumerate(parts):
            mine = cache if n == len(parts) - 1 else copy.deepcopy(cache)  # the last part takes the cache itself
            if len(part) == 1 and len(part[0].ids) == done + 1:
                self.add_ready(part[0], mine)
            else:
                self.walk(part, mine, done)

    def extend_siblings(self, cache, parts: list[list[Leaf]], done: int) -> list[tuple]:
        """Each branch's shared tokens after ``done`` appended to its own copy of ``cache``, all branches in
        one forward pass: the edges right-padded into rows over the cache repeated per row. Causal
        attention keeps a padding position out of every real token's view, and each branch's cache is cut
        back to its own tokens, so the padding leaves no trace. Consumes ``cache``.
        (child cache, tokens it holds) per part."""
        import torch

        stops = [edge_end(part, done) for part in parts]
        edges = [list(part[0].ids[done:stop]) for part, stop in zip(parts, stops)]
        width = max(map(len, edges))
        x = torch.tensor([e + [e[-1]] * (width - len(e)) for e in edges], dtype=torch.long, device=self.lm.device)
        self.stats["prefill_tokens"] += sum(map(len, edges))
        if self.extends_lean(cache):  # the prefix read once for every branch, not repeated per row
            with torch.inference_mode():
                new = self.step.extend(x, cache)
            return [(self.grown(cache, new, row, stop - done), stop) for row, stop in enumerate(stops)]
        cache.batch_repeat_interleave(len(parts))
        with torch.inference_mode():
            self.lm(input_ids=x, use_cache=True, logits_to_keep=1, **{cache_kwarg(self.lm): cache})
        children = []
        for row, stop in enumerate(stops):
            child = self.new_cache(0)
            for n, layer in enumerate(cache.layers):
                child.update(layer.keys[row:row + 1, :, :stop], layer.values[row:row + 1, :, :stop], n)  # a copy
            children.append((child, stop))
        return children

    def grown(self, prefix, new: list, row: int, length: int):
        """A new cache holding ``prefix``'s positions then the first ``length`` of row ``row`` of ``new``
        (per layer keys and values, as :meth:`LeanLlamaStep.extend` returns them)."""
        import torch

        child = self.new_cache(0)
        for n, (k, v) in enumerate(new):
            parts_k, parts_v = [k[row:row + 1, :, :length]], [v[row:row + 1, :, :length]]
            held = prefix.layers[n]
            if held.keys is not None and held.keys.numel():
                parts_k.insert(0, held.keys)
                parts_v.insert(0, held.values)
            keys, values = torch.cat(parts_k, dim=-2), torch.cat(parts_v, dim=-2)  # a copy
            layer = child.layers[n]
            if hasattr(layer, "adopt"):
                layer.adopt(keys, values, keys.shape[-2])
            else:
                child.update(keys, values, n)
        return child

    def add_ready(self, leaf: Leaf, cache) -> None:
        """Queue a leaf for decoding; decode the queue once it holds ``max_rows`` rows, so that no more than
        about one batch of caches is held at a time (a chunk of distinct long prompts would otherwise hold
        every prompt's cache until the end of the walk)."""
        self.ready.append((leaf, cache))
        if sum(len(x.rows) for x, _ in self.ready) >= self.max_rows:
            self.flush()

    def flush(self) -> None:
        """Decode every ready leaf: per answer cap, leaves whose caches can be merged in batches of up to
        ``max_rows`` rows, any other leaf alone."""
        ready, self.ready = self.ready, []
        by_cap: dict[int, list] = {}
        for leaf, cache in ready:
            by_cap.setdefault(leaf.cap, []).append((leaf, cache))
        for cap, items in by_cap.items():
            batch: list = []
            for item in items:
                if not mergeable(item[1]):
                    self.decode([item], cap)
                    continue
                if batch and sum(len(leaf.rows) for leaf, _ in batch) + len(item[0].rows) > self.max_rows:
                    self.decode(batch, cap)
                    batch = []
                batch.append(item)
            if batch:
                self.decode(batch, cap)

    def decode(self, items: list, cap: int) -> None:
        """Every row of the leaves ``items`` ((leaf, cache of its prompt minus the last token)) in one
        ``generate`` call: the caches left-padded to one length and stacked, each repeated once per row."""
        import torch

        gc = self.config_for_cap(cap)
        rows = [i for leaf, _ in items for i in leaf.rows]
        shared = not processes_logits(gc) and getattr(self.step, "attends_shared_prompts", False) \
            and self.lm.device.type == "cpu" and all(mergeable(c) for _, c in items)
        if shared:  # each prompt's keys and values once, whatever its rows
            cache = SharedPromptCache.from_caches([c for _, c in items], [len(leaf.rows) for leaf, _ in items],
                                                  gc.max_new_tokens + 1)
            ids, mask = left_pad([list(leaf.ids) for leaf, _ in items for _ in leaf.rows], gc.pad_token_id)
        elif len(items) == 1:
            (leaf, cache), = items
            if len(leaf.rows) > 1:
                cache.batch_repeat_interleave(len(leaf.rows))
            ids = torch.tensor([list(leaf.ids)] * len(leaf.rows), dtype=torch.long)
            mask = torch.ones_like(ids)
        else:
            cache = self.merged(items, cap)
            ids, mask = left_pad([list(leaf.ids) for leaf, _ in items for _ in leaf.rows], gc.pad_token_id)
        decodings = [self.decodings[i] for i in rows]
        if processes_logits(gc):  # settings only generate applies: let it decode
            extra = seeded_kwargs({}, decodings)
            with torch.inference_mode():
                gen = self.lm.generate(input_ids=ids.to(self.lm.device), attention_mask=mask.to(self.lm.device),
                                       generation_config=gc, **{cache_kwarg(self.lm): cache}, **extra)
            new = gen[:, ids.shape[1]:]
            texts = self.tok.batch_decode(new, skip_special_tokens=True)
            reasons = finish_reasons(new, gc.eos_token_id, gc.max_new_tokens)
        else:
            answers = decode_rows(self.step, cache, ids, mask, decodings, gc.max_new_tokens, gc.eos_token_id)
            texts = [self.tok.decode(tokens, skip_special_tokens=True) for tokens, _ in answers]
            reasons = [why for _, why in answers]
        for i, text, why in zip(rows, texts, reasons):
            self.out[i] = Generation(text, why)
        self.stats["prefill_tokens"] += len(items)  # each prompt's last token, run by generate
        self.stats["leaves"] += len(items)
        self.stats["decode_calls"] += 1
        if self.callback:
            self.callback(len(rows))

    def merged(self, items: list, cap: int):
        """One cache for the rows of ``items``: each leaf's keys and values right-aligned in one buffer per
        layer (zeros before them, which the attention mask hides), once per row of the leaf, with room for
        ``cap`` more positions."""
        width = max(cache.get_seq_length() for _, cache in items)
        rows = sum(len(leaf.rows) for leaf, _ in items)
        cache = self.new_cache(cap)
        for n, layer in enumerate(cache.layers):
            first = items[0][1].layers[n].keys
            shape = (rows, first.shape[1], width + cap, first.shape[-1])
            k_buf, v_buf = first.new_empty(shape), first.new_empty(shape)
            r = 0
            for leaf, c in items:
                k, v = c.layers[n].keys, c.layers[n].values
                start, end = width - k.shape[-2], r + len(leaf.rows)
                k_buf[r:end, :, :start].zero_()
                v_buf[r:end, :, :start].zero_()
                k_buf[r:end, :, start:width].copy_(k.expand(len(leaf.rows), *k.shape[1:]))
                v_buf[r:end, :, start:width].copy_(v.expand(len(leaf.rows), *v.shape[1:]))
                r = end
            if hasattr(layer, "adopt"):
                layer.adopt(k_buf, v_buf, width)
            else:
                cache.update(k_buf[..., :width, :], v_buf[..., :width, :], n)
        return cache


LOGIT_SETTINGS = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens",
                  "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id", "min_length",
                  "min_new_tokens", "sequence_bias", "encoder_repetition_penalty", "exponential_decay_length_penalty")


def processes_logits(gc) -> bool:
    """True when a greedy config asks ``generate`` to change the logits (a model's shipped repetition
    penalty, suppressed tokens, a minimum length): :func:`decode_rows` applies none of these."""
    neutral = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "min_length": 0, "min_new_tokens": 0,
               "no_repeat_ngram_size": 0}
    return any(getattr(gc, name, None) not in (None, neutral.get(name)) for name in LOGIT_SETTINGS)


COMPACT_AT = 0.75  # drop finished rows once the live ones are at most this share of the batch
GQA_SDPA_FLAG = "TRANSFORMERS_SDPA_FORCE_GQA"


@contextlib.contextmanager
def masked_gqa_in_sdpa(device):
    """On a CPU, let transformers hand grouped-query attention to ``scaled_dot_product_attention`` even
    with a padding mask (its ``TRANSFORMERS_SDPA_FORCE_GQA``), for the duration of one decode.

    transformers repeats the key/value heads itself whenever a mask is given, because CUDA's fused kernels
    refuse masked GQA and fall back to the math kernel; the CPU kernel takes it. For SmolLM2's shapes
    (3 key/value heads for 9 query heads, 64 rows, 520 positions, bf16) the CPU kernel gave the same
    output to the bit and took 4.5 ms a layer against 60 ms with the heads repeated. Elsewhere, and when
    the user has set the variable, nothing changes.
    """
    if str(device).split(":")[0] != "cpu" or GQA_SDPA_FLAG in os.environ:
        yield
        return
    os.environ[GQA_SDPA_FLAG] = "1"
    try:
        yield
    finally:
        os.environ.pop(GQA_SDPA_FLAG, None)


def decode_rows(step, cache, ids, mask, decodings: Sequence[RowDecoding], cap: int, eos_ids,
                first_logits=None, compact: bool = True, gqa_kernel: bool = True) -> list[tuple[list, str]]:
    """Decode each row from ``cache`` up to ``cap`` new tokens with ``step``
    (:func:`fae.backends.decode_step.decode_step_for`): (its new tokens, ``"stop"`` or ``"length"``) per row.

    ``cache`` holds all of the prompt ``ids`` (left-padded as ``mask`` says) but the last token, which the
    first step reads; or, with ``first_logits`` (the prompt's last position, from its prefill), all of them.
    ``generate`` runs a batch until its last row stops; here, with ``compact``, finished rows leave the batch
    (their keys and values dropped with ``batch_select_indices``, a copy of the cache, so only once a quarter
    of the rows have finished), so short answers beside a long one stop costing steps. Greedy rows take the
    argmax of the float32 logits, as ``generate`` does; sampled rows draw from their own seeded generator
    (:func:`fae.backends.seeded.draw_token`, one draw per step, as :class:`~fae.backends.seeded.SeededRowSampler`
    draws them). ``gqa_kernel``: grouped-query attention under a padding mask by PyTorch's kernel
    (:func:`masked_gqa_in_sdpa`); False keeps transformers' own choice, the bits ``generate`` computes.
    """
    import torch

    device = cache_device(cache, ids)
    rows = RowState(decodings, eos_ids, cap)
    mask = mask.to(device)
    positions = (mask.sum(dim=1, keepdim=True) - 1).to(device)
    if first_logits is None:
        next_ids = ids[:, -1:].to(device)
    with torch.inference_mode(), masked_gqa_in_sdpa(device if gqa_kernel else "none"):
        for t in range(cap):
            if first_logits is not None and t == 0:
                logits = first_logits
            else:
                logits = step(next_ids, mask, positions, cache)
            live, picks = rows.take(logits, t)
            if not live:
                break
            if compact and len(live) <= COMPACT_AT * len(rows.active):  # drop finished rows (a copy of the cache)
                index = torch.tensor(live, device=device)
                cache.batch_select_indices(index)
                mask, positions = mask[index], positions[index]
                rows.keep(live)
                picks = [picks[j] for j in live]
            next_ids = torch.tensor(picks, dtype=torch.long, device=device).unsqueeze(1)
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            positions = positions + 1
    return rows.answers()


def cache_device(cache, ids):
    """Where ``cache``'s tensors live (``ids``' device for an empty cache)."""
    for layer in getattr(cache, "layers", None) or []:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            return layer.keys.device
    return ids.device


class RowState:
    """Each row's tokens, finish reason and generator while :func:`decode_rows` runs; ``active`` maps the
    batch's rows to the answers."""

    def __init__(self, decodings: Sequence[RowDecoding], eos_ids, cap: int):
        import torch

        self.decodings, self.cap = decodings, cap
        self.eos = {int(e) for e in ([eos_ids] if isinstance(eos_ids, int) else (eos_ids or []))}
        self.generators = [None if d.greedy else torch.Generator(device="cpu").manual_seed(d.seed) for d in decodings]
        self.active = list(range(len(decodings)))
        self.done: set[int] = set()
        self.tokens: list[list[int]] = [[] for _ in decodings]
        self.reasons = ["length"] * len(decodings)

    def take(self, logits, t: int) -> tuple[list[int], list[int]]:
        """Pick each batch row's token at step ``t``: (batch rows still decoding, every row's pick)."""
        picks = logits.argmax(dim=-1).tolist()
        for j, r in enumerate(self.active):
            if self.generators[r] is not None:
                picks[j] = draw_token(logits[j], self.decodings[r], self.generators[r])
        live = []
        for j, (r, token) in enumerate(zip(self.active, picks)):
            if r in self.done:  # finished, still in the batch until the next compaction
                continue
            self.tokens[r].append(token)
            if token in self.eos:
                self.reasons[r] = "stop"
                self.done.add(r)
            elif t + 1 < self.cap:
                live.append(j)
            else:
                self.done.add(r)
        return live, picks

    def keep(self, live: list[int]) -> None:
        """Keep only the batch rows at indices ``live`` (the others finished), as the batch is compacted."""
        self.active = [self.active[j] for j in live]

    def answers(self) -> list[tuple[list, str]]:
        """Every row's (generated token ids, finish reason ``stop`` or ``length``), in the rows' order."""
        return [(self.tokens[r], self.reasons[r]) for r in range(len(self.decodings))]


def mergeable(cache) -> bool:
    """True when every layer of ``cache`` is a plain full-attention layer (transformers' ``DynamicLayer`` or
    our reserving one) holding one row: left padding such layers' keys and values is exact. A sliding-window
    layer has dropped positions by its own rule, so its leaf is decoded alone."""
    return plain_single_row(cache) and all(x.keys is not None for x in cache.layers)


def plain_single_row(cache) -> bool:
    """True when every layer of ``cache`` is a plain full-attention layer that is empty or holds one row."""
    from transformers.cache_utils import DynamicLayer

    plain = (DynamicLayer, reserving_layer_class())
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(x) in plain and (x.keys is None or x.keys.shape[0] == 1) for x in layers)


def generate_shared(lm, tok, token_ids: Sequence[Sequence[int]], decodings: Sequence[RowDecoding],
                    config_for_cap: Callable[[int], object], default_cap: int,
                    callback: Callable[[int], None] | None = None, max_rows: int = 64,
                    step: Callable | None = None) -> tuple[list[Generation], dict]:
    """One answer per prompt (``token_ids[i]`` decoded as ``decodings[i]`` says), each shared prefix read once.

    Returns the answers in input order and counts: ``prompt_tokens`` (what reading every prompt whole
    would prefill), ``prefill_tokens`` (what was read), ``leaves`` (distinct prompts decoded). ``step``: the
    decoding step (:func:`fae.backends.decode_step.decode_step_for`; transformers' forward when None).
    """
    caps = [d.max_new_tokens or default_cap for d in decodings]
    leaves = leaves_of(token_ids, caps)
    decoder = SharedPrefixDecoder(lm, tok, config_for_cap, decodings, [Generation("")] * len(token_ids), callback,
                                  max_rows, step)
    decoder.stats["prompt_tokens"] = sum(len(ids) for ids in token_ids)
    if leaves:
        decoder.walk(leaves, decoder.new_cache(max(caps)), 0)
        decoder.flush()
    return decoder.out, decoder.stats
