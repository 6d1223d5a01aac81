"""A whole decoding step as one ``torch.compile`` graph on the CPU, beside the eager lean step it would
replace: how much of a step's time above its memory floor compiling removes (docs/scale.md).

    eval "$(python -m real_fae_core.hardware)"
    python benchmarks/compiled_step.py --model models/smollm2-135m-instruct \\
        --records data/check-covid-test.jsonl --output benchmarks/results/compiled_step.json

The lean step (fae/backends/decode_step.py) runs eagerly: each layer is a handful of oneDNN projections and
some thirty small calls (norms, rotary, cache writes, attention), each paying PyTorch's dispatch. A graph
compiled by inductor fuses the small calls into generated C++ loops and, with freezing, lays the weights
out for oneDNN as the lean step does by hand. Compiling needs shapes that stay put from step to step: a
cache that grows by one position makes every step a new shape (``dynamic=True`` still specialises the
length where the new position is written, and recompiles at every step until its limit), so the graph here
keeps its keys and values in buffers of a fixed length and attends over the whole buffer behind a mask, as
transformers' ``StaticCache`` does; the position and the mask are inputs. The arithmetic is regrouped, so
its greedy tokens are counted against the lean step's, not assumed equal.

Batch 1, bf16, one prompt at a time: per prompt, the prompt is prefilled by transformers, then
``--steps`` greedy tokens are decoded by each step from copies of that prefill. Needs a C++ compiler
(inductor builds its CPU kernels with g++ or clang++; checked before the model loads) and a model the
lean step reads (Llama, Mistral, Qwen2 layers).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.roofline import machine, prefill  # noqa: E402
from data_prep.prompts import encode_chat, render_evidence_prompt  # noqa: E402
from data_prep.records import load_records  # noqa: E402
from fae.backends.decode_step import lean_problem  # noqa: E402
from fae.backends.hf import load_hf_model  # noqa: E402
from real_fae_core.atomicio import atomic_write_json  # noqa: E402
from real_fae_core.entry import run_guarded  # noqa: E402
from real_fae_core.errors import UserError  # noqa: E402


def static_llama(lm, max_length: int):
    """A decoding step of ``lm`` (a Llama-family model the lean step reads) over key/value buffers of
    ``max_length`` positions, as a module: ``forward(ids, positions, slot, keep)`` writes the new keys and
    values at position ``slot`` (a one-element tensor) and attends to the positions where ``keep`` is True."""
    import torch
    from torch.nn.functional import embedding, linear, scaled_dot_product_attention, silu

    inner, cfg = lm.model, lm.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    heads, kv_heads, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rms_norm_eps
    scaling = inner.layers[0].self_attn.scaling  # the model's own, as the lean step reads it

    def frozen(t):
        return torch.nn.Parameter(t.detach().clone(), requires_grad=False)

    class StaticLlama(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.norm, self.head = frozen(inner.embed_tokens.weight), frozen(inner.norm.weight), \
                frozen(lm.lm_head.weight)
            self.register_buffer("inv_freq", inner.rotary_emb.inv_freq.detach().clone())
            self.scaling = inner.rotary_emb.attention_scaling
            self.weights = torch.nn.ModuleList()
            for layer in inner.layers:
                a, f, w = layer.self_attn, layer.mlp, torch.nn.Module()
                w.norm_in = frozen(layer.input_layernorm.weight)
                w.norm_mid = frozen(layer.post_attention_layernorm.weight)
                w.qkv = frozen(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
                w.out, w.down = frozen(a.o_proj.weight), frozen(f.down_proj.weight)
                w.gate_up = frozen(torch.cat([f.gate_proj.weight, f.up_proj.weight]))
                self.weights.append(w)
            shape = (len(inner.layers), 1, kv_heads, max_length, head_dim)
            self.register_buffer("keys", torch.zeros(shape, dtype=lm.dtype))
            self.register_buffer("values", torch.zeros(shape, dtype=lm.dtype))

        def rms(self, h, weight):
            h32 = h.float()
            return weight * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)

        def forward(self, ids, positions, slot, keep):
            h = embedding(ids, self.embed)
            angles = positions.float()[..., None] * self.inv_freq.float()
            angles = torch.cat([angles, angles], dim=-1)[:, None]
            cos, sin = (angles.cos() * self.scaling).to(h.dtype), (angles.sin() * self.scaling).to(h.dtype)
            nq, nk, half = heads * head_dim, kv_heads * head_dim, head_dim // 2
            for n, w in enumerate(self.weights):
                x = linear(self.rms(h, w.norm_in), w.qkv)
                q, k, v = (x[..., a:b].unflatten(-1, (-1, head_dim)).transpose(1, 2)
                           for a, b in ((0, nq), (nq, nq + nk), (nq + nk, nq + 2 * nk)))
                q, k = (t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin for t in (q, k))
                self.keys[n].index_copy_(2, slot, k)
                self.values[n].index_copy_(2, slot, v)
                o = scaled_dot_product_attention(q, self.keys[n], self.values[n], attn_mask=keep, enable_gqa=True,
                                                 scale=scaling)
                h = h + linear(o.transpose(1, 2).flatten(2), w.out)
                g, u = linear(self.rms(h, w.norm_mid), w.gate_up).chunk(2, dim=-1)
                h = h + linear(silu(g) * u, w.down)
            return linear(self.rms(h, self.norm), self.head)[:, -1].float()

        def adopt(self, cache) -> None:
            """Copy a prefilled one-row transformers cache into the buffers."""
            for n, layer in enumerate(cache.layers):
                length = layer.keys.shape[-2]
                self.keys[n, :, :, :length] = layer.keys
                self.values[n, :, :, :length] = layer.values

    return StaticLlama().eval()


def decode_lean(step, cache, first_logits, prompt_length: int, steps: int) -> tuple[list[int], list[float]]:
    """``steps`` greedy tokens through the lean step: (tokens, seconds of each step)."""
    import torch

    tokens, seconds = [int(first_logits.argmax())], []
    mask = torch.ones(1, prompt_length, dtype=torch.long)
    with torch.inference_mode():
        for s in range(steps):
            mask = torch.cat([mask, mask.new_ones(1, 1)], dim=1)
            start = time.perf_counter()
            logits = step(torch.tensor([[tokens[-1]]]), mask, torch.tensor([[prompt_length + s]]), cache)
            seconds.append(time.perf_counter() - start)
            tokens.append(int(logits.argmax()))
    return tokens, seconds


def decode_static(module, forward, cache, first_logits, prompt_length: int, steps: int):
    """``steps`` greedy tokens through ``forward`` (the module or its compiled graph) after copying the
    prefilled ``cache`` into its buffers: (tokens, seconds of each step)."""
    import torch

    tokens, seconds = [int(first_logits.argmax())], []
    width = module.keys.shape[3]
    with torch.inference_mode():
        module.adopt(cache)
        for s in range(steps):
            at = prompt_length + s
            keep = (torch.arange(width) <= at)[None, None, None]
            start = time.perf_counter()
            logits = forward(torch.tensor([[tokens[-1]]]), torch.tensor([[at]]), torch.tensor([at]), keep)
            seconds.append(time.perf_counter() - start)
            tokens.append(int(logits.argmax()))
    return tokens, seconds


def measure(lm, token_ids: list[list[int]], steps: int) -> dict:
    """Per prompt: the eager lean step, the static module run eagerly, and its compiled graph."""
    import torch

    from fae.backends.decode_step import LeanLlamaStep
    from fae.backends.reserved_cache import reserved_cache

    lean = LeanLlamaStep(lm)
    module = static_llama(lm, max(map(len, token_ids)) + steps + 1)
    # freezing: the weights as constants, laid out for oneDNN once, as the lean step does by hand
    compiled = torch.compile(module, options={"freezing": True})
    width = module.keys.shape[3]
    start = time.perf_counter()  # the first call compiles (on empty buffers: the values do not matter)
    with torch.inference_mode():
        zero = torch.zeros(1, 1, dtype=torch.long)
        compiled(zero, zero, zero[0], torch.ones(1, 1, 1, width, dtype=torch.bool))
    compile_seconds = time.perf_counter() - start
    per_prompt = []
    for ids in token_ids:
        cache = reserved_cache(lm, steps + 1)
        first = prefill(lm, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), cache)
        runs = {"lean": decode_lean(lean, copy.deepcopy(cache), first, len(ids), steps),
                "static_eager": decode_static(module, module, cache, first, len(ids), steps),
                "static_compiled": decode_static(module, compiled, cache, first, len(ids), steps)}
        per_prompt.append({"prompt_tokens": len(ids), **{
            name: {"step_ms": 1e3 * statistics.median(seconds), "tokens": tokens}
            for name, (tokens, seconds) in runs.items()}})
    return {"compile_seconds": compile_seconds, "prompts": per_prompt}


def summary(result: dict) -> dict:
    """Median step time of each way over the prompts; how many prompts' greedy tokens equal the lean step's
    all through, and the mean count of leading tokens that do (a near tie decided the other way sends the
    rest of an answer elsewhere)."""
    prompts = result["prompts"]
    out = {}
    for name in ("lean", "static_eager", "static_compiled"):
        agree = []
        for p in prompts:
            mine, lean = p[name]["tokens"], p["lean"]["tokens"]
            agree.append(next((i for i, (a, b) in enumerate(zip(mine, lean)) if a != b), len(lean)))
        out[name] = {"step_ms": statistics.median(p[name]["step_ms"] for p in prompts),
                     "prompts_equal_to_lean": sum(a == len(p["lean"]["tokens"]) for a, p in zip(agree, prompts)),
                     "mean_leading_tokens_equal": statistics.mean(agree)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="SmolLM2-135M-Instruct (real-import-gguf) directory")
    p.add_argument("--records", required=True, help="converted Check-COVID records")
    p.add_argument("--prompts", type=int, default=4, help="prompts, one at a time")
    p.add_argument("--steps", type=int, default=32, help="greedy tokens decoded per prompt and way")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    # every prerequisite before the model loads: a compiler for inductor's C++ kernels, the records, the model
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")):
        raise UserError("torch.compile on a CPU builds C++ kernels: no C++ compiler found (g++, clang++ or $CXX)")
    records = load_records(args.records)[:args.prompts]
    lm, tok = load_hf_model(args.model, dtype="bf16", device="cpu")
    problem = lean_problem(lm)
    if problem:
        raise UserError(f"{args.model}: the lean step cannot read this model ({problem}): nothing to compare with")
    token_ids = [encode_chat(tok, render_evidence_prompt(r)) for r in records]
    result = {"machine": machine(), "dtype": "bfloat16", "rows": 1, "steps": args.steps,
              **measure(lm, token_ids, args.steps)}
    result["summary"] = summary(result)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.output, result)  # whole or not at all, whatever else writes there
    for name, s in result["summary"].items():
        print(f"{name}: {s['step_ms']:.1f} ms a step; greedy tokens equal to the lean step's on "
              f"{s['prompts_equal_to_lean']} of {len(token_ids)} prompts (the first "
              f"{s['mean_leading_tokens_equal']:.1f} on average)")
    print(f"compiling: {result['compile_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_guarded("compiled_step.py", main))
