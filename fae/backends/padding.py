"""The one left padding of a batch of token ids: generation, label probabilities and the probes use it."""

from __future__ import annotations


def left_pad(batch: list[list[int]], pad_id: int):
    """(input_ids, attention_mask) tensors, padded on the left: the one padding of
    generation, label probabilities and the probes (which add position ids)."""
    import torch

    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        if x:
            ids[i, width - len(x):] = torch.tensor(x, dtype=torch.long)
            mask[i, width - len(x):] = 1
    return ids, mask
