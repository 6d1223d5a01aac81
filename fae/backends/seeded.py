"""Seeded sampling per batch row for transformers ``generate``: a row's sample depends on its seed, not its batch.

``generate(do_sample=True)`` draws every row of a batch from one random stream (torch's global
generator), so a row's sample changes with the rows batched beside it and with their order: the same
prompt and seed give another answer in a batch of 4 than alone. The evaluation-choice study (SPEC §10)
needs the opposite, each unit's sample a function of its own seed, so that a condition (source, budget,
answer format) never changes a sample through the batch it happened to share.

:class:`SeededRowSampler` is a logits processor that keeps one ``torch.Generator`` per sampled row
(seeded with the row's :class:`~fae.backends.RowDecoding` seed, on the CPU so the stream is the same on
every device). At each step it draws one uniform number from the row's own generator, applies the
row's temperature, top-k and top-p to that row's logits alone, picks the token the draw lands on, and
masks every other token: ``generate`` runs greedy and its argmax takes the drawn token. Greedy rows
(``seed`` None) are left untouched, so greedy and sampled prompts can share a batch. A row draws one
number per step whether or not it has finished, so its t-th token always comes from its t-th draw.

What remains batch-dependent is the model's arithmetic: left padding in a mixed batch can move a logit
in its last bits, as it can for greedy answers (fae/backends/hf.py). A sample changes only where a
draw falls within that rounding of a boundary between two tokens' cumulative probabilities.
``fae.pave.sampling`` samples one prompt per ``generate`` call with ``torch.manual_seed`` for the same
reason; this processor is meant to replace that later.
"""

from __future__ import annotations

from typing import Any, Sequence

from fae.backends import RowDecoding


def draw_token(logits, decoding: RowDecoding, generator) -> int:
    """The token of one row: ``logits`` (1-D, one row's scores) sampled as ``decoding`` says with ``generator``.

    Top-k keeps the k highest logits (ties: the lower token id first, a stable sort), top-p then keeps the
    smallest run of the most probable tokens whose probability reaches ``top_p`` (the nucleus, the first
    token always), and the draw ``u`` in [0, 1) picks the token whose cumulative probability first
    exceeds ``u`` times the kept mass. Probabilities are float64 so the pick is as sharp as the logits.
    """
    import torch

    u = float(torch.rand((), generator=generator, dtype=torch.float64))  # first: one draw per row per step
    if logits.device.type == "mps":  # no float64 there
        logits = logits.cpu()
    if decoding.top_k and decoding.top_k < logits.shape[-1]:  # sort only the candidates: those >= the k-th value
        kth = torch.topk(logits, decoding.top_k).values[-1]
        candidates = torch.nonzero(logits >= kth).flatten()  # ascending ids, so ties keep the lower id first
        values, at = torch.sort(logits[candidates].double() / decoding.temperature, descending=True, stable=True)
        values, order = values[:decoding.top_k], candidates[at[:decoding.top_k]]
    else:
        values, order = torch.sort(logits.double() / decoding.temperature, descending=True, stable=True)
        if decoding.top_k:
            values, order = values[:decoding.top_k], order[:decoding.top_k]
    probs = torch.softmax(values, dim=0)  # tokens masked to -inf (a grammar) get 0
    if decoding.top_p < 1:
        before = torch.cumsum(probs, dim=0) - probs
        probs = torch.where(before < decoding.top_p, probs, torch.zeros_like(probs))
    cum = torch.cumsum(probs, dim=0)
    pick = int(torch.searchsorted(cum, (u * cum[-1]).reshape(1), right=True))
    last = int(torch.nonzero(probs).max())  # u * mass rounded up to the mass: the last kept token
    return int(order[min(pick, last)])


class SeededRowSampler:
    """A transformers logits processor (one per ``generate`` call): each sampled row from its own generator.

    ``decodings[i]`` is batch row ``i``'s decoding; greedy rows are left alone.
    """

    def __init__(self, decodings: Sequence[RowDecoding]):
        import torch

        self.rows = [(i, d, torch.Generator(device="cpu").manual_seed(d.seed))
                     for i, d in enumerate(decodings) if not d.greedy]

    def __call__(self, input_ids, scores):
        for i, decoding, generator in self.rows:
            token = draw_token(scores[i], decoding, generator)
            scores[i] = float("-inf")
            scores[i, token] = 0.0
        return scores


def seeded_kwargs(extra: dict[str, Any], decodings: Sequence[RowDecoding] | None) -> dict[str, Any]:
    """``generate`` kwargs ``extra`` with a :class:`SeededRowSampler` for ``decodings`` appended to its
    logits processors (after a grammar's, so a sample stays inside it); ``extra`` itself when every row is
    greedy, so a greedy batch runs exactly as without this module."""
    if not decodings or all(d.greedy for d in decodings):
        return extra
    from transformers import LogitsProcessorList

    processors = LogitsProcessorList([*extra.get("logits_processor", []), SeededRowSampler(decodings)])
    return {**extra, "logits_processor": processors}
