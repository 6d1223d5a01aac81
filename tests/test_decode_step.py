"""The lean decoding step (fae/backends/decode_step.py): transformers' numbers with fewer calls, and the
int8/int4 weights of ``--weights``.

The step is checked where its bits could part from transformers': a left-padded batch (the attention
kernel transformers picks under a mask depends on the tensors' strides and on TRANSFORMERS_SDPA_FORCE_GQA),
an unpadded row, bf16 (oneDNN's packed weights) and fp32, Llama and Qwen2 (projection biases). Through
``generate_batched`` the answers must be ``generate``'s to the character, rows finishing at different steps.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _scaled(path, dtype):
    """The tiny model with weights x5 (answers that vary with the prompt), in ``dtype``."""
    import torch

    from fae.backends.hf import load_hf_model

    lm, tok = load_hf_model(path, None, dtype, "cpu")
    with torch.no_grad():
        for p in lm.parameters():
            p.mul_(5.0)
    from fae.backends.packed_linear import pack_linear_weights

    for m in lm.modules():  # re-pack from the scaled weights
        m.__dict__.pop("_packed_weight", None)
        m.__dict__.pop("forward", None)
    pack_linear_weights(lm)
    return lm, tok


@pytest.fixture(scope="module")
def smollm_shaped(tmp_path_factory):
    """A random two-layer Llama with SmolLM2's attention (9 query heads of 64 over 3 key/value heads): at
    its head size and a few hundred positions the attention kernels transformers chooses between differ in
    their last bits, which the tiny test models' 16-wide heads hide."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tiny_models import build_tokenizer

    tok = build_tokenizer("llama", None, 600)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=576, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("smollm-shaped")
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _prefilled(lm, lengths, seed=0):
    """A left-padded batch of random prompts of ``lengths``, prefilled into a reserving cache."""
    import torch

    from fae.backends.padding import left_pad
    from fae.backends.reserved_cache import cache_kwarg, reserved_cache

    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(10, lm.config.vocab_size - 10, (n,), generator=g).tolist() for n in lengths]
    ids, mask = left_pad(rows, 0)
    cache = reserved_cache(lm, 8)
    positions = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 1)
    with torch.inference_mode():
        lm(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
           **{cache_kwarg(lm): cache})
    nxt = torch.randint(10, lm.config.vocab_size - 10, (len(rows), 1), generator=g)
    return cache, nxt, torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1), mask.sum(1, keepdim=True)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("force_gqa", [False, True])
@pytest.mark.parametrize("lengths", [(23,), (23, 9, 17)])
def test_the_lean_step_computes_transformers_logits_to_the_bit(tiny_model, dtype, force_gqa, lengths, monkeypatch):
    _same_bits(tiny_model, dtype, force_gqa, lengths, monkeypatch)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("force_gqa", [False, True])
def test_the_lean_step_computes_transformers_logits_at_smollm2s_attention(smollm_shaped, dtype, force_gqa,
                                                                          monkeypatch):
    _same_bits(smollm_shaped, dtype, force_gqa, (430, 260, 317, 12), monkeypatch)


def _same_bits(model, dtype, force_gqa, lengths, monkeypatch):
    import torch

    from fae.backends.decode_step import LeanLlamaStep, decode_step_for, hf_step

    if force_gqa:
        monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    else:
        monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA", raising=False)
    lm, _ = _scaled(model, dtype)
    lean = decode_step_for(lm)
    assert isinstance(lean, LeanLlamaStep)
    cache, nxt, mask, positions = _prefilled(lm, lengths)
    with torch.inference_mode():
        want = hf_step(lm)(nxt, mask, positions, cache)
        cache.crop(-1)
        got = lean(nxt, mask, positions, cache)
    assert torch.equal(got, want)


@pytest.mark.parametrize("model, repeats", [("noisy_llama", 1), ("smollm_shaped", 40)])
def test_generate_batched_through_the_lean_step_answers_what_generate_answers(model, repeats, request):
    """Greedy answers of different lengths (rows leave the batch as they stop), with and without the label
    probabilities (which keep every row and reuse the prompt's cache); at SmolLM2's attention shapes and
    a few hundred positions too, where the attention kernel under a padding mask matters."""
    from data_prep.prompts import encode_chat
    from fae.backends.decode_step import decode_step_for
    from fae.backends.hf import generate_batched, greedy_config

    lm, tok = _scaled(request.getfixturevalue(model), "fp32")
    claims = ["The vaccine reduces the risk of severe disease.", "Masks work.", "line3: line7: line9:",
              "Cutting Knowledge Date: December 2023", "system user assistant", "line1: The vaccine"]
    ids = [encode_chat(tok, [{"role": "user", "content": c * repeats * (1 + i % 3)}]) for i, c in enumerate(claims)]
    gc = greedy_config(lm, tok, 24)
    step = decode_step_for(lm)
    import torch

    with torch.inference_mode():
        first = lm.generate(input_ids=torch.tensor(ids[:1]), generation_config=gc)[0, len(ids[0]):].tolist()
    eos = gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id]
    gc.eos_token_id = [*eos, first[3]]  # a token one answer says early: that row stops there
    seen = []

    def watched(*args):  # generate's attention choice is transformers' own: no forced GQA kernel
        seen.append(os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA"))
        return step(*args)

    for label_probs in (False, True):
        want = generate_batched(lm, tok, ids, gc, 4, label_probs=label_probs)
        got = generate_batched(lm, tok, ids, gc, 4, label_probs=label_probs, step=watched)
        assert [(g.text, g.finish_reason, g.label_probs) for g in got] == \
            [(g.text, g.finish_reason, g.label_probs) for g in want]
    assert seen and set(seen) == {None}
    reasons = {g.finish_reason for g in want}
    assert reasons == {"stop", "length"}, reasons  # rows stop at different steps: compaction is exercised
    assert len({g.text for g in want}) > 2


def test_models_the_lean_step_does_not_know_decode_through_transformers(tiny_qwen, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from fae.backends.decode_step import LeanLlamaStep, decode_step_for, lean_problem
    from real_fae_core.errors import UserError

    config = AutoConfig.from_pretrained(tiny_qwen)
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 16, 1
    config.layer_types = ["full_attention", "sliding_attention"]
    lm = AutoModelForCausalLM.from_pretrained(tiny_qwen, config=config, dtype=torch.float32)
    assert lean_problem(lm) == "sliding-window attention"
    assert not isinstance(decode_step_for(lm), LeanLlamaStep)
    with pytest.raises(UserError, match="sliding-window"):
        decode_step_for(lm, "int4")
    with pytest.raises(UserError, match="int5"):
        decode_step_for(lm, "int5")


def test_int8_and_int4_weights_stay_close_to_the_model_and_read_fewer_bytes(tiny_llama):
    """Weight-only quantized steps: logits near bf16's (cosine), weights 1/2 and about 1/4 the bytes."""
    import torch

    from fae.backends.decode_step import LeanLlamaStep, quantize_int4, quantize_int8

    from fae.backends.hf import load_hf_model

    lm, _ = load_hf_model(tiny_llama, None, "bf16", "cpu")
    cache, nxt, mask, positions = _prefilled(lm, (32, 20))
    model = LeanLlamaStep(lm, "model")
    with torch.inference_mode():
        want = model(nxt, mask, positions, cache)
        sizes = {"model": model.weight_bytes()}
        for weights in ("int8", "int4"):
            cache.crop(-1)
            step = LeanLlamaStep(lm, weights)
            got = step(nxt, mask, positions, cache)
            cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
            assert cos.min() > (0.9999 if weights == "int8" else 0.99), (weights, cos)
            assert not torch.equal(got, want)
            sizes[weights] = step.weight_bytes()
    assert sizes["int8"] < 0.6 * sizes["model"] and sizes["int4"] < 0.35 * sizes["model"], sizes
    # the quantizers round trip within half a step of their grid
    w = torch.randn(48, 64) * 0.05
    q, scale = quantize_int8(w)
    assert (q.float() * scale.float()[:, None] - w).abs().max() <= scale.float().max() * 0.5 + 1e-7
    packed, scales_zeros = quantize_int4(w)
    x = torch.eye(64, dtype=torch.bfloat16)  # the kernel on the identity: the dequantized weight, transposed
    dequant = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_zeros).float().T
    assert (dequant - w).abs().max() < 0.05 * 2 / 15 + 0.01


def test_the_weights_option_is_recorded_and_checked(tiny_llama):
    from fae.backends.hf import HFBackend, HFOptions

    assert HFBackend.decoding_of(HFOptions(model="m", weights="int4"))["weights"] == "int4"
    backend = HFBackend({"model": str(tiny_llama), "dtype": "bf16", "device": "cpu", "weights": "int8",
                         "max_new_tokens": 4, "label_probs": False})
    out = backend.generate([[{"role": "user", "content": "Masks work."}]])
    assert len(out) == 1 and out[0].finish_reason in ("stop", "length")
    assert os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA") is None  # fae run's path leaves transformers' choice


def _at_alignment(rows: int, cols: int, offset: int, dtype=None):
    """A rows x cols tensor of random values (float32 unless ``dtype``) whose data start ``offset`` bytes
    past a 64-byte boundary (where weights read from a safetensors file may lie)."""
    import torch

    dtype = dtype or torch.float32
    size = torch.finfo(dtype).bits // 8
    buffer = torch.empty(rows * cols + 64 // size, dtype=dtype)
    start = ((offset - buffer.data_ptr()) % 64) // size
    t = buffer[start:start + rows * cols].view(rows, cols)
    t.copy_(torch.randn(rows, cols))
    assert t.data_ptr() % 64 == offset
    return t


def test_packed_weights_keep_each_layers_memory_alignment():
    """The lean step's stacked query/key/value (and gate/up) weight puts each block where its layer's own
    weight lies modulo 64 bytes: MKL's float32 product on AMD EPYC rounds a weight 24 bytes past a boundary
    differently from a 64-byte aligned copy, and the logits would leave transformers' by a bit. Where the
    layers' alignments cannot all be kept, the layers are called one by one."""
    import torch

    from fae.backends.decode_step import StackedProjections, concatenated_as_aligned, packed_projection

    torch.manual_seed(0)
    same = [_at_alignment(rows, 16, 24) for rows in (32, 8, 8)]
    stacked = concatenated_as_aligned(same)
    assert torch.equal(stacked, torch.cat(same))
    blocks = stacked.split([32, 8, 8])
    assert [b.data_ptr() % 64 for b in blocks] == [24, 24, 24]

    def linear_layers(weights):
        layers = []
        for w in weights:
            m = torch.nn.Linear(16, w.shape[0], bias=False)
            m.weight = torch.nn.Parameter(w, requires_grad=False)
            layers.append(m)
        return layers

    apart = [_at_alignment(32, 16, 24), _at_alignment(8, 16, 28)]
    assert concatenated_as_aligned(apart) is None
    modules = linear_layers(apart)
    projection = packed_projection(modules, "model")
    assert isinstance(projection, StackedProjections) and projection.out_features == 40
    x = torch.randn(3, 1, 16)
    assert torch.equal(projection(x), torch.cat([m(x) for m in modules], dim=-1))

    # a weight read as a oneDNN-reordered (bf16) or quantized copy is stacked wherever its sources lie
    from fae.backends.decode_step import ProjectionWeight
    from fae.backends.packed_linear import packing_available

    modules = linear_layers([_at_alignment(32, 16, 24, torch.bfloat16), _at_alignment(8, 16, 26, torch.bfloat16)])
    assert concatenated_as_aligned([m.weight for m in modules]) is None
    expected_kinds = {"model": "packed" if packing_available() else None, "int8": "int8"}
    for weights, kind in expected_kinds.items():
        projection = packed_projection(modules, weights)
        if kind is None:
            assert isinstance(projection, StackedProjections)
        else:
            assert isinstance(projection, ProjectionWeight) and projection.kind == kind
