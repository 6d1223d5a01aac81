"""What a trained adapter says about itself: the model card and the resolved configuration."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from real.training.onpolicy import REWARD_TERMS

# Set per process by the launcher, not by the recipe.
RUNTIME_FIELDS = {"local_rank"}


def resolved_config(script_args, training_args, model_args) -> dict:
    """Every argument as one flat mapping, re-usable as ``--config`` (secrets redacted)."""
    out: dict = {}
    for obj in (script_args, training_args, model_args):
        d = obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj)
        for f in dataclasses.fields(obj):
            if not f.init or f.name not in d or f.name in RUNTIME_FIELDS:
                continue
            v = d[f.name]
            if f.name.endswith("_token"):  # to_dict() masks these as "<NAME>"
                v = getattr(obj, f.name)
                if v is not None and f.name not in ("eos_token", "pad_token"):
                    continue  # a secret (hub_token): never written
            out[f.name] = v
    return json.loads(json.dumps(out, default=str))


def _on_policy(args) -> bool:
    return hasattr(args, "num_generations")  # GRPOConfig (trainer grpo)


def _plain(x):
    return getattr(x, "value", x)


def model_card(*, base_model, variant, data_path, data_info, data_sha, args, model_args, metrics, versions) -> str:
    """README.md of the output: base model, data and its sha256, pair counts, hyper-parameters, results."""
    world = metrics.get("world_size")
    lines = [
        "---",
        f"base_model: {base_model}",
        "library_name: peft" if model_args.use_peft else "library_name: transformers",
        f"tags: [real-fae, fact-verification, trl, {'grpo' if _on_policy(args) else 'sft'}"
        + (", lora]" if model_args.use_peft else "]"),
        "---",
        "",
        f"# Fact-checking verifier: {variant or 'unknown variant'} on {Path(str(base_model)).name}",
        "",
        (f"Trained with `real-train` (TRL SFTTrainer, completion-only loss) on the `{variant}` variant of the "
         "REAL training pairs (SPEC §4)." if not _on_policy(args) else
         f"Trained with `real-train` (TRL GRPOTrainer: on-policy evidence ablation, SPEC §4) on the prompts of "
         f"the `{variant}` pairs, rewarded by its own ablations (terms and weights below)."
         + (f" Started from the adapter `{data_info['init_adapter']}`." if data_info.get("init_adapter") else ""))
        + " Answers are one JSON object `{\"label\": ..., \"evidence\": [...]}`.",
        "",
        "## Data",
        "",
        f"- path: `{data_path}`",
        f"- sha256: `{data_sha}`",
        f"- pairs: {data_info.get('pairs')}" + (f" ({', '.join(f'{k}: {n}' for k, n in sorted(data_info.get('by_kind', {}).items()))})" if data_info.get("by_kind") else ""),
        f"- pairs trained on: {metrics.get('train_samples', data_info.get('pairs'))}"
        + (f" ({data_info['dropped_overlong']} longer than max_length {args.max_length} tokens dropped "
           "with drop_overlong)" if data_info.get("dropped_overlong") else ""),
        "",
        "## Hyper-parameters",
        "",
        "| name | value |",
        "|---|---|",
    ]
    hp = {
        "base model": base_model,
        "variant": variant,
        "LoRA": (f"r={model_args.lora_r}, alpha={model_args.lora_alpha}, dropout={model_args.lora_dropout}, "
                 f"targets={model_args.lora_target_modules}") if model_args.use_peft else "off (full fine-tuning)",
        "optimizer": _plain(args.optim),
        "learning rate": args.learning_rate,
        "scheduler": f"{_plain(args.lr_scheduler_type)}, warmup steps {args.warmup_steps or 0}",
        "epochs": args.num_train_epochs,
        "max steps": args.max_steps,
        "per-device batch": args.per_device_train_batch_size,
        "gradient accumulation": args.gradient_accumulation_steps,
        "processes": world,
        "global batch": metrics.get("global_batch_size"),
        "max length": args.max_length,
        "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
        "seed": args.seed,
    }
    if _on_policy(args):
        hp.update({"generations per prompt": args.num_generations, "max completion tokens": args.max_completion_length,
                   "temperature": args.temperature, "beta (KL)": args.beta,
                   "reward weights": ", ".join(f"{t} {w}" for t, w in zip(REWARD_TERMS, args.reward_weights)),
                   "control seed": args.control_seed, "line ids": data_info.get("line_ids")})
    lines += [f"| {k} | {v} |" for k, v in hp.items()]
    lines += ["", "## Results", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(metrics.items())]
    lines += ["", "## Versions", ""]
    lines += [f"- {k} {v}" for k, v in versions.items()]
    lines += ["", "The full argument set is in `resolved_config.yaml` (usable as `real-train --config`).", ""]
    return "\n".join(lines)
