"""Rows that share a prompt read its keys and values once (fae/backends/shared_prompt_cache.py): the attention
equals attention over the prompt and the row's own positions, through steps and dropped rows."""

from __future__ import annotations

import pytest

from fae.backends.shared_prompt_cache import SharedPromptCache


class _OneRowLayer:
    def __init__(self, keys, values):
        self.keys, self.values = keys, values


class _OneRowCache:
    """What the prefix tree hands over per prompt: layers with keys and values of one row."""

    def __init__(self, layers):
        self.layers = layers


def _reference(q, keys, values, scaling):
    """Attention of one row's heads over ``keys``/``values`` (key/value heads x positions x size), the
    key/value heads repeated as transformers' repeat_kv does."""
    import torch

    group = q.shape[0] // keys.shape[0]
    k, v = keys.repeat_interleave(group, 0).float(), values.repeat_interleave(group, 0).float()
    weights = torch.softmax((q.float()[:, None, :] * k).sum(-1) * scaling, dim=-1)
    return (weights[..., None] * v).sum(1)  # heads x size


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_attention_over_a_shared_prompt_equals_attention_over_its_positions_and_the_rows_own(dtype):
    import torch

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    layers, kv_heads, heads, dim, scaling = 2, 3, 9, 16, 0.25
    lengths, rows_per_prompt = [7, 12, 4], [2, 1, 3]  # prompts of different lengths, 6 rows
    prompts = [[(torch.randn(1, kv_heads, n, dim, dtype=dt), torch.randn(1, kv_heads, n, dim, dtype=dt))
                for _ in range(layers)] for n in lengths]
    caches = [_OneRowCache([_OneRowLayer(k, v) for k, v in p]) for p in prompts]
    cache = SharedPromptCache.from_caches(caches, rows_per_prompt, room=6)
    assert [g.keys[0].shape[-2] for g in cache.groups] == [12, 4]  # the 4-token prompt is not padded to 12
    prompt_of = [p for p, count in enumerate(rows_per_prompt) for _ in range(count)]
    own = [[[] for _ in range(layers)] for _ in prompt_of]  # each row's own keys and values so far
    tolerance = 2e-6 if dtype == "float32" else 2e-2
    alive = list(range(len(prompt_of)))
    for step in range(5):
        if step == 3:  # the last row of prompt 0 and the only row of prompt 1 finish
            alive = [r for r in alive if r not in (1, 2)]
            cache.batch_select_indices(torch.tensor([j for j, r in enumerate(previous) if r in alive]))
        previous = list(alive)
        for n in range(layers):
            q = torch.randn(len(alive), heads, 1, dim, dtype=dt)
            k = torch.randn(len(alive), kv_heads, 1, dim, dtype=dt)
            v = torch.randn(len(alive), kv_heads, 1, dim, dtype=dt)
            got = cache.attend(n, q, k, v, scaling)
            assert got.shape == (len(alive), 1, heads * dim) and got.dtype == dt
            for j, r in enumerate(alive):
                own[r][n].append((k[j], v[j]))
                pk, pv = prompts[prompt_of[r]][n]
                keys = torch.cat([pk[0]] + [x for x, _ in own[r][n]], dim=1)
                values = torch.cat([pv[0]] + [y for _, y in own[r][n]], dim=1)
                want = _reference(q[j, :, 0], keys, values, scaling).reshape(-1)
                assert (got[j, 0].float() - want).abs().max() < tolerance, (step, n, r)
    assert cache.prompts_held() == 2  # prompt 1 lost its only row: its keys and values were dropped


def test_the_prefix_trees_lean_decoding_reads_each_prompt_once_and_answers_as_the_repeated_caches(
        tiny_llama, monkeypatch):
    """fae study's decoding (the lean step) goes through the shared cache, and its answers, greedy and
    seeded, equal those of the repeated caches (transformers' forward, each prompt copied per row)."""
    from data_prep.prompts import encode_chat
    from fae.backends import RowDecoding
    from fae.backends import shared_prompt_cache
    from fae.backends.decode_step import LeanLlamaStep
    from fae.backends.hf import greedy_config, load_hf_model
    from fae.backends.prefix_tree import generate_shared

    lm, tok = load_hf_model(tiny_llama, None, "fp32", "cpu")
    claims = ["The vaccine works.", "Masks reduce spread of the virus in schools.", "Zinc cures it."]
    ids = [encode_chat(tok, [{"role": "user", "content": c}]) for c in claims for _ in range(3)]
    decodings = [RowDecoding(max_new_tokens=8) if i % 3 == 0 else
                 RowDecoding(seed=i, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=8) for i in range(len(ids))]

    def config(cap):
        return greedy_config(lm, tok, cap)

    built = []
    original = shared_prompt_cache.SharedPromptCache.from_caches.__func__
    monkeypatch.setattr(shared_prompt_cache.SharedPromptCache, "from_caches",
                        classmethod(lambda cls, *a, **k: built.append(a[1]) or original(cls, *a, **k)))
    extended, extend = [], LeanLlamaStep.extend
    monkeypatch.setattr(LeanLlamaStep, "extend", lambda self, ids, prefix: extended.append(
        (ids.shape[0], prefix.get_seq_length() if prefix is not None else 0)) or extend(self, ids, prefix))
    shared, _ = generate_shared(lm, tok, ids, decodings, config, 8, step=LeanLlamaStep(lm))
    assert built == [[3, 3, 3]]  # three prompts, held once each for their three rows
    # the tree's edges were prefilled by the lean step: the shared head from nothing, then the three claims'
    # edges as sibling rows after it
    assert extended[0][1] == 0 and any(rows > 1 and held > 0 for rows, held in extended), extended
    repeated, _ = generate_shared(lm, tok, ids, decodings, config, 8)
    assert [g.text for g in shared] == [g.text for g in repeated]
    assert [g.finish_reason for g in shared] == [g.finish_reason for g in repeated]
    assert len({g.text for g in shared}) > 3


@pytest.mark.parametrize("held", [0, 9])
def test_the_lean_prefill_after_a_cached_prefix_gives_the_keys_and_values_of_one_forward_pass(tiny_llama, held):
    """LeanLlamaStep.extend: rows of new tokens (right-padded to one width) after a shared one-row cache get
    the keys and values, layer by layer, that transformers' forward computes over the prefix and each row's
    own tokens read whole (the prefix part and the causal part of the split attention both count: the keys
    of layer 2 on depend on layer 1's attention output)."""
    import torch

    from fae.backends.decode_step import LeanLlamaStep
    from fae.backends.hf import load_hf_model
    from fae.backends.reserved_cache import cache_kwarg, new_cache

    lm, _ = load_hf_model(tiny_llama, None, "fp32", "cpu")
    torch.manual_seed(0)
    prefix = torch.randint(3, lm.config.vocab_size, (1, held))
    lengths = [11, 6, 1]
    rows = [torch.randint(3, lm.config.vocab_size, (n,)).tolist() for n in lengths]
    padded = torch.tensor([r + [r[-1]] * (max(lengths) - len(r)) for r in rows])
    cache = new_cache(lm, 0)
    with torch.inference_mode():
        if held:
            lm(input_ids=prefix, use_cache=True, **{cache_kwarg(lm): cache})
        new = LeanLlamaStep(lm).extend(padded, cache if held else None)
        assert len(new) == lm.config.num_hidden_layers
        for r, row in enumerate(rows):
            whole = new_cache(lm, 0)
            lm(input_ids=torch.cat([prefix[0], torch.tensor(row)])[None], use_cache=True, **{cache_kwarg(lm): whole})
            for n, (k, v) in enumerate(new):
                want_k, want_v = whole.layers[n].keys[:, :, held:], whole.layers[n].values[:, :, held:]
                assert (k[r:r + 1, :, :lengths[r]] - want_k).abs().max() < 1e-5, (r, n)
                assert (v[r:r + 1, :, :lengths[r]] - want_v).abs().max() < 1e-5, (r, n)


def test_the_lean_prefill_stops_the_last_layer_at_its_keys_and_values(tiny_llama):
    """An edge's logits are never read, so ``extend`` runs no attention output or MLP in the last layer (the
    keys and values it returns are checked against transformers' forward above)."""
    import torch

    from fae.backends.decode_step import LeanLlamaStep
    from fae.backends.hf import load_hf_model

    lm, _ = load_hf_model(tiny_llama, None, "fp32", "cpu")
    step = LeanLlamaStep(lm)
    calls = []
    for n, layer in enumerate(step.layers):
        out, down = layer[2], layer[5]
        step.layers[n] = layer[:2] + ((lambda x, n=n, f=out: calls.append(("out", n)) or f(x)),) + layer[3:5] + \
            ((lambda x, n=n, f=down: calls.append(("down", n)) or f(x)),)
    with torch.inference_mode():
        new = step.extend(torch.tensor([[5, 6, 7]]), None)
    last = lm.config.num_hidden_layers - 1
    assert len(new) == last + 1
    assert sorted(calls) == sorted([(kind, n) for n in range(last) for kind in ("out", "down")])
