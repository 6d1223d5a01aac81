"""LoRA step time on a CPU: each training choice of the SmolLM2 recipe against plain fp32, in one run.

    python benchmarks/cpu_train_step.py --recipe recipes/smollm2-135m-instruct/no_enhancement.yaml \
        --model models/smollm2-135m-instruct --pairs data/pairs/smollm2-135m-instruct/no_enhancement \
        --steps 4 --json benchmarks/results/cpu_train_step.json

Every choice trains the same pairs in the same order through ``real.training.build_trainer`` (the
real SFTTrainer + PEFT path); the first step of each is a warm-up and is not timed. Ratios are to
the fp32 baseline measured in the same run, so they hold on this machine only: run it on idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_fae_core.hardware import matmul_peak_gflops, native_bf16_cpu_flags  # noqa: E402

ALL_LAYERS_ATTN = "[q_proj, k_proj, v_proj, o_proj]"


def choices(top_regex: str) -> dict[str, list[str]]:
    """Name -> real-train overrides. The baseline is the paper's LoRA (attention, all layers) in fp32."""
    return {
        "fp32 (baseline)": ["--cpu_bf16", "false", "--lora_target_modules", *ALL_LAYERS_ATTN.strip("[]").split(", ")],
        "bf16 autocast": ["--cpu_bf16", "true", "--lora_target_modules", *ALL_LAYERS_ATTN.strip("[]").split(", ")],
        "LoRA on top layers (fp32)": ["--cpu_bf16", "false", "--lora_target_modules", top_regex],
        "bf16 + top layers": ["--cpu_bf16", "true", "--lora_target_modules", top_regex],
        # the recipe as it is (bf16, LoRA on every projection of its top layers), then without padding:
        # TRL's padding_free packs a batch into one row with position ids; transformers' SDPA masks each
        # sequence from the others (masking_utils: packed sequences), so the loss is the padded batch's
        "recipe": ["--cpu_bf16", "true"],
        "recipe + padding_free": ["--cpu_bf16", "true", "--padding_free", "true"],
        # TRL's fused LM head off CUDA projects every position onto the vocabulary and masks the result;
        # the recipe (cpu_scored_positions=labelled, real/training/cpu_loss.py) projects only the answer tokens
        "recipe, every position scored": ["--cpu_bf16", "true", "--cpu_scored_positions", "all"],
        # not a speed option (it changes the training): what the recipe's LoRA dropout costs. PEFT draws a
        # dropout mask of each adapter's input for each of the 70 adapters; torch's CPU dropout draws its
        # Bernoulli mask at ~6 ns an element, a quarter to a third of a SmolLM2 step
        "recipe without LoRA dropout": ["--cpu_bf16", "true", "--lora_dropout", "0"],
    }


def time_steps(recipe: str, overrides: list[str], steps: int, out: str) -> dict:
    from transformers import TrainerCallback

    from real.training.args import parse_args
    from real.training.trainer import build_trainer

    class StepClock(TrainerCallback):
        def __init__(self):
            self.times, self._t = [], None

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)

    argv = ["--config", recipe, *overrides, "--output_dir", out, "--max_steps", str(steps + 1),
            "--save_strategy", "no", "--logging_steps", "1000", "--warmup_steps", "0", "--disable_tqdm", "true"]
    script_args, training_args, model_args = parse_args(argv)
    clock = StepClock()
    run = build_trainer(script_args, training_args, model_args, callbacks=[clock])
    tokens = count_tokens(run.trainer)
    trainable = sum(p.numel() for p in run.trainer.model.parameters() if p.requires_grad)
    run.trainer.train()
    timed = clock.times[1:]
    counted = tokens[1:len(timed) + 1]
    real, padded, labelled = ([c[i] for c in counted] for i in range(3))
    flops = step_flops(run.trainer.model)
    return {"median_step_s": statistics.median(timed), "steps_timed": len(timed), "step_s": timed,
            "trainable_parameters": trainable, "bf16": training_args.bf16,
            "padding_free": bool(getattr(training_args, "padding_free", False)),
            "per_device_train_batch_size": training_args.per_device_train_batch_size,
            "cpu_scored_positions": getattr(training_args, "cpu_scored_positions", None),
            "real_tokens": real, "computed_tokens": padded, "labelled_tokens": labelled,
            "padding_waste": 1 - sum(real) / sum(padded) if padded else None,
            "useful_tflop_per_step": [flops(r, n) / 1e12 for r, n in zip(real, labelled)],
            "useful_gflops": sum(flops(r, n) for r, n in zip(real, labelled)) / sum(timed) / 1e9}


def count_tokens(trainer) -> list[tuple[int, int, int]]:
    """(real tokens, tokens computed, tokens that carry a label) of every batch the collator builds, in order."""
    seen = []
    collate = trainer.data_collator

    def counting(features):
        batch = collate(features)
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        labels = batch["labels"][:, 1:]  # the positions whose next token is scored
        seen.append((int(mask.sum()) if mask is not None else ids.numel(), ids.numel(), int((labels != -100).sum())))
        return batch

    trainer.data_collator = counting
    return seen


def step_flops(model):
    """Useful FLOPs of one step: the forward pass of every layer for every real token, the backward through the
    layers from the lowest one holding a LoRA weight up (input gradients through the frozen weights: one
    forward's FLOPs again; LoRA's own weights are negligible), and the output layer forward and backward for
    the tokens that carry a label (the loss needs no other logits); attention's own FLOPs left out, so the
    count is a lower bound. A function of (real tokens, labelled tokens)."""
    import re

    cfg = model.config
    head = 2 * cfg.vocab_size * cfg.hidden_size
    layer_params: dict[int, int] = {}
    lowest = None
    for name, p in model.named_parameters():
        m = re.search(r"\.layers\.(\d+)\.", name)
        if not m:
            continue
        layer = int(m.group(1))
        if "lora_" in name:
            lowest = layer if lowest is None else min(lowest, layer)
        else:
            layer_params[layer] = layer_params.get(layer, 0) + p.numel()
    body = sum(layer_params.values())
    span = sum(n for layer, n in layer_params.items() if lowest is not None and layer >= lowest)
    return lambda tokens, labelled: (2 * body + 2 * span) * tokens + 2 * head * labelled


def _peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _repo_relative(path: str) -> str:
    p = Path(path).resolve()
    repo = Path(__file__).resolve().parents[1]
    return str(p.relative_to(repo)) if p.is_relative_to(repo) else path


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--recipe", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--pairs", required=True)
    p.add_argument("--steps", type=int, default=4, help="timed steps per choice (after one warm-up step)")
    p.add_argument("--top-regex", default=r".*\.layers\.(2[2-9])\.self_attn\.(q|k|v|o)_proj",
                   help="LoRA targets of the top-layers choice (a PEFT regular expression)")
    p.add_argument("--only", nargs="*", help="run only these choices (names as printed)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    import torch

    results = {}
    for name, overrides in choices(args.top_regex).items():
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as out:
            res = time_steps(args.recipe, ["--model_name_or_path", args.model, "--dataset_name", args.pairs,
                                           *overrides], args.steps, out)
        res["peak_rss_mib_so_far"] = _peak_rss_mib()  # the process's peak up to this choice (ru_maxrss only rises)
        results[name] = res
        print(f"{name:28s} median {res['median_step_s']:7.2f} s/step over {res['steps_timed']} steps "
              f"({res['trainable_parameters'] / 1e6:.2f}M trainable)", flush=True)
    peak = matmul_peak_gflops("bf16")
    base = results.get("fp32 (baseline)")
    for name, res in results.items():
        if base:
            res["speedup_vs_fp32"] = base["median_step_s"] / res["median_step_s"]
        res["share_of_bf16_peak"] = res["useful_gflops"] / peak
        print(f"{name:28s} {res.get('speedup_vs_fp32', float('nan')):5.2f}x vs fp32, "
              f"{res['useful_gflops']:.1f} GFLOP/s useful = {res['share_of_bf16_peak']:.1%} of the bf16 peak "
              f"({peak:.0f} GFLOP/s), padding waste {res['padding_waste']:.1%}")
    if args.json:
        meta = {"cpu": platform.processor() or platform.machine(), "native_bf16": native_bf16_cpu_flags(),
                "torch": torch.__version__, "threads": torch.get_num_threads(), "cores": os.cpu_count(),
                "recipe": _repo_relative(args.recipe), "pairs": args.pairs, "steps_timed_per_choice": args.steps,
                "bf16_matmul_peak_gflops": peak,
                "flops": "per real (non-padding) token: forward of every layer + backward through the layers "
                         "from the lowest LoRA layer up; per labelled token: the output layer forward and backward; "
                         "attention left out"}
        Path(args.json).write_text(json.dumps({"machine": meta, "choices": results, "peak_rss_mib": _peak_rss_mib()},
                                              indent=2) + "\n")
    print(f"peak RSS {_peak_rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
