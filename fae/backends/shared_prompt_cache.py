"""Decoding many rows from few prompts: each prompt's keys and values held once, read once per step.

The study decodes each distinct prompt six times (greedy and five seeds), and each decoding step of a row
reads its whole prompt's keys and values. Repeating a prompt's cache once per row, as a batch of
``generate`` needs, copies it six times and makes every step read it six times: with Check-COVID's
1,400-token pools that is most of a step's memory traffic, and the copies (and the gathers that drop
finished rows) most of the rest.

:class:`SharedPromptCache` keeps each prompt's keys and values once (the prompts right-aligned in one
buffer per layer, the padding before them masked) and each row's own positions (the prompt's last token
and the answer so far) in a small buffer of its own. A step's attention is computed in two parts and
merged exactly (the log-sum-exp merge of split softmax attention, as FlashAttention's and cascade
attention's kernels do): the rows of one prompt attend to its keys together, as extra query positions of
one call (so the prompt is read once for all of them, and grouped-query heads share a key/value head the
same way), and each row attends to its own positions. PyTorch's CPU flash-attention kernel computes both
parts and returns each part's log-sum-exp. The result is the attention over the concatenated positions up
to floating-point grouping: two partial softmaxes merged in float32 instead of one pass, so a logit can
move in its last bits (``tests/test_shared_prompt_cache.py`` bounds it and checks greedy answers).

Only :class:`fae.backends.decode_step.LeanLlamaStep` reads this cache (its ``attend``); a finished row
leaves by :meth:`batch_select_indices`, which copies only the rows' own small buffers.

The prefix tree's prefill splits the same way (:func:`attend_after_prefix`): rows of new tokens that continue
one cached prefix (sibling edges of the tree, or one edge) attend to the prefix together, without a mask,
and each to its own new tokens under the plain causal mask. One call over the concatenated positions needs
an explicit mask (the causal diagonal is offset by the prefix), which PyTorch's CPU kernel reads in full
and whose blocks above the diagonal it cannot skip: for a 1,800-token edge after 250 cached positions the
split took about two thirds of the time.
"""

from __future__ import annotations

from typing import Sequence


class SharedPromptCache:
    """Per layer: the prompts' keys and values (prompts x key/value heads x width x head size, right-aligned),
    and each row's own positions (rows x key/value heads x room x head size). ``prompt_of[r]``: row r's
    prompt. Build with :meth:`from_caches`."""

    def __init__(self, prompt_keys: list, prompt_values: list, prompt_lengths: Sequence[int],
                 prompt_of: Sequence[int], room: int):
        import torch

        self.prompt_keys, self.prompt_values = prompt_keys, prompt_values
        first = prompt_keys[0]
        prompts, kv_heads, width, dim = first.shape
        self.lengths = list(prompt_lengths)
        keep = torch.arange(width)[None, :] >= (width - torch.tensor(self.lengths))[:, None]
        self.prompt_mask = None if all(n == width for n in self.lengths) else \
            torch.zeros(keep.shape, dtype=first.dtype).masked_fill_(~keep, float("-inf"))[:, None, None, :]
        rows = len(prompt_of)
        self.own_keys = [first.new_empty((rows, kv_heads, room, dim)) for _ in prompt_keys]
        self.own_values = [first.new_empty((rows, kv_heads, room, dim)) for _ in prompt_keys]
        self.filled = [0] * len(prompt_keys)
        self.layers: list = []  # no transformers layers: cache_device falls back to the ids' device
        self.regroup(list(prompt_of))

    @classmethod
    def from_caches(cls, caches: Sequence, rows_per_cache: Sequence[int], room: int) -> "SharedPromptCache":
        """From one single-row transformers cache per prompt (the prompt minus its last token), asked by
        ``rows_per_cache[i]`` rows each, with ``room`` positions per row for the last prompt token and the
        answer."""
        lengths = [c.layers[0].keys.shape[-2] for c in caches]
        width = max(lengths)
        keys, values = [], []
        for n in range(len(caches[0].layers)):
            for parts, name in ((keys, "keys"), (values, "values")):
                first = getattr(caches[0].layers[n], name)
                buf = first.new_zeros((len(caches), first.shape[1], width, first.shape[-1]))
                for p, c in enumerate(caches):
                    held = getattr(c.layers[n], name)
                    buf[p, :, width - held.shape[-2]:].copy_(held[0])
                parts.append(buf)
        prompt_of = [p for p, count in enumerate(rows_per_cache) for _ in range(count)]
        return cls(keys, values, lengths, prompt_of, room)

    def regroup(self, prompt_of: list[int]) -> None:
        """Index each row's queries into its prompt's group: ``slots`` (prompts x the most rows a prompt
        has) holds row numbers, ``len(prompt_of)`` for an empty slot (a zero query, its output dropped)."""
        import torch

        self.prompt_of = prompt_of
        members: list[list[int]] = [[] for _ in self.lengths]
        for r, p in enumerate(prompt_of):
            members[p].append(r)
        width = max(len(m) for m in members)
        slots = [m + [len(prompt_of)] * (width - len(m)) for m in members]
        self.slots = torch.tensor(slots, dtype=torch.long)
        self.slot_of_row = torch.tensor([p * width + members[p].index(r) for r, p in enumerate(prompt_of)],
                                        dtype=torch.long)

    def attend(self, layer: int, q, k, v, scaling: float):
        """Write the rows' new keys and values (rows x key/value heads x 1 x head size) and return the
        attention output of the queries ``q`` (rows x heads x 1 x head size) as rows x 1 x (heads x size)."""
        import torch

        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        t = self.filled[layer]
        self.own_keys[layer][:, :, t:t + 1].copy_(k)
        self.own_values[layer][:, :, t:t + 1].copy_(v)
        self.filled[layer] = t + 1
        rows, heads, _, dim = q.shape
        kv_heads = k.shape[1]
        group = heads // kv_heads
        # the rows' own positions (a few, so in float32: one rounding fewer): each row's query heads of a
        # key/value head as query positions
        q_own = q.reshape(rows, kv_heads, group, dim).float()
        out_own, lse_own = flash(q_own, self.own_keys[layer][:, :, :t + 1].float(),
                                 self.own_values[layer][:, :, :t + 1].float(), 0.0, False, scale=scaling)
        # the prompts: every row of a prompt (and its heads of a key/value head) as query positions
        per_prompt = self.slots.shape[1]
        q_rows = torch.cat([q.reshape(rows, heads, dim), q.new_zeros((1, heads, dim))]).index_select(
            0, self.slots.reshape(-1))
        q_prompt = q_rows.reshape(-1, per_prompt, kv_heads, group, dim).transpose(1, 2) \
            .reshape(-1, kv_heads, per_prompt * group, dim)
        out_p, lse_p = flash(q_prompt, self.prompt_keys[layer], self.prompt_values[layer], 0.0, False,
                             attn_mask=self.prompt_mask, scale=scaling)
        out_p = out_p.reshape(-1, kv_heads, per_prompt, group, dim).transpose(1, 2) \
            .reshape(-1, kv_heads, group, dim).index_select(0, self.slot_of_row)
        lse_p = lse_p.reshape(-1, kv_heads, per_prompt, group).transpose(1, 2).reshape(-1, kv_heads, group) \
            .index_select(0, self.slot_of_row)
        return merge_parts(out_p, lse_p, out_own, lse_own).to(q.dtype).reshape(rows, 1, heads * dim)

    def batch_select_indices(self, indices) -> None:
        """Keep the rows ``indices`` (a copy of their own positions only; prompts left without a row are
        dropped, a copy of the others' keys and values)."""
        import torch

        keep = [int(i) for i in indices]
        self.own_keys = [b[indices] for b in self.own_keys]
        self.own_values = [b[indices] for b in self.own_values]
        prompt_of = [self.prompt_of[i] for i in keep]
        used = sorted(set(prompt_of))
        if len(used) < len(self.lengths):
            index = torch.tensor(used, dtype=torch.long)
            self.prompt_keys = [b[index] for b in self.prompt_keys]
            self.prompt_values = [b[index] for b in self.prompt_values]
            if self.prompt_mask is not None:
                self.prompt_mask = self.prompt_mask[index]
            self.lengths = [self.lengths[p] for p in used]
            renumber = {p: n for n, p in enumerate(used)}
            prompt_of = [renumber[p] for p in prompt_of]
        self.regroup(prompt_of)


def merge_parts(out_a, lse_a, out_b, lse_b):
    """Softmax attention over two disjoint sets of positions, from each set's output and log-sum-exp (the
    flash kernel's two results): the outputs weighted by each set's share of the total softmax mass, in
    float32. Shapes: outputs ... x size, log-sum-exps ... (the same leading dimensions)."""
    import torch

    share_a = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)  # e^lse_a / (e^lse_a + e^lse_b)
    return torch.lerp(out_b.float(), out_a.float(), share_a)


def attend_after_prefix(q, k, v, prefix_keys, prefix_values, scaling: float):
    """Causal attention of new tokens that continue one cached prefix: ``q`` (rows x heads x tokens x size)
    over the prefix (``prefix_keys``/``prefix_values``: 1 x key/value heads x length x size, shared by every
    row; None or empty when there is none) and over each row's own new ``k``/``v`` (rows x key/value heads x
    tokens x size), token i seeing its own tokens up to i. Returns rows x heads x tokens x size in ``q``'s
    dtype. The prefix is read once for all rows (rows and grouped query heads as query positions of one
    call); the own part is PyTorch's causal kernel; the two merge by :func:`merge_parts`."""
    import torch

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    rows, heads, tokens, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    out_own, lse_own = flash(q, k, v, 0.0, True, scale=scaling)  # the kernel maps query heads to key/value heads
    if prefix_keys is None or prefix_keys.shape[-2] == 0:
        return out_own
    # every row's queries of a key/value head as query positions of one batch row
    q_all = q.reshape(rows, kv_heads, group * tokens, dim).transpose(0, 1).reshape(1, kv_heads, -1, dim)
    out_p, lse_p = flash(q_all, prefix_keys, prefix_values, 0.0, False, scale=scaling)
    out_p = out_p.reshape(kv_heads, rows, group * tokens, dim).transpose(0, 1).reshape(rows, heads, tokens, dim)
    lse_p = lse_p.reshape(kv_heads, rows, group * tokens).transpose(0, 1).reshape(rows, heads, tokens)
    return merge_parts(out_p, lse_p, out_own, lse_own).to(q.dtype)
