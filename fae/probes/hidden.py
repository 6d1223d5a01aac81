"""Last-prompt-token hidden-state capture for the probes.

Models load with :func:`fae.backends.hf.load_hf_model`, as in `fae run`.

The probes read the verifier's state at the position right before the first
generated token: the last token of the chat-templated prompt with the
generation prompt appended. Prompts are run in left-padded batches, so that
token sits at position -1 of every row; explicit ``position_ids`` (as
``generate`` builds them) make a padded row see exactly the positions it
would see alone.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from real_fae_core.errors import UserError
from real_fae_core.progress import progress_bar
from data_prep.prompts import encode_chat
from fae.backends.hf import left_pad


def model_device(model) -> torch.device:
    """The device of the model's first parameter, where its inputs must go."""
    return next(model.parameters()).device


def encode_prompts(tokenizer, prompts: Iterable[Sequence[dict]]) -> list[list[int]]:
    """Token ids of each chat prompt (generation prompt appended, no double BOS)."""
    return [encode_chat(tokenizer, m) for m in prompts]


def left_pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``position_ids`` for a left-padded batch.

    Padding is :func:`fae.backends.hf.left_pad`, as in `fae run`; position ids
    count real tokens only (``cumsum(mask) - 1``), exactly what ``generate``
    passes, so padding does not shift a row's positions.
    """
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("every prompt needs at least one token")
    ids, mask = left_pad([list(s) for s in seqs], pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "position_ids": pos.to(device),
    }


def num_hidden_states(model) -> int:
    """Length of ``hidden_states`` (embeddings + one per layer)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    return int(cfg.num_hidden_layers) + 1


def check_layer(model, layer: int) -> int:
    """``layer`` itself when it indexes the model's hidden states (negative counts from the last; 0 is the
    embeddings); otherwise a :class:`UserError` saying the range."""
    n = num_hidden_states(model)
    if not -n <= layer < n:
        raise UserError(
            f"--layer {layer} is out of range: this model has {n} hidden states "
            f"(0 = embeddings, {n - 1} or -1 = last layer after the final norm)"
        )
    return layer


@torch.no_grad()
def capture_last_token_states(
    model,
    token_seqs: Sequence[Sequence[int]],
    *,
    pad_id: int,
    layers: int | Sequence[int] = -1,
    batch_size: int = 8,
    dedupe: bool = True,
    progress: bool = False,
    desc: str = "hidden states",
) -> torch.Tensor:
    """Hidden state at the last prompt token of every sequence.

    Returns float32 on CPU, shape ``[N, D]`` for one layer or ``[N, L, D]``
    for a list of layers (indices into ``hidden_states``: 0 = embeddings,
    -1 = last layer, which transformers returns after the final norm).
    Identical sequences are encoded once (``dedupe``); sequences are sorted
    by length so batches carry little padding, and results come back in the
    input order.
    """
    single = isinstance(layers, int)
    layer_list = [layers] if single else list(layers)
    for layer in layer_list:
        check_layer(model, layer)
    dev = model_device(model)

    keys = [tuple(int(t) for t in s) for s in token_seqs]
    if dedupe:
        uniq: dict[tuple, int] = {}
        for k in keys:
            uniq.setdefault(k, len(uniq))
        unique_keys = list(uniq)
        index = [uniq[k] for k in keys]
    else:
        unique_keys, index = keys, list(range(len(keys)))

    order = sorted(range(len(unique_keys)), key=lambda i: len(unique_keys[i]))
    out: torch.Tensor | None = None
    batches = [order[i:i + batch_size] for i in range(0, len(order), max(1, batch_size))]
    it = batches
    if progress:
        it = progress_bar(batches, desc=desc, unit="batch")
    for b in it:
        enc = left_pad_batch([unique_keys[i] for i in b], pad_id, dev)
        res = model(**enc, output_hidden_states=True, use_cache=False, logits_to_keep=1)
        hs = res.hidden_states
        states = torch.stack([hs[layer][:, -1, :] for layer in layer_list], dim=1).float().cpu()
        if out is None:
            out = torch.empty((len(unique_keys), len(layer_list), states.shape[-1]))
        out[torch.as_tensor(b)] = states
    if out is None:
        return torch.empty((0, 0) if single else (0, len(layer_list), 0))
    full = out[torch.as_tensor(index, dtype=torch.long)]
    return full[:, 0, :] if single else full
