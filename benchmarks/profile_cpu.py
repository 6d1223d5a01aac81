"""Where a CPU's time goes: torch.profiler over one LoRA training step (bf16 autocast, the SmolLM2 recipe's
LoRA targets) and one FAE generate batch (bf16), each after a warm-up; the top operators by self CPU time.

    eval "$(python -m real_fae_core.hardware)"   # the allocator settings the recipes use
    python benchmarks/profile_cpu.py --model models/smollm2-135m-instruct \\
        --records data/check-covid-test.jsonl --output benchmarks/results/profile_cpu.txt

The step trains on 8 random token rows of the recipe's mean pair length (~350 tokens) with the recipe's
LoRA (PEFT: every projection of layers 20-29); the FAE batch is 16 Check-COVID prompts, 48 new tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_prep.prompts import render_evidence_prompt  # noqa: E402
from data_prep.records import load_records  # noqa: E402
from real_fae_core.hardware import CPU_ALLOCATOR_ENV  # noqa: E402

LORA_TARGETS = r".*\.layers\.(2[0-9])\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"


def table(prof, rows: int) -> str:
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def training_step(model_dir: str, rows: int) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lm = get_peft_model(lm, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS))
    ids = torch.randint(100, 40000, (8, 350))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = lm(input_ids=ids, labels=ids)
        out.loss.backward()
        lm.zero_grad(set_to_none=True)

    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    return table(prof, rows)


def fae_batch(model_dir: str, records: str, rows: int) -> str:
    import torch

    from fae.backends.hf import HFBackend

    backend = HFBackend({"model": model_dir, "batch_size": 16, "max_new_tokens": 48, "device": "cpu",
                         "dtype": "bf16", "label_probs": False})
    prompts = [render_evidence_prompt(r) for r in load_records(records)[:16]]
    backend.generate(prompts[:2])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        backend.generate(prompts)
    return table(prof, rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--records", required=True, help="converted Check-COVID records")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    env = {k: os.environ[k] for k in CPU_ALLOCATOR_ENV if k in os.environ}
    text = (f"# torch.profiler, CPU; allocator settings in the environment: {env or 'none'}\n\n"
            f"## one LoRA training step (bf16 autocast, 8 x 350 tokens)\n\n{training_step(args.model, args.rows)}\n\n"
            f"## one FAE generate batch (bf16, 16 prompts, 48 new tokens)\n\n"
            f"{fae_batch(args.model, args.records, args.rows)}\n")
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
