"""Streaming MLP activation statistics: float64 running sums of |input of ``mlp.down_proj``|
per neuron and paradigm, padding masked out, so memory does not grow with the claims."""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import numpy as np

from real_fae_core.errors import UserError
from real_fae_core.progress import progress_bar
from data_prep.prompts import (
    encode_chat,
    render_evidence_prompt,
    render_knowledge_prompt,
)
from data_prep.records import ClaimRecord
from fae.probes.hidden import left_pad_batch

PARADIGMS = ("evidence", "knowledge")
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def find_down_projs(model) -> list[tuple[int, str, object]]:
    """``(layer, name, module)`` for each ``down_proj``, by name suffix (works under PEFT)."""
    found = []
    for name, mod in model.named_modules():
        if name.split(".")[-1] != "down_proj":
            continue
        m = _LAYER_RE.search(name)
        found.append((int(m.group(1)) if m else len(found), name, mod))
    if not found:
        raise UserError("no MLP down_proj modules found in this model")
    found.sort(key=lambda t: t[0])
    return found


class ActivationAccumulator:
    """Per-paradigm float64 running sums of |down_proj input| and token counts.

    State is ``[n_layers, intermediate]`` per paradigm, whatever the number
    of prompts. Use :meth:`add` once per batch.
    """

    def __init__(self, model):
        import torch

        self.model = model
        self.modules = find_down_projs(model)
        self.layers = [layer for layer, _, _ in self.modules]
        self.sums: dict[str, list] = {}
        self.tokens = {p: 0 for p in PARADIGMS}
        self._mask = None
        self._paradigm = None
        self._handles = []
        dev = next(model.parameters()).device
        for p in PARADIGMS:
            self.sums[p] = [torch.zeros(mod.in_features, dtype=torch.float64, device=dev)
                            for _, _, mod in self.modules]
        for k, (_, _, mod) in enumerate(self.modules):
            self._handles.append(mod.register_forward_pre_hook(self._hook(k)))

    def _hook(self, k: int):
        import torch

        def hook(module, args):
            if self._paradigm is None:
                return None
            x = args[0]
            sel = x[self._mask]  # [real tokens, intermediate]; padding dropped
            self.sums[self._paradigm][k] += sel.abs().sum(0, dtype=torch.float64)
            return None

        return hook

    def add(self, paradigm: str, token_seqs, pad_id: int) -> None:
        """Run one batch of ``paradigm``'s prompts (token ids, left-padded with ``pad_id``) and add its
        |down_proj input| over the real tokens to that paradigm's sums; no logits beyond the last are computed."""
        import torch

        dev = next(self.model.parameters()).device
        enc = left_pad_batch(token_seqs, pad_id, dev)
        self._mask = enc["attention_mask"].bool()
        self._paradigm = paradigm
        try:
            with torch.no_grad():
                self.model(**enc, use_cache=False, logits_to_keep=1)
        finally:
            self._paradigm = None
            self._mask = None
        self.tokens[paradigm] += int(enc["attention_mask"].sum())

    def close(self) -> None:
        """Remove the forward hooks, leaving the model as it was; the sums stay readable."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def mean_abs(self, paradigm: str) -> np.ndarray:
        """``[n_layers, intermediate]`` mean |activation| per prompt token."""
        n = max(self.tokens[paradigm], 1)
        return np.stack([s.cpu().numpy() for s in self.sums[paradigm]]) / n


def _batched(it: Iterable, n: int) -> Iterator[list]:
    buf = []
    for x in it:
        buf.append(x)
        if len(buf) == n:
            yield buf
            buf = []
    if buf:
        yield buf


def accumulate(model, tokenizer, records: Iterable[ClaimRecord], *, batch_size: int = 8,
               progress: bool = False, total: int | None = None) -> ActivationAccumulator:
    """Stream records through the model under both paradigms (full pool vs claim only)."""
    acc = ActivationAccumulator(model)
    bar = None
    if progress:
        bar = progress_bar(total=total, desc="fae neurons", unit="claim")
    try:
        for batch in _batched(records, batch_size):
            ev = [encode_chat(tokenizer, render_evidence_prompt(r)) for r in batch]
            kn = [encode_chat(tokenizer, render_knowledge_prompt(r)) for r in batch]
            acc.add("evidence", ev, tokenizer.pad_token_id)
            acc.add("knowledge", kn, tokenizer.pad_token_id)
            if bar is not None:
                bar.update(len(batch))
    finally:
        acc.close()
        if bar is not None:
            bar.close()
    return acc
