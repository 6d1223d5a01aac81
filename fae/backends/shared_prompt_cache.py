"""Decoding many rows from few prompts: each prompt's keys and values held once, read once per step.

The study decodes each distinct prompt six times (greedy and five seeds), and each decoding step of a row
reads its whole prompt's keys and values. Repeating a prompt's cache once per row, as a batch of
``generate`` needs, copies it six times and makes every step read it six times: with Check-COVID's
1,400-token pools that is most of a step's memory traffic, and the copies (and the gathers that drop
finished rows) most of the rest.

:class:`SharedPromptCache` keeps each prompt's keys and values once (prompts of similar length
right-aligned in one buffer per layer, the padding before them masked) and each row's own positions (the prompt's last token
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

from dataclasses import dataclass
from typing import Sequence

from fae.backends.padding import length_groups


@dataclass
class PromptGroup:
    """Prompts of similar length (:func:`fae.backends.padding.length_groups`), right-aligned in one buffer
    per layer: ``keys``/``values`` (prompts x key/value heads x width x size per layer), ``mask`` (prompts x
    1 x 1 x width, additive, -inf on the padding; None when every prompt fills the width). ``prompts``: the
    cache's prompt numbers, in buffer order. Padding a 300-token prompt to a 2,000-token one beside it would
    make every step read the padding (half of a Check-COVID unit's prompt positions)."""

    prompts: list[int]
    keys: list
    values: list
    mask: object = None

    @classmethod
    def build(cls, prompts: list[int], layers: list[list[tuple]]) -> "PromptGroup":
        """From each prompt's (keys, values) per layer (``layers[n][i]``: prompt ``prompts[i]``'s, one row)."""
        import torch

        lengths = [k.shape[-2] for k, _ in layers[0]]
        width = max(lengths)
        keys, values = [], []
        for per_prompt in layers:
            for parts, which in ((keys, 0), (values, 1)):
                first = per_prompt[0][which]
                buf = first.new_zeros((len(prompts), first.shape[1], width, first.shape[-1]))
                for i, pair in enumerate(per_prompt):
                    buf[i, :, width - pair[which].shape[-2]:].copy_(pair[which][0])
                parts.append(buf)
        keep = torch.arange(width)[None, :] >= (width - torch.tensor(lengths))[:, None]
        mask = None if all(n == width for n in lengths) else \
            torch.zeros(keep.shape, dtype=keys[0].dtype).masked_fill_(~keep, float("-inf"))[:, None, None, :]
        return cls(prompts, keys, values, mask)

    def select(self, positions: list[int]) -> "PromptGroup":
        """The group of the prompts at ``positions`` of this one (a copy of their keys and values)."""
        import torch

        index = torch.tensor(positions, dtype=torch.long)
        return PromptGroup([self.prompts[i] for i in positions], [b[index] for b in self.keys],
                           [b[index] for b in self.values], None if self.mask is None else self.mask[index])


class SharedPromptCache:
    """Per layer: the prompts' keys and values (grouped by length, :class:`PromptGroup`), and each row's
    own positions (rows x key/value heads x room x head size). ``prompt_of[r]``: row r's prompt. Build with
    :meth:`from_caches`."""

    def __init__(self, groups: list[PromptGroup], prompt_of: Sequence[int], room: int):
        self.groups = groups
        first = groups[0].keys[0]
        rows, (_, kv_heads, _, dim) = len(prompt_of), first.shape
        self.own_keys = [first.new_empty((rows, kv_heads, room, dim)) for _ in groups[0].keys]
        self.own_values = [first.new_empty((rows, kv_heads, room, dim)) for _ in groups[0].keys]
        self.filled = [0] * len(self.own_keys)
        self.layers: list = []  # no transformers layers: cache_device falls back to the ids' device
        self.regroup(list(prompt_of))

    @classmethod
    def from_caches(cls, caches: Sequence, rows_per_cache: Sequence[int], room: int) -> "SharedPromptCache":
        """From one single-row transformers cache per prompt (the prompt minus its last token), asked by
        ``rows_per_cache[i]`` rows each, with ``room`` positions per row for the last prompt token and the
        answer."""
        lengths = [c.layers[0].keys.shape[-2] for c in caches]
        groups = [PromptGroup.build(members, [[(caches[p].layers[n].keys, caches[p].layers[n].values)
                                               for p in members] for n in range(len(caches[0].layers))])
                  for members in length_groups(lengths)]
        prompt_of = [p for p, count in enumerate(rows_per_cache) for _ in range(count)]
        return cls(groups, prompt_of, room)

    def prompts_held(self) -> int:
        """How many prompts' keys and values the cache holds (prompts whose rows have all finished are gone)."""
        return sum(len(g.prompts) for g in self.groups)

    def regroup(self, prompt_of: list[int]) -> None:
        """Index each row's queries into its prompt's place: per group, ``slots`` (prompts x the most rows a
        prompt of the group has) holds row numbers, ``len(prompt_of)`` for an empty slot (a zero query, its
        output dropped); ``slot_of_row``: each row's place among all groups' slots, in group order."""
        import torch

        self.prompt_of = prompt_of
        members: dict[int, list[int]] = {}
        for r, p in enumerate(prompt_of):
            members.setdefault(p, []).append(r)
        self.slots, place, offset = [], {}, 0
        for g in self.groups:
            width = max(len(members.get(p, [])) for p in g.prompts)
            self.slots.append(torch.tensor([members.get(p, []) + [len(prompt_of)] * (width - len(members.get(p, [])))
                                            for p in g.prompts], dtype=torch.long))
            for i, p in enumerate(g.prompts):
                for j, r in enumerate(members.get(p, [])):
                    place[r] = offset + i * width + j
            offset += len(g.prompts) * width
        self.slot_of_row = torch.tensor([place[r] for r in range(len(prompt_of))], dtype=torch.long)

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
        # the prompts, group by group: every row of a prompt (and its heads of a key/value head) as query
        # positions
        q_rows = torch.cat([q.reshape(rows, heads, dim), q.new_zeros((1, heads, dim))])
        outs, lses = [], []
        for g, slots in zip(self.groups, self.slots):
            per_prompt = slots.shape[1]
            q_prompt = q_rows.index_select(0, slots.reshape(-1)).reshape(-1, per_prompt, kv_heads, group, dim) \
                .transpose(1, 2).reshape(-1, kv_heads, per_prompt * group, dim)
            out_p, lse_p = flash(q_prompt, g.keys[layer], g.values[layer], 0.0, False, attn_mask=g.mask,
                                 scale=scaling)
            outs.append(out_p.reshape(-1, kv_heads, per_prompt, group, dim).transpose(1, 2)
                        .reshape(-1, kv_heads, group, dim))
            lses.append(lse_p.reshape(-1, kv_heads, per_prompt, group).transpose(1, 2).reshape(-1, kv_heads, group))
        out_p = (outs[0] if len(outs) == 1 else torch.cat(outs)).index_select(0, self.slot_of_row)
        lse_p = (lses[0] if len(lses) == 1 else torch.cat(lses)).index_select(0, self.slot_of_row)
        return merge_parts(out_p, lse_p, out_own, lse_own).to(q.dtype).reshape(rows, 1, heads * dim)

    def batch_select_indices(self, indices) -> None:
        """Keep the rows ``indices`` (a copy of their own positions only; prompts left without a row are
        dropped, a copy of the others' keys and values in their group)."""
        keep = [int(i) for i in indices]
        self.own_keys = [b[indices] for b in self.own_keys]
        self.own_values = [b[indices] for b in self.own_values]
        prompt_of = [self.prompt_of[i] for i in keep]
        used = set(prompt_of)
        if len(used) < self.prompts_held():
            groups = []
            for g in self.groups:
                positions = [i for i, p in enumerate(g.prompts) if p in used]
                if positions:
                    groups.append(g if len(positions) == len(g.prompts) else g.select(positions))
            self.groups = groups
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
