"""One decoding step of a Llama-family model without transformers' module stack, and weight-only int8/int4.

Decoding reads every weight once per new token, so a step's floor is the bytes of the weights (and the KV
cache) over the memory bandwidth. transformers' forward spends a large share of a CPU step above that floor
in Python: per layer, three projection calls where one would do, two more for the MLP, the rotary and mask
preparation, hooks and output records. :class:`LeanLlamaStep` computes the same step from the model's own
tensors with fewer calls: the query/key/value projections packed into one weight, gate and up into one,
the model's own rotary module called once per step, transformers' own attention function (so the attention
kernel, and its bits, are the ones transformers would choose), and the KV cache written in place through the
cache's own ``update``. On the CPU the bf16 weights are laid out for oneDNN once
(:mod:`fae.backends.packed_linear`). The logits equal transformers' to the bit on SmolLM2 in
bf16 and fp32 (tests/test_decode_step.py); a model it does not know (another layer type, a sliding window,
biases or norms it does not read) decodes through transformers' forward (:func:`hf_step`).

``weights``: ``model`` reads the weights as loaded. ``int8`` and ``int4`` are weight-only quantized copies
of every decoder projection and of the output layer, read by PyTorch's CPU kernels
(``_weight_int8pack_mm``: one scale per output row; ``_weight_int4pack_mm_for_cpu``: groups of 32 with a
scale and a zero point, the layout of GGUF's Q4_1), for the decode step only: prefill is bound by
arithmetic, not by reading weights, and keeps the model's weights. The answers then differ from the
model's; the run records which weights decoded it.
"""

from __future__ import annotations

from typing import Callable

from real_fae_core.errors import UserError
from fae.backends.packed_linear import packed_weight_of, packing_available
from fae.backends.reserved_cache import cache_kwarg
from fae.backends.shared_prompt_cache import attend_after_prefix

DECODE_WEIGHTS = ("model", "int8", "int4")
INT4_GROUP = 32  # weights per scale and zero point (GGUF Q4_1's block)
INT4_INNER_TILES = 8
LEAN_LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer")


def hf_step(lm) -> Callable:
    """The step as transformers computes it: ``lm``'s forward over one new token per row."""
    kwarg = cache_kwarg(lm)

    def step(ids, mask, positions, cache):
        return lm(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                  **{kwarg: cache}).logits[:, -1, :].float()

    return step


def lean_problem(lm) -> str | None:
    """Why :class:`LeanLlamaStep` cannot compute ``lm``'s step exactly (None when it can)."""
    inner = getattr(lm, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(lm, "lm_head") or not hasattr(inner, "rotary_emb"):
        return f"{type(lm).__name__} is not a decoder-only model with .model.layers and .lm_head"
    cfg = lm.config
    kinds = {type(layer).__name__ for layer in layers}
    if not kinds <= set(LEAN_LAYERS):
        return f"layer type {sorted(kinds - set(LEAN_LAYERS))[0]} (known: {', '.join(LEAN_LAYERS)})"
    if any(kind != "full_attention" for kind in (getattr(cfg, "layer_types", None) or [])) or \
            getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True) is not False:
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return "an MLP other than SiLU-gated without bias"
    if getattr(cfg, "_attn_implementation", "sdpa") != "sdpa":
        return f"attention implementation {cfg._attn_implementation}"
    attention = layers[0].self_attn
    if getattr(attention, "o_proj").bias is not None:
        return "an output projection with a bias"
    return None


def quantize_int8(weight):
    """(int8 weight, bf16 scale per output row): symmetric, round to nearest."""
    import torch

    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)  # rounded first: the grid the kernel uses
    q = (w / scale.float()[:, None]).round().clamp(-128, 127).to(torch.int8)
    return q.contiguous(), scale


def quantize_int4(weight, group: int = INT4_GROUP):
    """(packed int4 weight, bf16 scales and zero points) for ``_weight_int4pack_mm_for_cpu``: per group of
    ``group`` input weights, 16 levels from the group's minimum to its maximum (asymmetric, as Q4_1)."""
    import torch

    w = weight.detach().float()
    rows, cols = w.shape
    if cols % group:
        raise UserError(f"int4 weights need input widths divisible by {group}, not {cols}")
    g = w.reshape(rows, cols // group, group)
    low, high = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-12).to(torch.bfloat16).float()  # rounded first: the kernel's grid
    zero = (low + scale * 8).to(torch.bfloat16).float()  # the kernel computes (q - 8) * scale + zero
    q = ((g - zero) / scale + 8).round().clamp(0, 15).to(torch.int32).reshape(rows, cols)
    scales_zeros = torch.cat([scale, zero], dim=2).transpose(0, 1).contiguous().to(torch.bfloat16)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INT4_INNER_TILES), scales_zeros


def reordered_for_onednn(weight) -> bool:
    """Whether the decode step reads a model-precision ``weight`` as a oneDNN-reordered copy (bf16 on a CPU
    that can reorder ahead of time) rather than as the dense tensor itself."""
    import torch

    return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and packing_available()


class ProjectionWeight:
    """One linear map (no bias, or a bias added after) in the form the decode step reads it."""

    def __init__(self, weight, bias, weights: str, packed=None):
        """``packed``: the weight already reordered for oneDNN (a model layer's own copy, shared, not copied)."""
        import torch

        self.bias, self.kind, (self.out_features, self.in_features) = bias, weights, weight.shape
        if weights == "model" and packed is not None:
            self.kind, self.q = "packed", packed
        elif weights == "int8":
            self.q, self.scale = quantize_int8(weight)
        elif weights == "int4":  # the kernel packs output rows by 16: pad with zero rows, cut them off after
            pad = -weight.shape[0] % 16
            self.q, self.scale = quantize_int4(torch.nn.functional.pad(weight.detach(), (0, 0, 0, pad)))
        elif reordered_for_onednn(weight):
            self.kind, self.q = "packed", torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16)
        else:
            self.kind, self.q = "dense", weight.detach()

    def __call__(self, x):
        import torch

        if self.kind == "dense":
            return torch.nn.functional.linear(x, self.q, self.bias)
        if self.kind == "packed":
            return torch.ops.mkldnn._linear_pointwise(x, self.q, self.bias, "none", [], "")
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if self.kind == "int8":
            y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.q, INT4_GROUP, self.scale)
        y = y[:, :self.out_features].reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def nbytes(self) -> int:
        """Bytes a call reads from its weights (the packed storage, scales and zero points, bias)."""
        parts = [self.q] + ([self.scale] if self.kind in ("int8", "int4") else []) + \
            ([self.bias] if self.bias is not None else [])
        return sum(t.numel() * t.element_size() if t.is_mkldnn else t.untyped_storage().nbytes() for t in parts)


class StackedProjections:
    """Several projections of one input, called one by one, their outputs concatenated: what
    :func:`packed_projection` falls back to where one concatenated weight cannot sit at each layer's own
    memory alignment (:func:`concatenated_as_aligned`)."""

    def __init__(self, parts: list[ProjectionWeight]):
        self.parts = parts
        self.in_features, self.out_features = parts[0].in_features, sum(p.out_features for p in parts)

    def __call__(self, x):
        import torch

        return torch.cat([p(x) for p in self.parts], dim=-1)

    def nbytes(self) -> int:
        """Bytes a call reads from the parts' weights."""
        return sum(p.nbytes() for p in self.parts)


def concatenated_as_aligned(tensors):
    """``torch.cat(tensors)`` in a buffer where each block starts at the address its source has, modulo 64
    bytes; None where no buffer can (the sources' alignments disagree with their sizes). A CPU matrix
    product's float32 result can depend on where its weight lies (MKL on AMD EPYC rounds a weight 16-byte
    aligned differently from one 8 bytes off), and weights read from a safetensors file lie wherever the
    file put them: a copy at another alignment would not compute transformers' logits to the bit."""
    import torch

    size = tensors[0].element_size()
    total = sum(t.numel() for t in tensors)
    buffer = torch.empty(total + 64 // size, dtype=tensors[0].dtype, device=tensors[0].device)
    shift = (tensors[0].data_ptr() - buffer.data_ptr()) % 64
    if shift % size:
        return None
    flat = buffer[shift // size:shift // size + total]
    offset = 0
    for t in tensors:
        if (flat.data_ptr() + offset * size - t.data_ptr()) % 64:
            return None
        offset += t.numel()
    out = flat.view(total // tensors[0].shape[1], tensors[0].shape[1])
    torch.cat([t.detach() for t in tensors], out=out)
    return out


def packed_projection(modules, weights: str) -> ProjectionWeight | StackedProjections:
    """One :class:`ProjectionWeight` for several linear layers reading the same input (outputs stacked), or,
    where the stacked weight is read as it lies and cannot keep each layer's alignment, one per layer."""
    import torch

    weight = modules[0].weight
    if len(modules) > 1:  # a reordered or quantized copy is computed the same wherever its source lay
        dense = weights == "model" and not reordered_for_onednn(weight)
        weight = concatenated_as_aligned([m.weight for m in modules]) if dense else \
            torch.cat([m.weight for m in modules]).contiguous()
    if weight is None:
        return StackedProjections([packed_projection([m], weights) for m in modules])
    biases = [m.bias for m in modules]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else m.weight.new_zeros(m.weight.shape[0]) for b, m in zip(biases, modules)])
    packed = packed_weight_of(modules[0]) if len(modules) == 1 else None
    return ProjectionWeight(weight, bias, weights, packed)


class LeanLlamaStep:
    """``step(ids, mask, positions, cache) -> float32 logits`` for one new token per row, the model's
    weights read in as few calls as the layer allows. Build with :func:`decode_step_for`.

    ``cache``: a transformers cache (attention as transformers computes it, under ``mask``) or a
    :class:`fae.backends.shared_prompt_cache.SharedPromptCache` (its ``attend``: rows sharing a prompt read
    its keys and values once; ``mask`` is then the cache's own)."""

    attends_shared_prompts = True  # reads a SharedPromptCache (the prefix tree's decoding asks)

    def __init__(self, lm, weights: str = "model"):
        inner, cfg = lm.model, lm.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.eps, self.weights = cfg.rms_norm_eps, weights
        self.embed, self.rotary = inner.embed_tokens, inner.rotary_emb
        self.layers, self.attention = [], [layer.self_attn for layer in inner.layers]
        for layer in inner.layers:
            a, f = layer.self_attn, layer.mlp
            self.layers.append((layer.input_layernorm.weight, packed_projection([a.q_proj, a.k_proj, a.v_proj], weights),
                                packed_projection([a.o_proj], weights), layer.post_attention_layernorm.weight,
                                packed_projection([f.gate_proj, f.up_proj], weights),
                                packed_projection([f.down_proj], weights)))
        self.norm = inner.norm.weight
        self.head = packed_projection([lm.lm_head], weights)

    def weight_bytes(self) -> int:
        """Bytes one step reads from the projections and the output layer (norms and one embedding row aside)."""
        return sum(p.nbytes() for layer in self.layers for p in (layer[1], layer[2], layer[4], layer[5])) \
            + self.head.nbytes()

    def rms(self, h, weight):
        """transformers' RMSNorm, operation for operation (``torch.nn.functional.rms_norm`` is one call but
        dispatches to five kernels and takes longer at a handful of rows); in place on the float32 copy of a
        bf16 input (the same values, fewer allocations)."""
        import torch

        h32 = h.float()
        scale = h32.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()
        normed = h32.mul_(scale) if h32 is not h else h32 * scale  # never in place on the residual itself
        return weight * normed.to(h.dtype)

    def rotation(self, h, positions):
        """The rotary embedding's cos and sin for ``positions`` (rows x tokens), broadcast over heads, with sin's
        first half negated: rotate_half(x) * sin == roll(x, half) * that sin, the same products, as (-a) * b ==
        a * (-b) exactly; one call a layer instead of three."""
        import torch

        cos, sin = (t.unsqueeze(1) for t in self.rotary(h, positions))
        half = self.head_dim // 2
        return cos, sin * torch.cat([sin.new_full((half,), -1), sin.new_ones(self.head_dim - half)])

    def project(self, n: int, h, cos, sin) -> tuple:
        """Layer ``n``'s rotated queries and keys and its values for ``h`` (rows x tokens x hidden), each
        rows x heads x tokens x size: all that the layer adds to a KV cache."""
        norm_in, qkv = self.layers[n][:2]
        rows, tokens = h.shape[:2]
        nq, nk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        x = qkv(self.rms(h, norm_in))
        # the rotary embedding of the query and key heads in one pass (elementwise: the same numbers as two);
        # then each projection in its own contiguous layout, as transformers has it (the attention kernel is
        # several times slower on the strided views)
        qk = x[..., :nq + nk].view(rows, tokens, -1, self.head_dim).transpose(1, 2)
        qk = qk * cos + qk.roll(self.head_dim // 2, dims=-1) * sin
        q = qk[:, :self.heads].transpose(1, 2).contiguous().transpose(1, 2)
        k = qk[:, self.heads:].transpose(1, 2).contiguous().transpose(1, 2)
        v = x[..., nq + nk:].contiguous().view(rows, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def layer(self, n: int, h, cos, sin, attend):
        """Decoder layer ``n`` over ``h`` (rows x tokens x hidden); ``attend(n, q, k, v)`` returns the attention
        output (rows x tokens x heads x size, in any layout) of the rotated queries and keys."""
        import torch

        out, norm_mid, gate_up, down = self.layers[n][2:]
        rows, tokens = h.shape[:2]
        q, k, v = self.project(n, h, cos, sin)
        h = h + out(attend(n, q, k, v).reshape(rows, tokens, self.heads * self.head_dim))
        g, u = gate_up(self.rms(h, norm_mid)).chunk(2, dim=-1)
        return h + down(torch.nn.functional.silu(g) * u)

    def __call__(self, ids, mask, positions, cache):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        h = self.embed(ids)
        cos, sin = self.rotation(h, positions)
        keep = None if hasattr(cache, "attend") or mask is None or bool(mask.all()) else mask[:, None, None, :].bool()

        def attend(n, q, k, v):
            if hasattr(cache, "attend"):
                return cache.attend(n, q, k, v, self.attention[n].scaling)
            k, v = cache.layers[n].update(k, v)
            return sdpa_attention_forward(self.attention[n], q, k, v, keep, scaling=self.attention[n].scaling)[0]

        for n in range(len(self.layers)):
            h = self.layer(n, h, cos, sin, attend)
        return self.head(self.rms(h, self.norm))[:, -1].float()

    def extend(self, ids, prefix) -> list[tuple]:
        """The keys and values of new tokens ``ids`` (rows x tokens) that continue the positions held in
        ``prefix`` (a one-row transformers cache, the same prefix for every row; None when empty): per layer
        (keys, values), rows x key/value heads x tokens x size, for the caller to store. No logits, and the last
        layer stops at its keys and values: the prefix tree reads none of an edge's logits. Rows of different
        lengths are right-padded by the caller (causal attention keeps the padding out of every real token's
        view). Each layer's attention reads the prefix once for all rows
        (:func:`fae.backends.shared_prompt_cache.attend_after_prefix`)."""
        import torch

        held = prefix.get_seq_length() if prefix is not None else 0
        rows, tokens = ids.shape
        h = self.embed(ids)
        positions = torch.arange(held, held + tokens, device=ids.device).expand(rows, tokens)
        cos, sin = self.rotation(h, positions)
        new: list[tuple] = []

        def attend(n, q, k, v):
            new.append((k, v))
            keys, values = (prefix.layers[n].keys, prefix.layers[n].values) if held else (None, None)
            o = attend_after_prefix(q, k, v, keys, values, self.attention[n].scaling)
            return o.transpose(1, 2)

        last = len(self.layers) - 1
        for n in range(last):
            h = self.layer(n, h, cos, sin, attend)
        # the last layer's keys and values are all an edge needs of it: its attention and MLP feed only logits
        new.append(self.project(last, h, cos, sin)[1:])
        return new


def decode_step_for(lm, weights: str = "model") -> Callable:
    """The fastest exact step for ``lm``: :class:`LeanLlamaStep` where it applies, else transformers' forward.
    ``weights`` other than ``model`` need the lean step (and a CPU: the int kernels are PyTorch's CPU ones)."""
    if weights not in DECODE_WEIGHTS:
        raise UserError(f"weights: {weights!r} is not one of {', '.join(DECODE_WEIGHTS)}")
    problem = lean_problem(lm)
    if weights != "model":
        if problem:
            raise UserError(f"--weights {weights} decodes through the lean Llama step, which cannot read this "
                            f"model: {problem}")
        if lm.device.type != "cpu":
            raise UserError(f"--weights {weights} uses PyTorch's CPU kernels; the model is on {lm.device}")
    return hf_step(lm) if problem else LeanLlamaStep(lm, weights)
