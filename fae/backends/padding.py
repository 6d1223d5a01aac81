"""Batches of token rows: the one left padding (generation, label probabilities, the probes), the grouping
that bounds padding by length, and why a generated row stopped (batched and prefix-shared generation)."""

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


def length_groups(lengths: list[int]) -> list[list[int]]:
    """Indices of ``lengths`` in groups to be padded to their longest, longest first: a group holds lengths
    at least half its longest, so padding at most doubles what a group computes. A short format instruction
    padded to a long run of evidence beside it, or a 300-token prompt to a 2,000-token one, would otherwise
    be most of what is computed."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if groups and 2 * lengths[i] >= lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def finish_reasons(new_tokens, eos_ids, max_new_tokens: int) -> list[str]:
    """Why each generated row stopped: ``"length"`` when it filled ``max_new_tokens`` without an eos id.

    ``new_tokens`` holds only the generated part (batch, steps); rows that
    ended early are padded after their eos, so a row without any eos id ran
    until the cap and was cut off.
    """
    eos = {int(e) for e in ([eos_ids] if isinstance(eos_ids, int) else (eos_ids or []))}
    out = []
    for row in new_tokens.tolist():
        cut = len(row) >= int(max_new_tokens) and not eos.intersection(row)
        out.append("length" if cut else "stop")
    return out
