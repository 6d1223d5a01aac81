"""Speed against this machine's limits, per phase, in one run: the matmul peaks and the memory bandwidth, then
SmolLM2 on real Check-COVID prompts: prefill FLOP/s as a share of the bf16 peak (transformers' forward over a
left-padded batch, and the lean step's prefill one prompt at a time), a decoding step against its
memory floor (at batch 1, at fae run's default batch of 8 and at 16; transformers' forward and the lean
step, bf16 / int8 / int4 weights), and one LoRA training step's FLOP/s as a share of the peak.

    eval "$(python -m real_fae_core.hardware)"   # the allocator settings the recipes use
    python benchmarks/roofline.py --model models/smollm2-135m-instruct \\
        --records data/check-covid-test.jsonl --output benchmarks/results/roofline.json

Decoding reads every weight once per step, so its floor is bytes / bandwidth, not FLOPs: the weights the
step reads in its precision (the projections and the output layer; norms and one embedding row aside) plus
the KV cache at the step's mean length. The bandwidth is the fastest read of torch's CPU kernels here (a
float32 dot product, :func:`real_fae_core.hardware.memory_read_gbs`), measured twice: over 1 GiB (beyond
the last-level cache: DRAM) and over exactly the bf16 weights' bytes, repeated as decoding repeats it (the
share of them the last-level cache keeps counts); the floor uses the faster of the two, both recorded.
Prefill and training are FLOP-bound: FLOPs count 2 x (non-embedding parameters) per token forward, the
attention's score and value products added (causal: each position reads the positions before it), and
for the LoRA step as profile_cpu.py counts them (attention left out: a lower bound).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.profile_cpu import median_seconds, param_counts, training_step  # noqa: E402
from data_prep.prompts import encode_chat, render_evidence_prompt  # noqa: E402
from data_prep.records import load_records  # noqa: E402
from fae.backends.hf import HFOptions, load_hf_model  # noqa: E402
from real_fae_core.atomicio import atomic_write_json  # noqa: E402
from real_fae_core.entry import run_guarded  # noqa: E402
from real_fae_core.hardware import (  # noqa: E402
    CPU_ALLOCATOR_ENV,
    cpu_model_name,
    last_level_cache_bytes,
    matmul_peak_gflops,
    memory_read_gbs,
)

DECODE_ROWS = (1, HFOptions.batch_size, 16)  # batch 1, fae run's default batch, profile_cpu.py's batch
STEPS = 24


def prefill(lm, ids, mask, cache):
    import torch

    from fae.backends.reserved_cache import cache_kwarg

    positions = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 1)
    with torch.inference_mode():
        return lm(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                  **{cache_kwarg(lm): cache}).logits[:, -1, :].float()


def attention_flops(cfg, lengths) -> int:
    """Score and value products of causal self-attention over prompts of ``lengths`` (all layers)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_pair = 2 * 2 * cfg.num_attention_heads * head_dim * cfg.num_hidden_layers
    return sum(per_pair * n * (n + 1) // 2 for n in lengths)


def prefill_rate(lm, token_ids, peak: float) -> dict:
    """One forward pass over the left-padded prompts (what fae run's batches do): FLOP/s (weights only, and
    with attention)."""
    from fae.backends.padding import left_pad
    from fae.backends.reserved_cache import reserved_cache

    ids, mask = left_pad(token_ids, lm.config.pad_token_id or 0)
    prefill(lm, ids[:2], mask[:2], reserved_cache(lm, 1))  # warm-up

    def run():
        prefill(lm, ids, mask, reserved_cache(lm, 1))

    return {**prefill_figures(lm, token_ids, median_seconds(run, 3), peak), "padded_width": ids.shape[1],
            "path": "transformers' forward, the prompts left-padded in one batch"}


def lean_prefill_rate(lm, token_ids, peak: float) -> dict:
    """The same prompts through the lean step's prefill (``LeanLlamaStep.extend``, how fae study's prefix tree
    reads an edge), each prompt alone: no padding, causal attention without a mask, no logits."""
    import torch

    from fae.backends.decode_step import LeanLlamaStep

    step = LeanLlamaStep(lm)
    rows = [torch.tensor([x]) for x in token_ids]

    def run():
        with torch.inference_mode():
            for row in rows:
                step.extend(row, None)

    with torch.inference_mode():
        step.extend(rows[0], None)  # warm-up
    return {**prefill_figures(lm, token_ids, median_seconds(run, 3), peak),
            "path": "the lean step's extend, one prompt at a time"}


def prefill_figures(lm, token_ids, seconds: float, peak: float) -> dict:
    """FLOP/s of a prefill of ``token_ids`` that took ``seconds``: weights only, and with the attention."""
    body, _embed = param_counts(lm)
    lengths = [len(x) for x in token_ids]
    weights_flops = 2 * body * sum(lengths)
    total = weights_flops + attention_flops(lm.config, lengths)
    return {"dtype": str(lm.dtype).replace("torch.", ""), "prompts": len(token_ids), "prompt_tokens": sum(lengths),
            "seconds": seconds, "tokens_per_s": sum(lengths) / seconds,
            "gflops": total / seconds / 1e9, "gflops_weights_only": weights_flops / seconds / 1e9,
            "share_of_bf16_peak": total / seconds / 1e9 / peak}


def model_shaped_matmul_gflops(lm, rows: int, repeats: int = 3) -> dict:
    """bf16 matmul rates at the model's own projection shapes (``rows`` x in -> out, weights laid out for oneDNN
    as the model's are), FLOP-weighted over one layer: the ceiling a prefill of ``rows`` tokens can reach on
    these matrices, beside the square peak."""
    import torch

    from fae.backends.decode_step import LeanLlamaStep

    layer = LeanLlamaStep(lm).layers[0]
    shapes = {(p.q.shape[1], p.q.shape[0]) for p in (layer[1], layer[2], layer[4], layer[5])}
    out, flops, seconds = {}, 0.0, 0.0
    for k, n in sorted(shapes):
        x, w = torch.randn(rows, k, dtype=torch.bfloat16), torch.randn(n, k, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        run = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")  # noqa: E731
        run()
        best = min(median_seconds(run, 1) for _ in range(repeats))
        out[f"{k}x{n}"] = 2 * rows * k * n / best / 1e9
        flops, seconds = flops + 2 * rows * k * n, seconds + best
    out["one_layer"] = flops / seconds / 1e9
    return out


def kv_bytes(cfg, rows: int, length: float, element_size: int) -> float:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return rows * length * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * element_size


def time_steps(step, cache, ids, mask, first_logits, steps: int) -> float:
    """Seconds per step of ``steps`` greedy steps from a prefilled ``cache`` (the argmax fed back)."""
    import torch

    positions = mask.sum(dim=1, keepdim=True)  # the first new token's position
    with torch.inference_mode():
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        nxt = step(first_logits.argmax(-1, keepdim=True), mask, positions, cache).argmax(-1, keepdim=True)  # untimed
        t = time.perf_counter()
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            positions = positions + 1
            nxt = step(nxt, mask, positions, cache).argmax(-1, keepdim=True)
        return (time.perf_counter() - t) / steps


def decode_rows_for(lm, token_ids, rows: int, bandwidth: float, variants) -> list[dict]:
    """Per-step time of each ``(name, step, weight_bytes)`` variant at ``rows`` prompts, against its floor."""
    import torch

    from fae.backends.padding import left_pad
    from fae.backends.reserved_cache import reserved_cache

    ids, mask = left_pad(token_ids[:rows], lm.config.pad_token_id or 0)
    base = reserved_cache(lm, STEPS + 2)
    first = prefill(lm, ids, mask, base)
    element = torch.finfo(lm.dtype).bits // 8
    mean_length = ids.shape[1] + 1 + STEPS / 2  # padding included: the cache is read whole
    kv = kv_bytes(lm.config, rows, mean_length, element)
    out = []
    for name, step, weight_bytes in variants:
        per_step = time_steps(step, copy.deepcopy(base), ids, mask, first, STEPS)
        floor = (weight_bytes + kv) / (bandwidth * 1e9)
        out.append({"step": name, "rows": rows, "mean_cache_positions": mean_length, "step_ms": per_step * 1e3,
                    "weight_mib": weight_bytes / 2**20, "kv_mib": kv / 2**20, "floor_ms": floor * 1e3,
                    "times_floor": per_step / floor, "tokens_per_s": rows / per_step})
    return out


def projections_only(step, rows: int, repeats: int = 5) -> dict:
    """The step's weight reads alone: every projection of every layer and the output layer, in the step's
    order, on inputs of ``rows`` x its width (nothing else: no norm, attention or rotary). Their time against
    the whole step says how much of the step is the matmul kernels reading weights and how much the rest;
    their bytes over that time is the rate the kernels read at, beside the streaming read."""
    import torch

    calls = [p for layer in step.layers for p in (layer[1], layer[2], layer[4], layer[5])] + [step.head]
    inputs = {p.in_features: torch.randn(rows, 1, p.in_features, dtype=torch.bfloat16) for p in calls}

    def run():
        for p in calls:
            p(inputs[p.in_features])

    with torch.inference_mode():
        run()
        seconds = median_seconds(run, repeats)
    return {"projections_ms": seconds * 1e3, "kernel_read_gbs": step.weight_bytes() / seconds / 1e9}


def decode_phase(lm, token_ids, bandwidth: float) -> list[dict]:
    from fae.backends.decode_step import LeanLlamaStep, hf_step

    lean = {w: LeanLlamaStep(lm, w) for w in ("model", "int8", "int4")}
    dtype = str(lm.dtype).replace("torch.", "")
    variants = [(f"transformers forward ({dtype})", hf_step(lm), lean["model"].weight_bytes()),
                (f"lean step ({dtype})", lean["model"], lean["model"].weight_bytes()),
                ("lean step (int8 weights)", lean["int8"], lean["int8"].weight_bytes()),
                ("lean step (int4 weights)", lean["int4"], lean["int4"].weight_bytes())]
    rows = []
    for batch in DECODE_ROWS:
        for (_name, step, _bytes), row in zip(variants, decode_rows_for(lm, token_ids, batch, bandwidth, variants)):
            if isinstance(step, LeanLlamaStep):
                row.update(projections_only(step, batch))
                row["rest_ms"] = row["step_ms"] - row["projections_ms"]
            rows.append(row)
    return rows


def machine() -> dict:
    import torch
    import transformers

    return {"cpu": cpu_model_name(), "threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "last_level_cache_mib": (last_level_cache_bytes() or 0) / 2**20,
            "allocator_env": {k: os.environ[k] for k in CPU_ALLOCATOR_ENV if k in os.environ}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="SmolLM2-135M-Instruct (real-import-gguf) directory")
    p.add_argument("--records", required=True, help="converted Check-COVID records")
    p.add_argument("--prompts", type=int, default=max(DECODE_ROWS), help="prompts of the prefill and decode batches")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    records = load_records(args.records)[:args.prompts]  # a broken file stops before the model loads
    lm, tok = load_hf_model(args.model, dtype="bf16", device="cpu")
    token_ids = [encode_chat(tok, render_evidence_prompt(r)) for r in records]
    peaks = {"bf16": matmul_peak_gflops("bf16"), "fp32": matmul_peak_gflops("fp32")}
    body, embed = param_counts(lm)
    weight_bytes = 2 * (body + embed)
    bandwidth = {"dram_1gib_gbs": memory_read_gbs(1 << 30), "weights_sized_gbs": memory_read_gbs(weight_bytes)}
    result = {"machine": machine(), "matmul_peak_gflops": peaks, "memory_read_gbs": bandwidth,
              "model": {"path": Path(args.model).name, "parameters": body + embed, "bf16_weight_mib": weight_bytes / 2**20},
              "prefill": prefill_rate(lm, token_ids, peaks["bf16"]),
              "prefill_lean": lean_prefill_rate(lm, token_ids, peaks["bf16"]),
              "model_shaped_bf16_matmul_gflops": model_shaped_matmul_gflops(lm, sum(map(len, token_ids))),
              "decode": decode_phase(lm, token_ids, max(bandwidth.values()))}
    _table, train = training_step(args.model, 25)
    train["share_of_bf16_peak"] = train["step_gflops"] / peaks["bf16"]
    train["dtype"] = "bf16 autocast, fp32 master weights"
    result["lora_step"] = train
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.output, result)  # whole or not at all, whatever else writes there
    print(table(result))
    return 0


def table(r: dict) -> str:
    """The markdown table docs/scale.md shows."""
    bw, peak = r["memory_read_gbs"], r["matmul_peak_gflops"]
    lines = [f"{r['machine']['cpu']}, {r['machine']['threads']} threads, torch {r['machine']['torch']}; "
             f"matmul peak bf16 {peak['bf16']:.0f} GFLOP/s, fp32 {peak['fp32']:.0f}; read 1 GiB "
             f"{bw['dram_1gib_gbs']:.1f} GB/s, the weights' bytes {bw['weights_sized_gbs']:.1f} GB/s "
             f"(last-level cache {r['machine']['last_level_cache_mib']:.0f} MiB)", "",
             "| phase | dtype | rows | time | rate | limit | against the limit |", "|---|---|---|---|---|---|---|"]
    shaped = r["model_shaped_bf16_matmul_gflops"]["one_layer"]
    for pf in [r["prefill"]] + ([r["prefill_lean"]] if "prefill_lean" in r else []):
        lines.append(f"| prefill, {pf['prompt_tokens']} prompt tokens: {pf.get('path', '')} | {pf['dtype']} | "
                     f"{pf['prompts']} | {pf['seconds']:.2f} s | {pf['gflops']:.0f} GFLOP/s | bf16 peak | "
                     f"{pf['share_of_bf16_peak']:.0%} ({pf['gflops'] / shaped:.0%} of the {shaped:.0f} GFLOP/s its "
                     f"own projection shapes reach) |")
    for d in r["decode"]:
        split = (f"; projections alone {d['projections_ms']:.1f} ms (read at {d['kernel_read_gbs']:.1f} GB/s), "
                 f"the rest {d['rest_ms']:.1f} ms") if "projections_ms" in d else ""
        lines.append(f"| decode step: {d['step']} | | {d['rows']} | {d['step_ms']:.1f} ms | "
                     f"{d['tokens_per_s']:.0f} tokens/s | floor {d['floor_ms']:.1f} ms "
                     f"({d['weight_mib']:.0f} + {d['kv_mib']:.0f} MiB) | {d['times_floor']:.2f}x the floor{split} |")
    t = r["lora_step"]
    lines.append(f"| LoRA step, {t['rows']} x {t['row_tokens']} tokens | {t['dtype']} | {t['rows']} | "
                 f"{t['step_s']:.2f} s | {t['step_gflops']:.0f} GFLOP/s | bf16 peak | {t['share_of_bf16_peak']:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(run_guarded("roofline.py", main))
