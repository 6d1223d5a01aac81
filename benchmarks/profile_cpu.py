"""Where a CPU's time goes: torch.profiler over one LoRA training step (bf16 autocast, the SmolLM2 recipe's
LoRA targets) and one FAE generate batch (bf16), each after a warm-up; the top operators by self CPU time;
then each split into its phases, timed without the profiler, with the FLOP rate of each phase and, for
decoding, the memory traffic that bounds it.

    eval "$(python -m real_fae_core.hardware)"   # the allocator settings the recipes use
    python benchmarks/profile_cpu.py --model models/smollm2-135m-instruct \\
        --records data/check-covid-test.jsonl --output benchmarks/results/profile_cpu.txt \\
        --json benchmarks/results/profile_cpu.json

The step trains on 8 random token rows of the recipe's mean pair length (~350 tokens) with the recipe's
LoRA (PEFT: every projection of layers 20-29), the loss on the last 18 tokens of each row (a pair's answer)
with the vocabulary projected only there, as TRL's fused head does on the recipe's CPU path
(``cpu_scored_positions: labelled``); the FAE batch is 16 Check-COVID prompts, 48 new tokens.

FLOPs are counted as in fae_throughput.py / cpu_train_step.py: 2 x (non-embedding parameters) per token
forward, as much again backward through the layers from the lowest LoRA layer up (input gradients through
frozen weights), the output layer only where a label is; attention left out (a lower bound).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep.prompts import render_evidence_prompt  # noqa: E402
from data_prep.records import load_records  # noqa: E402
from real_fae_core.hardware import CPU_ALLOCATOR_ENV, matmul_peak_gflops, memory_read_gbs  # noqa: E402

LORA_TARGETS = r".*\.layers\.(2[0-9])\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
ROWS, ROW_TOKENS, ANSWER_TOKENS, LOWEST_LORA_LAYER = 8, 350, 18, 20
REPEATS = 3


def table(prof, rows: int) -> str:
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def median_seconds(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def param_counts(lm) -> tuple[int, int]:
    """(non-embedding parameters, embedding parameters) of a causal LM (tied or not)."""
    cfg = lm.config
    embed = cfg.vocab_size * cfg.hidden_size
    body = sum(p.numel() for p in lm.parameters()) - embed * (1 if cfg.tie_word_embeddings else 2)
    return body, embed


def training_step(model_dir: str, rows: int) -> tuple[str, dict]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    body, embed = param_counts(lm)
    lm = get_peft_model(lm, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS))
    inner = lm.base_model.model  # LlamaForCausalLM with the LoRA layers in place
    ids = torch.randint(100, 40000, (ROWS, ROW_TOKENS))
    labels = ids[:, -ANSWER_TOKENS:]

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = inner.model(input_ids=ids).last_hidden_state[:, -ANSWER_TOKENS - 1:-1]
            logits = inner.lm_head(hidden)  # the labelled positions only
            return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())

    def step():
        forward().backward()
        lm.zero_grad(set_to_none=True)

    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    step_s = median_seconds(step)
    forward_s = median_seconds(lambda: forward().detach())
    layers = lm.config.num_hidden_layers
    tokens, labelled = ROWS * ROW_TOKENS, ROWS * ANSWER_TOKENS
    trained_share = (layers - LOWEST_LORA_LAYER) / layers
    fwd_flops = 2 * body * tokens + 2 * embed * labelled
    bwd_flops = 2 * body * trained_share * tokens + 2 * embed * labelled  # input gradients through frozen weights
    split = {"rows": ROWS, "row_tokens": ROW_TOKENS, "labelled_tokens": labelled, "step_s": step_s,
             "forward_s": forward_s, "backward_s": step_s - forward_s,
             "forward_gflops": fwd_flops / forward_s / 1e9,
             "backward_gflops": bwd_flops / max(step_s - forward_s, 1e-9) / 1e9,
             "step_gflops": (fwd_flops + bwd_flops) / step_s / 1e9}
    return table(prof, rows), split


def fae_batch(model_dir: str, records: str, rows: int) -> tuple[str, dict]:
    import torch

    from data_prep.prompts import encode_chat
    from fae.backends.hf import HFBackend
    from fae.backends.padding import left_pad

    backend = HFBackend({"model": model_dir, "batch_size": 16, "max_new_tokens": 48, "device": "cpu",
                         "dtype": "bf16", "label_probs": False})
    prompts = [render_evidence_prompt(r) for r in load_records(records)[:16]]
    backend.generate(prompts[:2])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        backend.generate(prompts)
    return table(prof, rows), fae_split(backend, [encode_chat(backend.tok, m) for m in prompts], left_pad)


def fae_split(backend, token_ids: list[list[int]], left_pad) -> dict:
    """One batch's prefill (the prompt's forward pass) and its decoding steps, timed apart."""
    import torch

    lm, gc = backend.lm, backend.gc
    ids, mask = left_pad(token_ids, gc.pad_token_id)
    with torch.inference_mode():
        prefill_s = median_seconds(lambda: lm(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1))
        out = lm.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
        generate_s = median_seconds(lambda: lm.generate(input_ids=ids, attention_mask=mask, generation_config=gc))
    steps = out.shape[1] - ids.shape[1]  # every row runs until the batch's last one stops
    body, embed = param_counts(lm)
    real, width = int(mask.sum()), ids.shape[1]
    cfg = lm.config
    kv_heads = getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    bytes_per = 2  # bf16
    weight_bytes = (body + embed) * bytes_per
    mean_cache = width + steps / 2  # keys and values each step reads, per row (padding included)
    kv_bytes = len(token_ids) * mean_cache * cfg.num_hidden_layers * 2 * kv_heads * head_dim * bytes_per
    decode_s = max(generate_s - prefill_s, 1e-9)
    per_step = decode_s / max(steps - 1, 1)
    bandwidth = memory_read_gbs()
    return {"prompts": len(token_ids), "prompt_tokens": real, "padded_width": width,
            "padding_share": 1 - real / (width * len(token_ids)), "decode_steps": steps,
            "generate_s": generate_s, "prefill_s": prefill_s, "decode_s": decode_s,
            "prefill_share": prefill_s / generate_s,
            "prefill_gflops": 2 * body * real / prefill_s / 1e9,
            "decode_step_ms": per_step * 1e3,
            "decode_gflops": 2 * (body + embed) * len(token_ids) / per_step / 1e9,
            "decode_bytes_per_step_mib": (weight_bytes + kv_bytes) / 2**20,
            "memory_bandwidth_gbs": bandwidth,
            "decode_step_floor_ms": (weight_bytes + kv_bytes) / (bandwidth * 1e9) * 1e3}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--records", required=True, help="converted Check-COVID records")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--json", type=Path, help="also write the phase split as JSON here")
    args = p.parse_args(argv)
    env = {k: os.environ[k] for k in CPU_ALLOCATOR_ENV if k in os.environ}
    train_table, train_split = training_step(args.model, args.rows)
    fae_table, fae = fae_batch(args.model, args.records, args.rows)
    peak = matmul_peak_gflops("bf16")
    for split, key in ((train_split, "step_gflops"), (fae, "prefill_gflops"), (fae, "decode_gflops")):
        split[key.replace("gflops", "share_of_bf16_peak")] = split[key] / peak
    text = (f"# torch.profiler, CPU; allocator settings in the environment: {env or 'none'}\n\n"
            f"## one LoRA training step (bf16 autocast, {ROWS} x {ROW_TOKENS} tokens, the loss on the last "
            f"{ANSWER_TOKENS} of each)\n\n{train_table}\n\n"
            f"## one FAE generate batch (bf16, 16 prompts, 48 new tokens)\n\n{fae_table}\n\n"
            f"## phases, timed without the profiler (median of {REPEATS}; bf16 matmul peak {peak:.0f} GFLOP/s)\n\n"
            + phase_lines(train_split, fae) + "\n")
    args.output.write_text(text)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"bf16_matmul_peak_gflops": peak, "allocator_env": env,
                                         "training_step": train_split, "fae_batch": fae}, indent=2) + "\n")
    return 0


def phase_lines(train: dict, fae: dict) -> str:
    return "\n".join([
        f"- LoRA step {train['step_s']:.2f} s: forward {train['forward_s']:.2f} s at {train['forward_gflops']:.0f} "
        f"GFLOP/s, backward {train['backward_s']:.2f} s at {train['backward_gflops']:.0f} GFLOP/s; the step "
        f"{train['step_gflops']:.0f} GFLOP/s = {train['step_share_of_bf16_peak']:.1%} of the bf16 peak",
        f"- FAE batch {fae['generate_s']:.2f} s: prefill of {fae['prompt_tokens']} prompt tokens "
        f"({fae['padding_share']:.1%} padding) {fae['prefill_s']:.2f} s at {fae['prefill_gflops']:.0f} GFLOP/s = "
        f"{fae['prefill_share_of_bf16_peak']:.1%} of the peak; {fae['decode_steps']} decoding steps "
        f"{fae['decode_s']:.2f} s ({1 - fae['prefill_share']:.0%} of the batch), {fae['decode_step_ms']:.0f} ms "
        f"a step at {fae['decode_gflops']:.0f} GFLOP/s = {fae['decode_share_of_bf16_peak']:.1%} of the peak; "
        f"a step reads {fae['decode_bytes_per_step_mib']:.0f} MiB (weights and KV cache), "
        f"{fae['decode_step_floor_ms']:.0f} ms at the {fae['memory_bandwidth_gbs']:.1f} GB/s this machine streams",
    ])


if __name__ == "__main__":
    raise SystemExit(main())
