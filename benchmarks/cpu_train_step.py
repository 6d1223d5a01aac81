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
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALL_LAYERS_ATTN = "[q_proj, k_proj, v_proj, o_proj]"


def choices(top_regex: str) -> dict[str, list[str]]:
    """Name -> real-train overrides. The baseline is the paper's LoRA (attention, all layers) in fp32."""
    return {
        "fp32 (baseline)": ["--cpu_bf16", "false", "--lora_target_modules", *ALL_LAYERS_ATTN.strip("[]").split(", ")],
        "bf16 autocast": ["--cpu_bf16", "true", "--lora_target_modules", *ALL_LAYERS_ATTN.strip("[]").split(", ")],
        "LoRA on top layers (fp32)": ["--cpu_bf16", "false", "--lora_target_modules", top_regex],
        "bf16 + top layers": ["--cpu_bf16", "true", "--lora_target_modules", top_regex],
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
    trainable = sum(p.numel() for p in run.trainer.model.parameters() if p.requires_grad)
    run.trainer.train()
    timed = clock.times[1:]
    return {"median_step_s": statistics.median(timed), "steps_timed": len(timed), "step_s": timed,
            "trainable_parameters": trainable, "bf16": training_args.bf16,
            "per_device_train_batch_size": training_args.per_device_train_batch_size}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        results[name] = res
        print(f"{name:28s} median {res['median_step_s']:7.2f} s/step over {res['steps_timed']} steps "
              f"({res['trainable_parameters'] / 1e6:.2f}M trainable)", flush=True)
    base = results.get("fp32 (baseline)")
    if base:
        for name, res in results.items():
            res["speedup_vs_fp32"] = base["median_step_s"] / res["median_step_s"]
            print(f"{name:28s} {res['speedup_vs_fp32']:5.2f}x vs fp32")
    if args.json:
        meta = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                "threads": torch.get_num_threads(), "cores": os.cpu_count(), "recipe": args.recipe}
        Path(args.json).write_text(json.dumps({"machine": meta, "choices": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
